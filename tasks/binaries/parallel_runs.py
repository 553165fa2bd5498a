"""--parallel_runs: a sweep binary's runs trained by several copies of it at once.

A run keeps about 1.3 cores busy: its Python driver and TFF's runtime (a
`worker_binary` process) take turns, each waiting for the other. With
`--parallel_runs=N` a sweep binary (sweep, main_job, leaderboard) first starts N copies
of itself, its own command line plus `--run_shard=i/N`: copy i trains runs i, i + N,
i + 2N, ... of the grid (`tasks.simulation.sweep.run_sweep`'s `shard`), skipping
finished ones as every sweep does, and writes no table or page. Every run, its seed
and its results are those of one process; each copy records its runs as they finish
(run directory, ledger). When all copies have ended, the binary goes on as with one
process: the runs they finished are skipped, one a copy left unfinished (it failed or
was killed) is resumed and trained here, and the tables and pages are written.

A copy that fails costs only speed: its unfinished runs are trained by the binary
afterwards, after a line naming the copy's exit status (its own messages are above).
Interrupted (Ctrl-C, SIGTERM), the binary interrupts its copies and waits for them.
"""

import subprocess
import sys
from typing import Optional

from absl import flags

from tasks.binaries import exit_status

FLAGS = flags.FLAGS
# Its flags belong to the binary that defines them (its --helpshort lists them).
flags.disclaim_key_flags()


def define_flags(default: int = 1) -> None:
  """--parallel_runs (default `default`) and --run_shard (set on the copies)."""
  flags.DEFINE_integer(
      'parallel_runs', default, 'Train the runs in this many processes at once (copies '
      'of this binary, each with --run_shard): a run keeps about 1.3 cores busy, so '
      'on 2 cores 2 copies finish a sweep sooner. Results are the same.',
      lower_bound=1)
  flags.DEFINE_string(
      'run_shard', '', 'i/N: train only runs i, i + N, ... of the grid (from 0) and '
      'write no table; --parallel_runs sets it on its copies.')
  flags.register_validator(
      'run_shard', lambda value: not value or _parsed(value) is not None,
      message='--run_shard must be i/N with integers 0 ≤ i < N, e.g. 0/2.')


def _parsed(value: str) -> Optional[tuple[int, int]]:
  try:
    index, count = (int(part) for part in value.split('/'))
  except ValueError:
    return None
  return (index, count) if 0 <= index < count else None


def shard() -> tuple[int, int]:
  """(i, N) of --run_shard; (0, 1), every run, without it."""
  return _parsed(FLAGS.run_shard) if FLAGS.run_shard else (0, 1)


def is_copy() -> bool:
  """Whether this process is one of the copies (it trains its shard, writes no table)."""
  return bool(FLAGS.run_shard)


def starts_copies() -> bool:
  """Whether `train_in_copies` starts copies (--parallel_runs > 1, not in a copy)."""
  return FLAGS.parallel_runs > 1 and not is_copy()


def train_in_copies(module: str) -> None:
  """With --parallel_runs=N > 1, outside a copy: runs `python -m module` with this
  process's arguments and --run_shard=i/N for i < N, all at once, and waits for them."""
  if not starts_copies():
    return
  count = FLAGS.parallel_runs
  copies = []
  try:
    for index in range(count):
      # One progress bar: the first copy's.
      quiet = [] if index == 0 else ['--noprogress']
      # The flags given last win: this process's own --parallel_runs is overridden.
      copies.append(subprocess.Popen(
          [sys.executable, '-m', module, *sys.argv[1:], *quiet, '--parallel_runs=1',
           f'--run_shard={index}/{count}']))
      exit_status.interrupt_with_this_binary(copies[-1])
    for index, copy in enumerate(copies):
      if copy.wait() != 0:
        print(f'Copy {index} of {count} (--run_shard={index}/{count}) ended with exit '
              f'status {copy.returncode} (its messages are above); this process '
              'trains the runs it left.', file=sys.stderr)
  finally:
    exit_status.interrupt_copies()  # Those still running, on an error here.
