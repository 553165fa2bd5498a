r"""An experiment binary's wall time at two revisions, side by side, and whether their
results agree to the printed digit.

Runs `python -m tasks.binaries.<--job>` (each into a fresh temporary directory)
alternately from a checkout of another revision (`--baseline`, e.g. a `git worktree`
of the commit to compare against, with its own `.venv` link) and from this one,
`--repeats` times each (baseline first in odd pairs, this checkout first in even
ones), so that load from anything else on the machine hits both alike. Prints each
run's minutes, the ratio of the totals, and the results of both with whether they are
identical: the main job's table (its page without the timing header), or the
leaderboard's ledger of runs (every column but the configuration's fingerprint, which
hashes the code's configuration record, not the result).

  git worktree add --detach /tmp/main_job_base <commit>
  ln -s $PWD/.venv /tmp/main_job_base/.venv
  .venv/bin/python -m benchmarks.main_job_time --baseline=/tmp/main_job_base
  .venv/bin/python -m benchmarks.main_job_time --baseline=/tmp/main_job_base \
      --job=leaderboard -- --aggregators=gm,median --attacks=alie --rhos=0.1 --seeds=0

Extra arguments after `--` go to both binaries (e.g. `-- --aggregators=gm,mean` for
a shorter comparison). The leaderboard writes only into its temporary directory
(`--results_dir= --readme=`): its ledger there starts empty, so every run is timed.
"""

import csv
import os
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

_BASELINE = flags.DEFINE_string('baseline', None, 'Checkout of the revision to compare '
                                'against (its .venv/bin/python runs the job there).')
_JOB = flags.DEFINE_enum('job', 'main_job', ['main_job', 'leaderboard'],
                         'The binary of tasks.binaries to time.')
_REPEATS = flags.DEFINE_integer('repeats', 1, 'Runs of each revision.', lower_bound=1)

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where the binaries write: set here, so that each run starts from nothing.
_OWN_ARGS = ('output_dir', 'results_dir', 'readme', 'ledger', 'results_markdown',
             'update_committed_results')
# A sweep's marker of a run that could not finish (tasks.simulation.sweep.FAILED_MARKER).
_FAILED_MARKER = 'FAILED'


def run_job(checkout: str, extra_args, scratch: str) -> tuple[float, str]:
  """(seconds, its results as text) of one run of --job in `checkout`."""
  output_dir = tempfile.mkdtemp(dir=scratch)
  log_path = os.path.join(output_dir, 'log.txt')
  own_args = ['--results_dir=', '--readme='] if _JOB.value == 'leaderboard' else []
  start = time.perf_counter()
  # Output into a file: TFF's worker_binary keeps the pipes it inherits open.
  with open(log_path, 'w') as log:
    subprocess.run(
        [os.path.join(checkout, '.venv', 'bin', 'python'), '-m',
         f'tasks.binaries.{_JOB.value}', f'--output_dir={output_dir}', '--progress=false',
         *own_args, *extra_args], cwd=checkout, stdout=log, stderr=subprocess.STDOUT,
        check=True)
  seconds = time.perf_counter() - start
  failed = [root for root, _, files in os.walk(output_dir) if _FAILED_MARKER in files]
  if failed:
    sys.exit(f'{checkout}: {len(failed)} run(s) failed (see {log_path}), e.g. {failed[0]}.')
  if _JOB.value == 'leaderboard':
    return seconds, _ledger_without_fingerprints(os.path.join(output_dir, 'ledger.csv'))
  with open(os.path.join(output_dir, 'main_job.md')) as f:
    page = f.read()
  return seconds, page.split('-->', 1)[1].strip()


def _ledger_without_fingerprints(path: str) -> str:
  """The ledger's rows, sorted, without the configuration's fingerprint (it hashes the
  code's configuration record, not the result)."""
  with open(path, newline='') as f:
    reader = csv.DictReader(f)
    columns = [name for name in reader.fieldnames if name != 'fingerprint']
    rows = sorted(','.join(row[name] for name in columns) for row in reader)
  if not rows:
    sys.exit(f'{path}: no finished run to compare.')
  return '\n'.join([','.join(columns), *rows])


def main(argv):
  extra_args = argv[1:]
  overridden = [arg for arg in extra_args
                if arg.lstrip('-').split('=')[0].removeprefix('no') in _OWN_ARGS]
  if overridden:
    raise app.UsageError(f'{" ".join(overridden)}: this benchmark sets where the jobs '
                         'write (a fresh temporary directory each); leave it out.')
  checkouts = {'baseline': os.path.abspath(_BASELINE.value), 'this': _HERE}
  seconds = {name: [] for name in checkouts}
  results = {}
  with tempfile.TemporaryDirectory() as scratch:
    for repeat in range(_REPEATS.value):
      order = ['baseline', 'this'] if repeat % 2 == 0 else ['this', 'baseline']
      for name in order:
        elapsed, results[name] = run_job(checkouts[name], extra_args, scratch)
        seconds[name].append(elapsed)
        print(f'{name:8s} run {repeat + 1}: {elapsed / 60:.2f} min', flush=True)
  total = {name: sum(times) for name, times in seconds.items()}
  print(f'\nthis / baseline: {total["this"] / total["baseline"]:.3f} '
        f'({total["this"] / 60:.2f} min vs {total["baseline"] / 60:.2f} min over '
        f'{_REPEATS.value} run(s) each)')
  same = results['baseline'] == results['this']
  print(f'Results identical: {same}\n')
  print(results['this'] if same else
        f'baseline:\n{results["baseline"]}\n\nthis:\n{results["this"]}')
  if not same:
    sys.exit(1)


if __name__ == '__main__':
  # Required here, not at import: the flag registry is global, and a test that
  # imports this module would otherwise make every other binary's parse fail.
  flags.mark_flag_as_required('baseline')
  app.run(main)
