"""tasks.binaries.train --workers: the same metrics.csv as in one process; a worker
killed mid-round stops the run with a clear error, and the rerun resumes."""

import csv
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import processes
from tff_robust import distributed
from tff_robust.distributed import worker_connection

# Starts subprocesses (binaries, benchmarks or worker processes): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
_RUN = ['--task=emnist', '--model=linear', '--data_source=synthetic',
        '--clients_per_round=6', '--batch_size=10', '--aggregator=gm',
        '--attack=omniscient', '--rho=0.2', '--experiment_name=run', '--noprogress',
        '--notensorboard']
# Every column depends on nothing but the computation (the run is deterministic);
# compared to 1e-6 relative, as the issue asks of results. The GM's relative gradient
# ‖v⁺ − v‖·Σβ/Σα is a difference of two nearly equal estimates: the ~1e-7 relative
# rounding of sums taken in another order across workers grows by ‖v‖/‖v⁺ − v‖ (~30
# here), so it gets 1e-4.
RELATIVE_TOLERANCE = 1e-6
CANCELLING_COLUMNS = {'aggregator/relative_gradient': 1e-4}
# A killed worker: --worker_unavailable_timeout. The exit is held to one timeout plus
# the rerun's whole time (start, tracing, the rounds left), measured in the same test
# under the same load: a bound that grows with a busy machine, as the exit does, where
# a fixed margin failed there.
UNAVAILABLE_TIMEOUT_SECONDS = 10


def _command(root, rounds, workers=None, *flags):
  command = [sys.executable, '-m', 'tasks.binaries.train', *_RUN,
             f'--rounds={rounds}', f'--root_output_dir={root}', *flags]
  if workers:
    command.append('--workers=' + ','.join(workers))
  return command


def _rows(root):
  with open(os.path.join(root, 'run', 'metrics.csv')) as f:
    return list(csv.DictReader(f))


def _run(root, rounds, workers=None):
  return subprocess.run(_command(root, rounds, workers), cwd=_REPO, capture_output=True,
                        text=True, timeout=900, env=processes.quiet_env())


def _assert_same_rows(actual, expected):
  assert [r['round'] for r in actual] == [r['round'] for r in expected]
  for got, want in zip(actual, expected):
    assert list(got) == list(want)
    for column, value in want.items():
      if value == '' or got[column] == value:
        continue
      a, b = float(got[column]), float(value)
      tolerance = CANCELLING_COLUMNS.get(column.rsplit('/', 1)[0], RELATIVE_TOLERANCE)
      assert abs(a - b) <= tolerance * max(abs(b), 1e-30), (column, a, b)


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('single_process'))
  result = _run(root, rounds=3)
  assert result.returncode == 0, result.stderr[-3000:]
  return _rows(root)


def test_three_rounds_on_two_workers_write_the_single_process_metrics(
    reference, tmp_path):
  with distributed.LocalWorkers(2) as workers:
    result = _run(str(tmp_path), rounds=3, workers=workers.addresses)
    pids = workers.pids
  assert not processes.running(pids)
  assert result.returncode == 0, result.stderr[-3000:]
  _assert_same_rows(_rows(str(tmp_path)), reference)


@pytest.mark.parametrize('failure', ['killed', 'stopped'])
def test_a_failed_worker_stops_the_round_and_the_rerun_resumes(
    failure, reference, tmp_path):
  # Stopped (SIGSTOP: its connections stay open) is issue 54's: before, the driver
  # waited for as long as it was watched. Now no probe is answered and the round
  # fails within the timeout + worker_connection.PROBE_INTERVAL.
  root = str(tmp_path)
  metrics = os.path.join(root, 'run', 'metrics.csv')
  seen_children = set()
  with distributed.LocalWorkers(2) as workers:
    # A killed worker stays down: the round fails once it was unreachable for the
    # timeout, and the run ends soon after.
    child = subprocess.Popen(_command(
        root, 3, workers.addresses,
        f'--worker_unavailable_timeout={UNAVAILABLE_TIMEOUT_SECONDS}'), cwd=_REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, env=processes.quiet_env())
    try:
      deadline = time.monotonic() + 600
      # Round 0 finished: its row is written; kill a worker while round 1 runs.
      while not (os.path.exists(metrics) and len(_rows(root)) >= 1):
        assert child.poll() is None, child.stderr.read()[-3000:]
        assert time.monotonic() < deadline
        seen_children.update(processes.worker_children(child.pid))
        for launcher in processes.worker_launchers(child.pid):  # The driver's own.
          seen_children.update([launcher, *processes.worker_children(launcher)])
        time.sleep(0.05)
      killed = time.monotonic()
      if failure == 'killed':
        workers.kill(1)
      else:
        os.kill(workers.pids[1], signal.SIGSTOP)
      try:
        _, stderr = child.communicate(timeout=300)
      finally:
        if failure == 'stopped':
          os.kill(workers.pids[1], signal.SIGCONT)
      kill_to_exit = time.monotonic() - killed
    finally:
      if child.poll() is None:
        child.kill()
        child.wait()
    assert child.returncode == 3, stderr[-3000:]
    failed = re.search(r'ERROR: Round (\d+) failed: TFF worker (\S+):', stderr)
    assert failed, stderr[-3000:]
    assert failed.group(2) == workers.addresses[1]
    # One line, no traceback (issue 54: two of gRPC's closed channel).
    assert stderr.count('ERROR:') == 1 and 'Traceback' not in stderr, stderr[-3000:]
    if failure == 'stopped':
      assert 'stopped answering' in failed.string
    # Every finished round is kept: the rows are exactly the rounds before the failure.
    assert [r['round'] for r in _rows(root)] == [
        str(r) for r in range(int(failed.group(1)))]

    if failure == 'killed':
      workers.restart(1)
    rerun_start = time.monotonic()
    result = _run(root, rounds=3, workers=workers.addresses)
    rerun_seconds = time.monotonic() - rerun_start
    assert result.returncode == 0, result.stderr[-3000:]
    detection = UNAVAILABLE_TIMEOUT_SECONDS + (
        worker_connection.PROBE_INTERVAL if failure == 'stopped' else 0)
    print(f'MEASURED {failure}: the exit {kill_to_exit:.1f} s after, the rerun '
          f'{rerun_seconds:.1f} s')
    assert kill_to_exit < detection + rerun_seconds, (
        f'{kill_to_exit:.1f} s from the {failure} worker to the exit; the rerun took '
        f'{rerun_seconds:.1f} s\n{stderr[-3000:]}')
    pids = workers.pids
  assert not processes.running(pids)
  assert not processes.running(seen_children)
  _assert_same_rows(_rows(root), reference)


def test_unreachable_workers_are_named_before_training(tmp_path):
  result = subprocess.run(
      _command(str(tmp_path), 1, ['127.0.0.1:1'], '--worker_connect_timeout=1'),
      cwd=_REPO, capture_output=True, text=True, timeout=300, env=processes.quiet_env())
  assert result.returncode == 1
  assert '127.0.0.1:1' in result.stderr
  assert 'within 1 s' in result.stderr
  assert not (tmp_path / 'run' / 'metrics.csv').exists()
