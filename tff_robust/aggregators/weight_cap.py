"""A robust cap on the clients' weights, from one secure sum: truncation of α_i at a
multiple of a quantile of the clients' α (in the spirit of Portnoy, Tirosh and Hendler,
"Towards Federated Learning With Byzantine-Robust Client Weighting").

The weights α_i of a weighted aggregate are the clients' own example counts (TFF's
`NUM_EXAMPLES` weighting, the RFA paper's α_i), so a corrupted device reports any
weight it likes; one client claiming the total weight of the others owns the weighted
mean, the geometric median and the γ-mean alike. A quantile of the clients' weights,
each client counted once, moves only when a fraction of the clients beyond
1 − quantile (above) or quantile (below) lies about it: the median moves only with
half of the clients. Capping every α at `multiple` times that quantile bounds what
each corrupted client weighs by `multiple` times an honest median client.

The quantile is read from a histogram of the clients' weights: every client adds a
one-hot int32 vector, 1 in the bucket of its α, on a fixed grid of `BUCKETS_PER_OCTAVE`
buckets per factor 2 over float32's normal numbers (`bucket_edges`). The cap is
`multiple` times the upper edge of the bucket holding the quantile, so it lies within a
factor 2^(1/BUCKETS_PER_OCTAVE) ≈ 1.09 above `multiple` × the exact quantile, and no
client at or below `multiple` × the quantile is capped.
"""

import collections
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_robust.common import arguments
from tff_robust.iterative import contributions
from tff_robust.iterative import iterative_mean
from tff_robust.iterative import iterative_steps

BUCKETS_PER_OCTAVE = 8
# Edges from float32's smallest normal number (2^-126) to 2^128: every finite positive
# float32 weight lies in a bucket; float64 weights beyond go to the edge buckets.
_LOWEST_OCTAVE, _HIGHEST_OCTAVE = -126, 128
DEFAULT_QUANTILE = 0.5
DEFAULT_MULTIPLE = 2.0
CAP_MEASUREMENT = 'weight_cap'
NUM_CAPPED_MEASUREMENT = 'num_capped_clients'


def bucket_edges() -> np.ndarray:
  """The histogram's bucket edges (float64, increasing): 2^(k / BUCKETS_PER_OCTAVE).
  Bucket b holds the weights in [edges[b − 1], edges[b]); bucket 0 those below the
  first edge, the last bucket those at or above the last one."""
  exponents = np.arange(_LOWEST_OCTAVE * BUCKETS_PER_OCTAVE,
                        _HIGHEST_OCTAVE * BUCKETS_PER_OCTAVE + 1)
  return np.exp2(exponents / BUCKETS_PER_OCTAVE)


NUM_BUCKETS = len(bucket_edges()) + 1


def client_histogram(weight):
  """One client's `[NUM_BUCKETS]` int32 contribution: 1 in the bucket of its weight
  α > 0; zeros for α = 0 (a client with nothing to say, or one the non-finite filter
  dropped)."""
  weight = tf.cast(weight, tf.float64)
  bucket = tf.searchsorted(tf.constant(bucket_edges()), weight[tf.newaxis],
                           side='right')[0]
  return tf.one_hot(bucket, NUM_BUCKETS, dtype=tf.int32) * tf.cast(weight > 0, tf.int32)


def cap_from_histogram(histogram, quantile: float, multiple: float):
  """The cap (float64): `multiple` × the upper edge of the bucket holding the
  `quantile` of the counted clients (the first bucket whose cumulative count reaches
  `quantile` × their number); 0 when no client was counted."""
  edges = tf.constant(np.append(bucket_edges(), np.inf))
  cumulative = tf.cumsum(tf.cast(histogram, tf.float64))
  total = cumulative[-1]
  bucket = tf.reduce_sum(tf.cast(cumulative < quantile * total, tf.int32))
  return tf.where(total > 0, multiple * edges[bucket], tf.constant(0.0, tf.float64))


