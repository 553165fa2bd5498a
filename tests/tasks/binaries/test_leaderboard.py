"""The leaderboard binary end to end on synthetic data: table, heatmap, README."""

import os
import subprocess
import sys

from tasks.binaries import leaderboard
from tests.helpers import processes

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def test_leaderboard_runs_and_writes_its_pages(tmp_path):
  readme = tmp_path / 'README.md'
  readme.write_text(f'{leaderboard.README_BEGIN}\n{leaderboard.README_END}\n',
                    encoding='utf-8')
  result = subprocess.run(
      [sys.executable, '-m', 'tasks.binaries.leaderboard', '--data_source=synthetic',
       '--aggregators=mean,bucketing+median', '--attacks=sign_flip,label_flip',
       '--rhos=0,0.3', '--seeds=0', '--worker_momenta=0,0.5', '--rounds=1',
       '--clients_per_round=4', '--noprogress', f'--output_dir={tmp_path / "runs"}',
       f'--results_dir={tmp_path / "results"}', f'--readme={readme}'],
      cwd=_REPO, capture_output=True, text=True, timeout=600, env=processes.quiet_env())
  assert result.returncode == 0, result.stderr[-3000:]
  page = (tmp_path / 'results' / 'leaderboard_emnist_linear.md').read_text()
  assert 'worst case ρ=0.3' in page
  for label in ('mean', 'mean +wm0.5', 'bucketing+median', 'bucketing+median +wm0.5'):
    assert f' | {label} | ' in page, label
  assert page.strip() in readme.read_text(encoding='utf-8')
  assert (tmp_path / 'results' / 'leaderboard_emnist_linear.png').stat().st_size > 5000
