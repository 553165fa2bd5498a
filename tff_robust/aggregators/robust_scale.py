"""A robust, scale-equivariant typical distance of the clients, from one secure sum.

The smoothed Weiszfeld step of `tff_robust.GeometricMedianFactory` floors the
clients' distances to the broadcast estimate at ν = `relative_nu` × this scale of
those distances, so that ν follows the units of the updates and no client close to
the estimate weighs more than about α/ν. It is computed without revealing any single
client's distance.

Every client adds its weight α_i and α_i·log2(d_i) into the bucket ⌊log2 d_i⌋ of two
vectors of `NUM_BUCKETS` entries (one-hot, so their sum over clients is a weighted
histogram of log-distances); the server finds the bucket of the α-weighted lower
tercile (`QUANTILE` = 1/3: a third of the weight is closer) and returns the
α-weighted geometric mean of the distances in that bucket and its `WINDOW` neighbours
on each side (within a factor 2^WINDOW = 16 of the tercile). The tercile, not the
median, because far clients that inflate the scale can wreck a round and must then
hold more than two thirds of the weight (docs/decisions.md, "The robust scale is
taken around the lower tercile").

Properties (tested in `tests/tff_robust/aggregators/test_robust_scale.py` and
`tests/tff_robust/aggregators/test_gm_invariants.py`):

*   Robust: clients beyond the window (a 1e30 outlier, a free rider at 0, a client at
    1e-3 of the others' distance) do not move it, unless those closer hold at least
    a third of the weight or those farther more than two thirds; a client exactly at
    distance 0 (or non-finite) is not counted at all.
*   Scale-equivariant: multiplying every distance by c multiplies the scale by c
    exactly, as long as no client moves across the window's edge. The buckets are a
    fixed grid, so a client between 1/32 and 1/16 (or 16 and 32 times) of the
    tercile's bucket may enter or leave the window when everything is scaled by a c
    that is not a power of 2: the scale then moves by at most a factor
    2^(5·α_i/Σα).
*   Secure-aggregation compatible: one `tff.federated_sum` of a `[2, NUM_BUCKETS]`
    float64 array, no model value. It reveals the weighted histogram of the
    distances to the server (a client alone in its bucket reveals its α and its
    distance, at the zero start its norm), as the objective and Σβ reveal sums of
    them; it is not quantized for an integer secure sum nor noised by a DP inner mean.
*   Zero when no client is at a positive finite distance.

The buckets cover the distances of float32 models; those of a float64 model
(`float64=True`) span float64's exponents, so a 1e200 outlier among clients at 1e50
still lands in its own bucket.

The module also holds the trimmed start's half-weight radius: a histogram of the
clients' distances to the mean in quarter-octave buckets of d / D̄
(`client_radius_histogram`, `half_weight_bucket`, `bucket_upper_edge`).
"""

import numpy as np
import tensorflow as tf

from tff_robust.iterative import contributions

# Buckets ⌊log2 d⌋ in [LOWEST_EXPONENT, LOWEST_EXPONENT + NUM_BUCKETS); distances of
# float32 models lie in [2^-149, 2^150), outside it they go to the edge buckets.
LOWEST_EXPONENT = -160
NUM_BUCKETS = 320
# Those of float64 models: float64's exponents (subnormals included), and a margin
# for the norm of a model of up to 2^50 coordinates.
FLOAT64_LOWEST_EXPONENT = -1080
FLOAT64_NUM_BUCKETS = 2130
WINDOW = 4
# The fraction of the weight closer than the scale's bucket (why not the median:
# docs/decisions.md).
QUANTILE = 1.0 / 3.0


def buckets(float64: bool = False) -> tuple[int, int]:
  """(lowest exponent, number of buckets) for float32 or float64 models."""
  if float64:
    return FLOAT64_LOWEST_EXPONENT, FLOAT64_NUM_BUCKETS
  return LOWEST_EXPONENT, NUM_BUCKETS


