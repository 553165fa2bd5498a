"""The sweep: runs every cell, skips finished runs, writes its table and plots."""

import csv
import dataclasses
import os
import shutil
import tempfile
from unittest import mock

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow_federated as tff

from tasks import builders
from tasks import registry
from tasks.simulation import ledger
from tasks.simulation import loop
from tasks.simulation import metrics_file
from tasks.simulation import run_config
from tasks.simulation import sweep
from tasks.simulation import sweep_report
from tests.helpers import processes

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def _task(batch_size: int = 10, seed: int = 0):
  return builders.build_task('emnist', 'linear', source='synthetic',
                             client_spec=builders.ClientSpec(1, batch_size), seed=seed)


def _spec(**fields) -> sweep.SweepSpec:
  """A small sweep: 3 clients per round, learning rate 0.1, the given fields."""
  return sweep.SweepSpec(
      simulation_kwargs=dict(clients_per_round=3,
                             client_learning_rate=loop.StepSchedule(0.1)), **fields)


@pytest.mark.slow  # Trains end to end: sweeps of training runs.
class SweepTest(parameterized.TestCase):

  def test_table_plots_and_resume(self):
    output_dir = tempfile.mkdtemp(prefix='test_sweep_')
    self.addCleanup(shutil.rmtree, output_dir, ignore_errors=True)
    task = _task()
    spec = _spec(
        aggregators=['mean', 'gm'], attacks=['omniscient'], rhos=[0.0, 0.3],
        seeds=[0, 1], rounds=2)
    self.assertLen(spec.runs(), 8)
    messages = []
    sweep.run_sweep(task, spec, output_dir, progress=False, log=messages.append)
    markdown = sweep_report.write_report(spec, output_dir)

    self.assertIn('| aggregator | clean ρ=0 | omniscient ρ=0.3 |', markdown)
    self.assertLen(markdown.strip().splitlines(), 4)  # Header, rule, 2 aggregators.
    with open(os.path.join(output_dir, 'summary.csv')) as f:
      rows = list(csv.DictReader(f))
    self.assertLen(rows, 4)
    for row in rows:
      self.assertEqual(row['num_seeds'], '2')
      self.assertLessEqual(float(row['final_accuracy_min']),
                           float(row['final_accuracy_mean']))
      self.assertLessEqual(float(row['final_accuracy_mean']),
                           float(row['final_accuracy_max']))
    gm_calls = [r['secure_average_calls_per_round'] for r in rows if r['aggregator'] == 'gm']
    self.assertEqual(set(gm_calls), {'3.0'})
    for name in ('accuracy_vs_rho.png', 'curves_none_rho0.png',
                 'curves_omniscient_rho0.3.png'):
      path = os.path.join(output_dir, name)
      self.assertGreater(os.path.getsize(path), 1000, name)

    # A second session finds every run finished and only rewrites the report.
    messages.clear()
    sweep.run_sweep(task, spec, output_dir, progress=False, log=messages.append)
    self.assertLen(messages, 8)
    self.assertTrue(all(m.endswith('finished, skipped.') for m in messages))

  def test_worker_momentum_is_a_row_of_its_own(self):
    output_dir = tempfile.mkdtemp(prefix='test_sweep_momentum_')
    self.addCleanup(shutil.rmtree, output_dir, ignore_errors=True)
    task = _task()
    spec = _spec(
        aggregators=['mean'], attacks=['omniscient'], rhos=[0.0], seeds=[0],
        rounds=2, worker_momenta=[0.0, 0.9])
    self.assertEqual([run.name for run in spec.runs()],
                     ['mean_none_rho0_seed0', 'mean_wm0.9_none_rho0_seed0'])
    sweep.run_sweep(task, spec, output_dir, progress=False, log=lambda m: None)
    losses = [[row['train_loss'] for row in metrics_file.read_rows(
        sweep.run_dir(output_dir, run))] for run in spec.runs()]
    # Round 0 trains the same model; with momentum the first step is (1 − β)Δ.
    self.assertAlmostEqual(losses[0][0], losses[1][0], places=5)
    self.assertNotAlmostEqual(losses[0][1], losses[1][1], places=3)
    markdown = sweep_report.write_report(spec, output_dir)
    self.assertIn('| mean +wm0.9 |', markdown)


