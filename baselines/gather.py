"""Gathering every client's update at the server: the shared machinery of the
non-private baselines (coordinate-wise median, trimmed mean, Krum, centered clipping).

NOT compatible with secure aggregation: the server receives each client's update in
the clear (one `tff.federated_aggregate` whose accumulator holds the clients'
flattened updates, each stored once: O(n·p) memory, see `gathering_steps`). Use it for
baselines only, never in a deployment that promises privacy.

A model update of any structure is handled as one vector: the concatenation of its
flattened tensors (`flatten` / `unflatten`). The server then sees a matrix of shape
`[num_clients, num_parameters]`.
"""

import abc
import collections
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_robust.common import arguments
from tff_robust.iterative import iterative_mean
from tff_robust.common import numerics
from tff_robust.common import traced
from tff_robust.common import weighted_or_unweighted


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


# Rows the gathering accumulator holds without copying them (see `gathering_steps`);
# later clients still arrive, through a matrix that grows by one copy per client
# (rounds of more clients than this are quadratic in the excess).
LINEAR_CAPACITY = 128


def _row_type(dtype):
  # One client's flattened update, or an empty slot (shape [0]).
  return tff.TensorType(dtype.as_numpy_dtype, [None])


def _accumulator_type(dtype, size, capacity):
  return tff.StructType([
      ('slots', tff.StructType([(None, _row_type(dtype))] * capacity)),
      ('overflow', tff.TensorType(dtype.as_numpy_dtype, [None, size])),
      ('weights', tff.TensorType(np.float32, [None])),
      ('kept', tff.TensorType(np.bool_, [None])),
  ])


def _filled_rows(accumulator, size):
  """The accumulated rows as one `[m, size]` matrix, oldest first (one copy)."""
  pieces = [accumulator.overflow]
  pieces.extend(tf.reshape(slot, [-1, size]) for slot in accumulator.slots)
  return tf.concat(pieces, axis=0)


def _slot(row):
  # Any length (the slot type), without a copy: PlaceholderWithDefault forwards its
  # input.
  return tf.raw_ops.PlaceholderWithDefault(input=row, shape=[None])


def _empty_slots(dtype, capacity):
  return tuple(_slot(tf.zeros([0], dtype)) for _ in range(capacity))


def _append(vector, element):
  return tf.concat([vector, element[tf.newaxis]], axis=0)


def gather_at_server(value_type, weight_type, value, weight,
                     capacity: Optional[int] = None):
  """Federated step: every client's flattened update and weight, at SERVER.

  Returns, at SERVER, an `OrderedDict` with `values` (`[n, p]`, in an arbitrary but
  fixed client order) and `weights` (`[n]` float32) of the clients of weight > 0:
  a client of weight 0 has nothing to say (no examples, or dropped by
  `tff_robust.NonfiniteFilteringFactory` for a non-finite update) and is left out.
  Memory and time are O(n·p) for up to `capacity` clients, quadratic in the clients
  beyond (`gathering_steps`).
  """
  to_row, zero, accumulate, merge, report = gathering_steps(
      value_type, weight_type, capacity)
  rows = tff.federated_map(to_row, (value, weight))
  return tff.federated_aggregate(rows, zero(), accumulate, merge, report)


def gathering_steps(value_type, weight_type, capacity: Optional[int] = None):
  """The TensorFlow computations of `gather_at_server`: `(to_row, zero, accumulate,
  merge, report)`.

  TFF's runtime keeps every intermediate accumulator of a `federated_aggregate` alive
  until the aggregate is reported, so an accumulator that is a growing matrix costs
  O(n²·p) (OOM at 23 GB for the EMNIST ConvNet and 50 clients). Here the accumulator
  is a queue of `capacity` (default `LINEAR_CAPACITY`) row slots, empty slots of shape
  [0]: accumulating shifts every slot by one and puts the new row last. Shifting only
  passes tensors through, so TensorFlow shares their buffers rather than copying them,
  and every row is stored once; the report stacks the rows once. A row pushed out of
  the queue (beyond `capacity` clients) moves to a matrix that grows by concatenation,
  one copy of it per further client: memory is quadratic again in the m = n −
  `capacity` overflow rows, O(n·p + m²·p). `merge` (not called by TFF's local runtime;
  a composing runtime calls it once per worker) stacks both sides, one copy of each.

  Raises:
    TypeError: if `capacity` is not an integer.
    ValueError: if `capacity` < 1.
  """
  capacity = arguments.check_positive_int(
      'capacity', LINEAR_CAPACITY if capacity is None else capacity)
  return _gathering_steps(value_type, weight_type, capacity)


