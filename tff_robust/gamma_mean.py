"""The γ-mean (minimum γ-divergence location estimate) as an iterative secure aggregate.

Li, Hung, et al., "Robust Aggregation for Federated Learning by Minimum γ-Divergence
Estimation", Entropy 2022: Algorithm 2 (simple γ-mean, working model N(μ, I)) and
Algorithm 1 with the diagonal covariance the paper recommends for small samples.
"""

import collections
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_robust import arguments
from tff_robust import geometric_median
from tff_robust import iterative_mean
from tff_robust import numerics
from tff_robust import unit_weights

COVARIANCES = ('identity', 'diagonal')
INITIAL_POINTS = ('mean', 'geometric_median')
DEFAULT_GAMMA = 0.5  # The paper's federated experiments (Section 4.2).
# A total γ-weight below this counts as underflow: the float32 weighted sums of the
# inner mean would be denormal (imprecise) or zero. The estimate is then kept.
UNDERFLOW_WEIGHT = 1e-30


def _starting_calls(factory) -> int:
  """Secure-average calls of the factory computing the starting point; 0 for a factory
  that does not declare them (as before: only GeometricMedianFactory does)."""
  return getattr(factory, 'num_communication_passes', 0)


def _leaves(structure):
  return tf.nest.flatten(numerics.as_nest(structure))


def squared_distance(value, center):
  """‖x − μ‖² over the whole structure (float64; see `numerics.global_l2_distance`)."""
  return tf.square(numerics.global_l2_distance(value, center))


def scaled_squared_distance(value, center, variance):
  """Σ_j (x_j − μ_j)² / σ_j² over the whole structure, summed across tensors in float64.

  Per tensor in its own dtype: float64 copies of a large model would cost more than
  the distance. An overflow gives +inf, i.e. weight exp(−inf) = 0, the right limit. A
  coordinate of infinite variance (float32 overflow, see `GammaMeanFactory`) does not
  count: its term is 0, also when (x − μ)² overflowed too (inf / inf).
  """

  def term(x, c, v):
    ratio = tf.math.squared_difference(x, c) / v
    return tf.where(tf.math.is_inf(v), tf.zeros_like(ratio), ratio)

  terms = [
      tf.cast(tf.reduce_sum(term(x, c, v)), tf.float64)
      for x, c, v in zip(_leaves(value), _leaves(center), _leaves(variance))
  ]
  return tf.add_n(terms) if terms else tf.constant(0.0, tf.float64)


def gamma_weight(alpha, distance, gamma):
  """α·exp(−γ/2·D) as float32: in (0, α], so secure-sum bounds on α·x still hold."""
  weight = tf.cast(alpha, tf.float64) * tf.exp(-0.5 * gamma * distance)
  return tf.cast(weight, tf.float32)


