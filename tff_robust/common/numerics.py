"""TensorFlow helpers shared by the aggregators: norms and finiteness over structures.

Every function here runs inside a `tff.tensorflow.computation` on one client or on the
server, and treats a model update as one vector: the concatenation of all its tensors.
"""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

# float32's smallest normal number: TensorFlow's CPU kernels flush smaller results
# (and factors) to zero.
FLOAT32_TINY = float(np.finfo(np.float32).tiny)
# Below this norm the float32 squares were below FLOAT32_TINY: flushed to zero or
# denormal, so the directly summed norm is 0 or imprecise and is recomputed rescaled.
_SMALLEST_DIRECT_NORM = float(np.sqrt(FLOAT32_TINY)) * 1e3


def as_nest(structure):
  """`structure` with TFF's `Struct` (used for unnamed-container types) as Python
  containers, so that `tf.nest` can walk it."""
  if isinstance(structure, tff.structure.Struct):
    return tff.structure.to_odict_or_tuple(structure)
  return structure


def scaled(structure, scale):
  """Every tensor of `structure` times the float64 scalar `scale`, in the tensor's own
  dtype; in float64 when `scale` is below `FLOAT32_TINY`, where a float32 factor would
  be flushed to zero and zero the value instead of shrinking it (a client at 3e38
  clipped to norm 1, a weight of 1e-40)."""
  structure = as_nest(structure)

  def in_float64():
    return tf.nest.map_structure(
        lambda t: tf.cast(tf.cast(t, tf.float64) * scale, t.dtype), structure)

  def in_own_dtype():
    return tf.nest.map_structure(lambda t: t * tf.cast(scale, t.dtype), structure)

  return tf.cond(scale < FLOAT32_TINY, in_float64, in_own_dtype)


def global_l2_norm(structure):
  """Euclidean norm (float64) of all tensors of `structure` taken as one vector.

  Squares are summed in the tensors' own dtype (a float64 copy of a model of millions
  of parameters would cost more than the norm) and across tensors in float64. Only if
  that overflows, e.g. for an attacker's 1e30-sized update, is the norm recomputed on
  the tensors scaled by their largest entry; likewise when it underflows (every
  entry below about 1e-16, whose float32 squares are flushed to zero). A NaN stays NaN.
  """
  tensors = tf.nest.flatten(as_nest(structure))
  direct = _sqrt_of_sum([tf.reduce_sum(tf.square(t)) for t in tensors])
  return tf.cond(_out_of_range(direct), lambda: _rescaled_norm(tensors),
                 lambda: direct)


def global_l2_distance(a, b):
  """‖a − b‖ over whole structures, as `global_l2_norm(a − b)` but without
  materialising a − b and its square separately: one temporary per tensor, not three,
  which is most of the cost of a Weiszfeld pass on a large model."""
  pairs = list(zip(tf.nest.flatten(as_nest(a)), tf.nest.flatten(as_nest(b))))
  direct = _sqrt_of_sum(
      [tf.reduce_sum(tf.math.squared_difference(x, y)) for x, y in pairs])
  return tf.cond(_out_of_range(direct),
                 lambda: _rescaled_norm([x - y for x, y in pairs]),
                 lambda: direct)


def _out_of_range(direct_norm):
  """Whether a norm from summed squares overflowed, or may have underflowed."""
  return tf.logical_or(tf.math.is_inf(direct_norm),
                       direct_norm < _SMALLEST_DIRECT_NORM)


def _sqrt_of_sum(partial_sums):
  if not partial_sums:
    return tf.constant(0.0, tf.float64)
  return tf.sqrt(tf.add_n([tf.cast(p, tf.float64) for p in partial_sums]))


