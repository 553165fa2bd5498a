"""A binary refuses a bad flag before it imports TensorFlow: the message names the
flag, the exit status is absl's 1, and `tensorflow` was never imported (checked in
the program's own `sys.modules` when it exits, not by its time). A run prints its
first line before importing it."""

import pytest

from tests.helpers import processes

# Starts subprocesses (the binaries): not in the `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

_BINARIES = ('tasks.binaries.train', 'tasks.binaries.sweep', 'tasks.binaries.main_job',
             'tasks.binaries.leaderboard')
# (flag, what stderr says), for every binary.
_BAD_FLAGS = {
    'negative_rounds': ('--rounds=-1', 'flag --rounds=-1: -1 is not a positive integer'),
    'unknown_task': ('--task=emnst', '--task=emnst is not a built-in task'),
    'unknown_model': ('--model=cnnn', '--model=cnnn is not a model of --task=emnist'),
}
# (binary, flag, what stderr says).
_BAD_NAMES = {
    'train_unknown_aggregator': ('tasks.binaries.train', '--aggregator=medain',
                                 "--aggregator: Unknown aggregator 'medain'"),
    'train_unknown_attack': ('tasks.binaries.train', '--attack=alei',
                             '--attack: alei unknown for --task=emnist'),
    'train_bad_workers': ('tasks.binaries.train', '--workers=localhost',
                          "Worker address 'localhost' is not host:port"),
    'train_unknown_client_work': ('tasks.binaries.train', '--client_work=dito',
                                  'value should be one of <fedavg|ditto|personalized_rfa>'),
    'sweep_unknown_aggregator': ('tasks.binaries.sweep', '--aggregators=mean,medain',
                                 "--aggregators: Unknown aggregator 'medain'"),
    'leaderboard_unknown_wrapper': ('tasks.binaries.leaderboard',
                                    '--aggregators=grid,buckets+median',
                                    "Unknown wrapper(s) ['buckets']"),
    'main_job_unknown_attack': ('tasks.binaries.main_job', '--attacks=omniscent',
                                '--attacks: omniscent unknown for --task=emnist'),
}
_CASES = {**{f'{binary.rsplit(".", 1)[1]}_{name}': (binary, flag, message)
             for binary in _BINARIES for name, (flag, message) in _BAD_FLAGS.items()},
          **_BAD_NAMES}


@pytest.mark.parametrize('name', sorted(_CASES))
def test_a_flag_error_comes_before_tensorflow(name):
  module, flag, message = _CASES[name]
  result = processes.run_watching_imports(module, flag)
  assert result.returncode == 1, result.stderr[-2000:]
  assert message in result.stderr, result.stderr[-2000:]
  assert 'Traceback' not in result.stderr, result.stderr[-2000:]
  assert result.stderr.splitlines()[-1] == 'IMPORTED', result.stderr[-2000:]


def test_a_run_prints_its_first_line_before_importing_tensorflow(tmp_path):
  result = processes.run_watching_imports(
      'tasks.binaries.train', '--data_source=synthetic', '--num_clients=4',
      '--clients_per_round=2', '--rounds=1', '--noprogress', '--notensorboard',
      f'--root_output_dir={tmp_path}')
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stderr.splitlines()
  first = next(i for i, line in enumerate(lines) if 'output in' in line)
  assert lines[first].startswith('emnist_linear_gm_none_rho0_seed0: 1 rounds of '
                                 'emnist linear (synthetic data); output in ')
  assert first < lines.index('IMPORTING tensorflow'), lines
