"""The training binary killed by SIGKILL at three moments, one of them in the middle of
a checkpoint write, and restarted each time with the same flags: every round appears
once in metrics.csv, the rows equal an uninterrupted run's, and no worker_binary of a
killed process survives it."""

import csv
import os
import re
import signal
import subprocess
import sys
import time

from absl import flags
from absl.testing import flagsaver
import pytest

from tasks.binaries import train
from tasks.simulation import checkpoints
from tasks.simulation import metrics_file
from tests.helpers import processes

# Starts subprocesses (binaries, benchmarks or worker processes): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

FLAGS = flags.FLAGS
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
_ROUNDS = 6
_RUN = dict(task='emnist', model='linear', data_source='bundled', clients_per_round=3,
            batch_size=10, aggregator='gm', attack='omniscient', rho=0.2, seed=0,
            rounds=_ROUNDS, experiment_name='run', noprogress=None,
            notensorboard=None)
_POLL = 0.005
_TIMEOUT = 300


def _argv(**flag_values):
  return [f'--{k}' if v is None else f'--{k}={v}' for k, v in flag_values.items()]


def _rows(root):
  with open(os.path.join(root, 'run', metrics_file.METRICS_FILE), newline='') as f:
    return list(csv.DictReader(f))


def _finished_rows(root):
  """Rows in metrics.csv (0 while it is absent or being replaced)."""
  try:
    with open(os.path.join(root, 'run', metrics_file.METRICS_FILE), newline='') as f:
      return max(0, f.read().count('\n') - 1)
  except OSError:
    return 0


def _checkpoints(root):
  try:
    return os.listdir(os.path.join(root, 'run', checkpoints.CHECKPOINTS_DIR))
  except OSError:
    return []


def _saved_versions(root):
  return {int(m.group(1)) for m in map(re.compile(r'round_(\d+)$').match,
                                       _checkpoints(root)) if m}


def _checkpoint_being_written(root):
  """The version of a checkpoint the binary is writing (a `round_<v>_temp<n>` folder
  whose final `round_<v>` does not exist yet), or None."""
  saved = _saved_versions(root)
  for name in _checkpoints(root):
    match = re.match(r'round_(\d+)_temp\d+$', name)
    if match and int(match.group(1)) not in saved:
      return int(match.group(1))
  return None


def _start(root, log):
  return subprocess.Popen(
      [sys.executable, '-m', 'tasks.binaries.train', f'--root_output_dir={root}'] +
      _argv(**_RUN), cwd=_REPO, stdout=log, stderr=log, env=processes.quiet_env())


def _wait_for(child, condition, what):
  deadline = time.monotonic() + _TIMEOUT
  while not condition():
    assert child.poll() is None, f'the binary ended (status {child.returncode}) before {what}'
    assert time.monotonic() < deadline, f'timed out waiting for {what}'
    time.sleep(_POLL)


def _kill(child, stopped_when):
  """SIGSTOPs `child` once `stopped_when()` holds while stopped, then SIGKILLs it.

  Stopping first freezes the moment (the files are checked with the binary halted);
  returns the worker_binary processes it had started.
  """
  deadline = time.monotonic() + _TIMEOUT
  while True:
    assert child.poll() is None, f'the binary ended (status {child.returncode})'
    assert time.monotonic() < deadline, 'timed out waiting for the moment to kill'
    if stopped_when():
      child.send_signal(signal.SIGSTOP)
      if stopped_when():
        break
      child.send_signal(signal.SIGCONT)  # The moment passed while stopping.
    time.sleep(_POLL)
  workers = processes.worker_children(child.pid)
  child.kill()
  child.wait(timeout=60)
  return workers


def _wait_until_stopped(pids, timeout=20.0):
  deadline = time.monotonic() + timeout
  while processes.running(pids) and time.monotonic() < deadline:
    time.sleep(0.05)
  return processes.running(pids)


def _uninterrupted_rows(root):
  with flagsaver.flagsaver():
    FLAGS.unparse_flags()
    FLAGS(['train', f'--root_output_dir={root}'] + _argv(**_RUN))
    train.main(['train'])
  return _rows(root)


def test_killed_three_times_the_run_equals_an_uninterrupted_one(tmp_path):
  root = str(tmp_path / 'killed')
  log_path = tmp_path / 'stderr.txt'
  moments = {
      # Right after round 0's row, typically before its checkpoint.
      'after a metrics row': lambda: _finished_rows(root) >= 1,
      # Between the temporary checkpoint folder appearing and its rename.
      'during a checkpoint write': lambda: (_checkpoint_being_written(root) or 0) >= 3,
      # In the middle of a round's training.
      'during a round': lambda: 4 in _saved_versions(root) and _finished_rows(root) == 4,
  }
  killed_workers = []
  with open(log_path, 'wb') as log:
    for what, moment in moments.items():
      child = _start(root, log)
      try:
        killed = _kill(child, moment)
      finally:
        if child.poll() is None:
          child.kill()
          child.wait()
      assert killed, f'the binary killed {what} should have run a worker_binary'
      killed_workers += killed
      assert not _wait_until_stopped(killed), (
          f'worker_binary {killed} outlived the binary killed {what}')
    child = _start(root, log)
    assert child.wait(timeout=_TIMEOUT) == 0, log_path.read_text()[-3000:]

  rows = _rows(root)
  assert [r['round'] for r in rows] == [str(r) for r in range(_ROUNDS)]
  assert rows == _uninterrupted_rows(str(tmp_path / 'uninterrupted'))
  assert not processes.running(killed_workers)