def _rescaled_norm(tensors):
  largest = tf.reduce_max(tf.stack(
      [tf.cast(tf.reduce_max(tf.abs(t)), tf.float64) for t in tensors]))

  in_own_dtype = _sqrt_of_sum([tf.reduce_sum(tf.square(tf.math.divide_no_nan(
      t, tf.cast(largest, t.dtype)))) for t in tensors])
  # A denormal float32 largest entry is flushed to zero by TensorFlow's kernels.
  in_float64 = _sqrt_of_sum([tf.reduce_sum(tf.square(tf.math.divide_no_nan(
      tf.cast(t, tf.float64), largest))) for t in tensors])
  # Both are computed and one is kept: this runs only for an overflowed norm or one
  # below ~1e-16 (zero included), and a `tf.cond` nested in the caller's would trace
  # two more branch graphs per norm.
  return largest * tf.where(largest < FLOAT32_TINY, in_float64, in_own_dtype)


def is_all_finite(structure):
  """True iff no tensor of `structure` holds a NaN or an infinity."""
  checks = [tf.reduce_all(tf.math.is_finite(t)) for t in tf.nest.flatten(as_nest(structure))]
  return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def scale(structure, factor):
  return tf.nest.map_structure(
      lambda t: t * tf.cast(factor, t.dtype), as_nest(structure))


# The bit patterns of an exact zero (either sign) of the weight dtypes, read from the
# bits: TensorFlow's CPU kernels treat a subnormal input as zero, so `w == 0` cannot
# tell a subnormal weight from a zero one.
_MAGNITUDE_MASKS = {tf.float16: (tf.int16, 0x7fff), tf.bfloat16: (tf.int16, 0x7fff),
                    tf.float32: (tf.int32, 0x7fffffff),
                    tf.float64: (tf.int64, 0x7fffffffffffffff)}


def is_usable_weight(weight):
  """The client-weight rule of every aggregator: True iff `weight` is 0 (a client with
  nothing to say, kept and ignored) or finite and at least `FLOAT32_TINY`. A negative,
  non-finite or subnormal weight (also one below `FLOAT32_TINY` in float64, which
  float32 would flush) is not a client's example count: the client is dropped.
  Integer weights: True iff ≥ 0."""
  weight = tf.convert_to_tensor(weight)
  if weight.dtype.is_integer:
    return weight >= 0
  int_dtype, mask = _MAGNITUDE_MASKS[weight.dtype]
  magnitude_bits = tf.bitwise.bitwise_and(tf.bitcast(weight, int_dtype),
                                          tf.constant(mask, int_dtype))
  as_float64 = tf.cast(weight, tf.float64)
  return tf.logical_or(
      tf.equal(magnitude_bits, 0),
      tf.logical_and(tf.math.is_finite(as_float64), as_float64 >= FLOAT32_TINY))


def is_usable_weight_value(weight) -> bool:
  """`is_usable_weight` for one weight in numpy (the simulation's in-process paths):
  0, or finite and ≥ `FLOAT32_TINY`; integers ≥ 0."""
  weight = np.asarray(weight)
  if np.issubdtype(weight.dtype, np.integer):
    return bool(weight >= 0)
  weight = weight.astype(np.float64)
  return bool(weight == 0 or (np.isfinite(weight) and weight >= FLOAT32_TINY))


def is_usable_update(value, weight):
  """True iff the client's update is all finite and its weight usable
  (`is_usable_weight`)."""
  return is_all_finite(value) & is_usable_weight(weight)


def zeros_if_dropped(value, dropped):
  """The update itself, or zeros for a dropped client: inner mean factories multiply
  value by weight, and 0 * NaN is still NaN.

  `tf.cond` hands a kept update through without copying it, which matters for models
  of millions of parameters.
  """
  value = as_nest(value)
  return tf.cond(
      dropped > 0,
      lambda: tf.nest.map_structure(tf.zeros_like, value),
      lambda: tf.nest.map_structure(tf.identity, value))


def weight_if_usable(value, weight):
  """`(weight, dropped)`: float32 weight, zeroed for a client dropped by
  `is_usable_update` (a non-finite update; a negative, subnormal or non-finite
  weight), and an int32 1 for such a client, to be summed."""
  usable = is_usable_update(value, weight)
  return (tf.where(usable, tf.cast(weight, tf.float32), 0.0),
          tf.cast(tf.logical_not(usable), tf.int32))
