"""The leaderboard binary end to end on synthetic data: table, heatmap, README."""

import os
import shutil
import subprocess
import sys

import pytest

from tasks.simulation import leaderboard
from tests.helpers import command_lines
from tests.helpers import processes

# Starts subprocesses (binaries, benchmarks or worker processes): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def _leaderboard_flags(output_dir, results_dir, readme, *flags):
  return ['--data_source=synthetic', '--aggregators=mean,bucketing+median',
          '--attacks=sign_flip,label_flip', '--rhos=0,0.3', '--seeds=0',
          '--worker_momenta=0,0.5', '--rounds=1', '--clients_per_round=4',
          '--noprogress', f'--output_dir={output_dir}', f'--results_dir={results_dir}',
          f'--readme={readme}', *flags]


def _table(page: str) -> str:
  return page[page.index('| rank |'):]


def _empty_readme(directory):
  directory.mkdir(parents=True, exist_ok=True)
  readme = directory / 'README.md'
  readme.write_text(f'{leaderboard.README_BEGIN}\n{leaderboard.README_END}\n',
                    encoding='utf-8')
  return readme


@pytest.fixture(scope='module')
def invocations(tmp_path_factory):
  """The leaderboard command lines of the two tests below, run one after the other in
  one process (`command_lines.run_each`: each start costs a TensorFlow import):

  `whole`: the default grid of `_leaderboard_flags`, plain and momentum pages.
  `first`: a slice without momentum and one attack, its pages and ledger in `results`.
  Then three more, each writing its pages apart: `second` (no run directories
  there: the ledger's runs are skipped, only new cells train, and the table keeps the
  ledger's numbers), `fresh` (every run in the ledger, on a machine that never ran
  one, a fresh clone: nothing trains, the pages are written from the ledger alone),
  `broken` (a damaged ledger stops the binary before training, naming the file and
  the fix).
  """
  root = tmp_path_factory.mktemp('leaderboard')
  paths = dict(root=root, whole_readme=_empty_readme(root / 'whole'),
               readme=_empty_readme(root), results=root / 'results',
               ledger=root / 'results' / 'leaderboard_emnist_linear_runs.csv',
               damaged=root / 'damaged_runs.csv')
  paths['damaged'].write_text('junk\n')
  lines = dict(
      whole=_leaderboard_flags(root / 'whole' / 'runs', root / 'whole' / 'results',
                               paths['whole_readme']),
      first=_leaderboard_flags(root / 'runs', paths['results'], '', '--worker_momenta=0',
                               '--attacks=sign_flip'),
      second=_leaderboard_flags(root / 'elsewhere', root / 'wider', paths['readme'],
                                '--worker_momenta=0', f'--ledger={paths["ledger"]}'),
      fresh=_leaderboard_flags(root / 'fresh', root / 'fresh_pages', '',
                               '--worker_momenta=0', f'--ledger={paths["ledger"]}'),
      broken=_leaderboard_flags(root / 'third', root / 'third_pages', '',
                                '--worker_momenta=0', f'--ledger={paths["damaged"]}'))
  results = command_lines.run_each('tasks.binaries.leaderboard', list(lines.values()))
  return dict(zip(lines, results)), paths


def test_one_command_writes_the_plain_and_the_momentum_pages(invocations):
  runs, paths = invocations
  result = runs['whole']
  assert result.returncode == 0, result.stderr[-3000:]
  results = paths['root'] / 'whole' / 'results'
  momentum = (results / 'leaderboard_emnist_linear_momentum.md').read_text()
  assert '12 of its 12 runs are finished, 12 of them by this invocation' in momentum
  assert 'worst case ρ=0.3' in momentum
  for label in ('mean', 'mean +wm0.5', 'bucketing+median', 'bucketing+median +wm0.5'):
    assert f' | {label} | ' in momentum, label
  # The plain page has the rows without momentum, trained first, with the numbers
  # of the momentum page's same rows; the README shows it.
  plain = (results / 'leaderboard_emnist_linear.md').read_text()
  assert '6 of its 6 runs are finished, 6 of them by this invocation' in plain
  assert '+wm' not in _table(plain)
  for line in _table(plain).splitlines()[2:]:
    assert line.split('|', 2)[2] in momentum, line
  assert plain.strip() in paths['whole_readme'].read_text(encoding='utf-8')
  for stem in ('leaderboard_emnist_linear', 'leaderboard_emnist_linear_momentum'):
    assert (results / f'{stem}.png').stat().st_size > 5000


