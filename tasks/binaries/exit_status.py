"""How the binaries end: exit statuses, and one line instead of a traceback.

  0    finished
  1    bad flags (absl), or an output directory holding a run of other flags (or of
       more finished rounds than --rounds), or a task of your own (--task=module:function) that does not follow the `Task`
       protocol (`tasks.builders.TaskError`, naming the problem and the fix)
  2    a file the run reads is unreadable or inconsistent (`run_errors.RunFileError`:
       checkpoint, config.json, metrics.csv, TensorBoard directory; a run
       directory that is a file, `run_lock.RunDirectoryError`; a missing or
       malformed data file, a damaged leaderboard ledger), or a round left a
       non-finite model or non-finite losses or accuracy; or flags valid one by one cannot train together
       (`aggregator_flags.UnworkableSettingsError`, refused right after parsing); or
       some runs of a sweep failed (the others ran; the table marks them)
       another process owns the run directory (`run_lock`: one line naming it and
       the owner's pid)
  3    a TFF worker failed mid-round (`--workers`)
  130  Ctrl-C (SIGINT), 143 SIGTERM: one line, "interrupted after round r; rerun the
       same command to resume"; the finished rounds are kept

The errors of status 2 are ones the user fixes by hand; their message names the file,
what is wrong and the fix, so it is printed as one stderr line, without a traceback.
"""

import atexit
import contextlib
import logging
import math
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Optional

from absl import app

from tff_robust.common import teardown
from tff_robust.distributed import runtime

FLAGS_OR_OTHER_RUN = 1
BAD_FILE = 2
NON_FINITE = 2
UNWORKABLE_SETTINGS = 2
RUNS_FAILED = 2
RUN_OWNED = 2
WORKER_FAILED = 3

# Errors whose message is the whole story (the file or flag, the problem and the fix),
# as (module, class), with the exit status each ends the binary with. They are looked
# up in the modules imported when one is raised (a module not imported yet raised
# none), so that a binary checks its flags before importing TensorFlow.
ONE_LINE_ERRORS = (
    ((('tasks.simulation.run_errors', 'RunFileError'),
      ('tasks.builders.data_utils', 'MissingDataError'),
      ('tasks.builders.data_utils', 'MalformedDataError'),
      ('tasks.simulation.ledger', 'LedgerError')), BAD_FILE),
    ((('tasks.simulation.run_lock', 'RunLockedError'),), RUN_OWNED),
    ((('tasks.simulation.run_lock', 'RunDirectoryError'),), BAD_FILE),
    ((('tasks.binaries.aggregator_flags', 'UnworkableSettingsError'),), UNWORKABLE_SETTINGS),
    ((('tasks.simulation.run_errors', 'ConfigMismatchError'),
      ('tasks.catalog', 'TaskError')), FLAGS_OR_OTHER_RUN),
)


def _one_line_status(error: BaseException) -> Optional[int]:
  """The exit status of `error` if it is one of `ONE_LINE_ERRORS`, else None."""
  for errors, status in ONE_LINE_ERRORS:
    for module, name in errors:
      cls = getattr(sys.modules.get(module), name, None)
      if cls is not None and isinstance(error, cls):
        return status
  return None


# The rounds the run's checkpoints hold, as the binary last reported them
# (`rounds_checkpointed`); None until its run has resumed.
_checkpointed: Optional[int] = None


def rounds_checkpointed(finished: int) -> None:
  """Records that the run's checkpoints hold `finished` rounds, for the interruption
  line ("after round `finished` − 1"): pass it as `on_checkpoint` of
  `tasks.simulation.experiment.run_experiment`, which reports once the run has
  resumed and after every checkpoint."""
  global _checkpointed
  _checkpointed = finished


def _where() -> str:
  # From memory: the signal handler may interrupt the main thread anywhere, e.g.
  # inside TFF's asyncio loop while a checkpoint is written, where reading the
  # checkpoints could neither run nor be waited for without a race.
  if _checkpointed is None:
    return ''
  return f'after round {_checkpointed - 1}' if _checkpointed else 'in round 0'


# Copies of this binary it started (`tasks.binaries.parallel_runs`): interrupted with it.
_COPIES: list = []


def interrupt_with_this_binary(process: subprocess.Popen) -> None:
  """Makes Ctrl-C or SIGTERM of this binary pass on to `process` (a copy of it), and
  wait for it to end, before the binary ends."""
  _COPIES.append(process)


def interrupt_copies(signum: int = signal.SIGINT, timeout: float = 60.0) -> None:
  """Sends `signum` to the copies still running and waits for them to end (each
  keeps its checkpoints, as the binary does), killing one still running after
  `timeout` seconds."""
  for copy in _COPIES:
    if copy.poll() is None:
      copy.send_signal(signum)
  deadline = time.monotonic() + timeout
  for copy in _COPIES:
    if not _ended(copy, deadline):
      copy.kill()
      _ended(copy, math.inf)


def _ended(process: subprocess.Popen, deadline: float) -> bool:
  """Whether `process` ended by `deadline` (reaped here, its `returncode` set, or
  reaped elsewhere, its status unknown).

  Not `process.wait(timeout)`: called from the signal handler that interrupted the
  binary's own `process.wait()`, it would spin on the lock that call holds until the
  timeout (Ctrl-C took 60 s to end a binary whose copies had ended at once). The
  handler then exits: a `process.wait()` resumed after it would find the process
  reaped and report status 0.
  """
  if process.returncode is None:
    ended, code = runtime.reap(process.pid, deadline)
    if not ended:
      return False
    if code is not None:
      process.returncode = code
  return True


