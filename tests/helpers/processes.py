"""Helpers of the tests that start Python programs: quiet TensorFlow, and which
worker_binary processes a program started and whether they still run."""

import contextlib
import os
import subprocess
import sys

from tff_robust.distributed import runtime

# The repository's root: programs started from there import its packages.
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def quiet_env() -> dict[str, str]:
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')


def reported_workers(text: str) -> list[int]:
  """The pids on the line `WORKERS pid ...` of a program's output."""
  line = next(l for l in text.splitlines() if l.startswith('WORKERS'))
  return [int(pid) for pid in line.split()[1:]]


def is_running(pid: int) -> bool:
  try:
    with open(f'/proc/{pid}/stat', 'rb') as f:
      return f.read().rsplit(b')', 1)[1].split()[0] != b'Z'
  except OSError:
    return False


def running(pids) -> list[int]:
  return [pid for pid in pids if is_running(pid)]


def worker_children(parent: int) -> list[int]:
  """The running worker_binary children of process `parent`."""
  return runtime.worker_binaries(parent)


def _command_line(pid: int) -> list[str]:
  try:
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
      return [a.decode(errors='replace') for a in f.read().split(b'\0') if a]
  except OSError:
    return []


def worker_launchers(parent: int = None) -> list[int]:
  """The running `tff_robust.distributed.worker_launcher` children of process
  `parent` (default this one)."""
  parent = os.getpid() if parent is None else parent
  found = []
  for entry in os.listdir('/proc'):
    if not entry.isdigit() or not is_running(int(entry)):
      continue
    try:
      with open(f'/proc/{entry}/stat', 'rb') as f:
        ppid = int(f.read().rsplit(b')', 1)[1].split()[1])
    except OSError:
      continue
    if ppid == parent and 'tff_robust.distributed.worker_launcher' in _command_line(
        int(entry)):
      found.append(int(entry))
  return found


def flag_value(pid: int, name: str) -> str:
  """The value of `--name=value` on process `pid`'s command line."""
  prefix = f'--{name}='
  return next(a[len(prefix):] for a in _command_line(pid) if a.startswith(prefix))


# Owns a run directory (argv[1]) until its stdin closes; prints `locked` once it does.
_RUN_OWNER = ('import sys; from tasks.simulation import run_lock\n'
              'with run_lock.owned(sys.argv[1]):\n'
              '  print("locked", flush=True); sys.stdin.read()\n')


@contextlib.contextmanager
def run_owner(directory: str, cwd: str):
  """Another process owning run directory `directory` for the block, already owning
  it when the block starts (it says so: no fixed wait). Yields its Popen."""
  child = subprocess.Popen([sys.executable, '-c', _RUN_OWNER, directory], cwd=cwd,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  try:
    assert child.stdout.readline() == 'locked\n', 'the owner process did not start'
    yield child
  finally:
    child.kill()
    child.wait()
    child.stdin.close()
    child.stdout.close()


# Runs `python -m <module> <args>`, prints `IMPORTING tensorflow` when it starts
# importing TensorFlow and, however it ends, `IMPORTED` and the heavy packages it
# imported, as its last stderr line.
_WATCHING_IMPORTS = """
import atexit, runpy, sys

class Announce:
  def find_spec(self, name, path=None, target=None):
    if name == 'tensorflow':
      print('IMPORTING tensorflow', file=sys.stderr, flush=True)
      sys.meta_path.remove(self)

sys.meta_path.insert(0, Announce())
sys.argv = sys.argv[1:]
# An exit hook: a binary run as the program ends without unwinding (exit_status).
atexit.register(lambda: print(
    'IMPORTED', *sorted(m for m in ('tensorflow', 'tensorflow_federated', 'jax')
                        if m in sys.modules), file=sys.stderr, flush=True))
runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)
"""


def run_watching_imports(module: str, *args: str) -> subprocess.CompletedProcess:
  """`python -m module *args` from the repository, its imports of TensorFlow told on
  stderr (`_WATCHING_IMPORTS`): a check that does not depend on timing."""
  return subprocess.run([sys.executable, '-c', _WATCHING_IMPORTS, module, *args],
                        cwd=REPOSITORY, env=quiet_env(), capture_output=True, text=True,
                        timeout=600)
