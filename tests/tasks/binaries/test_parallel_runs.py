"""--parallel_runs: copies of a sweep binary train the grid side by side, each run
once and with the results one process gives; a shard trains its runs only and writes
no table, leaving the rest to the next invocation."""

import os
import subprocess
import sys

import pytest

from tests.helpers import command_lines
from tests.helpers import processes

# Starts subprocesses (binaries, benchmarks or worker processes): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

_REPO = processes.REPOSITORY
_FLAGS = ['--data_source=synthetic', '--aggregators=mean,gm', '--attacks=omniscient',
          '--rhos=0,0.2', '--seeds=0', '--rounds=2', '--clients_per_round=3',
          '--noprogress']
# spec.runs() order: each aggregator's clean run, then its attacked one.
_RUNS = ['mean_none_rho0_seed0', 'mean_omniscient_rho0.2_seed0',
         'gm_none_rho0_seed0', 'gm_omniscient_rho0.2_seed0']


def _sweep(output_dir, *flags):
  return subprocess.run(
      [sys.executable, '-m', 'tasks.binaries.sweep', *_FLAGS,
       f'--output_dir={output_dir}', *flags],
      cwd=_REPO, capture_output=True, text=True, timeout=900, env=processes.quiet_env())


def _finished(output_dir) -> list[str]:
  runs = output_dir / 'runs'
  return sorted(run for run in os.listdir(runs)
                if (runs / run / 'FINGERPRINT').exists()) if runs.exists() else []


def test_a_shard_and_then_copies_train_each_run_once_as_one_process_would(tmp_path):
  [alone] = command_lines.run_each('tasks.binaries.sweep',
                                   [[*_FLAGS, f'--output_dir={tmp_path / "one"}']])
  assert alone.returncode == 0, alone.stderr[-3000:]
  # A shard alone: its runs, no table.
  shard = _sweep(tmp_path / 'two', '--run_shard=1/2')
  assert shard.returncode == 0, shard.stderr[-3000:]
  assert _finished(tmp_path / 'two') == sorted(_RUNS[1::2])
  assert not (tmp_path / 'two' / 'summary.csv').exists()
  # Then two copies: the first trains what is left of its shard, the second nothing;
  # the binary, after them, trains nothing and writes the table.
  copies = _sweep(tmp_path / 'two', '--parallel_runs=2')
  assert copies.returncode == 0, copies.stderr[-3000:]
  assert _finished(tmp_path / 'two') == sorted(_RUNS)
  assert copies.stderr.count(': finished, skipped.') == len(_RUNS) + 2, (
      copies.stderr[-3000:])
  for run in _RUNS:
    metrics = [(tmp_path / side / 'runs' / run / 'metrics.csv').read_bytes()
               for side in ('one', 'two')]
    assert metrics[0] == metrics[1], run
  assert ((tmp_path / 'one' / 'summary.csv').read_bytes() ==
          (tmp_path / 'two' / 'summary.csv').read_bytes())
