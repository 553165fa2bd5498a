"""The ledger of finished runs: round trip, merging, fingerprints and damaged files."""

import math
import os
import shutil
import tempfile

from absl.testing import absltest
from absl.testing import parameterized

from tasks.simulation import ledger

_ENTRIES = {
    ('gm_alie_rho0.25_seed0', 'a' * 16): ledger.Entry(0.8125, False, 3.0),
    ('mean_none_rho0_seed1', 'b' * 16): ledger.Entry(0.1 + 0.2, True, 1.0),
    ('krum_ipm_rho0.1_seed2', 'c' * 16): ledger.Entry(math.nan, True, math.nan),
}


def _same(a: ledger.Entry, b: ledger.Entry) -> bool:
  return all(x == y or (math.isnan(x) and math.isnan(y))
             for x, y in zip((a.final_accuracy, a.secure_average_calls_per_round),
                             (b.final_accuracy, b.secure_average_calls_per_round))
             ) and a.diverged == b.diverged


class LedgerTest(parameterized.TestCase):

  def _directory(self) -> str:
    directory = tempfile.mkdtemp(prefix='test_ledger_')
    self.addCleanup(shutil.rmtree, directory, ignore_errors=True)
    return directory

  def test_round_trip_is_exact_and_sorted_by_run(self):
    path = os.path.join(self._directory(), 'sub', 'ledger.csv')
    ledger.write(path, _ENTRIES)
    read = ledger.read(path)
    self.assertEqual(set(read), set(_ENTRIES))
    for key, entry in _ENTRIES.items():
      self.assertTrue(_same(read[key], entry), key)
    with open(path) as f:
      lines = f.read().splitlines()
    self.assertEqual(lines[0], ','.join(ledger.FIELDS))
    self.assertEqual([line.split(',')[0] for line in lines[1:]],
                     sorted(run for run, _ in _ENTRIES))
    self.assertEqual(os.listdir(os.path.dirname(path)), ['ledger.csv'])

  def test_no_file_is_an_empty_ledger(self):
    self.assertEqual(ledger.read(os.path.join(self._directory(),
                                              'none.csv')), {})

  def test_merge_keeps_what_another_slice_wrote(self):
    path = os.path.join(self._directory(), 'ledger.csv')
    first, second, third = list(_ENTRIES.items())
    ledger.write(path, dict([first]))
    merged = ledger.merge(path, dict([second, third]))
    self.assertEqual(set(merged), set(_ENTRIES))
    self.assertEqual(set(ledger.read(path)), set(_ENTRIES))

  def test_fingerprint_ignores_key_order_and_sees_every_value(self):
    config = dict(run='gm_alie_rho0.25_seed0', rounds=30, lr=0.1)
    self.assertEqual(ledger.fingerprint(config),
                     ledger.fingerprint(dict(reversed(list(config.items())))))
    self.assertLen(ledger.fingerprint(config), 16)
    for key, value in (('rounds', 31), ('lr', 0.10000001), ('extra', None)):
      self.assertNotEqual(ledger.fingerprint(config),
                          ledger.fingerprint(dict(config, **{key: value})), key)

  @parameterized.named_parameters(
      ('wrong_header', 'run,accuracy\nx,1\n', 'line 1'),
      ('empty_file', '', 'line 1'),
      ('bad_number', ','.join(ledger.FIELDS) + '\nx,abc,oops,0,1\n', 'line 2'),
      ('bad_flag', ','.join(ledger.FIELDS) + '\nx,abc,0.5,yes,1\n', 'line 2'),
      ('cut_row', ','.join(ledger.FIELDS) + '\nx,abc,0.5,0,1\ny,abd,0.5\n', 'line 3'),
      ('no_name', ','.join(ledger.FIELDS) + '\n,abc,0.5,0,1\n', 'line 2'),
      ('extra_column', ','.join(ledger.FIELDS) + '\nx,abc,0.5,0,1,7\n', 'line 2'),
      # Values no run can have: ranked on a leaderboard page they would lead it.
      ('accuracy_above_1', ','.join(ledger.FIELDS) + '\nx,abc,7.5,0,1\n',
       r'line 2 is malformed \(final_accuracy must be in \[0, 1\]'),
      ('negative_accuracy', ','.join(ledger.FIELDS) + '\nx,abc,-0.3,0,1\n',
       'line 2 .*final_accuracy'),
      ('infinite_accuracy', ','.join(ledger.FIELDS) + '\nx,abc,inf,0,1\n',
       'line 2 .*final_accuracy'),
      ('negative_calls', ','.join(ledger.FIELDS) + '\nx,abc,0.5,0,-1\n',
       'line 2 .*secure_average_calls_per_round'),
      ('infinite_calls', ','.join(ledger.FIELDS) + '\nx,abc,0.5,0,inf\n',
       'line 2 .*secure_average_calls_per_round'),
  )
  def test_a_damaged_ledger_names_the_file_the_line_and_the_fix(self, text, line):
    path = os.path.join(self._directory(), 'ledger.csv')
    with open(path, 'w') as f:
      f.write(text)
    with self.assertRaisesRegex(ledger.LedgerError, f'{path}: {line} .*git checkout'):
      ledger.read(path)

  def test_undecodable_bytes_are_a_ledger_error(self):
    path = os.path.join(self._directory(), 'ledger.csv')
    with open(path, 'wb') as f:
      f.write(','.join(ledger.FIELDS).encode() + b'\n\xff\xfe,abc,0.5,0,1\n')
    with self.assertRaisesRegex(ledger.LedgerError, f'{path}: unreadable .*git checkout'):
      ledger.read(path)

  def test_a_git_conflict_says_how_to_resolve_it(self):
    path = os.path.join(self._directory(), 'ledger.csv')
    header = ','.join(ledger.FIELDS)
    with open(path, 'w') as f:
      f.write(f'{header}\n<<<<<<< HEAD\na,f,0.5,0,1\n=======\nb,f,0.6,0,1\n>>>>>>> x\n')
    with self.assertRaisesRegex(ledger.LedgerError,
                                f'{path}: line 2 is a git conflict marker. Keep'):
      ledger.read(path)


if __name__ == '__main__':
  absltest.main()
