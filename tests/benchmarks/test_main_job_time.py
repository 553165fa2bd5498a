"""benchmarks.main_job_time's comparison of two leaderboard ledgers."""

import os
import tempfile

from absl import flags
from absl.testing import absltest

from benchmarks import main_job_time

_HEADER = 'run,fingerprint,final_accuracy,diverged,secure_average_calls_per_round\n'


def _ledger(rows: str) -> str:
  handle, path = tempfile.mkstemp(suffix='.csv')
  with os.fdopen(handle, 'w') as f:
    f.write(_HEADER + rows)
  return path


class LedgerComparisonTest(absltest.TestCase):

  def _compared(self, rows):
    path = _ledger(rows)
    self.addCleanup(os.remove, path)
    return main_job_time._ledger_without_fingerprints(path)  # pylint: disable=protected-access

  def test_fingerprints_and_row_order_do_not_count(self):
    self.assertEqual(
        self._compared('gm_alie,aaaa,0.85,0,3.0\nmean_alie,bbbb,0.84,0,1.0\n'),
        self._compared('mean_alie,cccc,0.84,0,1.0\ngm_alie,dddd,0.85,0,3.0\n'))

  def test_results_count_to_the_last_digit(self):
    self.assertNotEqual(self._compared('gm_alie,aaaa,0.8475,0,3.0\n'),
                        self._compared('gm_alie,aaaa,0.8476,0,3.0\n'))

  def test_an_empty_ledger_is_an_error_not_a_match(self):
    with self.assertRaisesRegex(SystemExit, 'no finished run'):
      self._compared('')


class ImportTest(absltest.TestCase):

  def test_importing_leaves_the_global_flags_valid(self):
    # Tests import this module into processes that then parse other binaries'
    # flags: a flag required at import would fail every one of those parses.
    flags.FLAGS.validate_all_flags()


if __name__ == '__main__':
  absltest.main()
