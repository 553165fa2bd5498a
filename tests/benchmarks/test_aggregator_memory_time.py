"""benchmarks.aggregator_memory_time's table: every measured row, with its ratios to
the mean measured on the same path in the same run, printed and written as markdown."""

import os
import subprocess
import sys
import tempfile
from unittest import mock

from absl.testing import absltest
import pytest

from benchmarks import aggregator_memory_time
from tests.helpers import processes

# Starts subprocesses (binaries, benchmarks or worker processes): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _table_rows(markdown):
  """{(aggregator, path): [cells]} of the markdown table."""
  rows = {}
  for line in markdown.splitlines():
    if line.startswith('| `'):
      cells = [cell.strip() for cell in line.strip('|').split('|')]
      rows[cells[0].strip('`'), cells[1]] = cells[2:]
  return rows


class AggregatorMemoryTimeTableTest(absltest.TestCase):

  def test_markdown_holds_every_row_with_ratios_to_the_same_paths_mean(self):
    with tempfile.TemporaryDirectory() as directory:
      output = os.path.join(directory, 'new', 'table.md')
      result = subprocess.run(
          [sys.executable, '-m', 'benchmarks.aggregator_memory_time', '--clients=6',
           # The mean alone, on one path (each row is a Python process of its own;
           # another aggregator's row and the other path are measured as these are:
           # tests/baselines/test_gather_memory.py runs the median's on both paths,
           # the test below the ratios of both paths).
           '--parameters=100', '--calls=1', '--aggregators=mean',
           '--paths=simulation', f'--output={output}'],
          cwd=_REPO, capture_output=True, text=True, timeout=600,
          env=processes.quiet_env())
      self.assertEqual(result.returncode, 0, result.stderr[-3000:])
      with open(output, encoding='utf-8') as f:
        markdown = f.read()

    self.assertIn('--aggregators=mean', markdown.splitlines()[0])
    rows = _table_rows(markdown)
    names = ['generate_only', 'mean']
    self.assertEqual(list(rows), [(name, 'simulation') for name in names])
    time_ratio, peak_ratio = rows['mean', 'simulation'][1], rows['mean', 'simulation'][3]
    self.assertEqual((time_ratio, peak_ratio), ('1.00', '1.00'))
    for (name, path), cells in rows.items():
      self.assertIn(f'{name:<28s} {path:<10s} {cells[0]:>8s}', result.stdout)

  def test_ratios_are_to_the_mean_and_the_simulation_peak_is_python_plus_worker(self):
    gib = 2**30
    mean = dict(name='mean', path='simulation', seconds=4.0,
                python_peak_bytes=2 * gib, worker_peak_bytes=6 * gib)
    median = dict(name='median', path='simulation', seconds=13.0,
                  python_peak_bytes=int(1.5 * gib), worker_peak_bytes=gib // 2)
    row = aggregator_memory_time._row
    self.assertEqual(row(median, mean), ('median', 'simulation', '13.00', '3.25',
                                         '2.00 G', '0.25', '1.50 G'))
    on_worker = row(dict(median, path='worker'), dict(mean, path='worker'))
    self.assertEqual(on_worker[4:6], ('0.50 G', '0.08'))  # The worker's peak alone.
    self.assertEqual(row(median, None)[3:6], ('', '2.00 G', ''))

  def test_each_path_is_divided_by_its_own_mean(self):
    gib = 2**30

    def result(name, path, seconds, worker_gib):
      return dict(name=name, path=path, seconds=seconds, python_peak_bytes=gib,
                  worker_peak_bytes=int(worker_gib * gib))

    results = {(name, path): result(name, path, seconds, peak)
               for name, path, seconds, peak in (('mean', 'worker', 2.0, 4),
                                                 ('mean', 'simulation', 1.0, 1),
                                                 ('median', 'worker', 6.0, 2),
                                                 ('median', 'simulation', 5.0, 3))}
    with tempfile.TemporaryDirectory() as directory:
      output = os.path.join(directory, 'table.md')
      aggregator_memory_time._write_markdown(output, results, 'heading', 'command')
      with open(output, encoding='utf-8') as f:
        rows = _table_rows(f.read())
    # time / mean, peak / mean: the worker's peak alone on the worker path, Python +
    # worker on the simulation path.
    self.assertEqual((rows['median', 'worker'][1], rows['median', 'worker'][3]),
                     ('3.00', '0.50'))
    self.assertEqual((rows['median', 'simulation'][1], rows['median', 'simulation'][3]),
                     ('5.00', '2.00'))

  def test_an_aggregator_whose_worker_died_is_a_row_that_says_why(self):
    mean = dict(name='mean', path='worker', seconds=2.0, python_peak_bytes=2**30,
                worker_peak_bytes=2**33)
    died = dict(name='gamma_mean_diagonal', path='worker', failed=True,
                error='worker 127.0.0.1:1 not reachable within 10 s')
    self.assertEqual(aggregator_memory_time._row(died, mean)[2], 'failed (below)')
    with tempfile.TemporaryDirectory() as directory:
      output = os.path.join(directory, 'table.md')
      aggregator_memory_time._write_markdown(
          output, {('mean', 'worker'): mean, ('gamma_mean_diagonal', 'worker'): died},
          'heading', 'python -m benchmarks.aggregator_memory_time')
      with open(output, encoding='utf-8') as f:
        markdown = f.read()
    self.assertEqual(list(_table_rows(markdown)),
                     [('mean', 'worker'), ('gamma_mean_diagonal', 'worker')])
    self.assertIn('Failed: `gamma_mean_diagonal` on the worker path: worker '
                  '127.0.0.1:1 not reachable within 10 s', markdown)

  def test_a_failed_subprocess_gives_its_error_not_an_exception(self):
    reported = '{"name": "gm", "path": "worker", "error": "worker died"}'
    cases = [(reported, '', 'worker died'),
             ('', 'Traceback ...\nMemoryError', 'exit status 1; the end of its '
              'stderr: Traceback ...\nMemoryError')]
    for stdout, stderr, error in cases:
      done = subprocess.CompletedProcess([], 1, stdout=stdout, stderr=stderr)
      with mock.patch.object(subprocess, 'run', return_value=done):
        result = aggregator_memory_time.run_in_subprocess('gm', 'worker', [])
      self.assertEqual(result, dict(name='gm', path='worker', failed=True,
                                    error=error))


if __name__ == '__main__':
  absltest.main()
