"""The Figure 6 generator: its summaries against numpy, and end to end on tiny settings."""

import json
import os
import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import pytest

from benchmarks import personalization_report as report
from tests.helpers import processes

# Starts subprocesses (binaries, benchmarks or worker processes): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(method, aggregator, rho, seed, personalized, global_=None):
  run = {'method': method, 'aggregator': aggregator, 'rho': rho, 'seed': seed,
         'personalized/accuracy_mean': personalized}
  if global_ is not None:
    run['global_per_client/accuracy_mean'] = global_
  return run


class SummaryTest(parameterized.TestCase):

  def test_ditto_runs_give_the_global_line_too(self):
    self.assertEqual(
        report.line_values(_run('ditto', 'gm', 0.1, 0, 0.8, 0.7)),
        {'RFA + Ditto': 80.0, 'RFA': 70.0})
    # Algorithm 4 trains the global model on residuals: not the plain FedAvg line.
    self.assertEqual(
        report.line_values(_run('personalized_rfa', 'mean', 0.1, 0, 0.6)),
        {'FedAvg + Alg. 4': 60.0})

  @parameterized.parameters(0, 1, 2)
  def test_mean_min_max_over_seeds_match_numpy(self, seed):
    rng = np.random.default_rng(seed)
    accuracies = rng.random((4, 2, 3))  # seed × ρ × (personal, global, alg4)
    rhos = (0.0, 0.25)
    runs = []
    for s in range(4):
      for r, rho in enumerate(rhos):
        runs.append(_run('ditto', 'mean', rho, s, *accuracies[s, r, :2]))
        runs.append(_run('personalized_rfa', 'gm', rho, s, accuracies[s, r, 2]))
    summary = report.summarize(runs)
    for column, line in enumerate(('FedAvg + Ditto', 'FedAvg', 'RFA + Alg. 4')):
      for r, rho in enumerate(rhos):
        values = 100 * accuracies[:, r, column]
        np.testing.assert_allclose(summary[line][rho],
                                   (values.mean(), values.min(), values.max()))
    self.assertEqual(report.line_order(summary),
                     ['FedAvg', 'FedAvg + Ditto', 'RFA + Alg. 4'])

  def test_markdown_puts_ours_beside_the_paper(self):
    runs = [_run('personalized_rfa', 'gm', rho, s, acc)
            for s, acc in enumerate((0.5, 0.7)) for rho in (0.0, 0.25)]
    page = report.markdown(report.summarize(runs), {0.1: 0.8, 1.0: 0.9},
                                    1.0, 'cmd --x', 12.34, 2, 25, 0.2)
    self.assertIn('| RFA + Alg. 4 | 60.0 [50.0, 70.0] | 69.9 | 60.0 [50.0, 70.0] | 66.4 |',
                  page)
    self.assertIn('| 1 (chosen) | 90.0 |', page)
    self.assertIn('| 0.1 | 80.0 |', page)
    self.assertIn('12.3 minutes', page)
    self.assertIn('    cmd --x', page)


def test_generator_runs_end_to_end_and_writes_its_outputs(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'benchmarks.personalization', '--seeds=0',
       '--rhos=0,0.25', '--num_clients=8', '--rounds=2', '--clients_per_round=3',
       '--local_epochs=1', '--lambdas=0.1,1', f'--output_dir={tmp_path}'],
      cwd=_REPO, capture_output=True, text=True, timeout=900, env=processes.quiet_env())
  assert result.returncode == 0, result.stderr[-3000:]
  written = json.loads((tmp_path / 'fig6_personalization.json').read_text())
  assert set(written['lambda_sweep']) == {'0.1', '1.0'}
  assert max(written['lambda_sweep'].values()) == written['lambda_sweep'][
      str(written['chosen_lambda'])]
  # 2 ρ × (Ditto, Alg. 4) × (mean, GM), all with the chosen λ.
  assert len(written['runs']) == 8
  assert {r['ditto_lambda'] for r in written['runs'] if r['method'] == 'ditto'} == {
      written['chosen_lambda']}
  for run in written['runs']:
    assert 0 <= run['personalized/accuracy_mean'] <= 1
    assert (run['rho'] == 0) == (run['num_corrupted_clients'] == 0)
  page = (tmp_path / 'fig6_personalization.md').read_text()
  for line in ('FedAvg', 'RFA', 'FedAvg + Ditto', 'RFA + Ditto', 'FedAvg + Alg. 4',
               'RFA + Alg. 4'):
    assert f'| {line} | ' in page, line
  assert '--num_clients=8' in page
  assert (tmp_path / 'fig6_personalization.png').stat().st_size > 5000


if __name__ == '__main__':
  absltest.main()
