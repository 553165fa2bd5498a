"""Leaves no TFF `worker_binary` behind.

TFF 0.87 starts its C++ runtime as a `worker_binary` subprocess the first time a
computation runs, and only stops it when a Python finalizer happens to run: the process
often outlives the interpreter, holding the parent's stdout open (so `python x.py | tail`
never ends). Importing `tff_robust` registers `stop_worker_binaries` at exit, and, if
nobody else handles SIGTERM, turns SIGTERM into a normal exit so that `kill PID` (or a
job scheduler's timeout) also stops the worker.
"""

import atexit
import gc
import os
import signal
import threading
import time

_BINARY_NAME = b'worker_binary'


def _children_running(binary_name: bytes) -> list[int]:
  """Pids of this process's children whose command line names `binary_name`."""
  me = os.getpid()
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
    if parent == me and state != b'Z' and binary_name in cmdline:
      pids.append(int(entry))
  return pids


def worker_binaries() -> list[int]:
  """Pids of the `worker_binary` processes this Python process started and that run."""
  return _children_running(_BINARY_NAME)


def _disarm_tff_service_managers() -> None:
  """Keeps TFF's `ServiceManager.__del__` from running during interpreter teardown.

  That finalizer looks up `subprocess.Popen` when it runs; during teardown the module
  may already be gone, which prints an ignored AttributeError. The workers it would
  stop are stopped by `stop_worker_binaries` instead.
  """
  for manager in gc.get_objects():
    if type(manager).__name__ == 'ServiceManager' and hasattr(manager, '_process'):
      type(manager).__del__ = lambda self: None


def stop_worker_binaries(timeout: float = 5.0) -> None:
  """Stops (SIGINT, then SIGKILL after `timeout` seconds) this process's worker_binary
  children and reaps them."""
  pids = worker_binaries()
  for pid in pids:
    _signal(pid, signal.SIGINT)
  deadline = time.monotonic() + timeout
  while pids and time.monotonic() < deadline:
    pids = [pid for pid in pids if not _reaped(pid)]
    if pids:
      time.sleep(0.05)
  for pid in pids:
    _signal(pid, signal.SIGKILL)
    _reaped(pid, block=True)


def _signal(pid: int, sig: int) -> None:
  try:
    os.kill(pid, sig)
  except ProcessLookupError:
    pass


def _reaped(pid: int, block: bool = False) -> bool:
  try:
    done, _ = os.waitpid(pid, 0 if block else os.WNOHANG)
    return done == pid
  except ChildProcessError:  # Not our child any more, or already reaped.
    return True


def _stop_at_exit() -> None:
  _disarm_tff_service_managers()
  stop_worker_binaries()


def _exit_on_sigterm(signum, frame):
  del frame
  raise SystemExit(128 + signum)  # Runs the atexit handlers, unlike the default action.


atexit.register(_stop_at_exit)
if (threading.current_thread() is threading.main_thread() and
    signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
  signal.signal(signal.SIGTERM, _exit_on_sigterm)
