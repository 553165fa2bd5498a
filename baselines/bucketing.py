"""Bucketing (Karimireddy, He, Jaggi, "Byzantine-Robust Learning on Heterogeneous
Datasets via Bucketing", ICLR 2022, Algorithm 1) around a gathering baseline.

Each round the server shuffles the n client updates at random, averages them in
buckets of s consecutive updates, and hands the ⌈n/s⌉ bucket means to the robust
aggregator instead of the updates: heterogeneity between honest clients shrinks by
about √s, which is what lets coordinate-wise and distance-based rules tell honest
from corrupted updates on non-i.i.d. data.

It transforms the gathered matrix, so it wraps the gathering baselines only and is NOT
compatible with secure aggregation. (Done through sums only, each client would have to
send a whole model per bucket, its own in its bucket's slot and zeros elsewhere: ⌈n/s⌉
times FedAvg's communication.)
"""

import collections

import tensorflow as tf

from baselines import gather
from tff_robust.common import arguments


def bucket_order(num_clients, seed: int, round_num):
  """The round's random order of the gathered rows: a permutation of [0, n), a
  function of (seed, round) only, so a resumed run buckets as the original did."""
  keys = tf.random.stateless_uniform(
      [num_clients], seed=tf.stack([tf.constant(seed, tf.int64),
                                    tf.cast(round_num, tf.int64)]))
  return tf.argsort(keys, stable=True)


def bucket_means(values, weights, order, bucket_size: int):
  """Weighted means of the rows `values[order]` in consecutive groups of
  `bucket_size` (the last one may be smaller), and each bucket's total weight."""
  n = tf.shape(values)[0]
  num_buckets = (n + bucket_size - 1) // bucket_size
  bucket = tf.range(n) // bucket_size
  shuffled_weights = tf.cast(tf.gather(weights, order), values.dtype)
  totals = tf.math.unsorted_segment_sum(shuffled_weights, bucket, num_buckets)
  # Each row weighted by its share of its bucket's total: the sums are convex
  # combinations, so clients near float32's maximum with weights above 1 do not
  # overflow to an infinite bucket mean (w·x would).
  shares = tf.math.divide_no_nan(shuffled_weights, tf.gather(totals, bucket))

  def block_means(columns):
    return tf.math.unsorted_segment_sum(
        tf.gather(columns, order) * shares[:, tf.newaxis], bucket, num_buckets)

  # By column blocks: shuffled and weighted copies of the whole matrix would each be
  # its size.
  means = gather.by_column_blocks(block_means, values)
  return means, tf.cast(totals, weights.dtype)


class BucketingFactory(gather.GatheringAggregationFactory):
  """Bucket means of s shuffled client updates, then a gathering baseline on them.

  The created process's `next` has type signature
  `(<state, {value}@CLIENTS, {weight}@CLIENTS> -> <state, result=value@SERVER,
  measurements@SERVER>)`; the state is `<round=int64, inner=<the inner state>>`.
  The inner aggregator sees each bucket mean with the bucket's total weight.
  Measurements, in order: `num_clients` (clients, not buckets), the inner
  aggregator's own (computed on the buckets, e.g. Krum's `num_byzantine` counts
  buckets), `num_buckets`, and, behind the registry's non-finite filter,
  `num_nonfinite_clients`.

  NOT compatible with secure aggregation: every client's update reaches the server.
  """

  # The factories it wraps (checked by the constructor; `tasks.registry` reads it).
  wraps = gather.GatheringAggregationFactory

  def __init__(self, inner: gather.GatheringAggregationFactory, bucket_size: int = 2,
               seed: int = 0):
    """Initializes the factory.

    Args:
      inner: A gathering baseline (median, trimmed mean, Krum, centered clipping,
        the gathered geometric median).
      bucket_size: s >= 1, clients per bucket (1: the inner aggregator alone).
      seed: Seeds the per-round shuffles.

    Raises:
      TypeError: if `inner` is not a gathering baseline.
      TypeError: if `bucket_size` or `seed` is not an integer.
      ValueError: if `bucket_size` < 1.
    """
    if not isinstance(inner, self.wraps):
      raise TypeError(
          'bucketing wraps the gathering baselines (median, trimmed_mean, krum, '
          'multi_krum, centered_clipping, gathered_gm), which see the individual '
          f'updates; got {type(inner).__name__}. By name, bucketing+gm uses '
          'gathered_gm.')
    self._inner = inner
    self._bucket_size = arguments.check_positive_int('bucket_size', bucket_size)
    self._seed = arguments.check_int('seed', seed)

  inner = property(lambda self: self._inner, doc='The aggregator of the bucket means.')
  bucket_size = property(lambda self: self._bucket_size, doc='s, clients per bucket.')

  def _initial_state(self, dtype, size):
    return collections.OrderedDict(
        round=tf.constant(0, tf.int64),
        inner=self._inner._initial_state(dtype, size))  # pylint: disable=protected-access

  def _server_aggregate(self, values, weights, state):
    order = bucket_order(tf.shape(values)[0], self._seed, state['round'])
    means, totals = bucket_means(values, weights, order, self._bucket_size)
    result, inner_state, measurements = self._inner._server_aggregate(  # pylint: disable=protected-access
        means, totals, state['inner'])
    measurements = collections.OrderedDict(measurements)
    measurements['num_buckets'] = tf.shape(means)[0]
    new_state = collections.OrderedDict(round=state['round'] + 1, inner=inner_state)
    return result, new_state, measurements
