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


def _leaderboard(output_dir, results_dir, readme, *flags):
  return subprocess.run(
      [sys.executable, '-m', 'tasks.binaries.leaderboard',
       *_leaderboard_flags(output_dir, results_dir, readme, *flags)],
      cwd=_REPO, capture_output=True, text=True, timeout=600, env=processes.quiet_env())


def _table(page: str) -> str:
  return page[page.index('| rank |'):]


def _empty_readme(tmp_path):
  readme = tmp_path / 'README.md'
  readme.write_text(f'{leaderboard.README_BEGIN}\n{leaderboard.README_END}\n',
                    encoding='utf-8')
  return readme


def test_one_command_writes_the_plain_and_the_momentum_pages(tmp_path):
  readme = _empty_readme(tmp_path)
  result = _leaderboard(tmp_path / 'runs', tmp_path / 'results', readme)
  assert result.returncode == 0, result.stderr[-3000:]
  results = tmp_path / 'results'
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
  assert plain.strip() in readme.read_text(encoding='utf-8')
  for stem in ('leaderboard_emnist_linear', 'leaderboard_emnist_linear_momentum'):
    assert (results / f'{stem}.png').stat().st_size > 5000


def test_the_ledger_carries_finished_runs_to_another_machine(tmp_path):
  results = tmp_path / 'results'
  first = _leaderboard(tmp_path / 'runs', results, '', '--worker_momenta=0',
                       '--attacks=sign_flip')
  assert first.returncode == 0, first.stderr[-3000:]
  ledger_path = results / 'leaderboard_emnist_linear_runs.csv'
  assert len(ledger_path.read_text().splitlines()) == 1 + 4  # 2 rows × (clean, ρ=.3)
  page = (results / 'leaderboard_emnist_linear.md').read_text()

  # Three more invocations, in one process (`command_lines.run_each`), each writing
  # its pages apart: (1) no run directories here: the ledger's runs are skipped, only
  # new cells train, and the table keeps the ledger's numbers; (2) every run in the
  # ledger, on a machine that never ran one (a fresh clone): nothing trains, and the
  # pages are written from the ledger alone; (3) a damaged ledger stops the binary
  # before training, naming the file and the fix.
  readme = _empty_readme(tmp_path)
  damaged = tmp_path / 'damaged_runs.csv'
  damaged.write_text('junk\n')
  second, fresh, broken = command_lines.run_each('tasks.binaries.leaderboard', [
      _leaderboard_flags(tmp_path / 'elsewhere', tmp_path / 'wider', readme,
                         '--worker_momenta=0', f'--ledger={ledger_path}'),
      _leaderboard_flags(tmp_path / 'fresh', tmp_path / 'fresh_pages', '',
                         '--worker_momenta=0', f'--ledger={ledger_path}'),
      _leaderboard_flags(tmp_path / 'third', tmp_path / 'third_pages', '',
                         '--worker_momenta=0', f'--ledger={damaged}'),
  ])
  assert second.returncode == 0, second.stderr[-3000:]
  assert second.stderr.count('in the ledger, skipped.') == 4
  wider = (tmp_path / 'wider' / 'leaderboard_emnist_linear.md').read_text()
  assert '6 of its 6 runs are finished, 2 of them by this invocation' in wider
  assert wider.strip() in readme.read_text(encoding='utf-8')
  assert len(ledger_path.read_text().splitlines()) == 1 + 6
  for label in ('mean', 'bucketing+median'):
    clean = next(line for line in _table(page).splitlines() if f' {label} ' in line)
    assert clean.split('|')[3] in wider, label  # The same clean accuracy.

  assert fresh.returncode == 0, fresh.stderr[-3000:]
  assert fresh.stderr.count('in the ledger, skipped.') == 6
  page = (tmp_path / 'fresh_pages' / 'leaderboard_emnist_linear.md').read_text()
  assert '6 of its 6 runs are finished, 0 of them by this invocation' in page
  assert _table(page) == _table(wider)

  assert broken.returncode == 2
  assert f'ERROR: {damaged}: line 1' in broken.stderr
  assert 'git checkout' in broken.stderr
  assert not (tmp_path / 'third' / 'runs').exists()


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
