"""Building blocks of iterative secure aggregates: aggregates computed as a sequence of
weighted means, each through an inner `tff.aggregators` factory.

The geometric median and the γ-means share this shape: the server broadcasts a current
estimate, every client turns it into its own weight (and a few scalar statistics), and
one call of the inner weighted mean produces the next estimate. The server never sees a
single client's value: only the inner factory's aggregate and sums of client scalars.
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_robust import numerics

WEIGHT_TYPE = tff.TensorType(np.float32)


def default_inner_mean_factory() -> tff.aggregators.WeightedAggregationFactory:
  """A plain weighted mean that returns zeros, not NaN, when every weight is zero."""
  return tff.aggregators.MeanFactory(no_nan_division=True)


def check_inner_mean_factory(factory) -> tff.aggregators.WeightedAggregationFactory:
  if factory is None:
    return default_inner_mean_factory()
  if not isinstance(factory, tff.aggregators.WeightedAggregationFactory):
    raise TypeError(
        'inner_mean_factory must be a tff.aggregators.WeightedAggregationFactory '
        '(for example tff.aggregators.MeanFactory(value_sum_factory='
        f'tff.aggregators.SecureSumFactory(...))); got {type(factory).__name__}.'
    )
  return factory


def check_float_structure(value_type) -> None:
  """Raises a TypeError unless `value_type` is a structure of float tensors."""
  if not isinstance(value_type, (tff.TensorType, tff.StructType)):
    raise TypeError(
        f'Expected a tff.TensorType or tff.StructType value type, got {value_type!r}.'
    )
  if not tff.types.is_structure_of_floats(value_type):
    raise TypeError(
        'Robust aggregators need float values (model updates); got the value type '
        f'{value_type}. Cast integer tensors to float before aggregating.'
    )


def check_positive_int(name: str, value) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f'{name} must be an integer >= 1, got {value!r}.')
  return int(value)


def check_positive_float(name: str, value) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
    raise TypeError(f'{name} must be a number, got {value!r}.')
  if not np.isfinite(value) or value <= 0:
    raise ValueError(f'{name} must be a finite number > 0, got {value!r}.')
  return float(value)


def drop_nonfinite_clients(value_type, weight_type, value, weight):
  """Federated step zeroing non-finite client updates.

  Returns:
    `(value, weight, num_dropped)`: the cleaned values and float32 weights at CLIENTS,
    and the int32 number of dropped clients at SERVER.
  """

  @tff.tensorflow.computation(value_type, weight_type)
  def clean_weight(client_value, client_weight):
    return numerics.weight_if_finite(client_value, client_weight)

  @tff.tensorflow.computation(value_type, tf.int32)
  def clean_value(client_value, dropped):
    return numerics.zeros_if_dropped(client_value, dropped)

  # The finiteness scan runs once, in `clean_weight`; `clean_value` only reads its
  # verdict. Two maps rather than one returning a struct: selecting the value out of a
  # struct at CLIENTS would copy every client's update once more.
  weight_and_dropped = tff.federated_map(clean_weight, (value, weight))
  dropped = weight_and_dropped[1]
  return (tff.federated_map(clean_value, (value, dropped)),
          weight_and_dropped[0],
          tff.federated_sum(dropped))


@tff.tensorflow.computation(tf.float32, tf.float32)
def effective_weight(max_weight, weight_sum):
  return tf.math.divide_no_nan(max_weight, weight_sum)


def stack_at_server(server_scalars):
  """Stacks a Python list of SERVER scalars into one float32 vector at SERVER."""
  zipped = tff.federated_zip(collections.OrderedDict(
      (f'p{i}', s) for i, s in enumerate(server_scalars)))

  @tff.tensorflow.computation(zipped.type_signature.member)
  def stack(scalars):
    return tf.stack([tf.cast(s, tf.float32) for s in scalars.values()])

  return tff.federated_map(stack, zipped)


@tff.tensorflow.computation(tff.TensorType(np.float32, [None]))
def max_of_vector(vector):
  return tf.reduce_max(vector)


def tensor_types(value_type) -> list:
  """The `tff.TensorType` leaves of a value type, in the type's own element order."""
  if isinstance(value_type, tff.TensorType):
    return [value_type]
  leaves = []
  for _, element in tff.structure.iter_elements(value_type):
    leaves.extend(tensor_types(element))
  return leaves


def num_parameters(value_type) -> int:
  """p: the total number of scalars of a structure of fully defined tensors."""
  total = 0
  for leaf in tensor_types(value_type):
    if leaf.shape is None or any(d is None for d in leaf.shape):
      raise TypeError(f'Aggregators need fully defined shapes, got {value_type}.')
    total += int(np.prod(leaf.shape, dtype=np.int64))
  return total
