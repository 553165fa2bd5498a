"""The experiment runner on damaged run files: fallback to the newest readable
checkpoint, repair of a cut-off metrics row, and a RunFileError (leaving every file as
found) for what cannot be resumed around."""

import csv
import errno
import json
import os
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import builders
from tasks import registry
from tasks.simulation import checkpoints
from tasks.simulation import experiment
from tasks.simulation import loop
from tasks.simulation import metrics_file
from tasks.simulation import run_config
from tasks.simulation import run_errors
from tests.helpers import run_files

# Trains end to end (runs with checkpoints and TensorBoard files): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

_FINISHED = 3  # Rounds of the run that every case damages.
_ROUNDS = 4  # Rounds the resumed run finishes.
_CONFIG = {'run': 'test'}


def _simulation():
  task = builders.build_task('emnist', 'linear', source='synthetic',
                             client_spec=builders.ClientSpec(1, 10))
  return loop.Simulation(task, registry.aggregator_from_name('gm'), attack='omniscient',
                         rho=0.2, clients_per_round=3, seed=0)


def _run(simulation, directory, rounds, log=None, checkpoint_period=1,
         config=_CONFIG, on_checkpoint=lambda finished: None):
  return experiment.run_experiment(simulation, directory, rounds, config=config,
                                   progress=False, tensorboard=True,
                                   checkpoint_period=checkpoint_period,
                                   log=log or (lambda message: None),
                                   on_checkpoint=on_checkpoint)


def _rows(directory):
  with open(os.path.join(directory, metrics_file.METRICS_FILE), newline='') as f:
    return list(csv.DictReader(f))


def _config(directory):
  with open(os.path.join(directory, run_config.CONFIG_FILE)) as f:
    return json.load(f)


def _snapshot(directory):
  """Every file of `directory` with its bytes."""
  files = {}
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        files[os.path.relpath(path, directory)] = f.read()
  return files


class ExperimentFilesTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp(prefix='test_experiment_')
    cls.simulation = _simulation()
    cls.finished = os.path.join(cls.root, 'finished')
    _run(cls.simulation, cls.finished, _FINISHED)
    # The uninterrupted run every resumed one must equal.
    reference = os.path.join(cls.root, 'reference')
    shutil.copytree(cls.finished, reference)
    _run(cls.simulation, reference, _ROUNDS)
    cls.reference_rows = _rows(reference)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def _copy_of_finished_run(self):
    directory = tempfile.mkdtemp(dir=self.root)
    os.rmdir(directory)
    shutil.copytree(self.finished, directory)
    return directory

  def _assert_equals_the_uninterrupted_run(self, directory):
    self.assertEqual(_rows(directory), self.reference_rows)

  def test_keeps_the_first_and_two_latest_checkpoints(self):
    self.assertEqual(
        sorted(os.listdir(os.path.join(self.finished, checkpoints.CHECKPOINTS_DIR))),
        ['round_1', 'round_2', 'round_3'])
    self.assertEqual([r['round'] for r in self.reference_rows], ['0', '1', '2', '3'])

  @parameterized.named_parameters(*run_files.CHECKPOINT_DAMAGE)
  def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(self, damage, why):
    directory = self._copy_of_finished_run()
    damage(run_files.checkpoint(directory, 3))
    messages = []
    _run(self.simulation, directory, _ROUNDS, log=messages.append)
    self.assertRegex(messages[0], f'(?i)round_3 is unreadable .*{why}')
    self.assertIn('Resuming from round_2, after round 1; the metrics rows from round 2 '
                  'on are rewritten', messages[1])
    self._assert_equals_the_uninterrupted_run(directory)
    self.assertEqual(
        sorted(os.listdir(os.path.join(directory, checkpoints.CHECKPOINTS_DIR))),
        ['round_1', 'round_3', 'round_4', 'unreadable_round_3'])

  def test_two_damaged_checkpoints_fall_back_to_the_first(self):
    directory = self._copy_of_finished_run()
    run_files.garble_variables(run_files.checkpoint(directory, 3))
    run_files.empty_saved_model(run_files.checkpoint(directory, 2))
    messages = []
    _run(self.simulation, directory, _ROUNDS, log=messages.append)
    self.assertIn('Resuming from round_1, after round 0', messages[2])
    self._assert_equals_the_uninterrupted_run(directory)

  def test_cut_off_last_row_and_unfinished_writes_are_repaired(self):
    directory = self._copy_of_finished_run()
    metrics = os.path.join(directory, metrics_file.METRICS_FILE)
    with open(metrics, 'a', newline='') as f:  # Round 3's row, cut off by a kill.
      f.write('3,0,0.51')
    leftovers = [os.path.join(directory, checkpoints.CHECKPOINTS_DIR, 'round_4_temp1234'),
                 metrics + '_temp5678']
    os.mkdir(leftovers[0])
    open(leftovers[1], 'w').close()
    messages = []
    _run(self.simulation, directory, _ROUNDS, log=messages.append)
    self.assertRegex(messages[0], "metrics.csv: dropped line 5 is cut off: '3,0,0.51'")
    self.assertLen(messages, 3)
    for leftover in leftovers:
      self.assertFalse(os.path.exists(leftover))
    self._assert_equals_the_uninterrupted_run(directory)

  def test_damaged_rows_after_the_checkpoint_are_dropped(self):
    directory = self._copy_of_finished_run()
    # Resumed after round 1, round 2's row is dropped.
    run_files.garble_variables(run_files.checkpoint(directory, 3))
    run_files.replace_line(os.path.join(directory, metrics_file.METRICS_FILE), 4,
                           'garbage\r\n')
    messages = []
    _run(self.simulation, directory, _ROUNDS, log=messages.append)
    self.assertRegex(messages[2], "dropped line 4 has 1 of the \\d+ columns: 'garbage'")
    self._assert_equals_the_uninterrupted_run(directory)

  def test_a_kill_while_a_row_is_written_leaves_the_finished_rows_whole(self):
    directory = self._copy_of_finished_run()
    metrics = os.path.join(directory, metrics_file.METRICS_FILE)
    with open(metrics, 'rb') as f:
      before = f.read()
    write = tf.io.gfile.GFile.write

    def write_half_then_die(file, data):
      if not data.startswith(f'{_FINISHED},'):
        return write(file, data)
      write(file, data[:len(data) // 2])
      raise KeyboardInterrupt  # As a kill would, in the middle of round 3's row.

    with mock.patch.object(tf.io.gfile.GFile, 'write', write_half_then_die):
      with self.assertRaises(KeyboardInterrupt):
        _run(self.simulation, directory, _ROUNDS)
    with open(metrics, 'rb') as f:
      self.assertEqual(f.read(), before)
    _run(self.simulation, directory, _ROUNDS)
    self._assert_equals_the_uninterrupted_run(directory)

  @parameterized.named_parameters(
      ('metrics_disk_full', tff.program.CSVFileReleaseManager, 'release',
       OSError(errno.ENOSPC, 'No space left on device', 'metrics.csv_temp'),
       'metrics.csv_temp', 'No space left on device'),
      ('tensorboard_read_only', tff.program.TensorBoardReleaseManager, 'release',
       tf.errors.PermissionDeniedError(None, None, 'events file: read-only\ndetails'),
       'tensorboard', 'events file: read-only'),
      ('checkpoint_disk_full', tff.program.FileProgramStateManager, 'save',
       OSError(errno.ENOSPC, 'No space left on device'), 'checkpoints',
       'No space left on device'))
  def test_a_write_failing_mid_run_is_named_and_the_rerun_resumes(
      self, manager, method, error, path, reason):
    directory = self._copy_of_finished_run()
    original = getattr(manager, method)

    async def fail_in_round_3(self, value, key=None, *args):
      if (key if key is not None else args[0]) in (_FINISHED, _FINISHED + 1):
        raise error
      return await original(self, value, key, *args)

    with mock.patch.object(manager, method, fail_in_round_3):
      with self.assertRaisesRegex(
          run_errors.RunFileError,
          f'{path}: could not be written in round 3 \\({reason}\\)\\. .* resumes at '
          'round 3') as raised:
        _run(self.simulation, directory, _ROUNDS)
    self.assertNotIn('\n', str(raised.exception))
    _run(self.simulation, directory, _ROUNDS)
    self._assert_equals_the_uninterrupted_run(directory)

  def test_a_run_checkpointing_every_other_round_reruns_the_rest_identically(self):
    directory = os.path.join(self.root, 'every_other_round')
    run_round = self.simulation.run_round

    def killed_in_round_3(state, round_num):
      if round_num == 3:
        raise KeyboardInterrupt
      return run_round(state, round_num)

    reported = []
    with mock.patch.object(self.simulation, 'run_round', killed_in_round_3):
      with self.assertRaises(KeyboardInterrupt):
        _run(self.simulation, directory, _ROUNDS, checkpoint_period=2,
             on_checkpoint=reported.append)
    checkpoints_dir = os.path.join(directory, checkpoints.CHECKPOINTS_DIR)
    self.assertEqual(os.listdir(checkpoints_dir), ['round_2'])
    # What the interruption line says (`exit_status.rounds_checkpointed`): the
    # rounds the checkpoints hold, from the start, not the rows written.
    self.assertEqual(reported, [0, 2])
    self.assertLen(_rows(directory), 3)  # Round 2's row is ahead of the checkpoint.
    reported.clear()
    _run(self.simulation, directory, _ROUNDS, checkpoint_period=2,
         on_checkpoint=reported.append)
    self.assertEqual(reported, [2, 4])
    self.assertEqual(sorted(os.listdir(checkpoints_dir)), ['round_2', 'round_4'])
    self._assert_equals_the_uninterrupted_run(directory)

  def test_a_repeated_row_equal_to_the_first_is_dropped(self):
    directory = self._copy_of_finished_run()
    run_files.repeat_row_of_round_0(directory)
    messages = []
    _run(self.simulation, directory, _ROUNDS, log=messages.append)
    self.assertRegex(messages[0], r'metrics.csv: dropped line 3, a second row of round '
                     r'0 \(line 2\)')
    self._assert_equals_the_uninterrupted_run(directory)

  @parameterized.named_parameters(('without_line_end', ''), ('with_line_end', '\r\n'))
  def test_a_cut_off_row_of_the_last_checkpointed_round_is_rebuilt(self, line_end):
    directory = self._copy_of_finished_run()
    run_files.cut_off_last_row(directory, line_end)
    messages = []
    _run(self.simulation, directory, _ROUNDS, log=messages.append)
    self.assertRegex(messages[0], 'metrics.csv: line 4 .*: the row of round 2, which is '
                     'checkpointed; rebuilding it by rerunning')
    self._assert_equals_the_uninterrupted_run(directory)
    self.assertEqual(
        sorted(os.listdir(os.path.join(directory, checkpoints.CHECKPOINTS_DIR))),
        ['round_1', 'round_3', 'round_4'])

  def test_tensorboard_holds_one_value_per_step_after_a_resume(self):
    directory = self._copy_of_finished_run()
    self.assertEqual(run_files.tensorboard_steps(directory)['train_loss'], [0, 1, 2])
    run_files.garble_variables(run_files.checkpoint(directory, 3))  # Reruns round 2.
    _run(self.simulation, directory, _ROUNDS)
    steps = run_files.tensorboard_steps(directory)
    self.assertEqual(steps['train_loss'], [0, 1, 2, 3])
    self.assertEqual(steps['test_accuracy'], [0, 1, 2, 3])

  def test_without_config_json_the_checkpoints_refuse_other_flags(self):
    directory = self._copy_of_finished_run()
    os.remove(os.path.join(directory, run_config.CONFIG_FILE))
    before = _snapshot(directory)
    with self.assertRaisesRegex(
        run_errors.ConfigMismatchError,
        r"round_3 is a checkpoint of a run with a different configuration \(run: "
        r"'test' → 'other'; fingerprint \w+, these flags \w+\): it is not resumed"):
      _run(self.simulation, directory, _ROUNDS, config={'run': 'other'})
    self.assertEqual(_snapshot(directory), before)
    _run(self.simulation, directory, _ROUNDS)  # The run's own flags resume it.
    self._assert_equals_the_uninterrupted_run(directory)
    self.assertEqual(_config(directory), _CONFIG)

  def test_flags_that_change_the_state_are_named_as_another_configuration(self):
    # A warm-started GM carries its previous aggregate: the checkpoint's structure
    # differs, yet the answer is "other flags", not "damaged: delete the run".
    directory = self._copy_of_finished_run()
    os.remove(os.path.join(directory, run_config.CONFIG_FILE))
    task = builders.build_task('emnist', 'linear', source='synthetic',
                               client_spec=builders.ClientSpec(1, 10))
    warm = loop.Simulation(
        task, registry.aggregator_from_name('gm', initial_point='previous'),
        attack='omniscient', rho=0.2, clients_per_round=3, seed=0)
    before = _snapshot(directory)
    with self.assertRaisesRegex(run_errors.ConfigMismatchError,
                                r'round_3 is a checkpoint of a run with a different '
                                r"configuration \(run: 'test' → 'warm'"):
      _run(warm, directory, _ROUNDS, config={'run': 'warm'})
    self.assertEqual(_snapshot(directory), before)

  @parameterized.named_parameters(('config_json_kept', True),
                                  ('config_json_deleted', False))
  def test_checkpoints_without_a_configuration_need_config_json(self, kept):
    directory = os.path.join(self.root, f'older_checkpoints_{kept}')
    checkpoint = checkpoints.contents
    with mock.patch.object(checkpoints, 'contents',
                           lambda state, calls, _: checkpoint(state, calls, None)):
      _run(self.simulation, directory, _FINISHED)  # As an older version wrote them.
    if kept:
      _run(self.simulation, directory, _ROUNDS)
      self._assert_equals_the_uninterrupted_run(directory)
      return
    os.remove(os.path.join(directory, run_config.CONFIG_FILE))
    with self.assertRaisesRegex(run_errors.RunFileError,
                                'round_3: carries no configuration .* Restore config'):
      _run(self.simulation, directory, _ROUNDS)

  def test_a_run_stopped_in_round_0_takes_the_corrected_flags(self):
    directory = os.path.join(self.root, 'stopped_in_round_0')
    with mock.patch.object(self.simulation, 'run_round',
                           side_effect=KeyboardInterrupt):
      with self.assertRaises(KeyboardInterrupt):
        _run(self.simulation, directory, _ROUNDS, config={'run': 'mistaken'})
    with open(os.path.join(directory, metrics_file.METRICS_FILE)) as f:
      self.assertEqual(f.read(), 'round\n')  # Only the header.
    _run(self.simulation, directory, _ROUNDS)
    self._assert_equals_the_uninterrupted_run(directory)
    self.assertEqual(_config(directory), _CONFIG)

  @parameterized.named_parameters(*run_files.BAD_FILES)
  def test_what_cannot_be_resumed_is_named_and_left_as_found(self, damage, problem):
    directory = self._copy_of_finished_run()
    path = damage(directory)
    before = _snapshot(directory)
    with self.assertRaisesRegex(run_errors.RunFileError, problem) as raised:
      _run(self.simulation, directory, _ROUNDS)
    self.assertEqual(raised.exception.path, path)
    self.assertTrue(str(raised.exception).startswith(path + ': '))
    self.assertNotIn('\n', str(raised.exception))
    self.assertTrue(raised.exception.fix)
    self.assertEqual(_snapshot(directory), before)

  @parameterized.named_parameters(('every_checkpoint_kept', ()),
                                  ('only_round_1_kept', (2, 3)),
                                  ('only_round_3_kept', (1, 2)))
  def test_a_deleted_metrics_csv_is_rebuilt_by_rerunning_the_rounds(self, removed):
    directory = self._copy_of_finished_run()
    os.remove(os.path.join(directory, metrics_file.METRICS_FILE))
    for version in removed:
      shutil.rmtree(run_files.checkpoint(directory, version))
    messages = []
    _run(self.simulation, directory, _ROUNDS, log=messages.append)
    kept = max({1, 2, 3} - set(removed))
    self.assertRegex(messages[0], f'metrics.csv: missing, while the checkpoints hold '
                     f'rounds 0..{kept - 1}; rebuilding it by rerunning them from '
                     'round 0')
    self._assert_equals_the_uninterrupted_run(directory)

  @parameterized.named_parameters(('test_loss', 'evaluate', 'test_loss', 'nan'),
                                  ('train_loss', 'run_round', 'train_loss', 'inf'))
  def test_a_non_finite_metric_stops_the_run_as_a_non_finite_model_does(
      self, method, metric, value):
    # E.g. weights finite but at float32's limit (client lr 1e38 with the mean): the
    # test loss overflows to NaN while every weight is finite.
    directory = os.path.join(self.root, f'non_finite_{metric}')
    original = getattr(self.simulation, method)

    def broken_in_round_1(*args):
      result = original(*args)
      metrics = result[1] if method == 'run_round' else result
      if (args[1] if method == 'run_round' else broken_in_round_1.round) == 1:
        metrics[metric] = float(value)
      broken_in_round_1.round += method == 'evaluate'
      return result

    broken_in_round_1.round = 0
    with mock.patch.object(self.simulation, method, broken_in_round_1):
      with self.assertRaisesRegex(
          run_errors.NonFiniteStateError,
          f'Round 1 produced a model whose {metric}={value} is not finite'):
        _run(self.simulation, directory, _ROUNDS)
    self.assertEqual(
        os.listdir(os.path.join(directory, checkpoints.CHECKPOINTS_DIR)), ['round_1'])
    self.assertLen(_rows(directory), 2)  # Round 1's, for diagnosis.

  def test_a_newer_checkpoint_of_another_configuration_is_named_as_such(self):
    # Refused from its identity file, unloaded; metrics.csv, which has no row for it,
    # is not blamed, and the fix does not delete the healthy run.
    directory = self._copy_of_finished_run()
    foreign = run_files.checkpoint(directory, _FINISHED + 1)
    shutil.copytree(run_files.checkpoint(directory, _FINISHED), foreign)
    with open(os.path.join(foreign, 'run_identity.json'), 'w') as f:
      f.write(run_config.run_identity({'run': 'other'}))
    before = _snapshot(directory)
    with self.assertRaisesRegex(
        run_errors.ConfigMismatchError,
        f"round_4 is a checkpoint of a run with a different configuration \\(run: "
        f"'other' → 'test'.* move {foreign} out of") as raised:
      _run(self.simulation, directory, _ROUNDS + 1)
    self.assertNotIn(metrics_file.METRICS_FILE, str(raised.exception))
    self.assertNotIn('delete', str(raised.exception))
    self.assertEqual(_snapshot(directory), before)

  def test_fewer_rounds_than_finished_are_refused(self):
    directory = self._copy_of_finished_run()
    before = _snapshot(directory)
    with self.assertRaisesRegex(
        run_errors.ConfigMismatchError,
        f'holds a run of {_FINISHED} finished rounds, more than --rounds=2: a run is '
        f'not shortened .* Pass --rounds={_FINISHED}'):
      _run(self.simulation, directory, 2)
    self.assertEqual(_snapshot(directory), before)

  def test_config_that_is_not_an_object_is_named(self):
    directory = self._copy_of_finished_run()
    with open(os.path.join(directory, run_config.CONFIG_FILE), 'w') as f:
      json.dump([1, 2], f)
    with self.assertRaisesRegex(run_errors.RunFileError, 'holds a JSON list'):
      _run(self.simulation, directory, _ROUNDS)


class CheckConfigTest(parameterized.TestCase):
  """A restarted run must have the saved configuration, once it has a round to lose."""

  def _directory_with_config(self, finished):
    directory = tempfile.mkdtemp(prefix='test_check_config_')
    self.addCleanup(shutil.rmtree, directory)
    run_config.check_config(directory, {'seed': 0, 'rounds': 5})
    if finished == 'metrics':
      with open(os.path.join(directory, metrics_file.METRICS_FILE), 'w') as f:
        f.write('round,train_loss\n0,1.0\n')
    elif finished == 'header':
      with open(os.path.join(directory, metrics_file.METRICS_FILE), 'w') as f:
        f.write('round,train_loss\n')
    elif finished == 'checkpoint':
      os.makedirs(os.path.join(directory, checkpoints.CHECKPOINTS_DIR, 'round_1'))
    return directory

  def _saved(self, directory):
    with open(os.path.join(directory, run_config.CONFIG_FILE)) as f:
      return json.load(f)

  @parameterized.parameters('metrics', 'checkpoint')
  def test_a_run_with_finished_rounds_refuses_other_flags(self, finished):
    directory = self._directory_with_config(finished)
    with self.assertRaisesRegex(run_errors.ConfigMismatchError,
                                r"seed: 0 → 1\). Use the same flags"):
      run_config.check_config(directory, {'seed': 1, 'rounds': 5})
    self.assertEqual(self._saved(directory), {'seed': 0, 'rounds': 5})

  def test_ignored_keys_may_change(self):
    directory = self._directory_with_config('metrics')
    run_config.check_config(directory, {'seed': 0, 'rounds': 9}, ignore=('rounds',))
    self.assertEqual(self._saved(directory), {'seed': 0, 'rounds': 5})

  @parameterized.parameters(None, 'header')
  def test_a_run_without_a_finished_round_takes_the_new_flags(self, finished):
    # E.g. its data failed to load, or it stopped in round 0 with metrics.csv holding
    # only its header: the corrected command must not be refused.
    directory = self._directory_with_config(finished)
    run_config.check_config(directory, {'seed': 1, 'rounds': 5})
    self.assertEqual(self._saved(directory), {'seed': 1, 'rounds': 5})


if __name__ == '__main__':
  absltest.main()
