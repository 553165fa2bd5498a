"""benchmarks.dp_accuracy: every row at the target ε (its calls a round counted by the
accountant), the page's table, and the committed page's head.

The module defines --aggregators, --seeds, ... as the other benchmarks do, so its
checks run in a process of their own (two modules defining one flag name cannot be
imported together)."""

import os
import subprocess
import sys

from absl.testing import absltest
import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CHECKS = r'''
from absl import flags
from benchmarks import dp_accuracy
flags.FLAGS(['dp_accuracy', '--seeds=0,1', '--rhos=0.25', '--attacks=omniscient'])
rows = list(dp_accuracy.rows())
assert len(rows) == 7, rows
for row, nu in rows:
  z, passes, epsilon, records = dp_accuracy.noise_and_epsilon(row, nu or 0.2)
  assert passes == dict(gm=3, one_step_gm=1, gamma_mean=6, dp_fedavg=1)[row], row
  assert 7.99 <= epsilon <= 8.0 + 1e-9, (row, epsilon)
  assert records > z, (row, records, z)  # The clip's count takes a share.
noise = {key: (1.0, 3, 8.0, 1.1) for key in rows}
results = {('one_step_gm', 1.0, None, 0.0): [0.5, 0.6],
           ('one_step_gm', 1.0, 'omniscient', 0.25): [0.3, 0.4]}
page = dp_accuracy.page(results, noise, 60.0, 2, 4)
expected = ('| one-step RFA, relative ν 1 | 3 | 1.000 | 1.100 | 8.00 | '
            '55.0 [50.0, 60.0] | 35.0 [30.0, 40.0] |')
assert expected in page, page
assert len([l for l in page.splitlines() if l.startswith('| ')]) == 1 + len(rows), page
print('CHECKS PASSED')
'''


class DpAccuracyTest(absltest.TestCase):

  @pytest.mark.slow
  def test_rows_at_the_target_epsilon_and_the_page(self):
    env = dict(os.environ, PYTHONPATH=_REPO, TF_CPP_MIN_LOG_LEVEL='2')
    done = subprocess.run([sys.executable, '-c', _CHECKS], cwd=_REPO, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    self.assertIn('CHECKS PASSED', done.stdout, done.stderr[-3000:])

  def test_the_committed_page_names_its_command(self):
    with open(os.path.join(_REPO, 'results', 'dp_accuracy.md'), encoding='utf-8') as f:
      head = f.readline()
    self.assertIn('python -m benchmarks.dp_accuracy', head)
    self.assertIn('--target_epsilon=8', head)


if __name__ == '__main__':
  absltest.main()
