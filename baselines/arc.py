"""Adaptive robust clipping, ARC (Allouah, Guerraoui, Gupta, Jellouli, Rizk, Stephan,
"Boosting Robustness by Clipping Gradients in Distributed Learning", 2024;
arXiv:2405.14432, "The Vital Role of Gradient Clipping in Byzantine-Resilient
Distributed Learning"), in front of any aggregator.

With n client updates of which at most f are assumed Byzantine, every update is
clipped to the norm of the (k+1)-th largest update norm, k = ⌊2·(f/n)·(n − f)⌋: the k
largest updates get exactly that norm, the others are unchanged. This is ByzFL's `ARC`
pre-aggregator (`byzfl/aggregators/preaggregators.py`, LPD-EPFL/byzfl: norms sorted,
`nb_clipped = int((2 * f / n) * (n - f))`, threshold the norm at position
n − nb_clipped − 1 in increasing order). k is computed here in exact integer
arithmetic, ⌊2f(n − f) / n⌋; ByzFL's float expression is one lower where rounding
falls just below an integer (e.g. n = 242, f = 33: 56 instead of 57).

How it runs: in two phases around the inner aggregator, so it wraps ANY aggregator
(the gathering baselines, the geometric median, the mean, ...):
1.  every client sends the L2 norm of its update (one float64 scalar) and a 0/1 flag
    for weight > 0; the server collects the norms of the clients of weight > 0 and
    takes the order statistic;
2.  the server broadcasts the threshold, every client clips its own update, and the
    inner aggregator receives the clipped updates with the clients' weights.

NOT compatible with secure aggregation by itself: the order statistic needs every
norm, so **the server learns one L2 norm per client** in the clear (a
`tff.federated_aggregate` of scalars, not a sum). Nothing else of a client's update
leaves it except through the inner aggregator: around a secure-compatible aggregator
with a secure inner mean, the model-sized values move only through secure sums
(`tests/baselines/test_arc.py` walks the compiled computation to check exactly this).
"""

import collections
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from baselines import gather
from tff_robust.iterative import iterative_mean
from tff_robust.iterative import iterative_steps
from tff_robust.common import numerics
from tff_robust.common import traced

THRESHOLD = 'clipping_threshold'
NUM_CLIPPED = 'num_clipped'
_NORMS_TYPE = tff.StructType([
    ('norms', tff.TensorType(np.float64, [None])),
    ('kept', tff.TensorType(np.bool_, [None])),
])


def num_clipped_updates(num_clients, num_byzantine):
  """k = ⌊2·f·(n − f) / n⌋ (int64 tensors; 0 for n = 0): how many of the largest
  updates ARC clips. For f < n, k ≤ n/2, so the (k+1)-th largest norm exists."""
  n = tf.cast(num_clients, tf.int64)
  f = tf.cast(num_byzantine, tf.int64)
  return tf.math.floordiv(2 * f * (n - f), tf.maximum(n, 1))


def clipping_threshold(norms, num_byzantine):
  """The (k+1)-th largest of `norms` (float64 `[n]`); +inf, i.e. nothing clipped,
  when there is no norm."""
  n = tf.shape(norms, out_type=tf.int64)[0]
  k = num_clipped_updates(n, num_byzantine)
  descending = tf.sort(norms, direction='DESCENDING')
  return tf.cond(n > 0, lambda: tf.gather(descending, k),
                 lambda: tf.constant(np.inf, tf.float64))


def clip_to_norm(value, norm, threshold):
  """`value` scaled by threshold / norm if its norm is above the threshold.

  A scale below float32's smallest normal number (a client at 3e38 clipped to norm 1)
  would be flushed to zero by TensorFlow's CPU kernels and zero the update instead of
  clipping it: such a scale multiplies in float64.
  """
  value = numerics.as_nest(value)
  return tf.cond(norm <= threshold,
                 lambda: tf.nest.map_structure(tf.identity, value),
                 lambda: numerics.scaled(value, tf.math.divide_no_nan(threshold, norm)))


def collect_norms(norm, weight):
  """Federated step: `<norms, kept>` at SERVER, every client's norm (float64) and
  whether its weight is > 0, in an arbitrary but fixed client order."""
  zero, accumulate, merge, report = _norm_collection()
  return tff.federated_aggregate(tff.federated_zip((norm, weight)), zero(), accumulate,
                                 merge, report)


