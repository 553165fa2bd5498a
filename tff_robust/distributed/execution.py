"""Runs TFF computations with their clients spread over several `worker_binary`s.

TFF 0.87's distributed engine is its C++ `worker_binary` (a gRPC executor service,
shipped inside the TFF package at `tensorflow_federated/data/worker_binary`) driven by
Python remote executors. It has no ready-made builder for a context that talks to
workers you started yourself; this module builds one from public `tff.framework`
pieces:

  grpc channel (max message sizes raised: model-sized values)
    → `tff.framework.RemoteExecutorGrpcStub` (here wrapped to fail fast, naming the
      worker, instead of TFF's endless retry while a worker is down)
    → `tff.framework.RemoteExecutor` (one per cardinality, CLIENTS 0 when absent)
      inside `tff.framework.ResourceManagingExecutorFactory`
    → `tff.framework.AsyncExecutionContext` (the native compiler; TF frontend
      argument and result transforms), one per worker
    → TFF's mergeable execution (`tff.backends.native.
      create_mergeable_comp_execution_context`'s compiler and steps, run here):
      the CLIENTS-placed arguments of every call split into one contiguous shard per
      worker, the computation run up to its aggregation on every worker in parallel,
      the partial aggregates merged with the aggregation's own `merge` in worker
      order, the rest finished, per-client results returned in client order.

Use:

  process = tff_robust.build_robust_federated_aggregation_process(model_fn, opt)
  with tff_robust.distributed.LocalWorkers(2) as workers:        # or your own hosts
    with tff_robust.distributed.distributed_execution(workers.addresses):
      output = process.next(state, client_data)                  # unchanged code

TFF's mergeable form holds one round of aggregation: a computation whose aggregations
depend on one another is refused ("Detected one aggregate dependent on another").
RFA, the γ-mean and secure centered clipping are such chains of secure averages. The
learning processes tff_robust builds register a pass-by-pass equivalent of their
`next` (`tff_robust.learning.processes`), which this context runs instead, so every
one of them runs as written; FedAvg, GMA and one-step RFA with the paper's `nu=1e-6`
and `report_objective=False` are mergeable as they are and run as one computation.
An aggregation process of your own is driven pass by pass with
`tff_robust.distributed.passwise`.

A round's per-client values cross to the workers once: `keep_on_workers` sends each
worker its shard of a CLIENTS-placed value and keeps it there (a value of the
worker's TFF executor, referred to by id, as TFF's executor service allows) as a
`ResidentValue`, which the round's pass computations take in place of the value, so
each pass sends v and the computation and gets back one partial sum per worker;
`invoke_keeping` leaves chosen per-client results of an aggregation-free
computation (training's updates) on the workers that computed them. Both are freed
when the round ends. A worker that restarts during the round lost them: the call
raises `WorkerError` instead of being rerun.

Workers: `LocalWorkers` starts and stops workers on this machine (tests, demos, one big
machine), reachable from this machine only. On several machines, make the deployment's
TLS credentials once (`python -m tff_robust.distributed.worker_credentials --out=DIR`), start one
worker per machine (`python -m tff_robust.distributed --port=8000 --tls_cert=worker.pem
--tls_key=worker.key --tls_client_ca=ca.pem`) and pass their `host:port`s with
`credentials=DIR` (the driver's files). That command runs `tff_robust.distributed.worker_launcher`
without importing TensorFlow: the worker_binary runs in a private network namespace
behind a forwarder that accepts only drivers with the deployment's client certificate
(mutual TLS); without credentials a worker accepts connections from this machine
only, and a driver without credentials dials only workers on this machine. It refuses
a port already in use, prints one `listening on HOST:PORT ...` line once the port
accepts connections, and exits non-zero if the worker cannot start.
"""

import asyncio
import collections
import contextlib
import math
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from typing import Optional, Sequence

import grpc
import portpicker
import tensorflow_federated as tff
import tree
from tensorflow_federated.proto.v0 import executor_pb2
from tensorflow_federated.proto.v0 import executor_pb2_grpc
# The compiler and TF-frontend transforms TFF's own local C++ context is built with;
# TFF 0.87 exports no public name for them.
from tff_robust.common.tff_private import native_compiler
from tff_robust.common.tff_private import tensorflow_computation
# The pieces of TFF's mergeable context (splitting arguments into shards, its compiler,
# re-assembling results), run here in client order (see `DistributedContext.invoke`).
from tff_robust.common.tff_private import async_utils
from tff_robust.common.tff_private import structure
from tff_robust.common.tff_private import mergeable_comp_compiler
from tff_robust.common.tff_private import compiler_pipeline
from tff_robust.common.tff_private import mergeable_comp_execution_context as mergeable
from tff_robust.common.tff_private import tensorflow_tree_transformations
from tff_robust.common.tff_private import building_blocks
from tff_robust.common.tff_private import transformations
from tff_robust.common.tff_private import tree_analysis
from tff_robust.common.tff_private import cardinalities_utils
from tff_robust.common.tff_private import cardinality_carrying_base
from tff_robust.common.tff_private import type_analysis
from tff_robust.common.tff_private import type_conversions