@traced.once
def _gathering_steps(value_type, weight_type, capacity: int):
  """`gathering_steps` for a capacity already checked."""
  dtype = vector_dtype(value_type)
  size = num_parameters(value_type)
  accumulator_type = _accumulator_type(dtype, size, capacity)

  @tff.tensorflow.computation(value_type, weight_type)
  def to_row(client_value, client_weight):
    weight = tf.cast(client_weight, tf.float32)
    return flatten(client_value, dtype), weight, weight > 0

  @tff.tensorflow.computation
  def zero():
    return collections.OrderedDict(
        slots=_empty_slots(dtype, capacity),
        overflow=tf.zeros([0, size], dtype),
        weights=tf.zeros([0], tf.float32),
        kept=tf.zeros([0], tf.bool))

  row_type = to_row.type_signature.result

  @tff.tensorflow.computation(accumulator_type, row_type)
  def accumulate(accumulator, row):
    slots = tuple(accumulator.slots)
    # The oldest slot leaves the queue; it is empty unless more than `capacity`
    # clients arrived.
    overflow = tf.concat([accumulator.overflow, tf.reshape(slots[0], [-1, size])],
                         axis=0)
    return collections.OrderedDict(
        slots=slots[1:] + (_slot(row[0]),),
        overflow=overflow,
        weights=_append(accumulator.weights, row[1]),
        kept=_append(accumulator.kept, row[2]))

  @tff.tensorflow.computation(accumulator_type, accumulator_type)
  def merge(a, b):
    # Not called by TFF's local runtime (it accumulates client by client); the
    # composing runtimes call it once per worker.
    return collections.OrderedDict(
        slots=_empty_slots(dtype, capacity),
        overflow=tf.concat([_filled_rows(a, size), _filled_rows(b, size)], axis=0),
        weights=tf.concat([a.weights, b.weights], axis=0),
        kept=tf.concat([a.kept, b.kept], axis=0))

  @tff.tensorflow.computation(accumulator_type)
  def report(accumulator):
    kept = accumulator.kept
    rows = _filled_rows(accumulator, size)
    # Masking copies the matrix: only when some client is left out.
    values = tf.cond(tf.reduce_all(kept), lambda: rows,
                     lambda: tf.boolean_mask(rows, kept))
    return collections.OrderedDict(
        values=values, weights=tf.boolean_mask(accumulator.weights, kept))

  return to_row, zero, accumulate, merge, report


class GatheringAggregationFactory(weighted_or_unweighted.WeightedOrUnweightedFactory):
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

  def server_aggregate(self, values, weights, state):
    """What the created process computes once the updates are gathered, as
    TensorFlow ops: `values` (`[n, p]`, the flattened updates of the clients of
    weight > 0, all finite), `weights` (`[n]` float32) and the state (a nest) →
    `(aggregate vector, new state, measurements)`, the measurements those of the
    created process (`num_clients`, then the subclass's). A simulation that already
    holds every update in one place can call it without gathering them again."""
    vector, new_state, extra = self._server_aggregate(values, weights, state)
    measurements = collections.OrderedDict(num_clients=tf.shape(values)[0])
    measurements.update(extra)
    return vector, new_state, measurements

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
      vector, new_state, measurements = self.server_aggregate(
          gathered.values, gathered.weights, numerics.as_nest(state))
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


# Columns per block of `by_column_blocks`: sorting an [n, p] matrix along the clients
# takes a transposed copy, sorted values and int32 indices (~3 copies of the matrix);
# by blocks, only ~3·n·COLUMN_BLOCK values at a time.
COLUMN_BLOCK = 1 << 18


