"""TensorFlow helpers shared by the aggregators: norms and finiteness over structures.

Every function here runs inside a `tff.tensorflow.computation` on one client or on the
server, and treats a model update as one vector: the concatenation of all its tensors.
"""

import tensorflow as tf
import tensorflow_federated as tff


def as_nest(structure):
  """`structure` with TFF's `Struct` (used for unnamed-container types) as Python
  containers, so that `tf.nest` can walk it."""
  if isinstance(structure, tff.structure.Struct):
    return tff.structure.to_odict_or_tuple(structure)
  return structure


def global_l2_norm(structure):
  """Euclidean norm (float64) of all tensors of `structure` taken as one vector.

  Squares are summed in the tensors' own dtype (no float64 copy of a model of millions
  of parameters, which would cost more than the norm) and across tensors in float64.
  Only if that overflows, e.g. for an attacker's 1e30-sized update, is the norm
  recomputed on the tensors scaled by their largest entry.
  """
  tensors = tf.nest.flatten(as_nest(structure))
  if not tensors:
    return tf.constant(0.0, tf.float64)

  def sum_of_squares(scale):
    return tf.add_n([
        tf.cast(tf.reduce_sum(tf.square(t / tf.cast(scale, t.dtype))), tf.float64)
        for t in tensors])

  direct = tf.sqrt(sum_of_squares(tf.constant(1.0, tf.float64)))

  def rescaled():
    largest = tf.reduce_max(tf.stack([
        tf.cast(tf.reduce_max(tf.abs(t)), tf.float64) for t in tensors]))
    return largest * tf.sqrt(sum_of_squares(largest))

  # A NaN stays NaN (callers drop such clients); only an overflow is recomputed.
  return tf.cond(tf.math.is_inf(direct), rescaled, lambda: direct)


def is_all_finite(structure):
  """True iff no tensor of `structure` holds a NaN or an infinity."""
  checks = [tf.reduce_all(tf.math.is_finite(t)) for t in tf.nest.flatten(as_nest(structure))]
  return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def subtract(a, b):
  return tf.nest.map_structure(tf.subtract, as_nest(a), as_nest(b))


def scale(structure, factor):
  return tf.nest.map_structure(
      lambda t: t * tf.cast(factor, t.dtype), as_nest(structure))


def is_finite_update(value, weight):
  """True iff the client's update and its weight are all finite."""
  return is_all_finite(value) & tf.math.is_finite(tf.cast(weight, tf.float32))


def zeros_if_nonfinite(value, weight):
  """The update itself if finite, else zeros: inner mean factories multiply value by
  weight, and 0 * NaN is still NaN.

  `tf.cond` hands a finite update through without copying it, which matters for
  models of millions of parameters.
  """
  value = as_nest(value)
  return tf.cond(
      is_finite_update(value, weight),
      lambda: tf.nest.map_structure(tf.identity, value),
      lambda: tf.nest.map_structure(tf.zeros_like, value))


def weight_if_finite(value, weight):
  """`(weight, dropped)`: float32 weight, zeroed for a non-finite client, and an int32
  1 for such a client, to be summed."""
  finite = is_finite_update(value, weight)
  return (tf.where(finite, tf.cast(weight, tf.float32), 0.0),
          tf.cast(tf.logical_not(finite), tf.int32))