from tff_robust.common import arguments
from tff_robust.distributed import passwise
from tff_robust.distributed import runtime
from tff_robust.distributed import worker_addresses
from tff_robust.distributed import worker_credentials
from tff_robust.distributed import worker_launcher
from tff_robust.distributed import worker_network
# pylint: enable=g-import-not-at-top,wrong-import-position

# How long a call waits for its answer before asking whether the worker still answers.
PROBE_INTERVAL = 5.0
# A method no worker serves: a live gRPC server answers UNIMPLEMENTED at once.
_PROBE_METHOD = '/tff_robust.Probe/Probe'
# HTTP/2 keepalive while calls are pending. At gRPC's default of 2 pings between data
# frames, the worker_binary's ping policy (one ping per 5 minutes, 2 strikes) never
# answers with GOAWAY "too_many_pings", which unlimited pings every 5 s did.
KEEPALIVE_OPTIONS = (('grpc.keepalive_time_ms', 30_000),
                     ('grpc.keepalive_timeout_ms', 20_000),
                     ('grpc.keepalive_permit_without_calls', 0))
# TFF's retryable codes (its stub's): the worker restarted or lost an executor.
_RETRYABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION)


class WorkerError(RuntimeError):
  """A worker_binary could not be reached or failed; `address` names it."""

  def __init__(self, address: str, message: str):
    super().__init__(f'TFF worker {address}: {message}')
    self.address = address


class _WorkerBack(tff.framework.RetryableError):
  """A worker failed a call and is reachable again: TFF reruns its share."""


worker_binary_path = worker_launcher.worker_binary_path
Credentials = worker_credentials.Credentials
as_driver_credentials = worker_credentials.as_driver_credentials
parse_addresses = worker_addresses.parse_addresses
check_credentials_needed = worker_addresses.check_credentials_needed
DEFAULT_MAX_MESSAGE_BYTES = worker_addresses.DEFAULT_MAX_MESSAGE_BYTES
DEFAULT_CONNECT_TIMEOUT_SECONDS = worker_addresses.DEFAULT_CONNECT_TIMEOUT_SECONDS
DEFAULT_UNAVAILABLE_TIMEOUT_SECONDS = worker_addresses.DEFAULT_UNAVAILABLE_TIMEOUT_SECONDS
DEFAULT_CALL_TIMEOUT_SECONDS = worker_addresses.DEFAULT_CALL_TIMEOUT_SECONDS


def _channel_options(max_message_bytes: int):
  return [('grpc.max_message_length', max_message_bytes),
          ('grpc.max_send_message_length', max_message_bytes),
          ('grpc.max_receive_message_length', max_message_bytes),
          *KEEPALIVE_OPTIONS]


def make_channel(address: str, credentials: Optional[Credentials] = None,
                 options=()) -> grpc.Channel:
  """A gRPC channel to the worker at `address`: mutual TLS with `credentials` (the
  driver's), else insecure (a worker on this machine)."""
  options = list(options)
  if credentials is None:
    return grpc.insecure_channel(address, options)
  return grpc.secure_channel(address, credentials.channel_credentials(),
                             options + credentials.channel_options())


# Words of a failed connection's gRPC details that mean the TLS handshake failed (a
# certificate, a name or a protocol refused), not that nothing listens (yet).
_HANDSHAKE_FAILURE_WORDS = ('ssl', 'tls', 'handshake', 'certificate', 'peer name',
                            'alpn', 'socket closed', 'connection reset')


def _connect_error(channel, deadline: float) -> str:
  """The details of a call that fails at once, as the channel cannot connect."""
  probe = channel.unary_unary(_PROBE_METHOD)
  try:
    probe(b'', wait_for_ready=False,
          timeout=max(min(deadline - time.monotonic(), 10.0), 0.1))
  except grpc.RpcError as e:
    if isinstance(e, grpc.Call) and e.code() == grpc.StatusCode.UNAVAILABLE:
      return e.details() or ''
  return ''


def wait_until_ready(address: str, timeout: float,
                     credentials: Optional[Credentials] = None,
                     channel: Optional[grpc.Channel] = None) -> None:
  """Blocks until a gRPC channel to `address` is ready (with `credentials`: its TLS
  handshake succeeded): `channel` (left open), or one made and closed here.

  Raises:
    WorkerError: after `timeout` seconds; at once if the worker refused the TLS
      handshake, or a driver without credentials met one that requires them.
  """
  global _last_readiness_wait
  own_channel = channel is None
  if own_channel:
    channel = make_channel(address, credentials)
  ready = grpc.channel_ready_future(channel)
  deadline = time.monotonic() + timeout
  try:
    while True:
      try:
        ready.result(timeout=min(max(deadline - time.monotonic(), 0.0), 1.0))
        return
      except grpc.FutureTimeoutError:
        pass
      # Why it does not connect: nothing listens (yet), or a refused handshake.
      details = _connect_error(channel, deadline)
      if any(word in details.lower() for word in _HANDSHAKE_FAILURE_WORDS):
        if credentials is None:
          hint = ('does the worker require credentials (started with --tls_*)? Pass '
                  'credentials=DIR (--worker_credentials=DIR).')
        else:
          hint = ('are the driver\'s credentials and the worker\'s --tls_* files '
                  'from the same deployment (`python -m tff_robust.'
                  'worker_credentials`), and does the worker use TLS at all?')
        raise WorkerError(address, f'refused the connection ({details}); {hint}')
      if time.monotonic() >= deadline:
        raise WorkerError(address, f'not reachable within {timeout:g} s' +
                          (f' ({details}).' if details else '.'))
  finally:
    ready.cancel()
    _last_readiness_wait = time.monotonic()
    if own_channel:
      _close_channel(channel)


