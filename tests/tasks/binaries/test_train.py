"""The training binary: CSV output, resume after interruption, flag validation."""

import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from unittest import mock

from absl import flags
from absl.testing import flagsaver
from absl.testing import parameterized
import pytest
import tensorflow_federated as tff

from tasks.binaries import aggregator_flags
from tasks.binaries import train
from tasks.simulation import checkpoints
from tasks.simulation import metrics_file
from tests.helpers import command_lines
from tests.helpers import processes
from tests.helpers import run_files

# Starts subprocesses (binaries, benchmarks or worker processes): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

FLAGS = flags.FLAGS
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
_SMALL_RUN = dict(task='emnist', model='linear', data_source='synthetic',
                  clients_per_round=3, batch_size=10, aggregator='gm',
                  attack='omniscient', rho=0.2, experiment_name='run', noprogress=None,
                  notensorboard=None)


def _argv(**flag_values):
  return ['train'] + [f'--{k}' if v is None else f'--{k}={v}'
                      for k, v in flag_values.items()]


def _run_main(**flag_values):
  with flagsaver.flagsaver():
    FLAGS.unparse_flags()
    FLAGS(_argv(**flag_values))
    train.main(['train'])


def _rows(output_dir):
  with open(os.path.join(output_dir, 'run', metrics_file.METRICS_FILE)) as f:
    return list(csv.DictReader(f))


def test_flags_that_do_less_than_they_say_are_named(tmp_path, capfd):
  _run_main(rounds=1, root_output_dir=tmp_path,
            **dict(_SMALL_RUN, clients_per_round=50, rho=0))
  stderr = capfd.readouterr().err
  assert ("--clients_per_round=50 is more than the task's 8 clients: all of them train "
          'every round.') in stderr
  assert '--attack=omniscient with --rho=0 corrupts no client: a clean run.' in stderr


def test_injected_nan_faults_are_reported_as_dropped_clients(tmp_path, capfd):
  # Krum with f = 1 of 5 clients: one NaN client leaves too few.
  with pytest.raises(SystemExit) as exited:
    _run_main(rounds=2, root_output_dir=tmp_path, **dict(
        _SMALL_RUN, aggregator='krum', aggregator_args='num_byzantine=1', attack='nan',
        rho=0.3, clients_per_round=5))
  assert exited.value.code == 2
  line = capfd.readouterr().err.splitlines()[-1]
  assert re.search(r'Clients .* \(corrupted by the nan attack\) sent non-finite '
                   r'updates and were dropped', line), line
  assert 'diverged' not in line and 'learning rate' not in line


