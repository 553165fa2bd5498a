"""One owner per run directory: an OS lock on a file inside it.

Two processes writing one run (a retried job, two terminals) interleave their metrics
rows and checkpoints. `owned(directory)` takes an exclusive `fcntl.flock` on
`<directory>/owner.lock` and writes the owner's pid into it. The kernel releases a
flock when its process ends, however it ends (SIGKILL, the OOM killer), so no stale
lock is ever left behind and nothing has to be cleaned up by hand.

Standard library only: a test or a tool can hold a run's lock without importing
TensorFlow.
"""

import contextlib
import fcntl
import os
from typing import Iterator, Optional

LOCK_FILE = 'owner.lock'

# Directories this process owns (real path → nesting depth). A flock is held per open
# file description, so a second `owned()` of the same directory in this process (the
# binary's, then the experiment runner's) must reuse the first, not lock against it.
_OWNED: dict[str, int] = {}


class RunLockedError(RuntimeError):
  """Another process owns the run directory.

  Attributes:
    path: The run directory.
    owner: The owner's pid, or None if it has not written it yet.
  """

  def __init__(self, path: str, owner: Optional[int]):
    self.path = path
    self.owner = owner
    who = f'process {owner}' if owner else 'another process'
    super().__init__(
        f'{path}: {who} is running this run. Wait for it to finish, or stop it '
        '(rerun the same command afterwards to resume); two processes must not '
        'write one run')


class RunDirectoryError(RuntimeError):
  """The run directory cannot be created (a file is in its place, or in an
  ancestor's); the message is one line naming the path and the fix."""

  def __init__(self, path: str, problem: str):
    self.path = path
    super().__init__(f'{path}: {problem}. Move it away, or choose another run '
                     'directory (--experiment_name / --root_output_dir / --output_dir)')


def owner(directory: str) -> Optional[int]:
  """The pid written in `directory`'s lock file, or None."""
  try:
    with open(os.path.join(directory, LOCK_FILE), encoding='ascii') as f:
      text = f.read().strip()
  except (OSError, UnicodeDecodeError):
    return None
  return int(text) if text.isdigit() else None


@contextlib.contextmanager
def owned(directory: str) -> Iterator[None]:
  """Holds `directory` (created if missing) for this process for the block.

  Raises:
    RunLockedError: at once, without waiting, if another process holds it.
    RunDirectoryError: if `directory` cannot be created.
  """
  key = os.path.realpath(directory)
  if key in _OWNED:
    _OWNED[key] += 1
    try:
      yield
    finally:
      _OWNED[key] -= 1
    return
  _make_directory(directory)
  # Python opens files non-inheritable: a worker_binary started by this process
  # does not keep the lock alive after the owner dies.
  descriptor = os.open(os.path.join(directory, LOCK_FILE), os.O_RDWR | os.O_CREAT,
                       0o644)
  try:
    try:
      fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise RunLockedError(directory, owner(directory)) from None
    os.ftruncate(descriptor, 0)
    os.write(descriptor, f'{os.getpid()}\n'.encode('ascii'))
    _OWNED[key] = 1
    try:
      yield
    finally:
      del _OWNED[key]
  finally:
    os.close(descriptor)  # Releases the flock.


def _make_directory(directory: str) -> None:
  if os.path.lexists(directory) and not os.path.isdir(directory):
    raise RunDirectoryError(directory, 'is a file, not a directory')
  try:
    os.makedirs(directory, exist_ok=True)
  except OSError as e:
    raise RunDirectoryError(directory, f'cannot be created ({e.strerror or e})') from e