class _FailFastStub(tff.framework.RemoteExecutorStub):
  """TFF's gRPC stub, but every call has a deadline and a worker that stays
  unreachable, or stops answering, raises `WorkerError`.

  TFF's `AsyncExecutionContext` retries an UNAVAILABLE worker forever (backing off to
  every 30 s), and TFF's stub sets no deadline, so a dead worker would hang the
  program silently and a stopped one (SIGSTOP, a frozen machine: the connection
  stays open) for good. Here:

  - an RPC that fails as unavailable waits for the worker to come back until
    `unavailable_timeout` after the first failure: if it does, the error stays
    retryable (TFF reruns that worker's share of the call on fresh executor state);
    if not, `WorkerError` names the worker and is not retried. The clock is the
    worker's, not the call's: the other calls of the failed computation (TFF goes on
    running its sibling tasks) and the calls after it fail at the same deadline, or
    at once after it, until the worker answers a call again (or
    `DistributedContext.wait_until_connected` finds it back);
  - while an RPC waits for its answer, the worker is asked every `PROBE_INTERVAL`
    seconds whether it still answers (an unknown method on a channel of its own, which
    a live gRPC server refuses at once, however busy its executor is): a worker that
    answers no probe for `unavailable_timeout` seconds has stopped; the call is
    cancelled and raises `WorkerError`, within `PROBE_INTERVAL + unavailable_timeout`
    of the stop. A slow worker still answers probes: how long a computation takes is
    bounded by `call_timeout` only (every RPC's deadline);
  - the channels send HTTP/2 keepalive pings (`KEEPALIVE_OPTIONS`) while calls are
    pending, so a connection whose peer vanished without closing it is closed too.

  Freeing state on the worker (`dispose`, `dispose_executor`: TFF calls them when a
  call fails and when the context closes) never waits for it: one attempt, at most
  `unavailable_timeout` long, errors ignored, and none while the worker is failing. So
  a program whose worker died stops about `unavailable_timeout` after the death, not
  that long again for every pending call and cached executor.
  """

  def __init__(self, address: str, channel, unavailable_timeout: float,
               call_timeout: float = DEFAULT_CALL_TIMEOUT_SECONDS,
               probe_channel=None):
    self._address = address
    self._channel = channel
    # A connection of its own, so that a probe never queues behind a call's data.
    self._probe_channel = probe_channel
    self._grpc_stub = executor_pb2_grpc.ExecutorGroupStub(channel)
    self._unavailable_timeout = unavailable_timeout
    self._call_timeout = call_timeout
    # time.monotonic() of the first failed call since the worker was last reached.
    self._failing_since: Optional[float] = None
    # Whether the worker answered no probe when last asked (stopped, not gone).
    self._stopped = False
    self._lock = threading.Lock()
    self._closed = False
    # Serialized bytes of every request and response: what crosses the network.
    self.bytes_sent = 0
    self.bytes_received = 0

  def reached(self) -> None:
    """The worker answers (again): a later failure starts a new clock."""
    self._failing_since = None

  @property
  def failing(self) -> bool:
    return self._failing_since is not None

  def close(self) -> None:
    """No RPC after this one (the channels are closing): calls raise `WorkerError`
    instead of gRPC's ValueError from a closed channel."""
    self._closed = True
    if self._probe_channel is not None:
      self._probe_channel.close()  # Never subscribed to.

  def answers(self, timeout: float) -> bool:
    """Whether the worker's gRPC server answers a probe within `timeout` seconds."""
    if self._probe_channel is None:
      return True
    probe = self._probe_channel.unary_unary(_PROBE_METHOD)
    try:
      probe(b'', timeout=timeout, wait_for_ready=True)
    except grpc.RpcError as e:
      # A live server refuses the unknown method; no answer, or no connection, in
      # time is a worker that does not answer.
      return isinstance(e, grpc.Call) and e.code() not in (
          grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE,
          grpc.StatusCode.CANCELLED)
    except ValueError:  # The probe channel was closed meanwhile.
      return False
    return True

  @property
  def stopped(self) -> bool:
    """Whether the worker answered no probe when last asked, and none since."""
    return self._stopped

  def _watch_until_answering(self) -> None:
    """Probes the stopped worker in the background until it answers again (or the
    stub closes); calls meanwhile fail at once."""
    while not self._closed and not self.answers(self._unavailable_timeout):
      pass
    if not self._closed:
      self._stopped = False
      self.reached()

  def _stopped_error(self, method: str, since: float) -> WorkerError:
    with self._lock:
      if not self._stopped:
        self._stopped = True
        threading.Thread(target=self._watch_until_answering, daemon=True,
                         name=f'probe {self._address}').start()
    if self._failing_since is None:
      self._failing_since = since  # Nothing to free there: see `_free`.
    return WorkerError(
        self._address, f'stopped answering: no answer to {method} and none to a '
        f'probe for {self._unavailable_timeout:g} s (is it stopped, or its machine '
        'frozen?).')

  def _await(self, method: str, future):
    """`future`'s response, probing the worker while it is pending."""
    while True:
      try:
        return future.result(timeout=PROBE_INTERVAL)
      except grpc.FutureTimeoutError:
        pass
      asked = time.monotonic()
      if self._stopped and not future.done():  # Found by another call meanwhile.
        future.cancel()
        raise self._stopped_error(method, asked)
      if not future.done() and not self.answers(self._unavailable_timeout):
        if future.done():  # The answer came as the probe gave up.
          continue
        future.cancel()
        raise self._stopped_error(method, asked)

  def _call(self, method: str, request):
    if self._closed:
      raise WorkerError(self._address, f'{method} after the driver closed its '
                        'channel (the program is ending).')
    if self._stopped:  # Until the watching probe is answered: at once.
      raise self._stopped_error(method, time.monotonic())
    rpc = getattr(self._grpc_stub, method)
    try:
      future = rpc.future(request, timeout=self._call_timeout)
    except ValueError:  # gRPC's "Channel closed!": the program is ending.
      raise WorkerError(self._address, f'{method} after the driver closed its '
                        'channel (the program is ending).') from None
    try:
      self.bytes_sent += request.ByteSize()
      response = self._await(method, future)
      self.bytes_received += response.ByteSize()
      self.reached()
      return response
    except grpc.RpcError as e:
      code = e.code() if isinstance(e, grpc.Call) else None
      if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        raise WorkerError(
            self._address, f'{method} did not finish within {self._call_timeout:g} s '
            '(the calls\' deadline: --worker_call_timeout, call_timeout=) although '
            'the worker answers; raise it for longer computations.') from None
      if self._closed or code == grpc.StatusCode.CANCELLED:
        raise WorkerError(self._address, f'{method} was cancelled (the driver is '
                          'closing its channel).') from None
      if code not in _RETRYABLE_CODES:
        raise WorkerError(self._address, f'{method} failed: {_grpc_details(e)}') from e
      self._wait_back(method, e)
      raise _WorkerBack(e) from e  # Back: TFF retries this worker's share.

  def _wait_back(self, method: str, error) -> None:
    """Returns once the channel is ready again; `WorkerError` if it is not by
    `unavailable_timeout` after the worker's first failure."""
    if self._failing_since is None:
      self._failing_since = time.monotonic()
    remaining = self._failing_since + self._unavailable_timeout - time.monotonic()
    if remaining <= 0 or not _ready_within(self._channel, remaining):
      raise WorkerError(
          self._address, f'unreachable for {self._unavailable_timeout:g} s during '
          f'{method} ({_grpc_details(error)}); did the worker stop?')

  def _free(self, method: str, request):
    """One attempt at a freeing call; None if the worker is away."""
    if self.failing or self._closed:
      return None
    try:
      self.bytes_sent += request.ByteSize()
      response = getattr(self._grpc_stub, method)(request,
                                                  timeout=self._unavailable_timeout)
      self.bytes_received += response.ByteSize()
      return response
    except grpc.RpcError as e:
      if (isinstance(e, grpc.Call) and self._failing_since is None and
          e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)):
        self._failing_since = time.monotonic()  # Nothing left to free there.
      return None
    except ValueError:  # The channel closed meanwhile (the program is ending).
      return None

  def get_executor(self, request):
    return self._call('GetExecutor', request)

  def create_value(self, request):
    return self._call('CreateValue', request)

  def create_struct(self, request):
    return self._call('CreateStruct', request)

  def create_call(self, request):
    return self._call('CreateCall', request)

  def create_selection(self, request):
    return self._call('CreateSelection', request)

  def compute(self, request):
    return self._call('Compute', request)

  def dispose(self, request):
    return self._free('Dispose', request)

  def dispose_executor(self, request):
    return self._free('DisposeExecutor', request)

  @property
  def is_ready(self) -> bool:
    """Whether the worker is taken to answer (no failure since it last did)."""
    return not self.failing and not self._stopped