class TrainTest(parameterized.TestCase):

  def _tempdir(self):
    # absltest's create_tempdir needs absl's own flags parsed, which pytest does not do.
    path = tempfile.mkdtemp(prefix='test_train_')
    self.addCleanup(shutil.rmtree, path, ignore_errors=True)
    return path

  def test_two_rounds_write_the_documented_columns(self):
    root = self._tempdir()
    _run_main(rounds=2, root_output_dir=root, **_SMALL_RUN)
    rows = _rows(root)
    self.assertEqual([r['round'] for r in rows], ['0', '1'])
    for column in metrics_file.DOCUMENTED_COLUMNS + (
        'aggregator/objective/0', 'aggregator/max_effective_weight',
        'num_corrupted_clients', 'client_learning_rate'):
      self.assertIn(column, rows[0])
    self.assertEqual([r['cumulative_secure_average_calls'] for r in rows], ['3', '6'])
    self.assertNotEqual(rows[1]['test_accuracy'], '')  # The last round is evaluated.

  def test_resume_after_interruption_neither_loses_nor_repeats_rounds(self):
    root = self._tempdir()
    save = tff.program.FileProgramStateManager.save

    async def save_until_round_3(manager, state, version):
      if version == 3:  # Killed after round 2's metrics, before its checkpoint.
        raise KeyboardInterrupt
      await save(manager, state, version)

    with mock.patch.object(tff.program.FileProgramStateManager, 'save',
                           save_until_round_3):
      with self.assertRaises(KeyboardInterrupt):
        _run_main(rounds=4, root_output_dir=root, **_SMALL_RUN)
    self.assertEqual([r['round'] for r in _rows(root)], ['0', '1', '2'])
    self.assertEqual(checkpoints.finished_rounds(os.path.join(root, 'run')), 2)
    _run_main(rounds=4, root_output_dir=root, **_SMALL_RUN)
    rows = _rows(root)
    self.assertEqual([r['round'] for r in rows], ['0', '1', '2', '3'])
    self.assertEqual([r['cumulative_secure_average_calls'] for r in rows],
                     ['3', '6', '9', '12'])
    # A longer --rounds extends the finished run.
    _run_main(rounds=5, root_output_dir=root, **_SMALL_RUN)
    self.assertEqual([r['round'] for r in _rows(root)], ['0', '1', '2', '3', '4'])

  @parameterized.named_parameters(
      ('rho', dict(rho=0.5), '--rho'),
      ('aggregator', dict(aggregator='bogus'), 'aggregator'),
      # The unknown name is blamed, not --aggregator_args, and the valid ones listed.
      ('aggregator_unknown', dict(aggregator='gmm'),
       "flag --aggregator=gmm: --aggregator: Unknown aggregator 'gmm'; known "
       'aggregators: mean, gm,'),
      # Refused at parse time, before the data load.
      ('workers_not_host_port', dict(workers='localhost'),
       "--workers.*'localhost' is not host:port"),
      ('workers_bad_port', dict(workers='127.0.0.1:99999'), "'127.0.0.1:99999' is not"),
      ('workers_repeated', dict(workers='h:1,h:1'), 'Worker addresses repeat'),
      ('attack', dict(attack='bogus'), 'omniscient'),
      ('model', dict(model='lstm'), '--model=lstm'),
      ('data_dir', dict(data_source='tff'), '--data_dir'),
      ('data_dir_not_read', dict(data_source='bundled', data_dir='/tmp'),
       '--data_dir is not read with --data_source=bundled'),
      ('aggregator_args', dict(aggregator_args='bogus=1'), '--aggregator_args'),
      ('rounds', dict(rounds=0), 'rounds'),
      ('client_learning_rate', dict(client_learning_rate='inf'),
       '--client_learning_rate must be a finite number'),
      ('server_learning_rate', dict(server_learning_rate='inf'),
       '--server_learning_rate must be a finite number'),
      ('rho_nan', dict(rho='nan'), '--rho must be a finite number'),
      ('attack_args', dict(attack='alie', attack_args='z=1,bogus=2'), '--attack_args'),
      ('attack_args_inf', dict(attack='ipm', attack_args='epsilon=inf'), 'epsilon'),
      ('attack_args_of_a_data_attack', dict(attack='data', rho=0.1, attack_args='z=3'),
       'takes no parameters'),
      ('attack_args_of_another_attack', dict(attack='ipm', attack_args='alie:z=3'),
       'alie:z=3 is for alie, which --attack=ipm does not run'),
      ('server_momentum', dict(server_momentum=5), '--server_momentum'),
      ('seed', dict(seed=-1), '--seed'),
      ('root_output_dir_is_a_file', dict(root_output_dir=os.path.abspath(__file__)),
       '--root_output_dir=.*is a file'),
      ('client_work', dict(client_work='fedprox'), 'client_work'),
      ('experiment_name_climbing_out', dict(experiment_name='../elsewhere'),
       "--experiment_name='../elsewhere' is not a directory inside --root_output_dir"),
      ('experiment_name_climbing_out_later', dict(experiment_name='a/../../b'),
       '--experiment_name=.* is not a directory inside'),
      ('experiment_name_absolute', dict(experiment_name='/tmp/elsewhere'),
       '--experiment_name=.* is not a directory inside'),
      ('experiment_name_parent', dict(experiment_name='..'),
       '--experiment_name=.* is not a directory inside'),
      ('experiment_name_root_itself', dict(experiment_name='.'),
       '--experiment_name=.* is not a directory inside'),
      ('worker_connect_timeout', dict(worker_connect_timeout='0'),
       '--worker_connect_timeout must be a finite number of seconds > 0'),
      ('worker_unavailable_timeout', dict(worker_unavailable_timeout='-1'),
       '--worker_unavailable_timeout must be a finite number of seconds > 0'),
      ('worker_unavailable_timeout_inf', dict(worker_unavailable_timeout='inf'),
       '--worker_unavailable_timeout must be a finite number of seconds > 0'),
  )
  def test_bad_flag_values_name_the_flag(self, values, expected):
    with flagsaver.flagsaver():
      FLAGS.unparse_flags()
      with self.assertRaisesRegex(flags.Error, expected):
        FLAGS(_argv(**values))

  def test_an_experiment_name_may_name_a_subdirectory(self):
    with flagsaver.flagsaver():
      FLAGS.unparse_flags()
      FLAGS(_argv(experiment_name='study/run_1'))
      self.assertEqual(FLAGS.experiment_name, 'study/run_1')

  def test_attack_args_reach_the_chosen_attack_only(self):
    with flagsaver.flagsaver():
      FLAGS.unparse_flags()
      FLAGS(_argv(attack='alie', attack_args='z=1.5'))
      self.assertEqual(FLAGS.attack_args, ['z=1.5'])