@traced.once
def _norm_collection():
  """`collect_norms`' (zero, accumulate, merge, report)."""

  @tff.tensorflow.computation
  def zero():
    return collections.OrderedDict(norms=tf.zeros([0], tf.float64),
                                   kept=tf.zeros([0], tf.bool))

  @tff.tensorflow.computation(_NORMS_TYPE, (tf.float64, tf.float32))
  def accumulate(accumulator, norm_and_weight):
    norm, weight = norm_and_weight
    return collections.OrderedDict(
        norms=tf.concat([accumulator.norms, norm[tf.newaxis]], axis=0),
        kept=tf.concat([accumulator.kept, (weight > 0)[tf.newaxis]], axis=0))

  @tff.tensorflow.computation(_NORMS_TYPE, _NORMS_TYPE)
  def merge(a, b):
    return collections.OrderedDict(norms=tf.concat([a.norms, b.norms], axis=0),
                                   kept=tf.concat([a.kept, b.kept], axis=0))

  @tff.tensorflow.computation(_NORMS_TYPE)
  def report(accumulator):
    return collections.OrderedDict(norms=accumulator.norms, kept=accumulator.kept)

  return zero, accumulate, merge, report


class AdaptiveRobustClippingFactory(iterative_steps.IterativeAggregationFactory):
  """ARC: every client update clipped to the (k+1)-th largest update norm,
  k = ⌊2f(n − f)/n⌋, then any aggregator.

  n counts the clients of weight > 0 (a client of weight 0, e.g. dropped by
  `tff_robust.NonfiniteFilteringFactory`, takes no part in the order statistic); the
  order statistic is unweighted, as in the paper, and the inner aggregator sees every
  clipped update with its client's own weight. f is `num_byzantine`, or ⌊ρ·n⌋ with
  `byzantine_fraction` ρ. A round with f ≥ n > 0 clients fails with an
  `InvalidArgumentError` naming `num_byzantine`. Ties at the threshold change nothing:
  an update whose norm equals the threshold is already within it. f = 0 clips nothing.

  The created process's `next` has type signature
  `(<state, {value}@CLIENTS, {weight}@CLIENTS> -> <state, result=value@SERVER,
  measurements@SERVER>)`, with the inner process's state and result. Measurements:
  the inner aggregator's named measurements (kept flat; a non-named structure is under
  `inner`), plus
  *   `clipping_threshold`: the norm every update was clipped to (float64; +inf in a
      round without clients);
  *   `num_clipped`: clients whose update was scaled down.

  Norms, threshold and scale are float64 whatever the value dtype, so a float64 value
  structure is clipped to float64 accuracy: the result is as accurate as `inner` is
  on float64 values (the mean's to ~1e-16).

  `secure_compatible` is False: the server learns one L2 norm per client (see the
  module docstring); the updates themselves reach it only through `inner`.
  """

  # The server receives every client's update norm in the clear (one scalar each).
  secure_compatible = False
  # The factories it wraps (checked by the constructor; `tasks.registry` reads it).
  wraps = tff.aggregators.WeightedAggregationFactory

  def __init__(self, inner: tff.aggregators.WeightedAggregationFactory,
               num_byzantine: Optional[int] = None,
               byzantine_fraction: Optional[float] = None):
    """Initializes the factory.

    Args:
      inner: Any weighted aggregation factory; it receives the clipped updates.
      num_byzantine: f >= 0, the assumed number of corrupted clients per round.
      byzantine_fraction: alternatively ρ in [0, 0.5): f = ⌊ρ·n⌋. Exactly one of the
        two must be given.

    Raises:
      TypeError: if `inner` is not a weighted aggregation factory.
      TypeError: if `num_byzantine` is not an integer or `byzantine_fraction` not a
        number.
      ValueError: if neither or both of `num_byzantine` and `byzantine_fraction` are
        given, or one is out of range.
    """
    if not isinstance(inner, self.wraps):
      raise TypeError('arc wraps a tff.aggregators.WeightedAggregationFactory, got '
                      f'{type(inner).__name__}.')
    self._inner = inner
    self._num_byzantine, self._fraction = gather.check_assumed_byzantine(
        'arc', num_byzantine, byzantine_fraction)

  inner = property(lambda self: self._inner, doc='The aggregator of the clipped updates.')

  def check_num_clients(self, num_clients: int) -> None:
    """Raises a ValueError if a round of `num_clients` clients breaks n > f."""
    gather.check_more_clients_than_assumed_byzantine(
        'AdaptiveRobustClippingFactory', num_clients, self._num_byzantine)

  def steps(self, value_type) -> iterative_steps.IterativeSteps:
    """One pass that collects the norms and sets the threshold, then the inner
    aggregate's passes (`iterative_steps.steps_of`: one for a factory that is not
    iterative) on the clipped updates, so ARC(GM) runs pass by pass on workers."""
    iterative_mean.check_float_structure(value_type)
    return _ClippedSteps(iterative_steps.steps_of(self._inner, value_type),
                         self._num_byzantine, self._fraction)


