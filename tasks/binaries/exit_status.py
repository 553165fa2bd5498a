"""How the binaries end: exit statuses, and one line instead of a traceback.

  0    finished
  1    bad flags (absl), or an output directory holding a run of other flags
  2    a file the run reads is unreadable or inconsistent (`experiment.RunFileError`:
       checkpoint, config.json, metrics.csv, TensorBoard directory; a missing or
       malformed data file, a damaged leaderboard ledger), or a round left a
       non-finite model; or flags valid one by one cannot train together
       (`flag_groups.UnworkableSettingsError`, refused right after parsing); or
       some runs of a sweep failed (the others ran; the table marks them)
       another process owns the run directory (`run_lock`: one line naming it and
       the owner's pid)
  3    a TFF worker failed mid-round (`--workers`)
  143  SIGTERM (finished rounds are kept)

The errors of status 2 are ones the user fixes by hand; their message names the file,
what is wrong and the fix, so it is printed as one stderr line, without a traceback.
"""

import contextlib
import sys
from typing import Callable

from absl import app

from tasks.binaries import flag_groups
from tasks.builders import data_utils
from tasks.simulation import experiment
from tasks.simulation import ledger
from tasks.simulation import run_lock
from tff_robust import runtime

FLAGS_OR_OTHER_RUN = 1
BAD_FILE = 2
NON_FINITE = 2
UNWORKABLE_SETTINGS = 2
RUNS_FAILED = 2
RUN_OWNED = 2
WORKER_FAILED = 3

# Errors whose message is the whole story (the file or flag, the problem and the fix),
# with the exit status each ends the binary with.
ONE_LINE_ERRORS = (
    ((experiment.RunFileError, data_utils.MissingDataError,
      data_utils.MalformedDataError, ledger.LedgerError), BAD_FILE),
    ((run_lock.RunLockedError,), RUN_OWNED),
    ((flag_groups.UnworkableSettingsError,), UNWORKABLE_SETTINGS),
    ((experiment.ConfigMismatchError,), FLAGS_OR_OTHER_RUN),
)


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
  except tuple(e for errors, _ in ONE_LINE_ERRORS for e in errors) as e:
    exit_with(e, next(status for errors, status in ONE_LINE_ERRORS
                      if isinstance(e, errors)))


def run(main: Callable[[list[str]], None],
        check_flags: Callable[[], None] = lambda: None) -> None:
  """`absl.app.run(main)` for a binary that runs TFF computations.

  The binary's TFF worker_binary processes are stopped however it ends, even by
  SIGKILL (`runtime.worker_binaries_stopped(even_when_killed=True)`), and an error of
  `ONE_LINE_ERRORS` ends it with one stderr line and its exit status. All of `main`
  runs inside: an exit that skipped the workers' stop would also print TFF's
  finalizer traceback. So does an exit on bad flags, before `main`: the stop after
  `app.run` disarms the finalizer of the executor that importing TFF created.
  `check_flags` runs right after absl's parsing, for checks across flags whose
  errors are `ONE_LINE_ERRORS` (e.g. `flag_groups.UnworkableSettingsError`).
  """

  def parse_flags(argv):
    argv = app.parse_flags_with_usage(argv)
    with errors_as_one_line():
      check_flags()
    return argv

  def guarded_main(argv):
    with runtime.worker_binaries_stopped(even_when_killed=True):
      with errors_as_one_line():
        main(argv)

  try:
    app.run(guarded_main, flags_parser=parse_flags)
  finally:
    runtime.stop_worker_binaries()