def _blow_up_attacked_runs_at_round_1(run_round):
  """`Simulation.run_round` that hands a run with corrupted clients, at round 1, a
  finite model at float32's limit, from which local training overflows."""

  def patched(simulation, state, round_num):
    if simulation.corrupted_clients and round_num == 1:
      state['model']['trainable'] = [np.full_like(a, 3e38)
                                     for a in state['model']['trainable']]
    return run_round(simulation, state, round_num)

  return patched


class FactoryPerConfigurationTest(parameterized.TestCase):

  @parameterized.parameters(('gm', {}, True), ('gm', {'num_communication_passes': 2}, True),
                            ('krum', {}, False), ('arc+mean', {}, False))
  def test_runs_share_a_factory_unless_their_rho_reaches_it(self, name, args, shared):
    # pylint: disable=protected-access
    first = sweep._aggregator_factory(name, 0.1, args)
    self.assertIs(sweep._aggregator_factory(name, 0.1, dict(args)), first)
    self.assertEqual(sweep._aggregator_factory(name, 0.25, args) is first, shared)

  def test_other_arguments_another_factory(self):
    # pylint: disable=protected-access
    self.assertIsNot(sweep._aggregator_factory('gm', 0.1, {}),
                     sweep._aggregator_factory('gm', 0.1, {'num_communication_passes': 2}))

  def test_the_least_recently_used_factory_is_dropped(self):
    # pylint: disable=protected-access
    self.enter_context(mock.patch.dict(sweep._FACTORIES, clear=True))

    def factory(passes):
      return sweep._aggregator_factory('gm', 0.1, {'num_communication_passes': passes})

    first, second = factory(2), factory(3)
    for passes in range(4, sweep._MAX_FACTORIES + 3):
      factory(passes)
      factory(2)  # In use: the first factory stays, the second is the oldest unused.
    self.assertLen(sweep._FACTORIES, sweep._MAX_FACTORIES)
    self.assertIs(factory(2), first)
    self.assertIsNot(factory(3), second)


@pytest.mark.slow  # Trains end to end: a sweep of training runs.
class DivergenceSweepTest(parameterized.TestCase):

  def test_a_diverged_run_is_entered_and_the_sweep_goes_on(self):
    output_dir = tempfile.mkdtemp(prefix='test_sweep_diverged_')
    self.addCleanup(shutil.rmtree, output_dir, ignore_errors=True)
    task = _task()
    # Krum refuses zero clients: the round that killed a whole leaderboard slice. The
    # mean keeps the blown-up model (TFF's finalizer skips a non-finite aggregate):
    # finite weights at float32's limit, whose test loss is NaN.
    spec = _spec(aggregators=['krum', 'mean'], attacks=['sign_flip'], rhos=[0.3],
                 seeds=[0], rounds=3)
    krum_run, mean_run = spec.runs()
    ledger_path = os.path.join(output_dir, 'ledger.csv')
    messages = []
    with mock.patch.object(loop.Simulation, 'run_round',
                           _blow_up_attacked_runs_at_round_1(loop.Simulation.run_round)):
      trained = sweep.run_sweep(task, spec, output_dir, progress=False,
                                log=messages.append, ledger_path=ledger_path)
    self.assertEqual(trained, 2)
    self.assertLen(messages, 2)
    self.assertRegex(messages[0], krum_run.name + r': Round 1: only 0 of 3 clients '
                     r'.*diverged')
    self.assertRegex(messages[1], mean_run.name + r': Round 1 produced a model whose '
                     r'test_loss=nan is not finite')
    entries = {key[0]: entry for key, entry in ledger.read(ledger_path).items()}
    self.assertEqual({name: entry.diverged for name, entry in entries.items()},
                     {krum_run.name: True, mean_run.name: True})
    self.assertBetween(entries[krum_run.name].final_accuracy, 0.0, 1.0)  # Round 0's.
    self.assertLen(metrics_file.read_rows(sweep.run_dir(output_dir, krum_run)), 1)
    # Round 1's row is kept for diagnosis; no later round was trained.
    self.assertLen(metrics_file.read_rows(sweep.run_dir(output_dir, mean_run)), 2)

    messages.clear()
    self.assertEqual(sweep.run_sweep(task, spec, output_dir, progress=False,
                                     log=messages.append), 0)
    self.assertEqual(messages, [
        f'[1/2] {krum_run.name}: diverged in an earlier session, skipped.',
        f'[2/2] {mean_run.name}: diverged in an earlier session, skipped.'])


