"""The training binary on damaged run and data files: exit status 2 with one stderr
line naming the file, no traceback, and the finished rounds kept."""

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from unittest import mock

from absl import flags
from absl.testing import flagsaver
from absl.testing import parameterized
import pytest

from tasks.binaries import exit_status
from tasks.binaries import train
from tasks.simulation import loop
from tasks.simulation import metrics_file
from tasks.simulation import run_config
from tests.helpers import processes
from tests.helpers import run_files

# Starts subprocesses (binaries, benchmarks or worker processes): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

FLAGS = flags.FLAGS
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
_RUN = dict(task='emnist', model='linear', data_source='synthetic', clients_per_round=3,
            batch_size=10, aggregator='gm', attack='omniscient', rho=0.2,
            experiment_name='run', noprogress=None, tensorboard=None)
_FINISHED = 3


def _argv(**flag_values):
  return [f'--{k}' if v is None else f'--{k}={v}' for k, v in flag_values.items()]


def _train_in_process(**flag_values):
  """Runs the binary's main as `exit_status.run` does; returns (exit status, stderr)."""
  # A real file: TFF hands sys.stderr to the worker_binary it starts.
  with tempfile.TemporaryFile('w+') as stderr:
    with flagsaver.flagsaver(), contextlib.redirect_stderr(stderr):
      FLAGS.unparse_flags()
      FLAGS(['train'] + _argv(**flag_values))
      try:
        with exit_status.errors_as_one_line():
          train.main(['train'])
        status = 0
      except SystemExit as e:
        status = e.code
    stderr.seek(0)
    return status, stderr.read()


def _metrics_lines(run_dir):
  with open(os.path.join(run_dir, metrics_file.METRICS_FILE), newline='') as f:
    return f.read().splitlines(keepends=True)


def _junk_data_file(directory):
  path = os.path.join(directory, 'emnist_all.sqlite')
  with open(path, 'w') as f:
    f.write('not a database')
  return path


class TrainFilesTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp(prefix='test_train_files_')
    cls.finished = os.path.join(cls.root, 'finished')
    status, stderr = _train_in_process(rounds=_FINISHED, root_output_dir=cls.finished,
                                       **_RUN)
    assert status == 0, stderr

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def _copy_of_finished_run(self):
    root = tempfile.mkdtemp(dir=self.root)
    shutil.rmtree(root)
    shutil.copytree(self.finished, root)
    return root

  def _assert_one_error_line_naming(self, stderr, path):
    errors = [line for line in stderr.splitlines() if line.startswith('ERROR: ')]
    self.assertLen(errors, 1, stderr)
    self.assertIn(path, errors[0])
    self.assertNotIn('Traceback', stderr)

  @parameterized.named_parameters(*run_files.BAD_FILES)
  def test_bad_run_file_exits_2_naming_it(self, damage, problem):
    root = self._copy_of_finished_run()
    path = damage(os.path.join(root, 'run'))
    metrics = os.path.join(root, 'run', metrics_file.METRICS_FILE)
    with open(metrics, 'rb') as f:
      rows_before = f.read()
    status, stderr = _train_in_process(rounds=_FINISHED + 1, root_output_dir=root,
                                       **_RUN)
    self.assertEqual(status, exit_status.BAD_FILE, stderr)
    self._assert_one_error_line_naming(stderr, path)
    self.assertRegex(stderr, problem)
    with open(metrics, 'rb') as f:
      self.assertEqual(f.read(), rows_before)  # No finished round lost.

  def test_a_run_owned_by_another_process_exits_2_naming_its_pid(self):
    root = self._copy_of_finished_run()
    run_dir = os.path.join(root, 'run')
    before = _metrics_lines(run_dir)
    with processes.run_owner(run_dir, _REPO) as owner:
      status, stderr = _train_in_process(rounds=_FINISHED + 1, root_output_dir=root,
                                         **_RUN)
    self.assertEqual(status, exit_status.RUN_OWNED, stderr)
    self._assert_one_error_line_naming(stderr, f'{run_dir}: process {owner.pid} is '
                                       'running this run')
    self.assertEqual(_metrics_lines(run_dir), before)

  def test_without_config_json_other_flags_are_refused_by_the_checkpoints(self):
    root = self._copy_of_finished_run()
    run_dir = os.path.join(root, 'run')
    os.remove(os.path.join(run_dir, run_config.CONFIG_FILE))
    before = _metrics_lines(run_dir)
    status, stderr = _train_in_process(
        rounds=_FINISHED + 1, root_output_dir=root,
        **dict(_RUN, aggregator='median', attack='data', rho=0.3))
    self.assertEqual(status, exit_status.FLAGS_OR_OTHER_RUN, stderr)
    self._assert_one_error_line_naming(stderr, 'round_3 is a checkpoint of a run with '
                                       "a different configuration (aggregator: 'gm' "
                                       "→ 'median'")
    self.assertNotIn('delete', stderr.lower())
    self.assertEqual(_metrics_lines(run_dir), before)
    self.assertFalse(os.path.exists(os.path.join(run_dir, run_config.CONFIG_FILE)))

  def test_a_cut_off_last_row_of_a_checkpointed_round_is_rebuilt(self):
    root = self._copy_of_finished_run()
    run_dir = os.path.join(root, 'run')
    finished = _metrics_lines(run_dir)
    run_files.cut_off_last_row(run_dir)
    status, stderr = _train_in_process(rounds=_FINISHED + 1, root_output_dir=root,
                                       **_RUN)
    self.assertEqual(status, 0, stderr)
    self.assertEqual(_metrics_lines(run_dir)[:len(finished)], finished)
    self.assertLen(_metrics_lines(run_dir), _FINISHED + 2)

  def test_a_run_directory_that_is_a_file_exits_2_naming_it(self):
    root = tempfile.mkdtemp(dir=self.root)
    path = os.path.join(root, 'run')
    with open(path, 'w') as f:
      f.write('not a run')
    status, stderr = _train_in_process(rounds=1, root_output_dir=root, **_RUN)
    self.assertEqual(status, exit_status.BAD_FILE, stderr)
    self._assert_one_error_line_naming(stderr, f'{path}: is a file, not a directory. '
                                       'Move it away')

  def test_fewer_rounds_than_finished_exit_1_keeping_every_round(self):
    root = self._copy_of_finished_run()
    run_dir = os.path.join(root, 'run')
    before = _metrics_lines(run_dir)
    status, stderr = _train_in_process(rounds=1, root_output_dir=root, **_RUN)
    self.assertEqual(status, exit_status.FLAGS_OR_OTHER_RUN, stderr)
    self._assert_one_error_line_naming(
        stderr, f'{run_dir} holds a run of {_FINISHED} finished rounds, more than '
        f'--rounds=1')
    self.assertNotIn('Finished', stderr)
    self.assertEqual(_metrics_lines(run_dir), before)

  def test_a_deleted_metrics_csv_is_rebuilt(self):
    root = self._copy_of_finished_run()
    run_dir = os.path.join(root, 'run')
    finished = _metrics_lines(run_dir)
    os.remove(os.path.join(run_dir, metrics_file.METRICS_FILE))
    shutil.rmtree(run_files.checkpoint(run_dir, 1))  # Only the latest two kept.
    status, stderr = _train_in_process(rounds=_FINISHED + 1, root_output_dir=root,
                                       **_RUN)
    self.assertEqual(status, 0, stderr)
    self.assertIn('metrics.csv: missing, while the checkpoints hold rounds 0..2; '
                  'rebuilding it', stderr)
    self.assertEqual(_metrics_lines(run_dir)[:len(finished)], finished)
    self.assertLen(_metrics_lines(run_dir), _FINISHED + 2)

  def test_a_model_whose_evaluation_is_nan_exits_2(self):
    # Client lr 1e38 with the mean: finite weights at float32's limit, NaN test loss.
    root = tempfile.mkdtemp(dir=self.root)
    status, stderr = _train_in_process(
        rounds=4, root_output_dir=root,
        **dict(_RUN, aggregator='mean', attack='none', rho=0,
               client_learning_rate='1e38'))
    self.assertEqual(status, exit_status.NON_FINITE, stderr)
    self._assert_one_error_line_naming(stderr, 'produced a model whose test_loss=nan '
                                       'is not finite')
    self.assertNotIn('Finished', stderr)

  def test_a_run_stopped_in_round_0_takes_the_corrected_flags(self):
    root = tempfile.mkdtemp(dir=self.root)
    with mock.patch.object(loop.Simulation, 'run_round', side_effect=KeyboardInterrupt):
      with self.assertRaises(KeyboardInterrupt):
        _train_in_process(rounds=1, root_output_dir=root, **_RUN)
    status, stderr = _train_in_process(rounds=1, root_output_dir=root,
                                       **dict(_RUN, clients_per_round=4))
    self.assertEqual(status, 0, stderr)

  def test_junk_data_file_exits_2_naming_it(self):
    data_dir = tempfile.mkdtemp(dir=self.root)
    path = _junk_data_file(data_dir)
    status, stderr = _train_in_process(
        rounds=1, root_output_dir=self.root, **dict(_RUN, data_source='tff',
                                                    data_dir=data_dir,
                                                    experiment_name='tff'))
    self.assertEqual(status, exit_status.BAD_FILE, stderr)
    self._assert_one_error_line_naming(stderr, path)
    self.assertIn('not a TFF SQLite dataset', stderr)

  @parameterized.named_parameters(
      ('every_checkpoint_unreadable', 'checkpoint'),
      ('junk_data_file', 'data'),
  )
  def test_the_binary_exits_2_without_a_traceback(self, damaged):
    root = self._copy_of_finished_run()
    flag_values = dict(_RUN, rounds=_FINISHED + 1, root_output_dir=root)
    if damaged == 'checkpoint':
      path = run_files.every_checkpoint_garbled(os.path.join(root, 'run'))
    else:
      data_dir = tempfile.mkdtemp(dir=self.root)
      path = _junk_data_file(data_dir)
      flag_values.update(data_source='tff', data_dir=data_dir, experiment_name='tff')
    result = subprocess.run(
        [sys.executable, '-m', 'tasks.binaries.train'] + _argv(**flag_values),
        cwd=_REPO, capture_output=True, text=True, timeout=300,
        env=processes.quiet_env())
    self.assertEqual(result.returncode, 2, result.stderr[-3000:])
    self._assert_one_error_line_naming(result.stderr, path)