def by_column_blocks(column_fn, values, block: int = COLUMN_BLOCK) -> tf.Tensor:
  """`column_fn` (an `[n, b]` block of columns → a `[b]` vector or a `[k, b]` matrix)
  over the columns of `values` block after block, concatenated along the columns: the
  memory of a block, not of the matrix.

  Blocks run one after another (each waits for the previous result): run in parallel,
  their temporary copies would add up to the whole matrix's.
  """
  size = values.shape[1]
  if size is None:
    raise ValueError('by_column_blocks needs a static number of columns.')
  results = []
  for start in range(0, size, block):
    with tf.control_dependencies(results[-1:]):
      results.append(column_fn(values[:, start:start + block]))
  if not results:
    return column_fn(values)
  return results[0] if len(results) == 1 else tf.concat(results, axis=-1)


def weighted_average_rows(values, weights, rows=None) -> tf.Tensor:
  """Σ w_i x_i / Σ w_i over the rows of `values` (`rows`, indices in the order summed,
  if given; else all), in values' dtype; zeros if the weights sum to zero.

  Accumulated in float64: with example counts as weights, Σ w_i x_i of a float32 client
  near 3e38 overflows float32 although the average does not.
  """
  if rows is not None:
    weights = tf.gather(weights, rows)
  weights = tf.cast(weights, tf.float64)
  total = tf.reduce_sum(weights)

  def column_average(block):
    if rows is not None:
      # Per block: the chosen rows are never copied whole.
      block = tf.gather(block, rows)
    return tf.cast(tf.math.divide_no_nan(tf.linalg.matvec(
        tf.cast(block, tf.float64), weights, transpose_a=True), total), values.dtype)

  # By column blocks: a float64 copy of the whole matrix would be twice its size.
  return by_column_blocks(column_average, values)


def check_assumed_byzantine(wrapper: str, num_byzantine, byzantine_fraction):
  """(f, ρ) of a wrapper told exactly one of f and ρ ∈ [0, 0.5), validated.

  Raises:
    TypeError: if f is not an integer or ρ not a number.
    ValueError: if neither or both are given, or one is out of range.
  """
  if (num_byzantine is None) == (byzantine_fraction is None):
    raise ValueError(
        f'Give {wrapper} exactly one of num_byzantine (f) and byzantine_fraction (f = '
        f'floor(fraction * n)); got num_byzantine={num_byzantine!r}, '
        f'byzantine_fraction={byzantine_fraction!r}.')
  return (arguments.check_optional_nonnegative_int('num_byzantine', num_byzantine),
          None if byzantine_fraction is None else arguments.check_number_in(
              'byzantine_fraction', byzantine_fraction, 0, 0.5, high_inclusive=False))


def check_more_clients_than_assumed_byzantine(factory: str, num_clients: int,
                                               num_byzantine: Optional[int]) -> None:
  """Raises a ValueError if a round of `num_clients` clients (of weight > 0) breaks
  n > f, the condition of NNM and ARC; with f = ⌊ρ·n⌋, ρ < 0.5, it always holds."""
  if num_byzantine is not None and 0 < num_clients <= num_byzantine:
    raise ValueError(
        f'{factory}: needs more clients of weight > 0 than num_byzantine (n > f), got '
        f'n = {num_clients} with f = {num_byzantine}; lower num_byzantine (or give '
        'byzantine_fraction) or sample more clients.')


def assumed_byzantine(num_byzantine: Optional[int], fraction: Optional[float],
                      n: tf.Tensor) -> tf.Tensor:
  """f (int32) in a round of `n` clients: `num_byzantine`, or ⌊ρ·n⌋ for ρ =
  `fraction` (as `check_assumed_byzantine` returned them)."""
  if num_byzantine is not None:
    return tf.constant(num_byzantine, tf.int32)
  return tf.cast(tf.floor(fraction * tf.cast(n, tf.float64)), tf.int32)


def assert_more_clients_than_assumed_byzantine(factory: str, n: tf.Tensor,
                                               f: tf.Tensor) -> tf.Operation:
  """The in-graph form of `check_more_clients_than_assumed_byzantine` (n > f, or no
  client at all), for a runtime that did not call that check first."""
  return tf.debugging.Assert(
      tf.logical_or(tf.equal(n, 0), n > f),
      [f'{factory}: needs more clients of weight > 0 than num_byzantine (n > f); lower '
       'num_byzantine or sample more clients. [n, f] =', n, f])
