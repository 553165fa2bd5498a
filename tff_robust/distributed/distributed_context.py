"""Runs TFF computations with their clients spread over several `worker_binary`s.

  DistributedContext      a synchronous TFF context over the workers at given addresses
  distributed_execution   that context installed for a block

TFF 0.87 has no builder for a context on workers you started yourself; this one is
assembled from public `tff.framework` pieces, per worker (`worker_connection`):

  grpc channel (message limits raised: model-sized values)
    → `worker_connection._FailFastStub` (in place of TFF's `RemoteExecutorGrpcStub`,
      which retries a down worker forever: deadlines, probes, `WorkerError`)
    → `tff.framework.RemoteExecutor` (one per cardinality, CLIENTS 0 when absent)
      inside `tff.framework.ResourceManagingExecutorFactory`
    → `tff.framework.AsyncExecutionContext` (the native compiler; TF frontend
      argument and result transforms)

and TFF's mergeable execution (`tff.backends.native.
create_mergeable_comp_execution_context`'s compiler and steps) run here: the
CLIENTS-placed arguments of a call split into one contiguous shard per worker, the
computation run up to its aggregation on every worker at once, the partial aggregates
merged with the aggregation's own `merge` in worker order, the rest finished,
per-client results returned in client order.

  process = tff_robust.build_robust_federated_aggregation_process(model_fn, opt)
  with tff_robust.distributed.LocalWorkers(2) as workers:        # or your own hosts
    with tff_robust.distributed.distributed_execution(workers.addresses):
      output = process.next(state, client_data)                  # unchanged code

The mergeable form holds one round of aggregation per computation: a computation
whose aggregations depend on one another (RFA, the γ-mean, secure centered clipping)
runs as its registered pass-by-pass equivalent (`passwise.register_equivalent`; the
`next` of every learning process tff_robust builds), and a round's per-client values
cross to the workers once (`keep_on_workers`, `invoke_keeping`: `resident_values`).
Trusts the workers with the clients' values and, without `merge_context`, the first
worker with every worker's partial sums. docs/distributed.md: deployment and costs.
"""

import asyncio
import collections
import contextlib
import math
import time
from typing import Optional, Sequence

import tensorflow_federated as tff
# The compiler TFF's own local C++ context is built with; TFF 0.87 exports no public
# name for it.
from tff_robust.common import tff_private
from tff_robust.common.tff_private import native_compiler
# The pieces of TFF's mergeable context (splitting arguments into shards, its compiler,
# re-assembling results), run here in client order (see `DistributedContext.invoke`).
from tff_robust.common.tff_private import async_utils
from tff_robust.common.tff_private import structure
from tff_robust.common.tff_private import mergeable_comp_compiler
from tff_robust.common.tff_private import compiler_pipeline
from tff_robust.common.tff_private import tensorflow_tree_transformations
from tff_robust.common.tff_private import building_blocks
from tff_robust.common.tff_private import transformations
from tff_robust.common.tff_private import tree_analysis
from tff_robust.common.tff_private import cardinalities_utils
from tff_robust.common.tff_private import type_analysis
from tff_robust.common.tff_private import type_conversions

from tff_robust.common import arguments
from tff_robust.distributed import passwise
from tff_robust.distributed import resident_values
from tff_robust.distributed import worker_addresses
from tff_robust.distributed import worker_connection
from tff_robust.distributed import worker_credentials


