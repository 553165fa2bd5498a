"""Centered clipping (Karimireddy, He, Jaggi, "Learning from History for Byzantine
Robust Optimization", ICML 2021, eq. (CC)) as an iterative secure aggregate.

Each of the L iterations is one broadcast and one weighted mean:
    v_{l+1} = v_l + Σ_i α_i c_i / Σ_i α_i,   c_i = (x_i − v_l)·min(1, τ/‖x_i − v_l‖),
where every client computes its own clipped difference c_i from the broadcast centre
v_l and the server receives only the output of the inner mean factory (and sums of
client scalars). With a secure inner mean the whole aggregate is secure.
`baselines.centered_clipping` is the same formula computed at the server from the
gathered updates.
"""

import collections
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_robust.common import arguments
from tff_robust.iterative import contributions
from tff_robust.iterative import iterative_steps
from tff_robust.iterative import iterative_mean
from tff_robust.common import numerics
from tff_robust.common import traced

INITIAL_POINTS = ('previous', 'mean', 'zero')


def check_arguments(clip_radius, num_iterations, initial_point):
  """(τ, L, initial point) of centered clipping, validated; shared with the gathering
  baseline `baselines.centered_clipping`.

  Raises:
    TypeError: for a τ that is not a number or an L that is not an integer.
    ValueError: for τ <= 0, L < 1 or an initial point not in `INITIAL_POINTS`.
  """
  if initial_point not in INITIAL_POINTS:
    raise ValueError(
        f'initial_point must be one of {INITIAL_POINTS}, got {initial_point!r}.')
  return (arguments.check_positive_float('clip_radius', clip_radius),
          arguments.check_positive_int('num_iterations', num_iterations),
          initial_point)


def clipped_difference(value, center, radius):
  """(x − v)·min(1, τ/‖x − v‖) over a whole structure (the values' structure).

  In the values' dtype when that is exact enough; in float64 when x − v overflows
  float32 (a client at 3e38 and a centre of the other sign) or the scale τ/‖x − v‖
  falls below float32's smallest normal number, which TensorFlow's CPU kernels flush
  to zero: either would zero the client's step instead of clipping it to norm τ.
  """
  value, center = numerics.as_nest(value), numerics.as_nest(center)
  distance = numerics.global_l2_distance(value, center)
  scale = tf.where(distance > radius, radius / distance, tf.constant(1.0, tf.float64))

  def in_own_dtype():
    return tf.nest.map_structure(lambda x, v: (x - v) * tf.cast(scale, x.dtype),
                                 value, center)

  def in_float64():
    differences = tf.nest.map_structure(
        lambda x, v: tf.cast(x, tf.float64) - tf.cast(v, tf.float64), value, center)
    norm = numerics.global_l2_norm(differences)
    exact_scale = tf.minimum(tf.constant(1.0, tf.float64),
                             tf.math.divide_no_nan(tf.constant(radius, tf.float64), norm))
    return tf.nest.map_structure(lambda d, x: tf.cast(d * exact_scale, x.dtype),
                                 differences, value)

  exact_enough = tf.logical_and(tf.math.is_finite(distance), scale >= numerics.FLOAT32_TINY)
  return tf.cond(exact_enough, in_own_dtype, in_float64)


def is_clipped(value, center, radius, weight):
  """(1 if client's ‖x − v‖ > τ, 1 if it counts at all) as int32, for sums: a client
  of weight 0 is neither clipped nor counted."""
  counts = tf.cast(weight > 0, tf.int32)
  far = numerics.global_l2_distance(value, center) > radius
  return tf.cast(far, tf.int32) * counts, counts


