"""Workers this process starts on this machine, reachable from this machine only.

  LocalWorkers              N workers on loopback ports (tests, demos, one big
                            machine), always stopped when the block ends
  private_local_execution   the driver's own worker for the computations no other
                            context takes, behind a Unix socket only this user reaches

Each worker is `python -m tff_robust.distributed` (`worker_launcher`): its
worker_binary in a private network namespace behind a forwarder. Trusts the
launcher to refuse a used port and to report when it listens; trusts nobody else on
the machine, hence loopback or a Unix socket only.
"""

import collections
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Optional, Sequence

import portpicker
import tensorflow_federated as tff

from tff_robust.common import arguments
from tff_robust.distributed import runtime
from tff_robust.distributed import worker_addresses
from tff_robust.distributed import worker_connection
from tff_robust.distributed import worker_credentials
from tff_robust.distributed import worker_launcher
from tff_robust.distributed import worker_network


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
    if (credentials is not None and
        not isinstance(credentials, worker_credentials.Credentials)):
      credentials = worker_credentials.Credentials.worker(os.fspath(credentials))
    self._credentials = credentials
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
      raise worker_connection.WorkerError(self.addresses[index], str(e)) from None
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
      raise worker_connection.WorkerError(
          self.addresses[index],
          f'{e} Log {self._logs[index]}:\n{self._tail(index)}') from None
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
    worker = worker_connection.WorkerContext(
        f'unix:{path}', worker_addresses.DEFAULT_MAX_MESSAGE_BYTES, startup_timeout,
        worker_addresses.DEFAULT_UNAVAILABLE_TIMEOUT_SECONDS, None)
    context = worker.sync_context()
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
      raise worker_connection.WorkerError(
          f'unix:{path}', 'the driver\'s own worker exited with status '
          f'{process.returncode} before listening (its error is above).')
    try:
      with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.connect(path)
      return
    except OSError:
      if time.monotonic() > deadline:
        raise worker_connection.WorkerError(
            f'unix:{path}', 'the driver\'s own worker was not listening after '
            f'{timeout:g} s.') from None
      time.sleep(0.02)

