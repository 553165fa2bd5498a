"""Memory of the gathering path: one coordinate-wise median of 50 × 1M float32.

The aggregation runs in a subprocess (`benchmarks.aggregator_memory_time --one`), so
that the measured peak is this aggregation's alone: the peak resident set (VmHWM) of
the Python process and of the TFF worker_binary it starts. On the worker path the
client updates are generated and gathered in the worker (gathering by concatenating a
growing matrix once per client kept every intermediate matrix alive, O(n²·p): 6.6 GB
in the worker here); on the simulation path they are numpy arrays in Python and the
median's server step runs there (`tasks.simulation.gathered`).
"""

import json
import os
import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized
import pytest

# Starts subprocesses (binaries, benchmarks or worker processes): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_GIB = 2**30
_LIMIT_BYTES = 1.5 * _GIB


def _running_worker_binaries(pids):
  """Those of `pids` that are still a live (not zombie) worker_binary process."""
  alive = []
  for pid in pids:
    try:
      with open(f'/proc/{pid}/stat', 'rb') as f:
        state = f.read().rsplit(b')', 1)[1].split()[0]
      with open(f'/proc/{pid}/cmdline', 'rb') as f:
        cmdline = f.read()
    except OSError:
      continue
    if state != b'Z' and b'worker_binary' in cmdline:
      alive.append(pid)
  return alive


class GatherMemoryTest(parameterized.TestCase):

  @parameterized.parameters('worker', 'simulation')
  def test_median_of_50_clients_of_1m_parameters_stays_under_1_5_gib(self, path):
    environment = dict(os.environ, PYTHONPATH=_ROOT, TF_CPP_MIN_LOG_LEVEL='2')
    completed = subprocess.run(
        [sys.executable, '-m', 'benchmarks.aggregator_memory_time', '--one=median',
         '--clients=50', '--parameters=1000000', '--calls=0', f'--paths={path}'],
        cwd=_ROOT, env=environment, capture_output=True, text=True, timeout=600)
    self.assertEqual(completed.returncode, 0, completed.stderr[-3000:])
    result = json.loads(completed.stdout.strip().splitlines()[-1])

    self.assertLen(result['worker_pids'], 1)
    # The updates live in the worker (worker path) or in Python (simulation path): a
    # peak below their size would mean that the measurement missed the aggregation.
    holder = 'worker_peak_bytes' if path == 'worker' else 'python_peak_bytes'
    self.assertGreater(result[holder], 50 * 1_000_000 * 4)
    # On the simulation path Python and the worker hold their copies at the same
    # time: the bound is on their sum there (the benchmark's peak of that path).
    peaks = {'worker_binary': result['worker_peak_bytes'],
             'Python': result['python_peak_bytes']}
    if path == 'simulation':
      peaks['Python + worker_binary'] = sum(peaks.values())
    for process, peak in peaks.items():
      self.assertLess(peak, _LIMIT_BYTES, f'{process} peak {peak / _GIB:.2f} GiB')
    self.assertEmpty(_running_worker_binaries(result['worker_pids']),
                     'the subprocess left its worker_binary running')


if __name__ == '__main__':
  absltest.main()