class _ClippedSteps(iterative_steps.WrappedSteps):
  """ARC's threshold pass, then `inner`'s passes on the updates clipped to it (each
  pass clips its clients' updates again: a deployed client keeps its own)."""

  def __init__(self, inner: iterative_steps.IterativeSteps,
               num_byzantine: Optional[int], fraction: Optional[float]):
    super().__init__(inner)
    self._client_norm, self._clip = _clipping_at_clients(inner.value_type)
    self._kept_flag = _kept_flag()
    self._threshold_at_server = _threshold_at_server(num_byzantine, fraction)

  def passes(self):
    return [iterative_steps.Pass('arc_threshold', self._threshold_pass)] + [
        self._clipped(step) for step in self._inner.passes()]

  def _threshold_pass(self, carry, value, alpha):
    collected = collect_norms(tff.federated_map(self._client_norm, value),
                              tff.federated_map(self._kept_flag, alpha))
    threshold_and_count = tff.federated_map(self._threshold_at_server, collected)
    return dict(carry, threshold=threshold_and_count[0],
                num_clipped=threshold_and_count[1])

  def _clipped(self, step):
    def run(carry, value, alpha):
      clipped = tff.federated_map(
          self._clip, (value, tff.federated_broadcast(carry['threshold'])))
      return dict(carry, inner=step.run(carry['inner'], clipped, alpha))

    return iterative_steps.Pass(f'arc.{step.name}', run)

  def finish(self, carry):
    output = self._inner.finish(carry['inner'])
    measurements = iterative_steps.with_measurements(
        output.measurements, collections.OrderedDict([
            (THRESHOLD, carry['threshold']), (NUM_CLIPPED, carry['num_clipped'])]))
    return tff.templates.MeasuredProcessOutput(
        state=output.state, result=output.result,
        measurements=tff.federated_zip(measurements))


@traced.once
def _clipping_at_clients(value_type):
  """The client computations value → ‖value‖ and (value, threshold) → the value
  clipped to the threshold."""

  @tff.tensorflow.computation(value_type)
  def client_norm(value):
    return numerics.global_l2_norm(value)

  @tff.tensorflow.computation(value_type, tf.float64)
  def clip(value, threshold):
    return clip_to_norm(value, numerics.global_l2_norm(value), threshold)

  return client_norm, clip


@traced.once
def _kept_flag():
  """The client computation weight → 1.0 if it is > 0, else 0.0."""
  @tff.tensorflow.computation(tf.float32)
  def kept_flag(weight):
    return tf.cast(weight > 0, tf.float32)

  return kept_flag


@traced.once
def _threshold_at_server(num_byzantine: Optional[int], fraction: Optional[float]):
  """The server computation from the collected norms to (threshold, number of
  clients above it), for f clients assumed Byzantine (a number or a fraction)."""

  @tff.tensorflow.computation(_NORMS_TYPE)
  def threshold_at_server(collected):
    norms = tf.boolean_mask(collected.norms, collected.kept)
    n = tf.shape(norms)[0]
    f = gather.assumed_byzantine(num_byzantine, fraction, n)
    check = gather.assert_more_clients_than_assumed_byzantine(
        'AdaptiveRobustClippingFactory', n, f)
    with tf.control_dependencies([check]):
      threshold = clipping_threshold(norms, f)
    return threshold, tf.reduce_sum(tf.cast(norms > threshold, tf.int32))

  return threshold_at_server
