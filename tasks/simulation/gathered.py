"""The simulation's shortcut for the gathering baselines: their server step run on the
updates Python already holds, instead of gathering them again through TFF.

In the simulation every client update reaches Python (the attacks act on them) before
the aggregator runs. A gathering baseline (`baselines.gather.GatheringAggregationFactory`:
median, trimmed mean, Krum, centered clipping, the gathered GM, and bucketing or NNM
in front of them) would then have TFF's runtime take the n updates back, filter
them, flatten them and stack them at the server, and that runtime keeps every
intermediate until the call ends: about 8 copies of the `[n, p]` matrix (9.9 GB for
the median of 50 × 6.4M float32, whose matrix is 1.2 GB). Here the finite updates are
written once into one matrix, which TensorFlow reads in place, and the factory's own
`server_aggregate`, the TensorFlow ops its federated process runs after gathering,
runs on it in this process.

The process a user deploys is untouched; the shortcut is taken only for the registry's
form of a gathering aggregator (`tff_robust.NonfiniteFilteringFactory` around a
gathering factory), and it returns what that process returns: the same result, state
and measurements (`num_clients`, the factory's own, `num_nonfinite_clients`), as
tested in tests/tasks/simulation/test_gathered.py.
"""

import collections
import ctypes
import functools
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from baselines import gather
from tff_robust.aggregators import nonfinite
from tff_robust.common import numerics

# TensorFlow's `Allocator::kAllocatorAlignment`: a buffer it takes without a copy.
_ALIGNMENT = 64

Aggregate = Callable[[Any, Sequence[Sequence[np.ndarray]], Sequence[float]],
                     tff.templates.MeasuredProcessOutput]


def in_process_aggregation(factory: tff.aggregators.WeightedAggregationFactory,
                           value_type: tff.Type) -> Optional[Aggregate]:
  """`aggregate(state, updates, weights)` computing `factory.create(value_type,
  float32).next` on the updates in this process, or None when `factory` is not a
  non-finite filter around a gathering baseline.

  `updates` is a list of one value of `value_type` per client (numpy leaves, e.g. the
  simulation's list of arrays), `weights` one weight per client; the state is the
  process's (`initialize()`'s) and keeps its structure. The call empties `updates`
  (each client's update is dropped once copied into the server's matrix): pass a copy
  of the list to keep it.
  """
  if not (isinstance(factory, nonfinite.NonfiniteFilteringFactory) and
          isinstance(factory.inner, gather.GatheringAggregationFactory)):
    return None
  gathering = factory.inner
  dtype = gather.vector_dtype(value_type).as_numpy_dtype
  size = gather.num_parameters(value_type)
  shapes = [tuple(leaf.shape) for leaf in gather.leaf_types(value_type)]

  def server_step(values, weights, state):
    vector, new_state, measurements = gathering.server_aggregate(values, weights, state)
    return gather.unflatten(vector, value_type), new_state, measurements

  traced = []  # Traced on the first call, once: the state's shapes never change.

  def traced_step(values, weights, state):
    if not traced:
      state_spec = tf.nest.map_structure(
          lambda x: tf.TensorSpec(np.shape(x), np.asarray(x).dtype), state)
      traced.append(tf.function(server_step, autograph=False, input_signature=[
          tf.TensorSpec([None, size], dtype), tf.TensorSpec([None], tf.float32),
          state_spec]))
    return traced[0](values, weights, state)

  def aggregate(state, updates, weights):
    weights = np.asarray(weights, np.float32)
    finite = [numerics.is_usable_weight_value(w) and
              _all_finite(_leaves(update, shapes))
              for update, w in zip(updates, weights)]
    kept = [i for i, ok in enumerate(finite) if ok and weights[i] > 0]
    values = _stacked_releasing(updates, kept, shapes, size, dtype)
    result, new_state, measurements = traced_step(values, weights[kept], state)
    measurements = collections.OrderedDict(
        (name, value.numpy()) for name, value in measurements.items())
    measurements[nonfinite.MEASUREMENT] = np.int32(finite.count(False))
    return tff.templates.MeasuredProcessOutput(
        state=tf.nest.pack_sequence_as(
            state, [np.asarray(t) for t in tf.nest.flatten(new_state)]),
        result=tf.nest.map_structure(np.asarray, result),
        measurements=measurements)

  return aggregate


def _leaves(update, shapes) -> list[np.ndarray]:
  """The update's leaves as arrays, checked against the value type's shapes (the
  federated process would refuse a value of another type)."""
  leaves = [np.asarray(leaf) for leaf in gather.leaf_values(update)]
  if [leaf.shape for leaf in leaves] != shapes:
    raise TypeError(f'A client update has leaves of shapes '
                    f'{[leaf.shape for leaf in leaves]}; the aggregator was created '
                    f'for {shapes}.')
  return leaves


def _all_finite(leaves) -> bool:
  return all(np.isfinite(leaf).all() for leaf in leaves)


def _stacked_releasing(updates: list, rows: Sequence[int], shapes, size: int,
                       dtype) -> tf.Tensor:
  """The `[len(rows), size]` matrix of the flattened updates `updates[i]`, i in `rows`,
  as a tensor: written row by row into one buffer that TensorFlow then uses in place
  (DLPack). Converting a numpy matrix would take two more copies of it (measured:
  2.4 GB for 1.2 GB).

  `updates` is emptied as its rows are copied: a caller that holds no other reference
  to them (the simulation loop) never holds the updates and the matrix at once.
  """
  values = _aligned_empty([len(rows), size], dtype)
  for row, i in zip(values, rows):
    offset = 0
    for leaf in _leaves(updates[i], shapes):
      row[offset:offset + leaf.size] = leaf.reshape(-1)
      offset += leaf.size
    updates[i] = None
    _return_freed_memory()
  updates.clear()
  return tf.experimental.dlpack.from_dlpack(values.__dlpack__())


def _return_freed_memory() -> None:
  """Hands the memory of freed updates back to the system at once where the C library
  can (glibc's `malloc_trim`). Without it the matrix and the updates it replaces are
  resident together: glibc serves arrays below its dynamic mmap threshold (raised to
  ~32 MB by the first freed one) from its heap and keeps what they free."""
  trim = _glibc_malloc_trim()
  if trim is not None:
    trim(0)


@functools.cache
def _glibc_malloc_trim():
  try:
    return ctypes.CDLL('libc.so.6').malloc_trim
  except (OSError, AttributeError):  # Not glibc (macOS, musl): nothing to trim.
    return None


def _aligned_empty(shape, dtype) -> np.ndarray:
  """An uninitialized array whose data TensorFlow accepts without a copy: TensorFlow
  requires `Allocator::kAllocatorAlignment` (64-byte) aligned buffers, numpy gives 16."""
  dtype = np.dtype(dtype)
  num_bytes = int(np.prod(shape)) * dtype.itemsize
  raw = np.empty(num_bytes + _ALIGNMENT, np.uint8)
  offset = -raw.ctypes.data % _ALIGNMENT
  return raw[offset:offset + num_bytes].view(dtype).reshape(shape)

