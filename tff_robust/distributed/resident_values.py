"""A round's per-client values kept on the workers, and the calls that refer to them.

  ResidentValue   a CLIENTS-placed value held on the workers, one contiguous shard
                  of the clients on each (values of the workers' TFF executors,
                  referred to by id, as TFF's executor service allows), until released
  WorkerInvoker   one worker's calls: as its TFF context makes them, except that an
                  argument holding shards of `ResidentValue`s refers to them there and
                  chosen results can be left there

Trusts a worker to keep its executor's values until disposed; a worker that was away
lost them, so a call on them raises `WorkerError` instead of being rerun. Why: an
aggregation of K passes then sends each client's update once, not K times.
"""

import asyncio
import collections
import contextlib

import tensorflow_federated as tff
import tree
from tff_robust.common import tff_private
from tff_robust.common.tff_private import cardinalities_utils
from tff_robust.common.tff_private import cardinality_carrying_base
from tff_robust.common.tff_private import structure
from tff_robust.common.tff_private import tensorflow_computation
from tff_robust.common.tff_private import type_conversions

from tff_robust.distributed import worker_connection


class _Piece(cardinality_carrying_base.CardinalityCarrying):
  """One worker's shard of a `ResidentValue`: a value on that worker's executor for
  the shard's cardinalities."""

  def __init__(self, worker: 'worker_connection.WorkerContext', remote, size: int):
    self.worker, self.remote, self.size = worker, remote, size

  @property
  def cardinality(self):
    return {tff.CLIENTS: self.size}


class ResidentValue(cardinality_carrying_base.CardinalityCarrying):
  """A CLIENTS-placed value held on the workers: each worker keeps its contiguous
  shard of the clients (the shards `DistributedContext` splits every call's
  arguments into) until `release()`.

  Pass it where a computation run by the same `DistributedContext` takes that value
  (e.g. a pass computation's clients' updates): each worker's call then refers to
  its shard instead of receiving it. Made by `DistributedContext.keep_on_workers` and
  `DistributedContext.invoke_keeping`; valid until released, the context closes, or a
  call on the same workers fails (TFF then resets the workers' executors).
  """

  def __init__(self, type_spec, pieces: list[_Piece]):
    self.type_signature = type_spec
    self._pieces = pieces
    self._starts = [sum(p.size for p in pieces[:i]) for i in range(len(pieces))]

  @property
  def cardinality(self):
    return {tff.CLIENTS: sum(p.size for p in self._check_held())}

  def _check_held(self) -> list[_Piece]:
    if self._pieces is None:
      raise ValueError('This ResidentValue was released: its values left the workers.')
    return self._pieces

  def __getitem__(self, index: slice) -> _Piece:
    """The shard of clients `index.start` to `index.stop` (as a call's arguments are
    split: the same contiguous shards)."""
    pieces = self._check_held()
    for start, piece in zip(self._starts, pieces):
      if (index.start or 0, index.stop) == (start, start + piece.size):
        return piece
    raise ValueError(f'Clients {index.start}:{index.stop} are not one worker\'s shard '
                     f'of this ResidentValue (shards of {[p.size for p in pieces]}).')

  def release(self) -> None:
    """Frees the shards on the workers (at once; a worker that is away is skipped)."""
    if self._pieces is None:
      return
    executors = [tff_private.executor_of(p.remote) for p in self._pieces]
    # TFF disposes a remote value when its last reference goes, in batches: drop
    # ours, then send the executors' pending batches now.
    self._pieces = None
    for executor in executors:
      # A shard of updates can be large: not kept until 20 await disposal.
      tff_private.flush_disposals(executor)

  def __enter__(self) -> 'ResidentValue':
    return self

  def __exit__(self, *exc_info):
    self.release()


def _holds_pieces(value) -> bool:
  if isinstance(value, _Piece):
    return True
  if isinstance(value, structure.Struct):
    return any(_holds_pieces(v) for _, v in structure.iter_elements(value))
  if isinstance(value, (list, tuple)):
    return any(_holds_pieces(v) for v in value)
  if isinstance(value, dict):
    return any(_holds_pieces(v) for v in value.values())
  return False


def _to_python(value):
  return structure.to_odict_or_tuple(value) if isinstance(
      value, structure.Struct) else None