def client_statistics(distance, weight, float64: bool = False,
                      count_zero: bool = False):
  """The client's `[2, num_buckets]` float64 contribution: α one-hot in the row 0,
  α·log2(d) one-hot in the row 1; zeros for non-finite d, and for d = 0 unless
  `count_zero`, which counts it as the smallest distance of the lowest bucket. For
  `[n]` distances and weights (clients gathered at a server): `[2, n, num_buckets]`.

  `count_zero` is for distances to an estimate: clients exactly at it (a majority
  client that the estimate has reached) then keep it there, as the geometric median
  does; distances to the zero update (a free rider's exact zero) are not counted."""
  lowest, num_buckets = buckets(float64)
  distance = tf.cast(distance, tf.float64)
  weight = tf.cast(weight, tf.float64)
  positive = tf.logical_and(distance > 0, tf.math.is_finite(distance))
  at_zero = tf.logical_and(tf.constant(count_zero), tf.equal(distance, 0.0))
  counted = tf.logical_or(positive, at_zero)
  # A zero distance is given the lowest bucket's exponent directly: no tiny constant
  # whose logarithm a runtime might compute differently.
  log_distance = tf.where(
      positive, tf.math.log(tf.where(positive, distance, tf.ones_like(distance))) /
      np.log(2.0), tf.where(at_zero, tf.constant(float(lowest), tf.float64),
                            tf.zeros_like(distance)))
  bucket = tf.clip_by_value(
      tf.cast(tf.floor(log_distance), tf.int32) - lowest, 0, num_buckets - 1)
  one_hot = tf.one_hot(bucket, num_buckets, dtype=tf.float64)
  one_hot = one_hot * tf.expand_dims(tf.where(counted, weight, 0.0), -1)
  return tf.stack([one_hot, one_hot * tf.expand_dims(log_distance, -1)])


def statistics_bound(float64: bool = False) -> contributions.Bound:
  """What an honest client's `client_statistics` can be: zeros, or α in one bucket b
  of row 0 and, in the same bucket of row 1, α·log2(d) with ⌊log2 d⌋ in bucket b (any
  log-distance in the edge buckets)."""
  lowest, num_buckets = buckets(float64)

  def admits(statistics, alpha, *context):
    statistics = tf.cast(statistics, tf.float64)
    counts, log_sums = statistics[0], statistics[1]
    alpha = tf.cast(alpha, tf.float64)
    counted = tf.not_equal(counts, 0)
    log_distance = tf.math.divide_no_nan(log_sums, alpha)
    edges = tf.cast(tf.range(num_buckets) + lowest, tf.float64)
    low = tf.where(tf.range(num_buckets) == 0, tf.constant(-np.inf, tf.float64), edges)
    high = tf.where(tf.range(num_buckets) == num_buckets - 1,
                    tf.constant(np.inf, tf.float64), edges + 1)
    # A margin for the rounding of α·log2(d) / α at a bucket's edge.
    in_bucket = tf.logical_and(log_distance >= low - 1e-6, log_distance < high + 1e-6)
    return tf.reduce_all([
        contributions.one_hot('alpha').admits(counts, alpha),
        tf.reduce_all(tf.math.is_finite(log_sums)),
        tf.reduce_all(tf.where(counted, in_bucket, tf.equal(log_sums, 0)))])

  return contributions.Bound('one-hot of α and α·log2 d in its bucket', admits)


def scale_from_statistics(statistics):
  """The α-weighted geometric mean of the distances within `WINDOW` buckets of the
  bucket of the α-weighted `QUANTILE` (float64), from the sum of `client_statistics`;
  0 if no client was counted."""
  counts, log_sums = statistics[0], statistics[1]
  cumulative = tf.cumsum(counts)
  total = cumulative[-1]
  quantile_bucket = tf.reduce_sum(tf.cast(cumulative < QUANTILE * total, tf.int32))
  in_window = tf.abs(tf.range(tf.shape(counts)[0]) - quantile_bucket) <= WINDOW
  window_weight = tf.reduce_sum(tf.where(in_window, counts, 0.0))
  window_log = tf.reduce_sum(tf.where(in_window, log_sums, 0.0))
  return tf.where(window_weight > 0,
                  tf.pow(tf.constant(2.0, tf.float64),
                         tf.math.divide_no_nan(window_log, window_weight)),
                  tf.constant(0.0, tf.float64))


