"""Leaves no TFF `worker_binary` behind, when asked to.

TFF 0.87 starts its C++ runtime as a `worker_binary` subprocess the first time a
computation runs, and only stops it when a Python finalizer happens to run: the process
often outlives the interpreter, holding the parent's stdout open (so `python x.py | tail`
never ends). Nothing here happens on import; a program opts in:

  with tff_robust.distributed.runtime.worker_binaries_stopped():
    ...  # run TFF computations

stops this process's workers when the block ends (also by an exception), and, while the
block runs and if nobody else handles SIGTERM, turns SIGTERM into a normal exit so that
`kill PID` (or a job scheduler's timeout) stops the workers too. A process killed by
SIGKILL (or the kernel's out-of-memory killer) runs no code at all: with
`worker_binaries_stopped(even_when_killed=True)` a tiny guardian process
(`tff_robust.distributed.worker_guardian`) kills this process's workers when it dies.
`stop_worker_binaries` does the stopping alone, e.g. at the end of a test session.
"""

import contextlib
import math
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from typing import Optional

from tff_robust.common import teardown
from tff_robust.distributed import worker_guardian

_BINARY_NAME = b'worker_binary'


def _children_running(binary_name: bytes, parent_pid: int) -> list[int]:
  """Pids of the running children of `parent_pid` whose command line names
  `binary_name`."""
  pids = []
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/stat', 'rb') as f:
        # The command name may hold spaces and parentheses: the fields after it start
        # at the last ')'.
        fields = f.read().rsplit(b')', 1)[1].split()
      with open(f'/proc/{entry}/cmdline', 'rb') as f:
        cmdline = f.read()
    except (OSError, IndexError):
      continue
    state, parent = fields[0], int(fields[1])
    if parent == parent_pid and state != b'Z' and binary_name in cmdline:
      pids.append(int(entry))
  return pids


def worker_binaries(parent_pid: Optional[int] = None) -> list[int]:
  """Pids of the running `worker_binary` processes that this Python process (or the
  process `parent_pid`) started."""
  return _children_running(_BINARY_NAME,
                           os.getpid() if parent_pid is None else parent_pid)


def _forget_stopped_workers() -> None:
  """Makes TFF's local ServiceManagers forget the workers stopped here.

  A manager whose process is None starts a fresh worker when it next needs one (so a
  program may go on computing after `stop_worker_binaries`) instead of signalling a
  reaped pid. Its finalizer, which would look up `subprocess.Popen` during interpreter
  teardown and print an ignored AttributeError, has nothing left to stop: it is
  replaced for these managers' class only.
  """
  for manager in teardown.service_managers():
    manager._process = None  # pylint: disable=protected-access
    manager._stub = None  # pylint: disable=protected-access
    type(manager).__del__ = teardown.stop_nothing


def stop_worker_binaries(timeout: float = 5.0) -> None:
  """Stops (SIGINT, then SIGKILL after `timeout` seconds) this process's worker_binary
  children and reaps them."""
  pids = worker_binaries()
  for pid in pids:
    _signal(pid, signal.SIGINT)
  deadline = time.monotonic() + timeout
  for pid in [pid for pid in pids if not reap(pid, deadline)[0]]:
    _signal(pid, signal.SIGKILL)
    reap(pid)
  if pids:  # Else no manager holds a worker (the walk costs ~0.2–0.5 s).
    _forget_stopped_workers()


def _signal(pid: int, sig: int) -> None:
  try:
    os.kill(pid, sig)
  except ProcessLookupError:
    pass


def reap(pid: int, deadline: float = math.inf) -> tuple[bool, Optional[int]]:
  """Waits until `deadline` (a `time.monotonic()` time) for the child process `pid`
  to end, and reaps it.

  Returns (ended, exit code): the code as `subprocess.Popen.returncode` reports it
  (−N for a signal N), None when it had been reaped elsewhere or is not a child of
  this process. Polls instead of blocking in `waitpid`, so that a signal handler may
  call it while the code it interrupted waits for the same child (`Popen.wait`, whose
  lock a second `Popen.wait` would spin on until its timeout).
  """
  while True:
    try:
      done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # Not our child any more, or already reaped.
      return True, None
    if done:
      return True, os.waitstatus_to_exitcode(status)
    if time.monotonic() >= deadline:
      return False, None
    time.sleep(0.01)


def _exit_on_sigterm(signum, frame):
  del frame
  raise SystemExit(128 + signum)  # Unwinds through `finally`, unlike the default.


@contextlib.contextmanager
def _guardian():
  """Runs `tff_robust.distributed.worker_guardian` over the workers started in the block."""
  token = f'{os.getpid()}-{secrets.token_hex(8)}'
  previous = os.environ.get(worker_guardian.ENVIRONMENT_VARIABLE)
  # Run by path: `python -m tff_robust.distributed.worker_guardian` would import the package,
  # i.e. TensorFlow, for a process that only waits. A session of its own keeps it out
  # of the terminal's Ctrl-C and hang-up, which would otherwise end it first.
  guardian = subprocess.Popen(
      [sys.executable, '-I', os.path.abspath(worker_guardian.__file__), token],
      stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
  os.environ[worker_guardian.ENVIRONMENT_VARIABLE] = token
  try:
    yield
  finally:
    if previous is None:
      del os.environ[worker_guardian.ENVIRONMENT_VARIABLE]
    else:
      os.environ[worker_guardian.ENVIRONMENT_VARIABLE] = previous
    guardian.stdin.close()  # The guardian's end of file, as if this process died.
    try:
      guardian.wait(timeout=10)
    except subprocess.TimeoutExpired:
      guardian.kill()
      guardian.wait()


@contextlib.contextmanager
def worker_binaries_stopped(timeout: float = 5.0, even_when_killed: bool = False):
  """Stops this process's worker_binary children when the block ends, however it ends.

  While the block runs in the main thread, a SIGTERM that nobody else handles exits
  through the block (exit status 143) instead of killing Python on the spot; the
  previous handler is restored afterwards.

  Args:
    timeout: Seconds a worker gets to stop after SIGINT before SIGKILL.
    even_when_killed: Also when this process is killed by SIGKILL (Linux): a guardian
      process, started for the block, kills the worker_binary processes started in
      the block once this process is gone (`tff_robust.distributed.worker_guardian`).
  """
  take_sigterm = (threading.current_thread() is threading.main_thread() and
                  signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
  with contextlib.ExitStack() as stack:
    if even_when_killed:
      stack.enter_context(_guardian())
    if take_sigterm:
      signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
      yield
    finally:
      if take_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
      stop_worker_binaries(timeout)
