"""The round profile on one round of one main-job run: the run trains (the profile
wraps the harness's phases in place, so a phase whose interface changed breaks the
run, not only its timing), and every phase that round goes through is timed."""

import re

import pytest

from tests.helpers import command_lines

# Starts subprocesses (binaries, benchmarks or worker processes): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow


def _milliseconds_per_round(table: str) -> dict[str, float]:
  return {phase: float(ms) for phase, ms in re.findall(
      r'^\| ([a-z +]+) \| [\d.]+ \| ([\d.]+) \| [\d.]+% \|$', table, flags=re.M)}


def test_one_round_trains_and_times_its_phases():
  result, = command_lines.run_each('benchmarks.round_profile', [[
      '--aggregators=gm', '--attacks=omniscient', '--rhos=0.1', '--rounds=1',
      '--eval_period=1']])
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'failed' not in result.stdout, result.stdout
  phases = _milliseconds_per_round(result.stdout.split('benchmarks.round_profile')[-1])
  assert set(phases) == {'setup', 'client datasets', 'training', 'attack',
                         'aggregation', 'server update', 'evaluation',
                         'metrics + checkpoints', 'other'}, result.stdout
  for phase in ('training', 'aggregation', 'server update', 'evaluation',
                'metrics + checkpoints'):
    assert phases[phase] > 0, (phase, result.stdout)
