"""The benchmark binaries refuse bad flags at parse time, naming the flag and the fix,
before anything trains (the personalization benchmark writes its results only after
its last run, ~45 minutes in)."""

import collections
import os
import re

import pytest

from tests.helpers import command_lines

# Starts subprocesses (binaries, benchmarks or worker processes): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

_PERSONALIZATION = 'benchmarks.personalization'
_MEMORY = 'benchmarks.aggregator_memory_time'
_ROUND_TIME = 'benchmarks.round_time'

# Command lines refused with status 1: (binary, flags, what stderr says). `{new}` is
# an output directory that must not be created, `{file}` an existing file.
_REFUSED = {
    'personalization_misspelled_attack': (
        _PERSONALIZATION, ['--attack=dat', '--output_dir={new}'],
        '--attack must be one of data, '),
    'personalization_rho_not_a_number': (
        _PERSONALIZATION, ['--rhos=0,0.1x', '--output_dir={new}'],
        '--rhos must be numbers in [0, 0.5)'),
    'personalization_negative_seed': (
        _PERSONALIZATION, ['--seeds=-1', '--output_dir={new}'],
        '--seeds must be integers ≥ 0'),
    'personalization_negative_lambda': (
        _PERSONALIZATION, ['--lambdas=0.1,-1', '--output_dir={new}'],
        '--lambdas must be numbers ≥ 0'),
    'personalization_misspelled_method': (
        _PERSONALIZATION, ['--methods=dito', '--output_dir={new}'],
        '--methods must name some of: ditto'),
    'personalization_output_dir_that_is_a_file': (
        _PERSONALIZATION, ['--output_dir={file}'], '--output_dir={file}: '),
    'memory_unknown_in_list': (
        _MEMORY, ['--aggregators=mean,mediann'],
        "--aggregators: Unknown aggregator 'mediann'"),
    'memory_unknown_one': (_MEMORY, ['--one=mediann'], "--one: Unknown aggregator 'mediann'"),
    'memory_unknown_wrapper': (
        _MEMORY, ['--aggregators=buckets+median'],
        "--aggregators: Unknown wrapper(s) ['buckets']"),
    'memory_impossible_byzantine_fraction': (
        _MEMORY, ['--byzantine_fraction=0.5'], '--byzantine_fraction must be in [0, 0.5)'),
    'memory_table_without_timed_calls': (_MEMORY, ['--calls=0'], '--calls=0 times nothing'),
    'round_time_unknown_aggregator': (
        _ROUND_TIME, ['--aggregators=rfa,mediann'],
        "--aggregators: Unknown aggregator 'mediann'"),
    'round_time_impossible_byzantine_fraction': (
        _ROUND_TIME, ['--byzantine_fraction=0.5'],
        '--byzantine_fraction must be in [0, 0.5)'),
}

# Command lines with the names those refusals must still accept.
_ACCEPTED = {
    'memory_generate_only': (
        _MEMORY, ['--one=generate_only', '--clients=2', '--parameters=10']),
    'memory_wrapped': (
        _MEMORY, ['--one=bucketing+median', '--clients=4', '--parameters=10', '--calls=1']),
    # Its fail-fast worker context (benchmarks.fail_fast) once named a private class
    # the package does not export: every run failed before timing a round.
    'round_time_tiny': (
        _ROUND_TIME, ['--model=linear', '--clients_per_round=2', '--rounds=1',
                      '--epochs=1', '--aggregators=rfa']),
}


@pytest.fixture(scope='module')
def paths(tmp_path_factory):
  directory = tmp_path_factory.mktemp('bad_flags')
  existing = directory / 'a_file'
  existing.write_text('')
  return dict(new=str(directory / 'new'), file=str(existing))


@pytest.fixture(scope='module')
def results(paths):
  """Every case's result, each binary's command lines run in one process."""
  lines_of = collections.defaultdict(dict)
  for name, (module, flags, *_) in {**_REFUSED, **_ACCEPTED}.items():
    lines_of[module][name] = [flag.format(**paths) for flag in flags]
  results = {}
  for module, lines in lines_of.items():
    results.update(zip(lines, command_lines.run_each(module, list(lines.values()))))
  return results


@pytest.mark.parametrize('name', sorted(_REFUSED))
def test_refused_naming_the_flag_and_nothing_runs(name, results, paths):
  _, _, message = _REFUSED[name]
  result = results[name]
  assert result.returncode == 1, result.stderr[-2000:]
  assert message.format(**paths) in result.stderr, result.stderr[-2000:]
  assert 'Traceback' not in result.stderr
  assert not os.path.exists(paths['new'])
  assert 'λ sweep' not in result.stdout  # The personalization benchmark trained nothing.
  assert 'generate_only' not in result.stdout  # The memory benchmark measured nothing.


def test_an_output_dir_that_is_a_file_says_to_pass_another_path(results):
  assert 'pass another path' in results['personalization_output_dir_that_is_a_file'].stderr


@pytest.mark.parametrize('name', sorted(_ACCEPTED))
def test_known_names_still_run(name, results):
  assert results[name].returncode == 0, results[name].stderr[-2000:]


def test_round_time_times_fed_avg_and_rfa(results):
  stdout = results['round_time_tiny'].stdout
  assert re.search(r'fed_avg +[0-9.]+ s +ratio to fed_avg +1\.000', stdout), stdout
  assert re.search(r'rfa +[0-9.]+ s +ratio to fed_avg', stdout), stdout
