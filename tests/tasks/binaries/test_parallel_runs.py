"""--parallel_runs: copies of a sweep binary train the grid side by side, each run
once and with the results one process gives; a shard trains its runs only and writes
no table, leaving the rest to the next invocation."""

import os

import pytest

from tests.helpers import command_lines

# Starts subprocesses (binaries, benchmarks or worker processes): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

_FLAGS = ['--data_source=synthetic', '--aggregators=mean,gm', '--attacks=omniscient',
          '--rhos=0,0.2', '--seeds=0', '--rounds=2', '--clients_per_round=3',
          '--noprogress']
# spec.runs() order: each aggregator's clean run, then its attacked one.
_RUNS = ['mean_none_rho0_seed0', 'mean_omniscient_rho0.2_seed0',
         'gm_none_rho0_seed0', 'gm_omniscient_rho0.2_seed0']


def _finished(output_dir) -> list[str]:
  runs = output_dir / 'runs'
  return sorted(run for run in os.listdir(runs)
                if (runs / run / 'FINGERPRINT').exists()) if runs.exists() else []


def test_a_shard_and_then_copies_train_each_run_once_as_one_process_would(tmp_path):
  # The three command lines run one after the other in one process (the copies are
  # processes of their own): each start costs a TensorFlow import.
  alone, shard, copies = command_lines.run_each('tasks.binaries.sweep', [
      [*_FLAGS, f'--output_dir={tmp_path / "one"}'],
      # A shard alone: its runs, no table.
      [*_FLAGS, f'--output_dir={tmp_path / "two"}', '--run_shard=1/2'],
      # Then two copies: the first trains what is left of its shard, the second
      # nothing; the binary, after them, trains nothing and writes the table.
      [*_FLAGS, f'--output_dir={tmp_path / "two"}', '--parallel_runs=2'],
  ])
  assert alone.returncode == 0, alone.stderr[-3000:]
  assert shard.returncode == 0, shard.stderr[-3000:]
  assert copies.returncode == 0, copies.stderr[-3000:]
  assert shard.stdout.strip() == '' and 'gm' in alone.stdout, shard.stdout  # No table.
  # The shard's runs were finished before the copies (the second copy and the binary
  # skip them), the others after (only the binary skips them).
  for run in _RUNS:
    skips = copies.stderr.count(f'{run}: finished, skipped.')
    assert skips == (2 if run in _RUNS[1::2] else 1), (run, copies.stderr[-3000:])
  assert _finished(tmp_path / 'two') == sorted(_RUNS)
  for run in _RUNS:
    metrics = [(tmp_path / side / 'runs' / run / 'metrics.csv').read_bytes()
               for side in ('one', 'two')]
    assert metrics[0] == metrics[1], run
  assert ((tmp_path / 'one' / 'summary.csv').read_bytes() ==
          (tmp_path / 'two' / 'summary.csv').read_bytes())