class SecureCenteredClippingFactory(iterative_steps.IterativeAggregationFactory):
  """Centered clipping through an inner weighted mean: L iterations of
  v ← v + Σ_i α_i clip_τ(x_i − v) / Σ_i α_i, clip_τ(z) = z·min(1, τ/‖z‖) over the
  whole model update, computed on the clients.

  The paper averages with 1/n; with client weights α_i the average is weighted (1/n
  for equal weights), as `baselines.centered_clipping.CenteredClippingFactory`, whose
  result this equals (tested to 1e-5) without gathering a single update.

  Starting point v₀ (`initial_point`):
  *   'previous' (default, the paper's choice): the aggregate returned in the previous
      round, kept in the process state (zero in the first round). The paper's clients
      send worker momenta (`--worker_momentum` in the simulation), so consecutive
      aggregates are close and one iteration suffices.
  *   'mean': the weighted mean of this round's updates, one more call of the inner
      mean (not robust by itself; the clipped steps pull it towards the bulk).
  *   'zero': v₀ = 0, the current model.

  Inputs must be finite: wrap the factory in `tff_robust.NonfiniteFilteringFactory`
  (`tasks.registry` does) to give a NaN or infinite client weight 0.

  The created process's `next` has type signature
  `(<state, {value}@CLIENTS, {weight}@CLIENTS> -> <state, result=value@SERVER,
  measurements@SERVER>)`; the state is `<previous=value, inner=<inner state>>` for
  'previous' and `<inner=<inner state>>` otherwise. Measurements:
  *   `num_secure_average_calls`: calls of the inner mean (L, or L + 1 from 'mean');
  *   `fraction_clipped`: fraction of the clients of weight > 0 whose difference was
      clipped in the last iteration;
  *   `inner`: the inner mean's measurements of the last call.

  Privacy: client values reach the server only through `inner_mean_factory` (pass a
  `tff.aggregators.MeanFactory` with `tff.aggregators.SecureSumFactory` value and
  weight sums for secure aggregation; its bound applies to α_i·c_i, whose norm is at
  most α_i·τ, and, from 'mean', to α_i·x_i); the clipped count and the number of
  clients are plain federated sums of per-client 0/1 flags.
  """

  # Client values reach the server only through the inner mean and scalar sums (see
  # the walk of the compiled computation in tests/tff_robust/aggregators/test_privacy.py).
  secure_compatible = True

  def __init__(
      self,
      clip_radius: float = 1.0,
      num_iterations: int = 3,
      initial_point: str = 'previous',
      inner_mean_factory: Optional[tff.aggregators.WeightedAggregationFactory] = None,
  ):
    """Initializes the factory.

    Args:
      clip_radius: τ > 0, the clipping radius.
      num_iterations: L >= 1, the broadcast-and-mean iterations (the paper uses 1
        with worker momentum).
      initial_point: 'previous', 'mean' or 'zero' (see the class docstring).
      inner_mean_factory: the weighted mean every iteration goes through. Defaults
        to `tff_robust.iterative.iterative_mean.Float64MeanFactory()` (products and sums in
        float64: the 'mean' start averages unbounded updates).

    Raises:
      ValueError: for τ <= 0, L < 1 or an unknown initial point.
      TypeError: for a τ that is not a number, an L that is not an integer, or an
        `inner_mean_factory` that is not a weighted aggregation factory.
    """
    self._radius, self._num_iterations, self._initial_point = check_arguments(
        clip_radius, num_iterations, initial_point)
    self._inner = iterative_mean.check_inner_mean_factory(inner_mean_factory)

  @property
  def num_secure_average_calls(self) -> int:
    """The inner-mean calls of every `next`."""
    return self._num_iterations + (self._initial_point == 'mean')

  @property
  def clip_radius(self) -> float:
    return self._radius

  @property
  def num_iterations(self) -> int:
    return self._num_iterations

  @property
  def initial_point(self) -> str:
    return self._initial_point

  @property
  def inner_mean_factory(self) -> tff.aggregators.WeightedAggregationFactory:
    return self._inner

  def steps(self, value_type) -> 'CenteredClippingSteps':
    return CenteredClippingSteps(self, value_type)