# gRPC's thread that watches a subscribed channel stops within this long after the
# last subscription ends (it polls every 0.2 s); closed while it runs, the channel
# makes it print a "Channel closed!" traceback.
_GRPC_POLLING_ENDS_SECONDS = 0.5
# time.monotonic() at which the last wait for a channel's readiness ended.
_last_readiness_wait = -math.inf


def _ready_within(channel, timeout: float) -> bool:
  """Whether `channel` connects within `timeout` seconds. The wait's subscription
  ends with it: one left on the channel would print a traceback when it closes."""
  global _last_readiness_wait
  ready = grpc.channel_ready_future(channel)
  try:
    ready.result(timeout=timeout)
    return True
  except grpc.FutureTimeoutError:
    return False
  finally:
    ready.cancel()
    _last_readiness_wait = time.monotonic()


def _close_channel(channel) -> None:
  """Closes `channel` once gRPC's watching thread of a recent wait has ended."""
  time.sleep(max(_last_readiness_wait + _GRPC_POLLING_ENDS_SECONDS - time.monotonic(),
                 0))
  channel.close()


def _grpc_details(error) -> str:
  cause = getattr(error, 'grpc_error', None) or getattr(error, '__cause__', None) or error
  if isinstance(cause, grpc.Call):
    return f'{cause.code().name}: {cause.details()}'
  return str(error) or type(error).__name__