@pytest.mark.slow  # Trains end to end: a sweep of training runs.
class FailedRunSweepTest(parameterized.TestCase):

  def test_a_run_that_cannot_train_is_marked_and_the_sweep_goes_on(self):
    output_dir = tempfile.mkdtemp(prefix='test_sweep_failed_')
    self.addCleanup(shutil.rmtree, output_dir, ignore_errors=True)
    # Krum at ρ = 0.45 assumes f = ⌊0.45·3⌋ = 1 of the 3 clients corrupted: 3 ≤ 2f + 2.
    spec = _spec(aggregators=['krum', 'mean'], attacks=['sign_flip'], rhos=[0.0, 0.45],
                 seeds=[0], rounds=1)
    messages = []
    sweep.run_sweep(_task(), spec, output_dir, progress=False, log=messages.append)
    krum_attacked = spec.runs()[1]
    self.assertEqual(krum_attacked.name, 'krum_sign_flip_rho0.45_seed0')
    self.assertLen(messages, 1)
    self.assertRegex(messages[0], r'^\[2/4\] krum_sign_flip_rho0.45_seed0: failed: .*'
                     r'n > 2f \+ 2')
    self.assertEqual(sweep.failed_runs(spec, output_dir), [krum_attacked])
    for run in spec.runs():  # The other runs trained.
      if run != krum_attacked:
        self.assertLen(metrics_file.read_rows(sweep.run_dir(output_dir, run)), 1)
    markdown = sweep_report.write_report(spec, output_dir)
    self.assertRegex(markdown, r'\| krum \| [0-9.]+ \| failed \|')
    with open(os.path.join(output_dir, 'summary.csv')) as f:
      rows = {(r['aggregator'], r['rho']): r for r in csv.DictReader(f)}
    self.assertEqual(rows[('krum', '0.45')]['num_failed'], '1')
    self.assertEqual(rows[('mean', '0.45')]['num_failed'], '0')

    # A rerun retries the failed run only (it fails again: same settings).
    messages.clear()
    self.assertEqual(sweep.run_sweep(_task(), spec, output_dir, progress=False,
                                     log=messages.append), 1)
    self.assertIn('[2/4] krum_sign_flip_rho0.45_seed0: failed: ', messages[1])