class DistributedContext(tff.framework.SyncContext):
  """A synchronous TFF context that spreads clients over worker_binary processes.

  `invoke` compiles a computation to TFF's mergeable form and runs it with the
  CLIENTS-placed arguments split into `len(addresses)` contiguous shards, one per
  worker, as `tff.backends.native.create_mergeable_comp_execution_context` does, but
  with per-client results in client order and partial aggregates merged in worker
  order (TFF's: in the order the workers finish). A computation whose aggregations
  depend on one another is refused by TFF's compiler ("Detected one aggregate
  dependent on another") unless it has a registered pass-by-pass equivalent
  (`tff_robust.distributed.passwise.register_equivalent`; the `next` of every
  learning process tff_robust builds), which then runs instead.

  A worker that cannot be reached, or answers no probe (stopped), for
  `unavailable_timeout` seconds makes `invoke` raise `WorkerError` naming it, within
  `unavailable_timeout` (unreachable) or `PROBE_INTERVAL + unavailable_timeout`
  (stopped, `worker_connection.PROBE_INTERVAL`) seconds; a call that outlasts
  `call_timeout` on a worker that still answers raises it too. `close()` frees this
  program's state on the workers and closes the channels (it does not stop the
  workers).

  With `credentials` every channel is mutual TLS; without them, every worker must be
  on this machine (a loopback address).
  """

  def __init__(self, addresses, *, credentials=None,
               max_message_bytes: int = worker_addresses.DEFAULT_MAX_MESSAGE_BYTES,
               connect_timeout: float = (
                   worker_addresses.DEFAULT_CONNECT_TIMEOUT_SECONDS),
               unavailable_timeout: float = (
                   worker_addresses.DEFAULT_UNAVAILABLE_TIMEOUT_SECONDS),
               keep_round_values: bool = True,
               call_timeout: float = worker_addresses.DEFAULT_CALL_TIMEOUT_SECONDS,
               merge_context=None):
    """Connects to the workers (waits up to `connect_timeout` s for each).

    Args:
      addresses: `host:port` of every worker, as a list or a comma-separated string.
      credentials: the driver's TLS credentials: a `Credentials`
        (`Credentials.driver(directory)`) or a directory that
        `python -m tff_robust.distributed.worker_credentials` wrote; None: workers on this
        machine only.
      max_message_bytes: gRPC message limit, > the largest value sent (a model, a
        client's dataset or update, a partial aggregate); at most 2^31 − 1.
      connect_timeout: seconds to wait for a worker at start; finite, > 0.
      unavailable_timeout: seconds a worker may be unreachable, or answer no probe,
        during a call before `WorkerError`; finite, > 0.
      call_timeout: every RPC's deadline, in seconds (finite, > 0): longer than
        any one computation takes on a worker (a worker that stops is found by the
        probes, not by this).
      merge_context: where the workers' partial aggregates are merged: an async TFF
        context of the driver's own (`private_local_execution().async_context`),
        so that no worker receives another's partial sums; None: on the first
        worker (which then receives every other worker's).
      keep_round_values: whether `keep_on_workers` and `invoke_keeping` keep values
        on the workers (the pass-by-pass aggregations then send each client's update
        to its worker once per round; the default); False: they return the values
        themselves and every call sends all of its arguments (more bytes per round,
        the same results; `benchmarks.distributed_round_time` compares the two).

    Raises:
      TypeError: for a limit of the wrong type (e.g. a float `max_message_bytes`).
      ValueError: for bad addresses or limits, unreadable credentials, or a worker
        not on this machine without credentials.
      WorkerError: naming a worker not reachable within `connect_timeout`, or one
        that refused the TLS handshake.
    """
    self.addresses = worker_addresses.parse_addresses(addresses)
    credentials = worker_credentials.as_driver_credentials(credentials)
    worker_addresses.check_credentials_needed(self.addresses, credentials)
    max_message_bytes = arguments.check_positive_int('max_message_bytes',
                                                     max_message_bytes)
    if max_message_bytes >= 2**31:  # gRPC's limit is a signed 32-bit length.
      raise ValueError(f'max_message_bytes must be < 2^31, got {max_message_bytes}.')
    # Finite: an infinite wait would hang a round for good.
    connect_timeout = arguments.check_positive_float('connect_timeout', connect_timeout)
    unavailable_timeout = arguments.check_positive_float('unavailable_timeout',
                                                         unavailable_timeout)
    call_timeout = arguments.check_positive_float('call_timeout', call_timeout)
    self._workers = []
    try:
      for address in self.addresses:
        self._workers.append(worker_connection.WorkerContext(
            address, max_message_bytes, connect_timeout, unavailable_timeout,
            credentials, call_timeout))
    except BaseException:
      self.close()
      raise
    # TFF's mergeable context's compiler; the compiled forms are cached per
    # computation. Its runner thread runs the workers' async calls.
    self._compiler = compiler_pipeline.CompilerPipeline(
        mergeable_comp_compiler.compile_to_mergeable_comp_form)
    self._runner = async_utils.AsyncThreadRunner()
    self.keep_round_values = bool(keep_round_values)
    self._merge_context = merge_context
    # The workers' own compiler (their contexts'), for calls on resident values.
    native = compiler_pipeline.CompilerPipeline(
        native_compiler.desugar_and_transform_to_native)
    self._invokers = [resident_values.WorkerInvoker(w, native) for w in self._workers]

  @property
  def num_workers(self) -> int:
    return len(self.addresses)

  def invoke(self, comp, arg):
    """Runs `comp` on the workers; a computation TFF cannot merge that has a
    pass-by-pass equivalent (`tff_robust.passwise.register_equivalent`: the `next` of
    every learning process tff_robust builds) runs as that equivalent.

    Raises:
      ValueError: for a computation with aggregations depending on one another and
        no equivalent; its first line is a hint (tff_robust's builders).
    """
    equivalent = passwise.equivalent(comp)
    if equivalent is not None and equivalent.mergeable is False:
      return self._run_equivalent(equivalent, arg)
    try:
      form = self._compiler.compile(comp)
    except ValueError:
      dependent = _dependent_aggregations(comp)
      if not dependent:
        raise
      if equivalent is None:
        raise ValueError(_not_mergeable_message(dependent)) from None
      equivalent.mergeable = False
      return self._run_equivalent(equivalent, arg)
    if equivalent is not None:
      equivalent.mergeable = True
    return self._run_form(form, arg)

  def _run_equivalent(self, equivalent, arg):
    # Its computations are invoked through the context stack: make it this one.
    with tff.framework.get_context_stack().install(self):
      return equivalent(arg)

  def _run_form(self, form, arg):
    """TFF's mergeable execution of `form`, with the shards' results in worker
    (i.e. client) order and the partial aggregates merged in worker order.

    TFF's own context concatenates CLIENTS-placed results and merges partial
    aggregates in the order the workers *finish*, so per-client results came back
    permuted and sums were added in a timing-dependent order.
    """
    contexts = self._invokers
    if arg is None:
      shards = [None] * len(contexts)
    else:
      shards = _shards(arg, form.up_to_merge.type_signature.parameter, len(contexts))
    result = self._runner.run_coro_and_return_result(
        _invoke_in_order(form, shards, contexts, self._merge_context))
    return type_conversions.type_to_py_container(
        result, form.after_merge.type_signature.result)

  @contextlib.contextmanager
  def keep_on_workers(self, value, type_spec):
    """Sends `value` (CLIENTS-placed, of `type_spec`) to the workers once and yields
    a `ResidentValue` to pass in its place to the computations of the block; frees
    it on the workers when the block ends.

    Each worker receives its contiguous shard of the clients (the shard every call
    gives it), so a computation called on it sends the workers its other arguments
    only: an aggregation with K passes sends each client's update once, not K
    times, and TFF's second copy of one worker's shard (the part after the merge
    takes the original arguments) is a reference too. Yields `value` itself if it is
    a `ResidentValue` already, holds no client, or `keep_round_values` is False.
    """
    type_spec = tff.to_type(type_spec)
    if not (isinstance(type_spec, tff.FederatedType) and
            type_spec.placement == tff.CLIENTS and not type_spec.all_equal):
      raise TypeError(f'keep_on_workers takes a CLIENTS-placed value, got {type_spec}.')
    if (not self.keep_round_values or
        isinstance(value, resident_values.ResidentValue) or not len(value)):  # pylint: disable=g-explicit-length-test
      yield value
      return
    shards = _shards(value, type_spec, self.num_workers)
    pieces = self._runner.run_coro_and_return_result(_gather(
        invoker.create(shard, type_spec)
        for invoker, shard in zip(self._invokers, shards)))
    resident = resident_values.ResidentValue(type_spec, pieces)
    del pieces  # The resident value holds the only references: `release` frees them.
    with resident:
      yield resident

  def invoke_keeping(self, comp, arg, keep: Sequence[str]):
    """`comp(arg)` with the result's elements named in `keep` left on the workers.

    `comp` has no aggregation (e.g. local training: the clients' updates and weights
    are kept where they were computed, for the passes of the aggregation that
    follows) and returns a struct. Returns an `OrderedDict` of its elements: those
    in `keep` as `ResidentValue`s (the caller releases them), the others computed
    (CLIENTS-placed ones in client order, the rest from the first worker: every
    worker computes them from the same arguments). With `keep_round_values` False,
    everything is computed (`invoke`).

    Raises:
      ValueError: if `comp` aggregates, or `keep` names no CLIENTS-placed element.
    """
    result_type = comp.type_signature.result
    names = structure.name_list(result_type) if isinstance(
        result_type, tff.StructType) else []
    for name in keep:
      if name not in names or not (
          isinstance(result_type[name], tff.FederatedType) and
          result_type[name].placement == tff.CLIENTS):
        raise ValueError(f'{name!r} is not a CLIENTS-placed element of {result_type}.')
    if tree_analysis.find_aggregations_in_tree(comp.to_building_block()):
      raise ValueError('invoke_keeping runs computations without aggregation; '
                       f'{comp.type_signature} aggregates.')
    if not self.keep_round_values:
      result = self.invoke(comp, arg)
      return collections.OrderedDict((name, result[name]) for name in names)
    shards = _shards(arg, comp.type_signature.parameter, self.num_workers)
    outputs = self._runner.run_coro_and_return_result(_gather(
        invoker.run_keeping(comp, shard, keep)
        for invoker, shard in zip(self._invokers, shards)))
    result = collections.OrderedDict()
    for name in names:
      element_type = result_type[name]
      if name in keep:
        result[name] = resident_values.ResidentValue(
            element_type, [kept[name] for _, kept in outputs])
      elif (isinstance(element_type, tff.FederatedType) and
            element_type.placement == tff.CLIENTS and not element_type.all_equal):
        result[name] = [v for computed, _ in outputs for v in computed[name]]
      else:
        result[name] = outputs[0][0][name]
    return result

  def wait_until_connected(self, timeout: float) -> None:
    """Blocks until this context's channel to every worker is ready and every
    worker answers, e.g. after a worker restarted (gRPC reconnects after a backoff
    that grows the longer the worker was away, so a call right after the restart may
    find it still waiting) or continued after it stopped.

    Raises:
      WorkerError: naming a worker still unreachable after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    for worker in self._workers:
      if not worker_connection.ready_within(worker.channel,
                                            max(deadline - time.monotonic(), 0)):
        raise worker_connection.WorkerError(worker.address,
                                            f'not reachable within {timeout:g} s.')
      while worker.stub.stopped:
        if time.monotonic() > deadline:
          raise worker_connection.WorkerError(
              worker.address, f'not answering within {timeout:g} s.')
        time.sleep(0.05)
      worker.stub.reached()

  def traffic(self) -> dict[str, tuple[int, int]]:
    """Worker address → (bytes sent to it, bytes received from it) so far: the
    serialized gRPC messages (values, computations, references)."""
    return {w.address: (w.stub.bytes_sent, w.stub.bytes_received)
            for w in self._workers}

  def close(self) -> None:
    for worker in self._workers:
      worker.close()
    self._workers = []
    self._invokers = []


def _is_aggregation(node) -> bool:
  return (isinstance(node, building_blocks.Intrinsic) and
          bool(node.intrinsic_def().aggregation_kind))


def _dependent_aggregations(comp) -> list:
  """The aggregation calls of `comp` that take another aggregation's result: what
  keeps TFF's compiler from building its mergeable form, found as that compiler
  finds them (on the call-dominant form of `comp` with its intrinsics lowered)."""
  tree = tff_private.as_lambda(comp.to_building_block())
  tree, _ = tensorflow_tree_transformations.replace_intrinsics_with_bodies(tree)
  tree = building_blocks.Lambda(tree.parameter_name, tree.parameter_type,
                                transformations.to_call_dominant(tree.result))
  return tff_private.calls_with_fn_consuming_arg(
      tree, fn_predicate=_is_aggregation, arg_predicate=_is_aggregation)


def _not_mergeable_message(dependent) -> str:
  """A one-line hint, then why the computation cannot run on the workers."""
  uris = collections.Counter(call.function.uri for call in dependent)
  return (
      'Build learning processes with tff_robust.build_process_with_aggregator (it '
      'takes build_weighted_fed_avg\'s arguments) and drive aggregation processes '
      'with tff_robust.passwise.PasswiseFactory: TFF\'s mergeable workers run one '
      'round of aggregation per computation.\n'
      'This computation\'s aggregations depend on one another (TFF\'s compiler: '
      '"Detected one aggregate dependent on another"): '
      + ', '.join(f'{n} × {uri}' for uri, n in sorted(uris.items())) +
      ' take the result of an earlier one. tff_robust\'s builders register a '
      '`next` that runs here as one computation per round of aggregation.')


def _shards(value, type_spec, num_shards: int) -> list:
  """`value` (of `type_spec`) as up to `num_shards` arguments, each with one
  contiguous slice of the clients (sizes as TFF's: ⌈remaining / shards left⌉), in
  client order; other values are repeated in every shard.

  TFF 0.87's own splitting (`MergeableCompExecutionContextValue`) gives every shard
  the first clients again when a CLIENTS-placed argument is followed by one placed
  elsewhere (e.g. `f(clients_value, server_value)`: 5 clients over 2 workers ran
  clients 0-2 twice).
  """
  num_clients = _num_clients(value, type_spec)
  if num_clients is None:  # No CLIENTS-placed argument.
    return [value] * num_shards
  if num_clients == 0:
    return [value]
  shards, start = [], 0
  for shards_left in range(num_shards, 0, -1):
    if start == num_clients:
      break  # Fewer clients than workers: no shard without clients.
    stop = start + math.ceil((num_clients - start) / shards_left)
    shards.append(_clients_slice(value, type_spec, start, stop))
    start = stop
  return shards


def _num_clients(value, type_spec) -> Optional[int]:
  """How many clients `value`'s CLIENTS-placed elements hold; None without any."""
  return cardinalities_utils.infer_cardinalities(value, type_spec).get(tff.CLIENTS)


async def _gather(coroutines):
  return await asyncio.gather(*coroutines)


def _clients_slice(value, type_spec, start: int, stop: int):
  if isinstance(type_spec, tff.StructType):
    elements = structure.iter_elements(structure.from_container(value))
    return structure.Struct([
        (name, _clients_slice(element, element_type, start, stop))
        for (_, element), (name, element_type) in zip(
            elements, structure.iter_elements(type_spec))])
  if (isinstance(type_spec, tff.FederatedType) and type_spec.placement == tff.CLIENTS
      and not type_spec.all_equal):
    return value[start:stop]
  return value


async def _invoke_in_order(form, shards, contexts, merge_context=None):
  """`form` (a `MergeableCompForm`) on `shards`, one per context: every shard's
  `up_to_merge` at once, their partial aggregates merged in shard order (in
  `merge_context`, default the first worker's), then `after_merge` on every shard,
  its results concatenated in shard order."""
  contexts = contexts[:len(shards)]
  partials = await asyncio.gather(*(
      context.invoke(form.up_to_merge, shard)
      for shard, context in zip(shards, contexts)))
  merger = merge_context if merge_context is not None else contexts[0]
  merged = partials[0]
  for partial in partials[1:]:
    merged = await merger.invoke(form.merge, structure.Struct.unnamed(merged, partial))
  result_type = form.after_merge.type_signature.result
  if type_analysis.contains_only(
      result_type, lambda t: not isinstance(t, tff.FederatedType) or t.all_equal):
    # Every shard would return the same (e.g. server-placed) result: compute it once.
    return await tff_private.compute_after_merged(form, shards[0], merged, contexts[0])
  results = await asyncio.gather(*(
      tff_private.compute_after_merged(form, shard, merged, context)
      for shard, context in zip(shards, contexts)))
  return tff_private.repackage_partitioned_values(list(results), result_type)


@contextlib.contextmanager
def distributed_execution(addresses, **kwargs):
  """Runs every TFF computation called in the block on the workers at `addresses`.

  Installs a `DistributedContext` (keyword arguments as its constructor's) on TFF's
  context stack for this thread and closes it afterwards. Yields the context.
  """
  context = DistributedContext(addresses, **kwargs)
  try:
    with tff.framework.get_context_stack().install(context):
      yield context
  finally:
    context.close()

