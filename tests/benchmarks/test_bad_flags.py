"""The benchmark binaries refuse bad flags at parse time, naming the flag and the fix,
before anything trains (the personalization benchmark writes its results only after
its last run, ~45 minutes in)."""

import os
import subprocess
import sys
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import pytest

from tests.helpers import processes

# Starts subprocesses (binaries, benchmarks or worker processes): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BadFlagsTest(parameterized.TestCase):

  def _run(self, module, *flags):
    return subprocess.run([sys.executable, '-m', module, *flags], cwd=_REPO,
                          capture_output=True, text=True, timeout=300,
                          env=processes.quiet_env())

  @parameterized.named_parameters(
      ('misspelled_attack', ['--attack=dat'], '--attack must be one of data, '),
      ('rho_not_a_number', ['--rhos=0,0.1x'], '--rhos must be numbers in [0, 0.5)'),
      ('negative_seed', ['--seeds=-1'], '--seeds must be integers ≥ 0'),
      ('negative_lambda', ['--lambdas=0.1,-1'], '--lambdas must be numbers ≥ 0'),
      ('misspelled_method', ['--methods=dito'], '--methods must name some of: ditto'),
  )
  def test_personalization(self, flags, message):
    with tempfile.TemporaryDirectory() as directory:
      result = self._run('benchmarks.personalization', *flags,
                         f'--output_dir={directory}/new')
      self.assertFalse(os.path.exists(f'{directory}/new'))
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertIn(message, result.stderr)
    self.assertNotIn('Traceback', result.stderr)
    self.assertNotIn('λ sweep', result.stdout)  # Nothing trained.

  def test_personalization_output_dir_that_is_a_file(self):
    with tempfile.NamedTemporaryFile() as file:
      path = file.name
      result = self._run('benchmarks.personalization', f'--output_dir={path}')
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertIn(f'--output_dir={path}: ', result.stderr)
    self.assertIn('pass another path', result.stderr)

  @parameterized.named_parameters(
      ('memory_list', 'benchmarks.aggregator_memory_time', '--aggregators=mean,mediann',
       "--aggregators: Unknown aggregator 'mediann'"),
      ('memory_one', 'benchmarks.aggregator_memory_time', '--one=mediann',
       "--one: Unknown aggregator 'mediann'"),
      ('memory_wrapper', 'benchmarks.aggregator_memory_time',
       '--aggregators=buckets+median', "--aggregators: Unknown wrapper(s) ['buckets']"),
      ('round_time', 'benchmarks.round_time', '--aggregators=rfa,mediann',
       "--aggregators: Unknown aggregator 'mediann'"),
  )
  def test_unknown_aggregator(self, module, flag, message):
    result = self._run(module, flag)
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertIn(message, result.stderr)
    self.assertNotIn('Traceback', result.stderr)

  @parameterized.named_parameters(
      ('memory', 'benchmarks.aggregator_memory_time'),
      ('round_time', 'benchmarks.round_time'),
  )
  def test_impossible_byzantine_fraction(self, module):
    result = self._run(module, '--byzantine_fraction=0.5')
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertIn('--byzantine_fraction must be in [0, 0.5)', result.stderr)
    self.assertNotIn('Traceback', result.stderr)

  def test_memory_table_needs_timed_calls(self):
    result = self._run('benchmarks.aggregator_memory_time', '--calls=0')
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertIn('--calls=0 times nothing', result.stderr)
    self.assertNotIn('generate_only', result.stdout)  # Nothing measured.

  @parameterized.named_parameters(
      ('memory_generate_only', 'benchmarks.aggregator_memory_time',
       ['--one=generate_only', '--clients=2', '--parameters=10']),
      ('memory_wrapped', 'benchmarks.aggregator_memory_time',
       ['--one=bucketing+median', '--clients=4', '--parameters=10', '--calls=1']),
  )
  def test_known_names_still_run(self, module, flags):
    result = self._run(module, *flags)
    self.assertEqual(result.returncode, 0, result.stderr[-2000:])


if __name__ == '__main__':
  absltest.main()