@pytest.mark.slow  # Trains end to end: sweeps of training runs, ledgers.
class LedgerSweepTest(parameterized.TestCase):

  def test_a_ledger_stands_in_for_the_run_directories(self):
    first_dir = tempfile.mkdtemp(prefix='test_sweep_ledger_')
    second_dir = tempfile.mkdtemp(prefix='test_sweep_ledger_')
    for directory in (first_dir, second_dir):
      self.addCleanup(shutil.rmtree, directory, ignore_errors=True)
    task = _task()
    spec = _spec(aggregators=['gm'], attacks=['sign_flip'], rhos=[0.0, 0.3],
                 seeds=[0], rounds=2)
    ledger_path = os.path.join(first_dir, 'ledger.csv')
    sweep.run_sweep(task, spec, first_dir, progress=False, log=lambda m: None,
                    ledger_path=ledger_path)
    entries = sweep.finished_entries(task, spec, first_dir)
    self.assertLen(entries, 2)
    self.assertEqual(ledger.read(ledger_path), entries)  # Entered as they finished.
    expected = sweep_report.summarize(spec, first_dir)

    # Another machine, with the ledger and no run directories, trains nothing and
    # tabulates the same numbers.
    messages = []
    trained = sweep.run_sweep(task, spec, second_dir, progress=False,
                              log=messages.append, recorded=entries)
    self.assertEqual(trained, 0)
    self.assertTrue(all(m.endswith('in the ledger, skipped.') for m in messages))
    self.assertFalse(os.path.exists(os.path.join(second_dir, 'runs')))
    recorded = sweep.recorded_results(task, spec, entries)
    self.assertEqual(sweep_report.summarize(spec, second_dir, recorded), expected)

    # Another protocol (more rounds, other local work or data) does not match.
    for other_task, other_spec in (
        (task, dataclasses.replace(spec, rounds=3)),
        (builders.build_task('emnist', 'linear', source='synthetic',
                             client_spec=builders.ClientSpec(2, 10)), spec),  # Epochs.
        (_task(seed=1), spec)):
      self.assertEqual(sweep.recorded_results(other_task, other_spec, entries), {})

  def test_finished_runs_may_drop_their_checkpoints(self):
    output_dir = tempfile.mkdtemp(prefix='test_sweep_ledger_')
    self.addCleanup(shutil.rmtree, output_dir, ignore_errors=True)
    task = _task()
    spec = _spec(aggregators=['mean'], attacks=['sign_flip'], rhos=[0.0, 0.3],
                 seeds=[0], rounds=2)
    ledger_path = os.path.join(output_dir, 'ledger.csv')
    self.assertEqual(sweep.run_sweep(task, spec, output_dir, progress=False,
                                     log=lambda m: None, ledger_path=ledger_path,
                                     keep_checkpoints=False), 2)
    for run in spec.runs():
      self.assertFalse(os.path.exists(os.path.join(sweep.run_dir(output_dir, run),
                                                   'checkpoints')))
    entries = sweep.finished_entries(task, spec, output_dir)
    self.assertEqual(ledger.read(ledger_path), entries)
    self.assertTrue(all(0 <= e.final_accuracy <= 1 for e in entries.values()))
    # Their fingerprints mark them finished, with or without the ledger.
    messages = []
    self.assertEqual(sweep.run_sweep(task, spec, output_dir, progress=False,
                                     log=messages.append), 0)
    self.assertLen(messages, 2)
    self.assertTrue(all(m.endswith('finished, skipped.') for m in messages))

  def test_a_run_finished_with_other_settings_is_not_entered(self):
    output_dir = tempfile.mkdtemp(prefix='test_sweep_ledger_')
    self.addCleanup(shutil.rmtree, output_dir, ignore_errors=True)
    task = _task()
    spec = _spec(aggregators=['mean'], attacks=['sign_flip'], rhos=[0.0], seeds=[0],
                 rounds=1)
    sweep.run_sweep(task, spec, output_dir, progress=False, log=lambda m: None)
    self.assertLen(sweep.finished_entries(task, spec, output_dir), 1)
    # The same directory read with another batch size: it was not trained that way.
    other = _task(batch_size=20)
    self.assertEqual(sweep.finished_entries(other, spec, output_dir), {})
    os.remove(os.path.join(sweep.run_dir(output_dir, spec.runs()[0]),
                           sweep.FINGERPRINT_FILE))
    self.assertEqual(sweep.finished_entries(task, spec, output_dir), {})

  def test_a_cell_owned_by_another_process_is_skipped(self):
    output_dir = tempfile.mkdtemp(prefix='test_sweep_owned_')
    self.addCleanup(shutil.rmtree, output_dir, ignore_errors=True)
    spec = _spec(aggregators=['mean'], attacks=['omniscient'], rhos=[0.0, 0.3],
                 seeds=[0], rounds=1)
    owned, free = spec.runs()
    messages = []
    with processes.run_owner(sweep.run_dir(output_dir, owned), _REPO) as owner:
      trained = sweep.run_sweep(_task(), spec, output_dir, progress=False,
                                log=messages.append)
    self.assertEqual(trained, 1)
    self.assertIn(f'[1/2] {owned.name}: run by process {owner.pid} now, skipped.',
                  messages)
    self.assertFalse(os.path.exists(os.path.join(sweep.run_dir(output_dir, owned),
                                                 sweep.FINGERPRINT_FILE)))
    self.assertTrue(os.path.exists(os.path.join(sweep.run_dir(output_dir, free),
                                                sweep.FINGERPRINT_FILE)))


class AggregatorRevisionTest(parameterized.TestCase):

  @parameterized.parameters(
      ('gm', {'GeometricMedianFactory': 4}),
      ('one_step_gm', {'GeometricMedianFactory': 4}),
      ('bucketing+gm', {'GatheredGeometricMedianFactory': 4}),
      ('arc+gm', {'GeometricMedianFactory': 4}),
      ('gamma_mean', {'GammaMeanFactory': 2}),
      ('median', {}),
      ('mean', {}),
  )
  def test_a_revised_default_reaches_the_fingerprint_through_wrappers(self, name,
                                                                      expected):
    # Only the factories whose results changed declare a revision: the ledger's
    # other runs keep their fingerprints and are not retrained.
    factory = registry.aggregator_from_name(name, assumed_byzantine_fraction=0.1)
    self.assertEqual(registry.results_revisions(factory), expected)


