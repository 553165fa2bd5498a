"""The driver's connection to one worker: gRPC channels, readiness, the fail-fast stub.

  make_channel, wait_until_ready   a channel (mutual TLS with the driver's credentials,
                                   else insecure: a worker on this machine) and the
                                   wait for its handshake, naming a refused one
  WorkerError                      a worker unreachable, stopped or failing, by address
  WorkerContext                    one worker's channel, stub, executor factory and
                                   async TFF context

Trusts the worker to be TFF's worker_binary (behind its launcher's forwarder); trusts
no answer to come: every call has a deadline and a stopped worker is found by probes,
since TFF's own stub retries an unavailable worker forever and sets no deadline.
"""

import math
import threading
import time
from typing import Optional

import grpc
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import executor_pb2_grpc
# The compiler and TF-frontend transforms TFF's own local C++ context is built with;
# TFF 0.87 exports no public name for them.
from tff_robust.common import tff_private
from tff_robust.common.tff_private import native_compiler
from tff_robust.common.tff_private import tensorflow_computation

from tff_robust.distributed import worker_addresses
from tff_robust.distributed import worker_credentials

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


def _channel_options(max_message_bytes: int):
  return [('grpc.max_message_length', max_message_bytes),
          ('grpc.max_send_message_length', max_message_bytes),
          ('grpc.max_receive_message_length', max_message_bytes),
          *KEEPALIVE_OPTIONS]


def make_channel(address: str,
                 credentials: Optional[worker_credentials.Credentials] = None,
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
                     credentials: Optional[worker_credentials.Credentials] = None,
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
                  'from the same deployment (`python -m tff_robust.distributed.'
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
  """The remote executors' stub in place of TFF's `RemoteExecutorGrpcStub`: the same
  calls of the worker's `ExecutorGroup` service, but every call has a deadline and a
  worker that stays unreachable, or stops answering, raises `WorkerError`.

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
               call_timeout: float = worker_addresses.DEFAULT_CALL_TIMEOUT_SECONDS,
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
    if remaining <= 0 or not ready_within(self._channel, remaining):
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


def ready_within(channel, timeout: float) -> bool:
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


def _native_context(context_class, executor_factory):
  """A TFF execution context of `context_class` over `executor_factory`, with TFF's
  native compiler and TensorFlow's argument and result transforms."""
  return context_class(
      executor_fn=executor_factory,
      compiler_fn=native_compiler.desugar_and_transform_to_native,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result)


class WorkerContext:
  """One worker's channel, executor factory and async context."""

  def __init__(self, address: str, max_message_bytes: int, connect_timeout: float,
               unavailable_timeout: float,
               credentials: Optional[worker_credentials.Credentials],
               call_timeout: float = worker_addresses.DEFAULT_CALL_TIMEOUT_SECONDS):
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
    self.context = _native_context(tff.framework.AsyncExecutionContext,
                                   self.executor_factory)

  def new_async_context(self) -> tff.framework.AsyncExecutionContext:
    """Another async context on this worker, with executors of its own."""
    factory = tff.framework.ResourceManagingExecutorFactory(self._executor_fn)
    self._factories.append(factory)
    return _native_context(tff.framework.AsyncExecutionContext, factory)

  def sync_context(self) -> tff.framework.SyncExecutionContext:
    """A synchronous context running every call on this worker alone (no merging)."""
    return _native_context(tff.framework.SyncExecutionContext, self.executor_factory)

  def close(self):
    # Frees this client's executors on the worker (a gone worker is skipped).
    for factory in self._factories:
      for cardinalities in tff_private.executor_cardinalities(factory):
        try:
          factory.clean_up_executor(dict(cardinalities))
        except Exception:  # pylint: disable=broad-except
          pass
    self.stub.close()
    _close_channel(self.channel)