def _exit_on_signal(signum, frame):
  """Ends the binary at once, with one line, on Ctrl-C or SIGTERM.

  Exiting on the spot, as SIGKILL would, is safe (a run's files survive a kill at any
  moment and a rerun resumes: `tasks.simulation.experiment`); unwinding instead would
  wait for the round in progress and TFF's teardown (8–15 s) and print their
  tracebacks. The worker_binary processes are stopped first.
  """
  del frame
  where = _where()
  print(f'{os.linesep if sys.stderr.isatty() else ""}interrupted'
        f'{" " + where if where else ""}; rerun the same command to resume',
        file=sys.stderr, flush=True)
  interrupt_copies(signum)
  runtime.stop_worker_binaries(timeout=1.0)
  sys.stdout.flush()
  os._exit(128 + signum)  # pylint: disable=protected-access


@contextlib.contextmanager
def _interruptions_end_the_binary():
  """Installs `_exit_on_signal` for SIGINT and SIGTERM in the block."""
  previous = {sig: signal.signal(sig, _exit_on_signal)
              for sig in (signal.SIGINT, signal.SIGTERM)}
  try:
    yield
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def exit_with(error, status: int):
  """Prints `error` as one `ERROR: ...` line on stderr and exits with `status`."""
  print('ERROR: ' + ' '.join(str(error).split()), file=sys.stderr)
  sys.exit(status)


@contextlib.contextmanager
def errors_as_one_line():
  """Ends the program with one stderr line and its exit status on an error of
  `ONE_LINE_ERRORS` raised in the block."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    status = _one_line_status(e)
    if status is None:
      raise
    exit_with(e, status)


def run(main: Callable[..., None],
        check_flags: Callable[..., None] = lambda *_: None,
        header: Callable[..., None] = lambda *_: None,
        settings: Optional[Callable[[], Any]] = None) -> None:
  """`absl.app.run(main)` for a binary that runs TFF computations.

  The binary's TFF worker_binary processes are stopped however it ends, even by
  SIGKILL (`runtime.worker_binaries_stopped(even_when_killed=True)`), and an error of
  `ONE_LINE_ERRORS` ends it with one stderr line and its exit status. All of `main`
  runs inside: an exit that skipped the workers' stop would also print TFF's
  finalizer traceback. So does an exit on bad flags, before `main`: the stop after
  `app.run` disarms the finalizer of the executor that importing TFF created.
  `check_flags` runs right after absl's parsing, for checks across flags whose
  errors are `ONE_LINE_ERRORS` (e.g. `aggregator_flags.UnworkableSettingsError`); so does
  `settings()`, if given, whose value (a `flag_groups.RunSettings`) `check_flags`,
  `header` and `main` are then passed. Ctrl-C and SIGTERM end the binary within a
  second or two with one line, saying where a rerun resumes from
  (`rounds_checkpointed`), and status 130 or 143. Run as the program (`python -m`),
  it ends without the interpreter's teardown once `main` returns or exits
  (`_exit_at_once`).

  The flags are parsed and checked before TensorFlow is imported; then `header()`
  prints the run's first line, and TensorFlow is imported, before `main`. Not inside
  `main`: imported after absl's initialization, TensorFlow creates its eager context
  in graph mode (`tensorflow.python.distribute.combinations` runs its
  `app.call_after_init` callback at once) and Keras models fail to build
  ("Attempt to convert a value (None)" in `Flatten`). With it, TFF's type
  deserialization is memoized for the binary
  (`tff_private.memoize_type_deserialization`: the same types, compiled sooner).
  """
  made = []

  def parse_flags(argv):
    argv = app.parse_flags_with_usage(argv)
    with errors_as_one_line():
      made.extend([settings()] if settings else [])
      check_flags(*made)
    header(*made)
    import tensorflow  # pylint: disable=g-import-not-at-top,unused-import
    from tff_robust.common import tff_private  # pylint: disable=g-import-not-at-top
    tff_private.memoize_type_deserialization()
    return argv

  def guarded_main(argv):
    with runtime.worker_binaries_stopped(even_when_killed=True):
      with errors_as_one_line():
        main(argv, *made)

  code = None
  try:
    with _interruptions_end_the_binary():
      app.run(guarded_main, flags_parser=parse_flags)
  except SystemExit as end:
    if not _is_the_program(main):
      raise
    code = end.code
  finally:
    runtime.stop_worker_binaries()
  if _is_the_program(main):
    _exit_at_once(code)


def _is_the_program(main: Callable[..., None]) -> bool:
  """Whether `main` is the running program's (`python -m binary`), not a binary's
  main called by another program (`tests/helpers/command_lines.py`)."""
  return getattr(main, '__module__', None) == '__main__'


def _exit_at_once(code) -> None:
  """Ends the program as `sys.exit(code)` does, without the interpreter's teardown,
  whose native finalizers (TensorFlow's, gRPC's) take seconds and write nothing a run
  needs (docs/decisions.md). The caller has stopped the worker_binaries; the exit
  hooks (`atexit`: the program's and a task module's own) still run, and the
  standard streams and logs are flushed."""
  if code is None:
    status = 0
  elif isinstance(code, int):
    status = code
  else:
    print(code, file=sys.stderr)  # As sys.exit prints a message.
    status = 1
  teardown.skip_disarming_at_exit()
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  logging.shutdown()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access