def _with_server_optimizer(spec, learning_rate, momentum=None):
  return dataclasses.replace(spec, simulation_kwargs=dict(
      spec.simulation_kwargs, server_optimizer=tff.learning.optimizers.build_sgdm(
          learning_rate=learning_rate, momentum=momentum)))


def _with_client_learning_rate(spec, learning_rate):
  return dataclasses.replace(spec, simulation_kwargs=dict(
      spec.simulation_kwargs, client_learning_rate=loop.StepSchedule(learning_rate)))


class RunIdentityTest(parameterized.TestCase):
  """A cell's identity (its config.json, bound to its checkpoints) holds every
  setting that changes what its rounds compute."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.task = _task()
    cls.spec = _with_server_optimizer(_spec(
        aggregators=['gm'], attacks=['alie'], rhos=[0.25], seeds=[0], rounds=3), 1.0)

  def _identity(self, task, spec):
    return run_config.run_identity(sweep.run_config(task, spec, spec.runs()[0]))

  @parameterized.named_parameters(
      ('server_learning_rate', lambda t: t, lambda s: _with_server_optimizer(s, 0.5)),
      ('server_momentum', lambda t: t, lambda s: _with_server_optimizer(s, 1.0, 0.9)),
      ('client_learning_rate', lambda t: t,
       lambda s: _with_client_learning_rate(s, 0.5)),
      ('batch_size', lambda t: _task(batch_size=20), lambda s: s),
      ('local_epochs', lambda t: builders.build_task(
          'emnist', 'linear', source='synthetic', client_spec=builders.ClientSpec(2, 10)),
       lambda s: s),
      ('data_seed', lambda t: _task(seed=1), lambda s: s),
      ('num_clients', lambda t: builders.build_task(
          'emnist', 'linear', source='synthetic', client_spec=builders.ClientSpec(1, 10),
          num_clients=5), lambda s: s),
      ('data_source', lambda t: dataclasses.replace(
          t, provenance=dict(t.provenance, source='bundled')), lambda s: s),
      ('clients_per_round', lambda t: t, lambda s: dataclasses.replace(
          s, simulation_kwargs=dict(s.simulation_kwargs, clients_per_round=4))),
  )
  def test_every_setting_that_changes_a_number_is_in_the_identity(self, task, spec):
    self.assertNotEqual(self._identity(task(self.task), spec(self.spec)),
                        self._identity(self.task, self.spec))

  def test_rounds_and_evaluation_period_are_in_the_fingerprint_only(self):
    for other in (dataclasses.replace(self.spec, rounds=5),
                  dataclasses.replace(self.spec, eval_period=2)):
      self.assertEqual(self._identity(self.task, other),
                       self._identity(self.task, self.spec))
      self.assertNotEqual(
          sweep.run_fingerprint(self.task, other, other.runs()[0]),
          sweep.run_fingerprint(self.task, self.spec, self.spec.runs()[0]))


def _metrics_text(directory):
  with open(os.path.join(directory, metrics_file.METRICS_FILE)) as f:
    return f.read()


@pytest.mark.slow  # Trains end to end: sweeps of training runs.
class CellIdentitySweepTest(parameterized.TestCase):
  """A cell without its fingerprint (interrupted, killed before writing it, or not
  made by the sweep) is resumed only under its own identity."""

  def setUp(self):
    super().setUp()
    self.output_dir = tempfile.mkdtemp(prefix='test_sweep_identity_')
    self.addCleanup(shutil.rmtree, self.output_dir, ignore_errors=True)
    self.task = _task()
    self.spec = _with_server_optimizer(_spec(
        aggregators=['mean'], attacks=['sign_flip'], rhos=[0.0], seeds=[0],
        rounds=2), 1.0)
    self.run = self.spec.runs()[0]
    self.directory = sweep.run_dir(self.output_dir, self.run)

  def _sweep(self, spec, output_dir=None, **kwargs):
    messages = []
    trained = sweep.run_sweep(self.task, spec, output_dir or self.output_dir,
                              progress=False, log=messages.append, **kwargs)
    return trained, messages

  def _without_fingerprint(self, spec):
    """The cell trained under `spec`, as a session killed before its fingerprint."""
    self._sweep(spec)
    os.remove(os.path.join(self.directory, sweep.FINGERPRINT_FILE))

  def _clean_run(self, spec):
    clean_dir = tempfile.mkdtemp(prefix='test_sweep_identity_clean_')
    self.addCleanup(shutil.rmtree, clean_dir, ignore_errors=True)
    self._sweep(spec, clean_dir)
    return sweep.run_dir(clean_dir, self.run)

  @parameterized.named_parameters(
      # An interrupted cell (1 of 2 rounds) resumed with another server learning rate.
      ('interrupted_server_learning_rate',
       lambda s: dataclasses.replace(_with_server_optimizer(s, 0.5), rounds=1),
       "server_optimizer: .*'_lr': 0.5"),
      # A finished run of another client learning rate placed in the cell.
      ('finished_client_learning_rate', lambda s: _with_client_learning_rate(s, 0.5),
       'client_learning_rate: .*0.5'),
      # More rounds than the sweep's: not shortened, not taken for this cell.
      ('more_rounds', lambda s: dataclasses.replace(s, rounds=3), 'more than'),
  )
  def test_a_cell_of_other_settings_is_set_aside_and_trained(self, other, named):
    self._without_fingerprint(other(self.spec))
    trained, messages = self._sweep(self.spec)
    self.assertEqual(trained, 1)
    self.assertLen(messages, 1)
    self.assertRegex(messages[0], f'{self.run.name}: .*{named}.* Moved it to '
                     f'{self.directory}.other-\\w+; training this cell afresh')
    stale = [n for n in os.listdir(os.path.dirname(self.directory)) if '.other-' in n]
    self.assertLen(stale, 1)  # Kept, not deleted.
    self.assertEqual(_metrics_text(self.directory),
                     _metrics_text(self._clean_run(self.spec)))
    self.assertEqual(sweep._stored_fingerprint(self.directory),  # pylint: disable=protected-access
                     sweep.run_fingerprint(self.task, self.spec, self.run))

  def test_a_cell_killed_before_its_fingerprint_is_recorded_without_training(self):
    self._without_fingerprint(self.spec)
    before = _metrics_text(self.directory)
    ledger_path = os.path.join(self.output_dir, 'ledger.csv')
    with mock.patch.object(loop.Simulation, 'run_round',
                           side_effect=AssertionError('a round was trained')):
      _, messages = self._sweep(self.spec, ledger_path=ledger_path)
    self.assertEqual(messages, [])
    self.assertEqual(_metrics_text(self.directory), before)
    self.assertEqual(sweep._stored_fingerprint(self.directory),  # pylint: disable=protected-access
                     sweep.run_fingerprint(self.task, self.spec, self.run))
    self.assertEqual(list(ledger.read(ledger_path)),
                     [(self.run.name, sweep.run_fingerprint(self.task, self.spec,
                                                            self.run))])


class StaleRunTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.spec = sweep.SweepSpec(aggregators=['gm'], attacks=['omniscient'],
                                rhos=[0.1], seeds=[0], rounds=3)
    self.run = self.spec.runs()[0]
    root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, root)
    self.directory = os.path.join(root, self.run.name)

  def _finished_under(self, fingerprint, diverged=False):
    os.makedirs(self.directory)
    with open(os.path.join(self.directory, sweep.FINGERPRINT_FILE), 'w') as f:
      f.write(fingerprint)
    if diverged:
      open(os.path.join(self.directory, sweep.DIVERGED_MARKER), 'w').close()

  def _why_skipped(self, fingerprint, owner=False):
    return sweep._why_skipped(self.directory, self.run, fingerprint, {},  # pylint: disable=protected-access
                              owner=owner)

  @parameterized.parameters(True, False)
  def test_a_run_finished_under_another_configuration_is_set_aside(self, diverged):
    # E.g. under an older revision of its aggregator: neither its result nor its
    # divergence is this configuration's.
    self._finished_under('old', diverged)
    self.assertIsNone(self._why_skipped('new'))
    self.assertTrue(os.path.isdir(self.directory))  # Only its owner moves it.
    self.assertIsNone(self._why_skipped('new', owner=True))
    self.assertEqual(os.listdir(self.directory), [])
    self.assertCountEqual(os.listdir(self.directory + '.stale-old'),
                          [sweep.FINGERPRINT_FILE] + [sweep.DIVERGED_MARKER] * diverged)

  def test_the_same_configuration_stays_finished(self):
    self._finished_under('same')
    self.assertEqual(self._why_skipped('same'), 'finished')