@pytest.mark.parametrize('aggregator, rho, clients, message', [
    ('krum', 0.45, 10, r'--aggregator=krum cannot aggregate a round of '
     r'--clients_per_round=10 clients at --rho=0.45: it assumes f = ⌊0.45·10⌋ = 4 .*'
     r'raise --clients_per_round to 11 or more; or lower --rho to 0.3'),
    ('multi_krum', 0.3, 4, r'--aggregator=multi_krum .*--clients_per_round=4 .*⌋ = 1 of them'),
    ('nnm+krum', 0.45, 10, r'--aggregator=nnm\+krum .*--clients_per_round=10'),
])
def test_an_aggregator_without_enough_clients_is_refused_naming_the_flags(
    aggregator, rho, clients, message):
  with flagsaver.flagsaver():
    FLAGS.unparse_flags()
    FLAGS(_argv(aggregator=aggregator, rho=rho, clients_per_round=clients))
    with pytest.raises(aggregator_flags.UnworkableSettingsError, match=message) as raised:
      train.check_settings()
  assert 'num_byzantine (' not in str(raised.value)  # Not a flag of the binary.


@pytest.fixture(scope='module')
def refused(tmp_path_factory):
  """Command lines the binary refuses before training, run in one process
  (`command_lines.run_each`): (result, its output root) by name."""
  lines = {
      'impossible_rho': ['--rho=0.7', '--data_source=synthetic'],
      'krum_with_too_few_clients': ['--aggregator=krum', '--rho=0.45',
                                    '--clients_per_round=10'],
  }
  roots = {name: tmp_path_factory.mktemp(name) for name in lines}
  results = command_lines.run_each('tasks.binaries.train', [
      [*line, f'--root_output_dir={roots[name]}'] for name, line in lines.items()])
  return {name: (result, roots[name]) for name, result in zip(lines, results)}


def test_bad_flag_exits_nonzero_before_training(refused):
  result, root = refused['impossible_rho']
  assert result.returncode != 0
  assert '--rho' in result.stderr
  # TFF's executor finalizer, left to run during interpreter teardown, would print an
  # ignored AttributeError traceback under the flag error.
  assert 'Traceback' not in result.stderr
  assert not os.listdir(root)