class GammaMeanFactory(unit_weights.WeightedOrUnweightedFactory):
  """The γ-mean of client updates: Gaussian-likelihood-weighted fixed-point means.

  The created `tff.templates.AggregationProcess` takes a value at CLIENTS (any
  structure of float tensors, treated as one vector x_i of dimension p) and a weight
  α_i, and returns at SERVER the γ-mean μ. Every iteration broadcasts the current
  estimate; each client computes its own weight and one call of `inner_mean_factory`
  returns the next estimate. The server learns nothing but the inner factory's
  outputs and sums of client scalars (the weight totals).

  *   `covariance='identity'` (Algorithm 2, simple γ-mean):
      d_i = exp(−γ/2 ‖x_i − μ‖²), μ ← Σ α_i d_i x_i / Σ α_i d_i.
  *   `covariance='diagonal'` (Algorithm 1 with diag(Σ)):
      d_i = exp(−γ/2 Σ_j (x_ij − μ_j)²/σ_j²); the same call averages the pair
      (x_i, (x_i − μ_old)²), from which μ ← Σ w_i x_i and
      σ² ← (1+γ) Σ w_i (x_i − μ)² = (1+γ) (Σ w_i (x_i − μ_old)² − (μ − μ_old)²)
      (w_i = α_i d_i / Σ α_k d_k; centring on the broadcast μ_old keeps this stable).
      σ² is floored at `variance_floor`. The initial σ₀² = Σ α_i (x_i − μ₀)² / Σ α_i
      (the weighted variance for the mean start) comes from the first call (which
      averages (x, x²) for the mean start, so that one is not centred) or, after the
      geometric median, from one extra call.

  Initial point μ₀: `'mean'` (one call, weights α_i) or `'geometric_median'` (the
  passes of `geometric_median_factory`, default
  `GeometricMedianFactory(inner_mean_factory=inner_mean_factory)`, run as a composed
  process). Then `num_iterations` iterations S follow. γ is `gamma`, or
  `gamma_per_dimension / p` (the paper's simulations use γ = c/p); default 0.5 (the
  paper's federated experiments).

  Range: the diagonal σ² is a float32 estimate computed in one pass from the centred
  second moment: a client beyond ~1.8e19 makes it +inf on its coordinates, which then
  stop counting in the distances (so such a client is not down-weighted there), and
  when the estimate moves by much more than the inliers' spread in one iteration, the
  cancellation in Σ w (x − μ_old)² − (μ − μ_old)² loses the inliers' variance. Both
  give a finite result that can differ from the exact (float64, two-pass) γ-mean.

  Underflow: in high dimension exp(−γ/2·D) underflows. Weights are computed in float64
  and passed as float32 (so they lie in [0, α_i], which keeps secure-sum bounds
  valid). When the total weight Σ α_i d_i of an iteration is below 1e-30 (every d_i
  underflowed), that iteration keeps the previous estimate (μ and σ²) and is counted
  in `num_underflow_passes`: the result is always defined. Use `gamma_per_dimension`
  for large models.

  Inputs must be finite: wrap the factory in `tff_robust.NonfiniteFilteringFactory`
  (the learning builders and `tasks.registry` do) to give a NaN or infinite client
  weight 0.

  The process's `next` has type signature
  `(<state, {value}@CLIENTS, {weight}@CLIENTS> -> <state, value@SERVER, measurements>)`
  (state: `<inner=..., initial_point=...>`, the inner and geometric-median states) and
  reports at SERVER:

  *   `num_secure_average_calls`: calls of an inner mean this round (the initial
      point's included).
  *   `underflow`: float32 vector of length S, 1.0 for an iteration that underflowed.
  *   `num_underflow_passes`: their number.
  *   `retained_weight`: float32 vector of length S, Σ α_i d_i / Σ α_i per iteration
      (how much weight the γ-weights keep; small values flag outliers or a γ too big).
  *   `initial_point`: the geometric-median process's measurements (only for
      `initial_point='geometric_median'`).
  *   `inner`: the inner factory's measurements of the last call.
  """

  # Client values reach the server only through sums (see the privacy tests).
  secure_compatible = True

  def __init__(
      self,
      gamma: Optional[float] = None,
      gamma_per_dimension: Optional[float] = None,
      num_iterations: int = 3,
      covariance: str = 'identity',
      initial_point: str = 'mean',
      inner_mean_factory: Optional[tff.aggregators.WeightedAggregationFactory] = None,
      geometric_median_factory: Optional[
          geometric_median.GeometricMedianFactory] = None,
      variance_floor: float = 1e-12,
  ):
    """Initializes the factory.

    Args:
      gamma: γ > 0. Default 0.5 if `gamma_per_dimension` is not given either.
      gamma_per_dimension: c > 0 for γ = c/p, p the number of scalar parameters of
        the value type (known at `create`). Exclusive with `gamma`.
      num_iterations: S >= 1 fixed-point iterations after the initial point.
      covariance: 'identity' (simple γ-mean) or 'diagonal'.
      initial_point: 'mean' or 'geometric_median'.
      inner_mean_factory: the weighted mean every iteration goes through; default
        `tff_robust.iterative_mean.Float64MeanFactory()`.
      geometric_median_factory: the factory of the initial point for
        `initial_point='geometric_median'`.
      variance_floor: lower bound (> 0) on σ_j² for the diagonal covariance, so that
        coordinates on which all clients agree do not divide by zero.

    Raises:
      ValueError: for γ <= 0 or c <= 0 (or both given), S < 1, an unknown
        covariance or initial point, or `variance_floor` <= 0.
      TypeError: for arguments of the wrong type (e.g. a float S), including
        factories of the wrong kind.
    """
    if gamma is not None and gamma_per_dimension is not None:
      raise ValueError('Give gamma or gamma_per_dimension, not both; got '
                       f'gamma={gamma!r}, gamma_per_dimension={gamma_per_dimension!r}.')
    self._gamma = None
    self._gamma_per_dimension = None
    if gamma_per_dimension is not None:
      self._gamma_per_dimension = arguments.check_positive_float(
          'gamma_per_dimension', gamma_per_dimension)
    else:
      self._gamma = arguments.check_positive_float(
          'gamma', DEFAULT_GAMMA if gamma is None else gamma)
    self._num_iterations = arguments.check_positive_int(
        'num_iterations', num_iterations)
    if covariance not in COVARIANCES:
      raise ValueError(f'covariance must be one of {COVARIANCES}, got {covariance!r}.')
    self._covariance = covariance
    if initial_point not in INITIAL_POINTS:
      raise ValueError(
          f'initial_point must be one of {INITIAL_POINTS}, got {initial_point!r}.')
    self._initial_point = initial_point
    self._inner = iterative_mean.check_inner_mean_factory(inner_mean_factory)
    if geometric_median_factory is None:
      geometric_median_factory = geometric_median.GeometricMedianFactory(
          inner_mean_factory=self._inner)
    elif not isinstance(geometric_median_factory,
                        tff.aggregators.WeightedAggregationFactory):
      raise TypeError('geometric_median_factory must be a weighted aggregation '
                      f'factory, got {type(geometric_median_factory).__name__}.')
    self._gm_factory = geometric_median_factory
    self._variance_floor = arguments.check_positive_float(
        'variance_floor', variance_floor)

  # Read by `tff_robust.passwise`, which runs the same iterations one computation each.
  num_iterations = property(lambda self: self._num_iterations, doc='S.')
  covariance = property(lambda self: self._covariance)
  initial_point = property(lambda self: self._initial_point)
  inner_mean_factory = property(lambda self: self._inner)
  geometric_median_factory = property(lambda self: self._gm_factory)
  variance_floor = property(lambda self: self._variance_floor)

  def gamma_for(self, value_type) -> float:
    """γ used for values of `value_type`."""
    if self._gamma is not None:
      return self._gamma
    return self._gamma_per_dimension / max(iterative_mean.num_parameters(value_type), 1)

  def create_weighted(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    iterative_mean.check_float_structure(value_type)
    gamma = self.gamma_for(value_type)
    if self._covariance == 'identity':
      steps = _SimpleSteps(value_type, gamma)
    else:
      steps = _DiagonalSteps(value_type, gamma, self._variance_floor)
    inner = self._inner.create(steps.inner_value_type, iterative_mean.WEIGHT_TYPE)
    use_gm = self._initial_point == 'geometric_median'
    gm = self._gm_factory.create(value_type, iterative_mean.WEIGHT_TYPE) if use_gm else None
    num_calls = self._num_iterations + (
        _starting_calls(self._gm_factory) + steps.calls_after_gm
        if use_gm else 1)

    @tff.federated_computation()
    def init_fn():
      state = collections.OrderedDict(inner=inner.initialize())
      if use_gm:
        state['initial_point'] = gm.initialize()
      return tff.federated_zip(state)

    @tff.federated_computation(
        init_fn.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      alpha = iterative_mean.float32_weights(weight_type, weight)
      alpha_sum = tff.federated_sum(alpha)
      inner_state = state.inner
      measurements = collections.OrderedDict()
      if use_gm:
        gm_output = gm.next(state.initial_point, value, alpha)
        estimate, inner_state, inner_measurements = steps.after_geometric_median(
            inner, inner_state, gm_output.result, value, alpha)
      else:
        estimate, inner_state, inner_measurements = steps.initial_mean(
            inner, inner_state, value, alpha)

      underflows, retained = [], []
      for _ in range(self._num_iterations):
        estimate, inner_state, inner_measurements, underflow, kept = steps.iterate(
            inner, inner_state, estimate, value, alpha, alpha_sum)
        underflows.append(underflow)
        retained.append(kept)

      underflow_vector = iterative_mean.stack_at_server(underflows)
      measurements['num_secure_average_calls'] = tff.federated_value(
          num_calls, tff.SERVER)
      measurements['underflow'] = underflow_vector
      measurements['num_underflow_passes'] = tff.federated_map(
          _count_ones, underflow_vector)
      measurements['retained_weight'] = iterative_mean.stack_at_server(retained)
      if use_gm:
        measurements['initial_point'] = gm_output.measurements
      measurements['inner'] = inner_measurements
      new_state = collections.OrderedDict(inner=inner_state)
      if use_gm:
        new_state['initial_point'] = gm_output.state
      return tff.templates.MeasuredProcessOutput(
          state=tff.federated_zip(new_state),
          result=steps.result(estimate),
          measurements=tff.federated_zip(measurements))

    return tff.templates.AggregationProcess(init_fn, next_fn)


@tff.tensorflow.computation(tff.TensorType(np.float32, [None]))
def _count_ones(vector):
  return tf.cast(tf.reduce_sum(vector), tf.int32)


@tff.tensorflow.computation(tf.float32, tf.float32)
def _underflow_and_retained(weight_sum, alpha_sum):
  underflow = tf.logical_and(weight_sum < UNDERFLOW_WEIGHT, alpha_sum > 0)
  return (tf.cast(underflow, tf.float32),
          tf.math.divide_no_nan(weight_sum, alpha_sum))


def _keep_if(underflow, old, new):
  """`old` where the iteration underflowed (a scalar 0/1 flag), else `new`."""
  return tf.nest.map_structure(
      lambda o, n: tf.where(underflow > 0, o, n),
      numerics.as_nest(old), numerics.as_nest(new))


class _SimpleSteps:
  """The federated steps of Algorithm 2; the estimate is μ (value_type at SERVER)."""

  calls_after_gm = 0

  def __init__(self, value_type, gamma):
    self.inner_value_type = value_type
    self._value_type = value_type

    @tff.tensorflow.computation(value_type, value_type, tf.float32)
    def client_weight(center, value, alpha):
      return gamma_weight(alpha, squared_distance(value, center), gamma)

    @tff.tensorflow.computation(value_type, value_type, tf.float32)
    def advance(center, proposal, underflow):
      return _keep_if(underflow, center, proposal)

    self._client_weight = client_weight
    self._advance = advance

  def initial_mean(self, inner, inner_state, value, alpha):
    output = inner.next(inner_state, value, alpha)
    return output.result, output.state, output.measurements

  def after_geometric_median(self, inner, inner_state, center, value, alpha):
    del inner, value, alpha
    return center, inner_state, None

  def iterate(self, inner, inner_state, center, value, alpha, alpha_sum):
    weights = tff.federated_map(
        self._client_weight, (tff.federated_broadcast(center), value, alpha))
    flags = tff.federated_map(
        _underflow_and_retained, (tff.federated_sum(weights), alpha_sum))
    output = inner.next(inner_state, value, weights)
    center = tff.federated_map(self._advance, (center, output.result, flags[0]))
    return center, output.state, output.measurements, flags[0], flags[1]

  def result(self, center):
    return center


class _DiagonalSteps:
  """The federated steps of Algorithm 1 with a diagonal covariance.

  The estimate is `<mean, variance>` at SERVER; the inner mean averages the pair
  `<value=x, square=(x − c)²>` for a broadcast centre c.
  """

  calls_after_gm = 1

  def __init__(self, value_type, gamma, variance_floor):
    pair_type = tff.StructWithPythonType(
        [('value', value_type), ('square', value_type)], collections.OrderedDict)
    self.inner_value_type = pair_type
    zero_center = tff.tensorflow.computation(
        lambda: tf.nest.map_structure(
            lambda t: tf.zeros(t.shape, t.dtype),
            iterative_mean.type_template(value_type)))

    def centered_pair(value, center):
      squares = tf.nest.map_structure(
          lambda x, c: tf.square(x - c), numerics.as_nest(value),
          numerics.as_nest(center))
      return collections.OrderedDict(value=numerics.as_nest(value), square=squares)

    @tff.tensorflow.computation(value_type, value_type)
    def pair_around(center, value):
      return centered_pair(value, center)

    @tff.tensorflow.computation(value_type, value_type, value_type, tf.float32)
    def client_step(center, variance, value, alpha):
      distance = scaled_squared_distance(value, center, variance)
      return (gamma_weight(alpha, distance, gamma), centered_pair(value, center))

    def variance_about(pair_mean, center, target, scale):
      # Σ w (x − target)² = Σ w (x − c)² − (m − c)² + (m − target)², m = Σ w x.
      # An overflowed second moment (inf − inf = NaN) is an infinite variance.
      return tf.nest.map_structure(
          lambda s, m, c, t: tf.where(
              tf.math.is_inf(s), s, tf.maximum(
                  scale * (s - tf.square(m - c) + tf.square(m - t)),
                  tf.cast(variance_floor, s.dtype))),
          numerics.as_nest(pair_mean['square']), numerics.as_nest(pair_mean['value']),
          numerics.as_nest(center), numerics.as_nest(target))

    estimate_type = tff.StructWithPythonType(
        [('mean', value_type), ('variance', value_type)], collections.OrderedDict)

    @tff.tensorflow.computation(pair_type, value_type, value_type)
    def initial_estimate(pair_mean, center, initial):
      pair_mean = numerics.as_nest(pair_mean)
      return collections.OrderedDict(
          mean=numerics.as_nest(initial),
          variance=variance_about(pair_mean, center, initial, 1.0))

    @tff.tensorflow.computation(pair_type, value_type)
    def mean_start(pair_mean, center):
      pair_mean = numerics.as_nest(pair_mean)
      mean = pair_mean['value']
      return collections.OrderedDict(
          mean=mean, variance=variance_about(pair_mean, center, mean, 1.0))

    @tff.tensorflow.computation(estimate_type, pair_type, tf.float32)
    def advance(estimate, pair_mean, underflow):
      estimate, pair_mean = numerics.as_nest(estimate), numerics.as_nest(pair_mean)
      mean = pair_mean['value']
      proposal = collections.OrderedDict(
          mean=mean,
          variance=variance_about(pair_mean, estimate['mean'], mean, 1.0 + gamma))
      return _keep_if(underflow, estimate, proposal)

    @tff.tensorflow.computation(estimate_type)
    def mean_of(estimate):
      return numerics.as_nest(estimate)['mean']

    self._zero_center = zero_center
    self._pair_around = pair_around
    self._client_step = client_step
    self._initial_estimate = initial_estimate
    self._mean_start = mean_start
    self._advance = advance
    self._mean_of = mean_of

  def initial_mean(self, inner, inner_state, value, alpha):
    # Centre 0: the pair is (x, x²), the one uncentred second moment (see docstring).
    center = tff.federated_eval(self._zero_center, tff.SERVER)
    pairs = tff.federated_map(
        self._pair_around, (tff.federated_broadcast(center), value))
    output = inner.next(inner_state, pairs, alpha)
    estimate = tff.federated_map(self._mean_start, (output.result, center))
    return estimate, output.state, output.measurements

  def after_geometric_median(self, inner, inner_state, center, value, alpha):
    pairs = tff.federated_map(
        self._pair_around, (tff.federated_broadcast(center), value))
    output = inner.next(inner_state, pairs, alpha)
    estimate = tff.federated_map(
        self._initial_estimate, (output.result, center, center))
    return estimate, output.state, output.measurements

  def iterate(self, inner, inner_state, estimate, value, alpha, alpha_sum):
    broadcast = tff.federated_broadcast(estimate)
    step = tff.federated_map(
        self._client_step, (broadcast.mean, broadcast.variance, value, alpha))
    weights, pairs = step[0], step[1]
    flags = tff.federated_map(
        _underflow_and_retained, (tff.federated_sum(weights), alpha_sum))
    output = inner.next(inner_state, pairs, weights)
    estimate = tff.federated_map(self._advance, (estimate, output.result, flags[0]))
    return estimate, output.state, output.measurements, flags[0], flags[1]

  def result(self, estimate):
    return tff.federated_map(self._mean_of, estimate)