class _WorkerContext:
  """One worker's channel, executor factory and async context."""

  def __init__(self, address: str, max_message_bytes: int, connect_timeout: float,
               unavailable_timeout: float, credentials: Optional[Credentials],
               call_timeout: float = DEFAULT_CALL_TIMEOUT_SECONDS):
    self.address = address
    self.channel = make_channel(address, credentials,
                                _channel_options(max_message_bytes))
    try:
      wait_until_ready(address, connect_timeout, credentials, self.channel)
    except BaseException:
      _close_channel(self.channel)
      raise
    # Other options than the calls' channel: gRPC gives it a connection of its own.
    self._probe_channel = make_channel(address, credentials,
                                       [('tff_robust.probe_channel', 1)])
    stub = _FailFastStub(address, self.channel, unavailable_timeout, call_timeout,
                         self._probe_channel)
    self.stub = stub

    def executor_fn(cardinalities):
      # A call without CLIENTS-placed arguments (e.g. `initialize`) runs on no client.
      cardinalities.setdefault(tff.CLIENTS, 0)
      executor = tff.framework.RemoteExecutor(stub)
      executor.set_cardinalities(cardinalities)
      return executor

    self._executor_fn = executor_fn
    self.executor_factory = tff.framework.ResourceManagingExecutorFactory(executor_fn)
    self._factories = [self.executor_factory]
    self.context = tff.framework.AsyncExecutionContext(
        executor_fn=self.executor_factory,
        compiler_fn=native_compiler.desugar_and_transform_to_native,
        transform_args=tensorflow_computation.transform_args,
        transform_result=tensorflow_computation.transform_result)

  def new_async_context(self) -> tff.framework.AsyncExecutionContext:
    """Another async context on this worker, with executors of its own."""
    factory = tff.framework.ResourceManagingExecutorFactory(self._executor_fn)
    self._factories.append(factory)
    return tff.framework.AsyncExecutionContext(
        executor_fn=factory,
        compiler_fn=native_compiler.desugar_and_transform_to_native,
        transform_args=tensorflow_computation.transform_args,
        transform_result=tensorflow_computation.transform_result)

  def close(self):
    # Frees this client's executors on the worker (a gone worker is skipped).
    for factory in self._factories:
      for cardinalities in list(factory._executors.keys()):  # pylint: disable=protected-access
        try:
          factory.clean_up_executor(dict(cardinalities))
        except Exception:  # pylint: disable=broad-except
          pass
    self.stub.close()
    _close_channel(self.channel)


class _Piece(cardinality_carrying_base.CardinalityCarrying):
  """One worker's shard of a `ResidentValue`: a value on that worker's executor for
  the shard's cardinalities."""

  def __init__(self, worker: '_WorkerContext', remote, size: int):
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
    executors = [p.remote._executor for p in self._pieces]  # pylint: disable=protected-access
    # TFF disposes a remote value when its last reference goes, in batches: drop
    # ours, then send the executors' pending batches now.
    self._pieces = None
    for executor in executors:
      _flush_disposals(executor)

  def __enter__(self) -> 'ResidentValue':
    return self

  def __exit__(self, *exc_info):
    self.release()


def _flush_disposals(executor) -> None:
  """Sends `executor`'s (a `tff.framework.RemoteExecutor`) batch of values to dispose
  now rather than once it holds 20 (TFF's batch size; a shard of updates can be
  large). TFF 0.87 has no public call for it."""
  # pylint: disable=protected-access
  pending = executor._dispose_request
  if pending is None or not pending.value_ref:
    return
  executor._dispose_request = executor_pb2.DisposeRequest(
      executor=executor._executor_id)
  executor._stub.dispose(pending)
  # pylint: enable=protected-access


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