class WeightCappingFactory(iterative_steps.IterativeAggregationFactory):
  """Caps every client's weight at `multiple` × the `quantile` of the clients'
  weights, then aggregates with `inner`.

  The created process's `next` has type signature
  `(<state, {value}@CLIENTS, {weight}@CLIENTS> -> <state, result=value@SERVER,
  measurements@SERVER>)` with the inner process's state and result. It runs one pass
  before the inner aggregate's: the clients' one-hot weight histograms are summed
  (`client_histogram`) and the server computes the cap (`cap_from_histogram`), which
  is broadcast; in every pass of `inner` each client then weighs min(α_i, cap). An
  `iterative_steps.IterativeAggregationFactory` inner keeps its passes (so
  `tff_robust.distributed.passwise.PasswiseFactory` runs the whole one pass per
  computation); any other inner factory is one pass after the histogram's.

  Measurements: the inner process's named measurements (kept flat; a non-named one
  under `inner`) plus
  *   `weight_cap`: the cap (float32; 0 when no client has weight > 0);
  *   `num_capped_clients`: the clients whose weight was above the cap (int32).

  Privacy: one `tff.federated_sum` of the `[NUM_BUCKETS]` int32 one-hot histograms and
  one of the 0/1 capped flags, beside the inner factory's own aggregations; no model
  value. The sum reveals the histogram of the clients' weights on the bucket grid (a
  client alone in its bucket reveals its α to within a factor 1.09), as the inner
  mean's weight sum reveals their total. Secure-aggregation compatible when `inner`
  is (`secure_compatible`).

  A weight should reach this factory finite and non-negative (inside
  `tff_robust.NonfiniteFilteringFactory`, as the learning builders and the registry
  put it).
  """

  def __init__(self, inner: tff.aggregators.WeightedAggregationFactory, *,
               quantile: float = DEFAULT_QUANTILE,
               multiple: float = DEFAULT_MULTIPLE):
    """Args:
      inner: the weighted factory the capped weights go to.
      quantile: in (0, 1): which quantile of the clients' weights (each client
        counted once) the cap is a multiple of; the default median moves only when
        half of the clients lie.
      multiple: ≥ 1: the cap over that quantile, i.e. the most a client weighs
        relative to the quantile's client.

    Raises:
      TypeError: if `inner` is not a weighted factory or a number is not a number.
      ValueError: if `quantile` is outside (0, 1) or `multiple` below 1 or not
        finite.
    """
    if not isinstance(inner, tff.aggregators.WeightedAggregationFactory):
      raise TypeError('WeightCappingFactory wraps a tff.aggregators.'
                      f'WeightedAggregationFactory, got {type(inner).__name__}.')
    self._inner = inner
    self._quantile = arguments.check_number_in('quantile', quantile, 0.0, 1.0,
                                               high_inclusive=False)
    if self._quantile == 0.0:
      raise ValueError('quantile must be in (0, 1) (the 0-quantile is the smallest '
                       f'weight, which one client sets), got {quantile!r}.')
    self._multiple = arguments.check_finite_float('multiple', multiple)
    if self._multiple < 1.0:
      raise ValueError(f'multiple must be at least 1 (a cap below the quantile caps '
                       f'honest clients at the quantile), got {multiple!r}.')

  @property
  def inner(self) -> tff.aggregators.WeightedAggregationFactory:
    return self._inner

  @property
  def quantile(self) -> float:
    return self._quantile

  @property
  def multiple(self) -> float:
    return self._multiple

  @property
  def secure_compatible(self) -> bool:
    """As the inner factory declares: the cap adds only sums of client vectors of
    counts and flags."""
    return bool(getattr(self._inner, 'secure_compatible', False))

  def steps(self, value_type) -> iterative_steps.IterativeSteps:
    iterative_mean.check_float_structure(value_type)
    return _CappedSteps(iterative_steps.steps_of(self._inner, value_type),
                        self._quantile, self._multiple)


@tff.tensorflow.computation(tf.float32, tf.float64)
def _capped(weight, cap):
  return tf.cast(tf.minimum(tf.cast(weight, tf.float64), cap), tf.float32)


@tff.tensorflow.computation(tf.float32, tf.float64)
def _is_capped(weight, cap):
  return tf.cast(tf.cast(weight, tf.float64) > cap, tf.int32)


@tff.tensorflow.computation(tf.float32)
def _histogram(weight):
  return client_histogram(weight)


class _CappedSteps(iterative_steps.WrappedSteps):
  """The histogram pass, then `inner`'s passes with every α capped."""

  def __init__(self, inner: iterative_steps.IterativeSteps, quantile: float,
               multiple: float):
    super().__init__(inner)

    @tff.tensorflow.computation(tff.TensorType(np.int32, [NUM_BUCKETS]))
    def cap(histogram):
      return cap_from_histogram(histogram, quantile, multiple)

    self._cap = cap

  def passes(self):
    inner_passes = list(self._inner.passes())
    if not inner_passes:
      raise ValueError('The inner aggregate has no pass.')
    return [iterative_steps.Pass('weight_cap', self._cap_pass)] + [
        self._with_capped_weights(step, counting=index == 0)
        for index, step in enumerate(inner_passes)]

  def _cap_pass(self, carry, value, alpha):
    del value
    # An honest client's histogram row is one-hot of 1, its flag 0 or 1.
    histogram = contributions.sum_of('weight_histogram', tff.federated_map(
        _histogram, alpha), alpha, contributions.one_hot('one'))
    return dict(carry, cap=tff.federated_map(self._cap, histogram))

  def _with_capped_weights(self, step, counting: bool):
    def run(carry, value, alpha):
      cap_at_clients = tff.federated_broadcast(carry['cap'])
      capped = tff.federated_map(_capped, (alpha, cap_at_clients))
      carry = dict(carry, inner=step.run(carry['inner'], value, capped))
      if counting:
        # Independent of the inner pass's aggregations: the same round.
        carry['num_capped'] = contributions.sum_of(
            'num_capped', tff.federated_map(_is_capped, (alpha, cap_at_clients)),
            alpha, contributions.FLAG)
      return carry

    # The first pass also counts: its own computation pass by pass.
    return iterative_steps.Pass(f'{"counted" if counting else "capped"}.{step.name}',
                                run)

  def finish(self, carry):
    output = self._inner.finish(carry['inner'])
    cap = tff.federated_map(_as_float32, carry['cap'])
    measurements = iterative_steps.with_measurements(output.measurements, collections.OrderedDict([
        (CAP_MEASUREMENT, cap), (NUM_CAPPED_MEASUREMENT, carry['num_capped'])]))
    return tff.templates.MeasuredProcessOutput(
        state=output.state, result=output.result,
        measurements=tff.federated_zip(measurements))


@tff.tensorflow.computation(tf.float64)
def _as_float32(value):
  return tf.cast(value, tf.float32)
