"""tasks.binaries.train --workers: a worker stopped or killed mid-round stops the run
with a clear error, the rerun resumes, and the finished run's metrics.csv is the one
process's."""

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


def _watch_children(child, seen_children):
  """Adds the driver's worker_binary and launcher processes to `seen_children`."""
  seen_children.update(processes.worker_children(child.pid))
  for launcher in processes.worker_launchers(child.pid):  # The driver's own.
    seen_children.update([launcher, *processes.worker_children(launcher)])


def _fail_a_worker_after(root, finished, failure, workers, seen_children):
  """Starts the binary, makes worker 1 fail (`failure`: 'stopped' or 'killed') once
  `finished` rounds are in metrics.csv, and returns the binary's exit status, its
  stderr and the seconds from the failure to its exit."""
  metrics = os.path.join(root, 'run', 'metrics.csv')
  child = subprocess.Popen(_command(
      root, 3, workers.addresses,
      f'--worker_unavailable_timeout={UNAVAILABLE_TIMEOUT_SECONDS}'), cwd=_REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, env=processes.quiet_env())
  try:
    deadline = time.monotonic() + 600
    while not (os.path.exists(metrics) and len(_rows(root)) >= finished):
      assert child.poll() is None, child.stderr.read()[-3000:]
      assert time.monotonic() < deadline
      _watch_children(child, seen_children)
      time.sleep(0.05)
    failed_at = time.monotonic()
    if failure == 'killed':
      workers.kill(1)  # It stays down: the round fails after the timeout.
    else:
      os.kill(workers.pids[1], signal.SIGSTOP)  # Connected, answering no probe.
    try:
      _, stderr = child.communicate(timeout=300)
    finally:
      if failure == 'stopped':
        os.kill(workers.pids[1], signal.SIGCONT)
    return child.returncode, stderr, time.monotonic() - failed_at
  finally:
    if child.poll() is None:
      child.kill()
      child.wait()


def test_a_failed_worker_stops_the_round_and_each_rerun_resumes(reference, tmp_path):
  """Worker 1 stopped (SIGSTOP) in round 1, then killed in round 2 of the rerun: each
  run exits with one line naming the worker and keeps its finished rounds; the last
  rerun finishes, and every round, each computed on the workers, equals the single
  process's."""
  root = str(tmp_path)
  seen_children = set()
  exits = {}
  with distributed.LocalWorkers(2) as workers:
    for finished, failure in enumerate(('stopped', 'killed'), start=1):
      status, stderr, exits[failure] = _fail_a_worker_after(
          root, finished, failure, workers, seen_children)
      assert status == 3, stderr[-3000:]
      failed = re.search(r'ERROR: Round (\d+) failed: TFF worker (\S+):', stderr)
      assert failed, stderr[-3000:]
      assert failed.group(2) == workers.addresses[1]
      assert int(failed.group(1)) == finished, stderr[-3000:]
      # One line, no traceback (gRPC's closed channel once printed two).
      assert stderr.count('ERROR:') == 1 and 'Traceback' not in stderr, stderr[-3000:]
      if failure == 'stopped':
        assert 'stopped answering' in failed.string
      # Every finished round is kept: the rows are exactly the rounds before.
      assert [r['round'] for r in _rows(root)] == [str(r) for r in range(finished)]
    workers.restart(1)
    rerun_start = time.monotonic()
    result = _run(root, rounds=3, workers=workers.addresses)
    rerun_seconds = time.monotonic() - rerun_start
    assert result.returncode == 0, result.stderr[-3000:]
    pids = workers.pids
  for failure, exit_seconds in exits.items():
    detection = UNAVAILABLE_TIMEOUT_SECONDS + (
        worker_connection.PROBE_INTERVAL if failure == 'stopped' else 0)
    print(f'MEASURED {failure}: the exit {exit_seconds:.1f} s after, the rerun '
          f'{rerun_seconds:.1f} s')
    assert exit_seconds < detection + rerun_seconds, (
        f'{exit_seconds:.1f} s from the {failure} worker to the exit; the rerun took '
        f'{rerun_seconds:.1f} s')
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