class WorkerInvoker:
  """Invokes computations on one worker as its `AsyncExecutionContext` does, except
  that an argument holding shards of `ResidentValue`s refers to them on the worker
  (TFF's context would serialize every argument again)."""

  def __init__(self, worker: worker_connection.WorkerContext, compiler):
    self._worker, self._compiler = worker, compiler

  async def invoke(self, comp, arg):
    if not _holds_pieces(arg):
      return await self._worker.context.invoke(comp, arg)
    return await self._run(comp, arg, keep=())

  async def create(self, value, type_spec) -> _Piece:
    """`value` (a shard of a CLIENTS-placed value of `type_spec`) on this worker."""
    size = len(value)
    with self._executor({tff.CLIENTS: size}) as executor:
      remote = await executor.create_value(_normalized(value), type_spec)
    return _Piece(self._worker, remote, size)

  async def run_keeping(self, comp, arg, keep):
    """`comp(arg)`, its elements named in `keep` left here as this worker's shards
    of them (`_run`)."""
    return await self._run(comp, arg, keep)

  @contextlib.contextmanager
  def _executor(self, cardinalities):
    """The worker's executor for `cardinalities` (TFF's: created once, cached); reset
    on failure as TFF's context does. A worker that was away raises `WorkerError`:
    what it held for the round is gone, so the call is not retried."""
    factory = self._worker.executor_factory
    try:
      yield factory.create_executor(dict(cardinalities))
    except tff.framework.RetryableError as e:
      factory.clean_up_executor(dict(cardinalities))
      raise worker_connection.WorkerError(
          self._worker.address, 'was unreachable during the round; the values it '
          f'held for the round are gone ({e}).') from e
    except Exception:
      factory.clean_up_executor(dict(cardinalities))
      raise

  async def _run(self, comp, arg, keep):
    """`comp(arg)` on this worker. With `keep` (names of elements of the result, a
    struct), returns (the other elements computed, by name; the kept elements as
    `_Piece`s of this worker's shard, by name), else the result."""
    result_type = comp.type_signature.result
    compiled = self._compiler.compile(comp)
    parameter = compiled.type_signature.parameter
    cardinalities = (cardinalities_utils.infer_cardinalities(arg, parameter)
                     if arg is not None else {})
    with self._executor(cardinalities) as executor:
      ingested = (await self._ingest(executor, arg, parameter)
                  if arg is not None else None)
      function = await executor.create_value(compiled, compiled.type_signature)
      call = await executor.create_call(function, ingested)
      if not keep:
        value = await call.compute()
        return tensorflow_computation.transform_result(
            type_conversions.type_to_py_container(value, result_type))
      names = structure.name_list(compiled.type_signature.result)
      computed, kept = collections.OrderedDict(), collections.OrderedDict()
      for index, name in enumerate(names):
        selection = await executor.create_selection(call, index)
        if name in keep:
          kept[name] = _Piece(self._worker, selection,
                              cardinalities.get(tff.CLIENTS, 0))
        else:
          computed[name] = tensorflow_computation.transform_result(
              type_conversions.type_to_py_container(await selection.compute(),
                                                    result_type[name]))
      return computed, kept

  async def _ingest(self, executor, value, type_spec):
    if isinstance(value, _Piece):
      if (value.worker is not self._worker
          or tff_private.executor_of(value.remote) is not executor):
        raise ValueError('A ResidentValue\'s shard was passed to another worker or '
                         'after the worker\'s executor was reset.')
      return value.remote
    if not _holds_pieces(value):
      return await executor.create_value(_normalized(value), type_spec)
    elements = structure.iter_elements(structure.from_container(value))
    names = [name for name, _ in structure.iter_elements(type_spec)]
    refs = await asyncio.gather(*(
        self._ingest(executor, element, element_type)
        for (_, element), (_, element_type) in zip(
            elements, structure.iter_elements(type_spec))))
    return await executor.create_struct(structure.Struct(list(zip(names, refs))))


def _normalized(value):
  """An argument as TFF's context serializes it (Structs as Python containers,
  tensors as numpy)."""
  return tensorflow_computation.transform_args(tree.traverse(_to_python, value))