class _WorkerInvoker:
  """Invokes computations on one worker as its `AsyncExecutionContext` does, except
  that an argument holding shards of `ResidentValue`s refers to them on the worker
  (TFF's context would serialize every argument again)."""

  def __init__(self, worker: _WorkerContext, compiler):
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
    """`comp(arg)`, its elements named in `keep` left here (`_run`)."""
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
      raise WorkerError(self._worker.address, 'was unreachable during the round; the '
                        f'values it held for the round are gone ({e}).') from e
    except Exception:
      factory.clean_up_executor(dict(cardinalities))
      raise

  async def _run(self, comp, arg, keep):
    """`comp(arg)` on this worker. With `keep` (names of elements of the result, a
    struct), returns (the other elements computed, by name; the kept elements'
    remote values, by name), else the result."""
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
          kept[name] = selection
        else:
          computed[name] = tensorflow_computation.transform_result(
              type_conversions.type_to_py_container(await selection.compute(),
                                                    result_type[name]))
      return computed, kept

  async def _ingest(self, executor, value, type_spec):
    if isinstance(value, _Piece):
      if value.worker is not self._worker or value.remote._executor is not executor:  # pylint: disable=protected-access
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
  (stopped) seconds; a call that outlasts `call_timeout` on a worker that still
  answers raises it too. `close()` frees this program's state on the workers
  and closes the channels (it does not stop the workers).

  With `credentials` every channel is mutual TLS; without them, every worker must be
  on this machine (a loopback address).
  """

  def __init__(self, addresses, *, credentials=None,
               max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
               connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_SECONDS,
               unavailable_timeout: float = DEFAULT_UNAVAILABLE_TIMEOUT_SECONDS,
               keep_round_values: bool = True,
               call_timeout: float = DEFAULT_CALL_TIMEOUT_SECONDS,
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
    self.addresses = parse_addresses(addresses)
    credentials = as_driver_credentials(credentials)
    check_credentials_needed(self.addresses, credentials)
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
        self._workers.append(_WorkerContext(address, max_message_bytes,
                                            connect_timeout, unavailable_timeout,
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
    self._invokers = [_WorkerInvoker(w, native) for w in self._workers]

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
    if (not self.keep_round_values or isinstance(value, ResidentValue) or
        not len(value)):  # pylint: disable=g-explicit-length-test
      yield value
      return
    shards = _shards(value, type_spec, self.num_workers)
    pieces = self._runner.run_coro_and_return_result(_gather(
        invoker.create(shard, type_spec)
        for invoker, shard in zip(self._invokers, shards)))
    resident = ResidentValue(type_spec, pieces)
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
        result[name] = ResidentValue(element_type, [
            _Piece(worker, kept[name],
                   _num_clients(shard, comp.type_signature.parameter) or 0)
            for worker, shard, (_, kept) in zip(self._workers, shards, outputs)])
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
      if not _ready_within(worker.channel, max(deadline - time.monotonic(), 0)):
        raise WorkerError(worker.address, f'not reachable within {timeout:g} s.')
      while worker.stub.stopped:
        if time.monotonic() > deadline:
          raise WorkerError(worker.address, f'not answering within {timeout:g} s.')
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
  tree = mergeable_comp_compiler._ensure_lambda(  # pylint: disable=protected-access
      comp.to_building_block())
  tree, _ = tensorflow_tree_transformations.replace_intrinsics_with_bodies(tree)
  tree = building_blocks.Lambda(tree.parameter_name, tree.parameter_type,
                                transformations.to_call_dominant(tree.result))
  return tree_analysis._extract_calls_with_fn_consuming_arg(  # pylint: disable=protected-access
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
    return await mergeable._compute_after_merged(  # pylint: disable=protected-access
        form, shards[0], merged, contexts[0])
  after_merge = mergeable._compute_after_merged  # pylint: disable=protected-access
  results = await asyncio.gather(*(
      after_merge(form, shard, merged, context)
      for shard, context in zip(shards, contexts)))
  return mergeable._repackage_partitioned_values(  # pylint: disable=protected-access
      list(results), result_type)


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


DriverExecution = collections.namedtuple('DriverExecution',
                                         ['context', 'async_context'])


@contextlib.contextmanager
def private_local_execution(max_message_megabytes: int = 10_000,
                            startup_timeout: float = 300.0):
  """Runs the TFF computations of the block that no other context takes (this
  thread's) on a worker_binary of this process's own that nothing else can reach.

  TFF's own local context starts its worker_binary listening on every interface,
  insecure: anyone who reaches the machine could run TensorFlow in it. Here the
  binary is `python -m tff_robust.distributed --listen_unix=PATH`: in a private
  network namespace, behind a Unix socket in a directory only this user may enter
  (mode 0700), as an unprivileged user when this process is root (as every worker).
  So a driver (`tasks.binaries.train --workers`) listens on no network at all. The
  results are TFF's local context's (the same compiler and binary).

  Yields a `DriverExecution`: its `context` (a `tff.framework.SyncExecutionContext`,
  installed for the block) and `async_context` (on the same worker, for
  `DistributedContext(merge_context=...)`: the workers' partial sums merged here).

  Raises:
    WorkerError: if the worker did not start within `startup_timeout` seconds.
  """
  directory = tempfile.mkdtemp(prefix='tff_driver_')  # Mode 0700: this user's.
  path = os.path.join(directory, 'worker.sock')
  process = worker_launcher.start_launcher(
      [f'--listen_unix={path}',
       f'--grpc_max_message_length_megabytes={max_message_megabytes}'],
      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
  worker = None
  try:
    _wait_for_unix_socket(process, path, startup_timeout)
    worker = _WorkerContext(f'unix:{path}', DEFAULT_MAX_MESSAGE_BYTES,
                            startup_timeout, DEFAULT_UNAVAILABLE_TIMEOUT_SECONDS, None)
    context = tff.framework.SyncExecutionContext(
        executor_fn=worker.executor_factory,
        compiler_fn=native_compiler.desugar_and_transform_to_native,
        transform_args=tensorflow_computation.transform_args,
        transform_result=tensorflow_computation.transform_result)
    with tff.framework.get_context_stack().install(context):
      # An executor factory of its own: the merges run in another event loop.
      yield DriverExecution(context, worker.new_async_context())
  finally:
    if worker is not None:
      worker.close()
    if process.poll() is None:
      process.send_signal(signal.SIGINT)
      try:
        process.wait(10)
      except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    shutil.rmtree(directory, ignore_errors=True)


def _wait_for_unix_socket(process: subprocess.Popen, path: str,
                          timeout: float) -> None:
  """Blocks until the launcher `process` accepts connections at `path`."""
  deadline = time.monotonic() + timeout
  while True:
    if process.poll() is not None:
      raise WorkerError(f'unix:{path}', 'the driver\'s own worker exited with status '
                        f'{process.returncode} before listening (its error is above).')
    try:
      with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.connect(path)
      return
    except OSError:
      if time.monotonic() > deadline:
        raise WorkerError(f'unix:{path}', f'the driver\'s own worker was not '
                          f'listening after {timeout:g} s.') from None
      time.sleep(0.02)


# Flags a LocalWorkers' launcher sets, reads itself, or that would stop it starting a
# worker (help, or flags read from elsewhere).
_REFUSED_WORKER_FLAGS = ('port', 'grpc_max_message_length_megabytes',
                         *worker_launcher.OWN_FLAGS, *worker_launcher.INDIRECT_FLAGS,
                         *worker_launcher.HELP_FLAGS)


def _checked_worker_flags(worker_flags: Sequence[str]) -> list[str]:
  """`worker_flags` as a list, each `--name=value` of the worker_binary's own."""
  if isinstance(worker_flags, str):
    raise TypeError(f'worker_flags={worker_flags!r}: give a list of flags, e.g. '
                    '[\'--max_concurrent_computation_calls=4\'].')
  worker_flags = list(worker_flags)
  for flag in worker_flags:
    name = flag.lstrip('-').partition('=')[0]
    if not flag.startswith('--') or '=' not in flag:
      raise ValueError(f'worker_flags: {flag!r} is not of the form --name=value.')
    if name in _REFUSED_WORKER_FLAGS:
      raise ValueError(
          f'worker_flags: --{name} is not for the workers\' binaries: LocalWorkers sets '
          'ports, host, message size and credentials from its own arguments, and every '
          'flag must be given on the command line (no help, flag files or environment).')
  return worker_flags


class LocalWorkers:
  """Starts `num_workers` workers on this machine, reachable from this machine only; a
  context manager that always stops them (by pid) when the block ends.

    with LocalWorkers(2) as workers:
      with distributed_execution(workers.addresses): ...

  Each worker is `python -m tff_robust.distributed.worker_launcher` (`tff_robust.distributed`'s
  worker command): its worker_binary runs in a private network namespace (as
  `nobody` when this process is root), and the
  launcher forwards connections to it from a port on `host` (a loopback address,
  default 127.0.0.1), with mutual TLS if `credentials` (the workers' side,
  `Credentials.worker(directory)` or that directory) are given; the driver then
  needs the driver's side. Workers listen on free ports (or `ports`). A port
  something already listens on is refused (`WorkerError` naming it), and a worker
  counts as started once it accepts connections on its port and is the only process
  listening there. Each worker's output goes to a log file in `log_dir` (`log_path(i)`),
  not to this process's stdout, so `python x.py | tail` ends; by default a temporary
  directory, which `stop()` removes, except when the block ends by an exception or
  the workers fail to start (the logs then stay, for the error).
  The kernel kills a launcher if the starting Python process dies, and its
  worker_binary with it (PR_SET_PDEATHSIG).

  `worker_flags` go to every worker_binary, e.g.
  `['--max_concurrent_computation_calls=4']`: the binary runs at most that many
  clients of one `federated_map` at a time (by default all of them). That lowers a
  worker's peak memory somewhat (10 ConvNet clients: 4.34 → 3.50 GiB with 2), not the
  values the runtime keeps for the whole call.

  Attributes:
    addresses: `host:port` of every worker.
    pids: the launchers' process ids (each holds its worker's port).
    binary_pids: their worker_binary processes' ids.
  """

  def __init__(self, num_workers: int, *, host: str = '127.0.0.1',
               ports: Optional[Sequence[int]] = None,
               max_message_megabytes: int = 10_000,
               log_dir: Optional[str] = None, startup_timeout: float = 60.0,
               credentials=None, worker_flags: Sequence[str] = ()):
    num_workers = arguments.check_positive_int('num_workers', num_workers)
    self._worker_flags = _checked_worker_flags(worker_flags)
    if ports is not None and len(ports) != num_workers:
      raise ValueError(f'Give {num_workers} ports, got {list(ports)}.')
    if not worker_network.is_loopback(host):
      raise ValueError(
          f'LocalWorkers(host={host!r}): local workers listen on a loopback address '
          'only. Workers for other machines are started there with `python -m '
          'tff_robust.distributed --port=N` and the deployment\'s credentials.')
    if credentials is not None and not isinstance(credentials, Credentials):
      credentials = Credentials.worker(os.fspath(credentials))
    self._credentials = credentials
    self._binary = worker_binary_path()
    self._requested = num_workers
    self._host = host
    self._ports = list(ports) if ports is not None else None
    self._max_megabytes = arguments.check_positive_int('max_message_megabytes',
                                                       max_message_megabytes)
    self._log_dir = log_dir
    self._temporary_log_dir = log_dir is None
    self._startup_timeout = arguments.check_positive_float('startup_timeout',
                                                           startup_timeout)
    self._processes: list[Optional[subprocess.Popen]] = []
    self._binaries: list[list[int]] = []
    self._logs: list[str] = []

  @property
  def addresses(self) -> list[str]:
    host = f'[{self._host}]' if ':' in self._host else self._host
    return [f'{host}:{port}' for port in self._ports or []]

  @property
  def pids(self) -> list[int]:
    return [p.pid for p in self._processes if p is not None]

  @property
  def binary_pids(self) -> list[int]:
    return [pid for pids in self._binaries for pid in pids]

  def log_path(self, index: int) -> str:
    return self._logs[index]

  def __enter__(self) -> 'LocalWorkers':
    try:
      self.start()
    except BaseException:
      self.stop(keep_logs=True)
      raise
    return self

  def __exit__(self, exc_type, *unused_exc_info):
    self.stop(keep_logs=exc_type is not None)

  def start(self) -> None:
    """Starts every worker and waits until each accepts connections.

    Raises:
      WorkerError: naming a worker whose port is in use, that exited, or that was not
        listening within `startup_timeout`.
    """
    if self._processes:
      raise RuntimeError('These workers are already started.')
    if self._log_dir is None:
      self._log_dir = tempfile.mkdtemp(prefix='tff_workers_')
    os.makedirs(self._log_dir, exist_ok=True)
    if self._ports is None:
      self._ports = [portpicker.pick_unused_port() for _ in range(self._num())]
    self._processes = [None] * len(self._ports)
    self._binaries = [[] for _ in self._ports]
    self._logs = [os.path.join(self._log_dir, f'worker_{i}_{port}.log')
                  for i, port in enumerate(self._ports)]
    for index in range(len(self._ports)):
      self._launch(index)
    for index in range(len(self._ports)):
      self._wait_ready(index)

  def _num(self) -> int:
    return len(self._ports) if self._ports else self._requested

  def _launch(self, index: int) -> None:
    try:
      worker_launcher.check_port_free(self._ports[index])
    except worker_launcher.PortInUseError as e:
      raise WorkerError(self.addresses[index], str(e)) from None
    flags = [f'--port={self._ports[index]}', f'--listen_host={self._host}',
             f'--grpc_max_message_length_megabytes={self._max_megabytes}']
    if self._credentials is not None:
      flags += self._credentials.launcher_flags()
    flags += self._worker_flags
    with open(self._logs[index], 'ab') as log:
      self._processes[index] = worker_launcher.start_launcher(
          flags, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

  def _wait_ready(self, index: int) -> None:
    process = self._processes[index]
    try:
      # The launcher listens once its worker_binary does.
      worker_launcher.wait_until_listening(process, self._ports[index],
                                           timeout=self._startup_timeout,
                                           host=self._host)
    except worker_launcher.WorkerStartError as e:
      if process.poll() is None:  # E.g. sharing its port with another process.
        process.kill()
      process.wait()
      raise WorkerError(self.addresses[index], f'{e} Log {self._logs[index]}:\n'
                        f'{self._tail(index)}') from None
    self._binaries[index] = runtime.worker_binaries(process.pid)

  def _tail(self, index: int, lines: int = 20) -> str:
    try:
      with open(self._logs[index], errors='replace') as f:
        return ''.join(f.readlines()[-lines:])
    except OSError:
      return ''

  def _wait_gone(self, index: int) -> None:
    """Waits until worker `index`'s worker_binary has exited (the kernel kills it when
    its launcher dies; it is not this process's child to reap)."""
    for pid in self._binaries[index]:
      while os.path.exists(f'/proc/{pid}') and not _zombie(pid):
        time.sleep(0.01)
    self._binaries[index] = []

  def kill(self, index: int, sig: int = signal.SIGKILL) -> None:
    """Sends `sig` to worker `index`'s launcher and reaps it (SIGKILL simulates a
    crashed machine: the kernel kills its worker_binary too)."""
    process = self._processes[index]
    if process is not None and process.poll() is None:
      process.send_signal(sig)
      process.wait()
    self._wait_gone(index)

  def restart(self, index: int) -> None:
    """Starts worker `index` again on its port (after `kill` or a crash)."""
    self.kill(index)
    self._launch(index)
    self._wait_ready(index)

  def stop(self, timeout: float = 5.0, keep_logs: bool = False) -> None:
    """Stops every worker (SIGINT, then SIGKILL after `timeout` s) and reaps it; removes
    the temporary log directory unless `keep_logs` (a `log_dir` given is kept)."""
    running = [p for p in self._processes if p is not None and p.poll() is None]
    for process in running:
      process.send_signal(signal.SIGINT)
    deadline = time.monotonic() + timeout
    for process in running:
      try:
        process.wait(max(deadline - time.monotonic(), 0.01))
      except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for index in range(len(self._binaries)):
      self._wait_gone(index)
    self._processes = []
    if not keep_logs and self._temporary_log_dir and self._log_dir is not None:
      shutil.rmtree(self._log_dir, ignore_errors=True)
      self._log_dir = None


def _zombie(pid: int) -> bool:
  try:
    with open(f'/proc/{pid}/stat', 'rb') as f:
      return f.read().rsplit(b')', 1)[1].split()[0] == b'Z'
  except OSError:
    return True