def test_the_ledger_carries_finished_runs_to_another_machine(invocations):
  runs, paths = invocations
  first, second, fresh, broken = (runs[k] for k in ('first', 'second', 'fresh', 'broken'))
  root = paths['root']
  assert first.returncode == 0, first.stderr[-3000:]
  page = (paths['results'] / 'leaderboard_emnist_linear.md').read_text()
  # 2 rows × (clean, ρ=.3), all in the ledger the next invocations read.
  assert '4 of its 4 runs are finished, 4 of them by this invocation' in page

  assert second.returncode == 0, second.stderr[-3000:]
  assert second.stderr.count('in the ledger, skipped.') == 4
  wider = (root / 'wider' / 'leaderboard_emnist_linear.md').read_text()
  assert '6 of its 6 runs are finished, 2 of them by this invocation' in wider
  assert wider.strip() in paths['readme'].read_text(encoding='utf-8')
  assert len(paths['ledger'].read_text().splitlines()) == 1 + 6
  for label in ('mean', 'bucketing+median'):
    clean = next(line for line in _table(page).splitlines() if f' {label} ' in line)
    assert clean.split('|')[3] in wider, label  # The same clean accuracy.

  assert fresh.returncode == 0, fresh.stderr[-3000:]
  assert fresh.stderr.count('in the ledger, skipped.') == 6
  page = (root / 'fresh_pages' / 'leaderboard_emnist_linear.md').read_text()
  assert '6 of its 6 runs are finished, 0 of them by this invocation' in page
  assert _table(page) == _table(wider)

  assert broken.returncode == 2
  assert f'ERROR: {paths["damaged"]}: line 1' in broken.stderr
  assert 'git checkout' in broken.stderr
  assert not (root / 'third' / 'runs').exists()


def test_a_narrowed_slice_leaves_the_committed_pages_alone(tmp_path):
  # In a copy of the sources, whose results/ and docs/results.md are the defaults: a
  # slice (--aggregators=mean) adds its runs to the ledger but must not replace the
  # full page and the docs' table by its one row.
  repo = tmp_path / 'repo'
  for package in ('tff_robust', 'baselines', 'tasks'):
    shutil.copytree(os.path.join(_REPO, package), repo / package,
                    ignore=shutil.ignore_patterns('__pycache__'))
  (repo / 'results').mkdir()
  page = repo / 'results' / 'leaderboard_emnist_linear.md'
  page.write_text('the full grid\n')
  (repo / 'docs').mkdir()
  readme = repo / 'docs' / 'results.md'
  readme.write_text(f'{leaderboard.README_BEGIN}\nthe full grid\n'
                    f'{leaderboard.README_END}\n', encoding='utf-8')
  result = subprocess.run(
      [sys.executable, '-m', 'tasks.binaries.leaderboard', '--data_source=synthetic',
       '--aggregators=mean', '--attacks=sign_flip', '--rhos=0', '--seeds=0',
       '--worker_momenta=0', '--rounds=1', '--clients_per_round=4', '--noprogress',
       f'--output_dir={tmp_path / "runs"}'],
      cwd=repo, capture_output=True, text=True, timeout=600, env=processes.quiet_env())
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'does not rewrite the committed pages (--results_dir, --readme)' in result.stderr
  assert page.read_text() == 'the full grid\n'
  assert 'the full grid' in readme.read_text(encoding='utf-8')
  assert (repo / 'results' / 'leaderboard_emnist_linear_runs.csv').exists()
  assert ' | mean | ' in (tmp_path / 'runs' / 'leaderboard.md').read_text()