class CenteredClippingSteps(iterative_steps.IterativeSteps):
  """The passes of one `SecureCenteredClippingFactory` for one value type.

  Passes (`tff_robust.iterative.iterative_steps`): 'mean' (the mean start only: one inner mean of
  the updates), then L iterations, each one broadcast of the centre v and one inner
  mean of the clients' clipped differences; the last ('last_iteration') also sums
  the clients' 0/1 flags for `fraction_clipped` (the others would compute every
  distance twice for nothing). The carry: `inner` (the inner mean's state), `center`
  and, after an iteration, `inner_measurements` (and `counts` after the last).
  """

  def __init__(self, factory: SecureCenteredClippingFactory, value_type):
    radius = factory.clip_radius
    self.value_type = value_type
    self._num_iterations = factory.num_iterations
    self._start = factory.initial_point
    self._num_secure_average_calls = factory.num_secure_average_calls
    self._inner = factory.inner_mean_factory.create(value_type,
                                                    iterative_mean.WEIGHT_TYPE)
    computations = _clipping_computations(value_type, radius)
    # An honest client's step has norm ≤ τ and its weight is α; its update is
    # unbounded in the mean start's pass.
    self._mean_bound = contributions.pair(contributions.UNBOUNDED,
                                          contributions.EQUAL_TO_ALPHA)
    self._step_bound = contributions.pair(contributions.norm_at_most(radius),
                                          contributions.EQUAL_TO_ALPHA)
    self._zeros = iterative_mean.zeros(value_type)
    self._computations = computations

  def initialize(self):
    state = collections.OrderedDict()
    if self._start == 'previous':
      state['previous'] = tff.federated_eval(self._zeros, tff.SERVER)
    state['inner'] = self._inner.initialize()
    return tff.federated_zip(state)

  def start(self, state):
    carry = {'inner': state['inner']}
    if self._start == 'previous':
      carry['center'] = state['previous']
    elif self._start == 'zero':
      carry['center'] = tff.federated_eval(self._zeros, tff.SERVER)
    return carry

  def passes(self):
    passes = []
    if self._start == 'mean':
      passes.append(iterative_steps.Pass('mean', self._start_at_mean))
    passes += [iterative_steps.Pass('iteration', self._iterate)] * (self._num_iterations - 1)
    return passes + [iterative_steps.Pass('last_iteration', self._last_iteration)]

  def _start_at_mean(self, carry, value, alpha):
    output = contributions.mean_of('mean', self._inner, carry['inner'], value, alpha,
                                   alpha, self._mean_bound)
    return {'inner': output.state, 'center': output.result}

  def _iterate(self, carry, value, alpha, count_clipped=False):
    """One broadcast and one inner mean: v ← v + Σ α_i clip_τ(x_i − v) / Σ α_i. The
    count's sum is independent of the mean: both see only the broadcast centre."""
    broadcast = tff.federated_broadcast(carry['center'])
    # Two maps, not one returning (step, flags): selecting the step out of a struct at
    # CLIENTS would copy every client's update once more.
    step = tff.federated_map(self._computations.clip_step, (broadcast, value))
    output = contributions.mean_of('clipped_difference', self._inner, carry['inner'],
                                   step, alpha, alpha, self._step_bound)
    center = tff.federated_map(self._computations.advance,
                               (carry['center'], output.result))
    carry = dict(carry, inner=output.state, center=center,
                 inner_measurements=output.measurements)
    if count_clipped:
      # (clipped clients, clients of weight > 0) at this centre.
      carry['counts'] = contributions.sum_of(
          'clip_counts',
          tff.federated_map(self._computations.clip_flags, (broadcast, value, alpha)),
          alpha, contributions.FLAG)
    return carry

  def _last_iteration(self, carry, value, alpha):
    return self._iterate(carry, value, alpha, count_clipped=True)

  def finish(self, carry):
    state = collections.OrderedDict()
    if self._start == 'previous':
      state['previous'] = carry['center']
    state['inner'] = carry['inner']
    counts = carry['counts']
    measurements = collections.OrderedDict(
        num_secure_average_calls=tff.federated_value(
            np.int32(self._num_secure_average_calls), tff.SERVER),
        fraction_clipped=tff.federated_map(self._computations.fraction,
                                           (counts[0], counts[1])),
        inner=carry['inner_measurements'])
    return tff.templates.MeasuredProcessOutput(
        state=tff.federated_zip(state), result=carry['center'],
        measurements=tff.federated_zip(measurements))


_ClippingComputations = collections.namedtuple(
    '_ClippingComputations', ['clip_step', 'clip_flags', 'advance', 'fraction'])


@traced.once
def _clipping_computations(value_type, radius: float) -> _ClippingComputations:
  """The client and server computations of centred clipping at radius τ."""

  @tff.tensorflow.computation(value_type, value_type)
  def clip_step(center, value):
    return clipped_difference(value, center, radius)

  @tff.tensorflow.computation(value_type, value_type, tf.float32)
  def clip_flags(center, value, weight):
    return is_clipped(value, center, radius, weight)

  @tff.tensorflow.computation(value_type, value_type)
  def advance(center, step):
    return tf.nest.map_structure(tf.add, numerics.as_nest(center),
                                 numerics.as_nest(step))

  @tff.tensorflow.computation(tf.int32, tf.int32)
  def fraction(num_clipped, num_clients):
    return tf.math.divide_no_nan(tf.cast(num_clipped, tf.float32),
                                 tf.cast(num_clients, tf.float32))

  return _ClippingComputations(clip_step, clip_flags, advance, fraction)