def test_krum_with_too_few_clients_exits_2_before_loading_data(refused):
  result, root = refused['krum_with_too_few_clients']
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.splitlines()[-1].startswith(
      'ERROR: --aggregator=krum cannot aggregate a round of --clients_per_round=10')
  assert 'Traceback' not in result.stderr
  assert not os.listdir(root)


def _without_tf_log_level():
  # The suite's own setting (tests/conftest.py) must not stand in for the binary's.
  env = dict(os.environ)
  env.pop('TF_CPP_MIN_LOG_LEVEL', None)
  return env


_TF_CPP_LINE = re.compile(r'^\d{4}-\d\d-\d\d [\d:.]+: [IWEF] ')


def test_a_short_run_prints_its_progress_and_few_lines_of_its_own(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'tasks.binaries.train', '--rounds=2', '--aggregator=mean',
       '--data_source=synthetic', '--experiment_name=run', f'--root_output_dir={tmp_path}'],
      cwd=_REPO, capture_output=True, timeout=300, env=_without_tf_log_level())
  stderr = result.stderr.decode()  # Not text=True, which makes each \r a new line.
  assert result.returncode == 0, stderr[-3000:]
  lines = stderr.rstrip('\n').split('\n')  # The bar redraws with \r: one line.
  # TensorFlow's C++ INFO and WARNING lines (130 of a run's 142) are gone; the CUDA
  # plugins' ERROR lines of the import stay visible, as errors should.
  assert not [l for l in lines if re.match(r'^\S+ \S+: [IW] ', l)], stderr
  own = [l for l in lines if not _TF_CPP_LINE.match(l)]
  # The first line (before TensorFlow's import), clients and corrupted clients, the
  # clients-per-round note, the progress bar, where the metrics are.
  assert len(own) <= 5, own
  assert any('2/2' in l for l in own), own
  # It ends without the interpreter's teardown (exit_status): every file is whole.
  assert [r['round'] for r in _rows(tmp_path)] == ['0', '1']
  assert run_files.tensorboard_steps(tmp_path / 'run')['train_loss'] == [0, 1]


def test_help_prints_no_tensorflow_lines():
  result = subprocess.run(
      [sys.executable, '-m', 'tasks.binaries.train', '--help'], cwd=_REPO,
      capture_output=True, text=True, timeout=300, env=_without_tf_log_level())
  assert '--clients_per_round' in result.stdout
  assert not [l for l in result.stderr.splitlines() if _TF_CPP_LINE.match(l)], (
      result.stderr)


@pytest.mark.parametrize('sig, status', [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_run_ends_with_one_line_saying_where_and_stops_its_workers(
    tmp_path, sig, status):
  child = subprocess.Popen(
      [sys.executable, '-m', 'tasks.binaries.train', '--rounds=500',
       f'--root_output_dir={tmp_path}'] + _argv(**_SMALL_RUN)[1:],
      cwd=_REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
      env=processes.quiet_env())
  metrics = tmp_path / 'run' / metrics_file.METRICS_FILE
  try:
    # Ready once round 1's row is written: not after a fixed time.
    while not (metrics.exists() and metrics.read_text().count('\n') >= 3):
      assert child.poll() is None, child.stderr.read().decode()[-2000:]
      time.sleep(0.05)
    workers = processes.worker_children(child.pid)
    assert workers, 'the binary should run a TFF worker_binary'
    child.send_signal(sig)
    stderr = child.communicate(timeout=120)[1].decode()
  finally:
    if child.poll() is None:
      child.kill()
  assert child.returncode == status, stderr[-2000:]
  assert 'Traceback' not in stderr
  last = re.fullmatch(r'interrupted after round (\d+); rerun the same command to resume',
                      stderr.splitlines()[-1])
  assert last, stderr[-2000:]
  # A checkpoint being written when the signal came may be finished after the line.
  assert 0 <= int(last.group(1)) < checkpoints.finished_rounds(str(tmp_path / 'run'))
  assert not processes.running(workers)  # The binary's TFF workers ended with it.
