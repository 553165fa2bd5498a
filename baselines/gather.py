"""Gathering every client's update at the server: the shared machinery of the
non-private baselines (coordinate-wise median, trimmed mean, Krum, centered clipping).

NOT compatible with secure aggregation: the server receives each client's update in
the clear (one `tff.federated_aggregate` whose accumulator concatenates the clients'
flattened updates). Use it for baselines only, never in a deployment that promises
privacy.

A model update of any structure is handled as one vector: the concatenation of its
flattened tensors (`flatten` / `unflatten`). The server then sees a matrix of shape
`[num_clients, num_parameters]`.
"""

import abc
import collections
import math
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_robust import iterative_mean
from tff_robust import numerics
from tff_robust import unit_weights


leaf_types = iterative_mean.tensor_types
num_parameters = iterative_mean.num_parameters


def vector_dtype(value_type) -> tf.DType:
  """float64 if any leaf is float64 (no precision lost), float32 otherwise."""
  dtypes = {np.dtype(leaf.dtype) for leaf in leaf_types(value_type)}
  return tf.float64 if np.dtype(np.float64) in dtypes else tf.float32


def leaf_values(structure) -> list:
  """The tensors of `structure` in the order of its TFF type (`tf.nest` would sort
  the keys of an `OrderedDict`, TFF keeps them in order)."""
  if tf.is_tensor(structure) or isinstance(structure, (np.ndarray, np.number)):
    return [structure]
  return tff.structure.flatten(tff.structure.from_container(structure, recursive=True))


def flatten(structure, dtype) -> tf.Tensor:
  """One vector (of `dtype`) holding every tensor of `structure`, in type order."""
  leaves = leaf_values(structure)
  if not leaves:
    return tf.zeros([0], dtype)
  return tf.concat([tf.reshape(tf.cast(t, dtype), [-1]) for t in leaves], axis=0)


def unflatten(vector: tf.Tensor, value_type) -> Any:
  """Inverse of `flatten`: the structure of `value_type` (Python containers)."""
  leaves = leaf_types(value_type)
  sizes = [int(np.prod(leaf.shape, dtype=np.int64)) for leaf in leaves]
  pieces = tf.split(vector, sizes) if leaves else []
  tensors = [
      tf.cast(tf.reshape(piece, leaf.shape), leaf.dtype)
      for piece, leaf in zip(pieces, leaves)
  ]
  return pack(value_type, iter(tensors))


def pack(value_type, tensors):
  """The structure of `value_type` (Python containers) filled from an iterator."""
  if isinstance(value_type, tff.TensorType):
    return next(tensors)
  elements = [(name, pack(element, tensors))
              for name, element in tff.structure.iter_elements(value_type)]
  return tff.types.type_to_py_container(tff.structure.Struct(elements), value_type)


def _gathered_type(dtype, size):
  return tff.StructType([
      ('values', tff.TensorType(dtype.as_numpy_dtype, [None, size])),
      ('weights', tff.TensorType(np.float32, [None])),
      ('kept', tff.TensorType(np.bool_, [None])),
  ])


def gather_at_server(value_type, weight_type, value, weight):
  """Federated step: every client's flattened update and weight, at SERVER.

  Returns, at SERVER, an `OrderedDict` with `values` (`[n, p]`, in an arbitrary but
  fixed client order) and `weights` (`[n]` float32) of the clients of weight > 0:
  a client of weight 0 has nothing to say (no examples, or dropped by
  `tff_robust.NonfiniteFilteringFactory` for a non-finite update) and is left out.
  """
  dtype = vector_dtype(value_type)
  size = num_parameters(value_type)
  accumulator_type = _gathered_type(dtype, size)

  @tff.tensorflow.computation(value_type, weight_type)
  def to_row(client_value, client_weight):
    weight = tf.cast(client_weight, tf.float32)
    return flatten(client_value, dtype), weight, weight > 0

  @tff.tensorflow.computation
  def zero():
    return collections.OrderedDict(
        values=tf.zeros([0, size], dtype),
        weights=tf.zeros([0], tf.float32),
        kept=tf.zeros([0], tf.bool))

  row_type = to_row.type_signature.result

  @tff.tensorflow.computation(accumulator_type, row_type)
  def accumulate(accumulator, row):
    return collections.OrderedDict(
        values=tf.concat([accumulator.values, row[0][tf.newaxis]], axis=0),
        weights=tf.concat([accumulator.weights, row[1][tf.newaxis]], axis=0),
        kept=tf.concat([accumulator.kept, row[2][tf.newaxis]], axis=0))

  @tff.tensorflow.computation(accumulator_type, accumulator_type)
  def merge(a, b):
    return collections.OrderedDict(
        values=tf.concat([a.values, b.values], axis=0),
        weights=tf.concat([a.weights, b.weights], axis=0),
        kept=tf.concat([a.kept, b.kept], axis=0))

  @tff.tensorflow.computation(accumulator_type)
  def report(accumulator):
    kept = accumulator.kept
    return collections.OrderedDict(
        values=tf.boolean_mask(accumulator.values, kept),
        weights=tf.boolean_mask(accumulator.weights, kept))

  rows = tff.federated_map(to_row, (value, weight))
  return tff.federated_aggregate(rows, zero(), accumulate, merge, report)


