"""Coordinate-wise median and trimmed mean (Yin et al. 2018, ref. [88] of the RFA paper).

Both gather every client's update at the server (`baselines.gather`): NOT compatible
with secure aggregation.
"""

import collections

import tensorflow as tf

from baselines import gather
from tff_robust.common import arguments


def _sorted_rows(values):
  # Sorting each coordinate across clients is the whole cost: O(n log n) per coordinate.
  return tf.sort(values, axis=0)


def _row64(matrix, i):
  return tf.cast(tf.gather(matrix, i), tf.float64)


class CoordinateWiseMedianFactory(gather.GatheringAggregationFactory):
  """Coordinate-wise median of the client updates.

  For every scalar parameter j the result is the median over the n clients (of weight > 0) of
  x_ij (for even n the mean of the two middle values, as `numpy.median`). Weights are
  ignored (an unweighted median, as in Yin et al. 2018 and the RFA paper's baseline);
  they are accepted so that the factory plugs into weighted builders such as
  `tff.learning.algorithms.build_weighted_fed_avg`.

  NOT compatible with secure aggregation: every client's update reaches the server.

  The created process's `next` has type signature
  `(<state=<>@SERVER, {value}@CLIENTS, {weight}@CLIENTS> ->
    <state=<>@SERVER, result=value@SERVER, measurements@SERVER>)`, with measurements
  *   `num_clients`: clients used (weight > 0; wrap the factory in
      `tff_robust.NonfiniteFilteringFactory`, as `tasks.registry` does, to give a
      client with a NaN or an infinity weight 0);
  With no client of weight > 0 the result is zero.
  """

  def _server_aggregate(self, values, weights, state):
    del weights
    n = tf.shape(values)[0]

    def median_of(columns):
      ordered = _sorted_rows(columns)
      return tf.cond(
          n > 0,
          # In float64: the two middle values may both be near the float32 maximum.
          lambda: tf.cast(
              0.5 * (_row64(ordered, (n - 1) // 2) + _row64(ordered, n // 2)),
              values.dtype),
          lambda: tf.zeros(tf.shape(columns)[1:], values.dtype))

    return gather.by_column_blocks(median_of, values), state, collections.OrderedDict()


class TrimmedMeanFactory(gather.GatheringAggregationFactory):
  """Coordinate-wise trimmed mean of the client updates.

  For every scalar parameter j, the k = ⌊β·n⌋ largest and the k smallest of the n
  clients' values are removed and the remaining n − 2k are averaged (β =
  `trim_fraction`, per tail). β < 0.5 guarantees n − 2k ≥ 1. Weights are ignored (the
  trimmed mean of Yin et al. 2018 is unweighted); they are accepted so that the factory
  plugs into weighted builders.

  NOT compatible with secure aggregation: every client's update reaches the server.

  The created process's `next` has type signature
  `(<state=<>@SERVER, {value}@CLIENTS, {weight}@CLIENTS> ->
    <state=<>@SERVER, result=value@SERVER, measurements@SERVER>)`, with measurements
  *   `num_clients`: clients used (weight > 0; wrap the factory in
      `tff_robust.NonfiniteFilteringFactory`, as `tasks.registry` does, to give a
      client with a NaN or an infinity weight 0);
  *   `num_trimmed_per_tail`: k.
  With no client of weight > 0 the result is zero.
  """

  def __init__(self, trim_fraction: float = 0.1):
    """Initializes the factory.

    Args:
      trim_fraction: β in [0, 0.5), the fraction of clients removed at each tail of
        every coordinate.

    Raises:
      TypeError: if `trim_fraction` is not a number.
      ValueError: if `trim_fraction` is not in [0, 0.5).
    """
    self._trim_fraction = arguments.check_number_in(
        'trim_fraction', trim_fraction, 0, 0.5, high_inclusive=False)

  def _server_aggregate(self, values, weights, state):
    del weights
    n = tf.shape(values)[0]
    # floor(β n) computed in float64: β·n is exact enough for any realistic n.
    k = tf.cast(tf.floor(self._trim_fraction * tf.cast(n, tf.float64)), tf.int32)

    def trimmed_mean_of(columns):
      kept = _sorted_rows(columns)[k:n - k]
      # Summed in float64: kept values near the float32 maximum must not overflow.
      mean = tf.math.divide_no_nan(
          tf.reduce_sum(tf.cast(kept, tf.float64), axis=0),
          tf.cast(n - 2 * k, tf.float64))
      return tf.cast(mean, values.dtype)

    return (gather.by_column_blocks(trimmed_mean_of, values), state,
            collections.OrderedDict(num_trimmed_per_tail=k))
