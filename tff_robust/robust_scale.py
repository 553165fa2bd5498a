"""A robust, scale-equivariant typical distance of the clients, from one secure sum.

The smoothed Weiszfeld step needs a floor ν on the distances of the clients to the
current estimate. An absolute ν (the paper's 1e-6) depends on the units of the updates,
and a client closer than the others' distance divided by the number of clients
(a free rider's zero update at the zero start) takes almost all the weight. A ν
relative to the clients' typical distance is neither: this module computes that
typical distance without revealing any single client's distance.

Every client adds its weight α_i and α_i·log2(d_i) into the bucket ⌊log2 d_i⌋ of two
vectors of `NUM_BUCKETS` entries (one-hot, so their sum over clients is a weighted
histogram of log-distances); the server finds the bucket of the α-weighted median and
returns the α-weighted geometric mean of the distances in that bucket and its
`WINDOW` neighbours on each side (within a factor 2^WINDOW = 16 of the median).

Properties (tested in `tests/tff_robust/test_robust_scale.py`):

*   Robust: clients beyond the window (a 1e30 outlier, a free rider at 0, a client at
    1e-3 of the others' distance) do not move it; a client exactly at distance 0 (or
    non-finite) is not counted at all.
*   Scale-equivariant: multiplying every distance by c multiplies the scale by c
    exactly, as long as no client moves across the window's edge (the window spans
    a factor of 2^9 = 512 around the median, so only clients far from the median do).
*   Secure: one `tff.federated_sum` of two `[NUM_BUCKETS]` float64 vectors.
*   Zero when no client is at a positive finite distance.
"""

import numpy as np
import tensorflow as tf

# Buckets ⌊log2 d⌋ in [LOWEST_EXPONENT, LOWEST_EXPONENT + NUM_BUCKETS); distances of
# float32 models lie in [2^-149, 2^150), outside it they go to the edge buckets.
LOWEST_EXPONENT = -160
NUM_BUCKETS = 320
WINDOW = 4


def client_statistics(distance, weight):
  """The client's `[2, NUM_BUCKETS]` float64 contribution: α one-hot in the row 0,
  α·log2(d) one-hot in the row 1; zeros for d = 0 or non-finite d."""
  distance = tf.cast(distance, tf.float64)
  weight = tf.cast(weight, tf.float64)
  counted = tf.logical_and(distance > 0, tf.math.is_finite(distance))
  log_distance = tf.where(counted, tf.math.log(distance) / np.log(2.0), 0.0)
  bucket = tf.clip_by_value(
      tf.cast(tf.floor(log_distance), tf.int32) - LOWEST_EXPONENT, 0, NUM_BUCKETS - 1)
  one_hot = tf.one_hot(bucket, NUM_BUCKETS, dtype=tf.float64)
  one_hot = one_hot * tf.where(counted, weight, 0.0)
  return tf.stack([one_hot, one_hot * log_distance])


def scale_from_statistics(statistics):
  """The α-weighted geometric mean of the distances within `WINDOW` buckets of the
  α-weighted median's bucket (float64), from the sum of `client_statistics`; 0 if
  no client was counted."""
  counts, log_sums = statistics[0], statistics[1]
  cumulative = tf.cumsum(counts)
  total = cumulative[-1]
  median_bucket = tf.reduce_sum(tf.cast(cumulative < 0.5 * total, tf.int32))
  in_window = tf.abs(tf.range(NUM_BUCKETS) - median_bucket) <= WINDOW
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