def relative_floor(statistics, relative):
  """ν = `relative` × the robust scale; 1 when no client is at a positive distance
  (then every client coincides with the estimate and any ν gives the same step)."""
  scale = scale_from_statistics(statistics)
  return tf.where(scale > 0, relative * scale, tf.constant(1.0, tf.float64))


# The half-weight radius of the trimmed start (`tff_robust.GeometricMedianFactory`):
# buckets of a quarter of an octave of d / D̄, D̄ the α-weighted mean distance (a unit
# that scales and shifts with the clients, so the buckets do), over 2^±64. A client
# 2^(1/4) ≈ 1.19 times farther than the median distance is always left out.
BUCKETS_PER_OCTAVE = 4
# The restricted step after the trimmed mean keeps the clients up to this many
# buckets above the weighted median's (about twice the median distance).
NEAR_BUCKETS = 4
RADIUS_LOWEST_EXPONENT = -64
RADIUS_NUM_BUCKETS = BUCKETS_PER_OCTAVE * 128


def safe_unit(unit):
  """`unit` (float64), or 1 where it is 0 or not finite (every client at the mean,
  or distances beyond float64): the buckets then stay defined."""
  unit = tf.cast(unit, tf.float64)
  usable = tf.logical_and(unit > 0, tf.math.is_finite(unit))
  return tf.where(usable, unit, tf.ones_like(unit))


def radius_bucket(distance, unit):
  """The bucket ⌊4·log2(d / unit)⌋ + 256 of the half-weight radius's histogram,
  int32, clamped to [0, RADIUS_NUM_BUCKETS): d = 0 in bucket 0, a non-finite d one
  past the last bucket (never counted, never kept)."""
  distance = tf.cast(distance, tf.float64)
  finite = tf.math.is_finite(distance)
  ratio = tf.math.divide_no_nan(distance, safe_unit(unit))
  log_ratio = tf.where(tf.logical_and(finite, ratio > 0),
                       tf.math.log(ratio) / np.log(2.0),
                       tf.constant(float(RADIUS_LOWEST_EXPONENT), tf.float64))
  bucket = tf.clip_by_value(
      tf.cast(tf.floor(BUCKETS_PER_OCTAVE * (log_ratio - RADIUS_LOWEST_EXPONENT)),
              tf.int32), 0, RADIUS_NUM_BUCKETS - 1)
  return tf.where(finite, bucket, RADIUS_NUM_BUCKETS)


def client_radius_histogram(distance, unit, weight):
  """The client's `[RADIUS_NUM_BUCKETS]` float64 contribution: α one-hot in its
  `radius_bucket` (zeros for a non-finite d). For `[n]` distances and weights:
  `[n, RADIUS_NUM_BUCKETS]`."""
  return tf.one_hot(radius_bucket(distance, unit), RADIUS_NUM_BUCKETS,
                    dtype=tf.float64) * tf.expand_dims(tf.cast(weight, tf.float64), -1)


def half_weight_bucket(histogram):
  """The bucket holding the α-weighted median distance (int32), from the sum of
  `client_radius_histogram`: the clients in it or below hold at least half of the
  weight. The last bucket when no weight was counted."""
  cumulative = tf.cumsum(histogram)
  median = tf.reduce_sum(tf.cast(cumulative < 0.5 * cumulative[-1], tf.int32))
  return tf.minimum(median, RADIUS_NUM_BUCKETS - 1)


def bucket_upper_edge(bucket, unit):
  """unit · 2^((bucket + 1)/4 − 64): the distance below which a client is in
  `bucket` or a lower one (float64; reported as the trimmed start's radius)."""
  exponent = (tf.cast(bucket + 1, tf.float64) / BUCKETS_PER_OCTAVE +
              RADIUS_LOWEST_EXPONENT)
  return safe_unit(unit) * tf.pow(tf.constant(2.0, tf.float64), exponent)