class GatheringAggregationFactory(unit_weights.WeightedOrUnweightedFactory):
  """Base class of the baselines computed at the server from all client updates.

  NOT compatible with secure aggregation: every client's update reaches the server.

  Subclasses implement `_server_aggregate(values, weights, state)`, a TensorFlow
  function of the `[n, p]` matrix of finite client updates and their `[n]` weights
  returning `(aggregate_vector, new_state, extra_measurements)`.
  """

  # Every client update reaches the server in the clear.
  secure_compatible = False

  def _initial_state(self, dtype, size):
    """The server state (TensorFlow values); `()` for stateless aggregators."""
    del dtype, size
    return ()

  @abc.abstractmethod
  def _server_aggregate(self, values, weights, state):
    raise NotImplementedError

  def create_weighted(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    iterative_mean.check_float_structure(value_type)
    dtype = vector_dtype(value_type)
    size = num_parameters(value_type)

    @tff.tensorflow.computation
    def initial_state():
      return self._initial_state(dtype, size)

    state_type = initial_state.type_signature.result
    gathered_type = tff.StructType([
        ('values', tff.TensorType(dtype.as_numpy_dtype, [None, size])),
        ('weights', tff.TensorType(np.float32, [None])),
    ])

    @tff.tensorflow.computation(state_type, gathered_type)
    def server_step(state, gathered):
      values, weights = gathered.values, gathered.weights
      vector, new_state, extra = self._server_aggregate(
          values, weights, numerics.as_nest(state))
      measurements = collections.OrderedDict(num_clients=tf.shape(values)[0])
      measurements.update(extra)
      return unflatten(vector, value_type), new_state, measurements

    @tff.federated_computation()
    def init_fn():
      return tff.federated_eval(initial_state, tff.SERVER)

    @tff.federated_computation(
        init_fn.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      gathered = gather_at_server(value_type, weight_type, value, weight)
      output = tff.federated_map(server_step, (state, gathered))
      return tff.templates.MeasuredProcessOutput(
          state=output[1], result=output[0], measurements=output[2])

    return tff.templates.AggregationProcess(init_fn, next_fn)


def check_fraction(name: str, value, upper: float, upper_inclusive: bool) -> float:
  """Validates a fraction in [0, upper) (or [0, upper])."""
  if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
    raise TypeError(f'{name} must be a number, got {value!r}.')
  ok = 0 <= value <= upper if upper_inclusive else 0 <= value < upper
  if not ok or not math.isfinite(value):
    bracket = ']' if upper_inclusive else ')'
    raise ValueError(f'{name} must be in [0, {upper}{bracket}, got {value!r}.')
  return float(value)


def weighted_average_rows(values, weights) -> tf.Tensor:
  """Σ w_i x_i / Σ w_i (values' dtype), zeros if the weights sum to zero.

  Accumulated in float64: with example counts as weights, Σ w_i x_i of a float32 client
  near 3e38 overflows float32 although the average does not.
  """
  weights = tf.cast(weights, tf.float64)
  total = tf.reduce_sum(weights)
  average = tf.math.divide_no_nan(
      tf.linalg.matvec(tf.cast(values, tf.float64), weights, transpose_a=True), total)
  return tf.cast(average, values.dtype)


def optional_int(name: str, value) -> Optional[int]:
  if value is None:
    return None
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
    raise ValueError(f'{name} must be an integer >= 0, got {value!r}.')
  return int(value)
