"""Ditto and personalized RFA as client-work variants of the one round loop: two
rounds against numpy references, personal state through checkpoints, bundled data."""

import asyncio
import collections
import tempfile
from unittest import mock

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import builders
from tasks import registry
from tasks.simulation import client_work
from tasks.simulation import evaluation
from tasks.simulation import loop
from tests.helpers import compilation
from tests.helpers import least_squares as ls


def _simulation(task, method, aggregator='mean', clients_per_round=None, lam=2.0,
                **kwargs):
  work = client_work.client_work_from_name(method, task, ditto_lambda=lam,
                                           personal_steps=None)
  return loop.Simulation(
      task, registry.aggregator_from_name(aggregator), work,
      clients_per_round=clients_per_round or len(task.client_weights),
      client_learning_rate=loop.StepSchedule(ls.LEARNING_RATE), **kwargs)


class PersonalizedClientWorkTest(tf.test.TestCase, parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.clients = ls.least_squares_clients(seed=10)
    cls.task = ls.least_squares_task(cls.clients)

  def test_a_second_simulation_of_a_sweep_trains(self):
    # The second run of a seed builds no Keras model eagerly (its initial model is
    # drawn once per process), so nothing may leave Keras' model classes in graph
    # mode, where the client work's eager models refuse to be called.
    for _ in range(2):
      simulation = _simulation(self.task, 'ditto', clients_per_round=2)
      _, metrics = simulation.run_round(simulation.initial_state(), 0)
      self.assertTrue(np.isfinite(metrics['train_loss']))

  @parameterized.named_parameters(('ditto', 'ditto'),
                                  ('personalized_rfa', 'personalized_rfa'))
  def test_two_rounds_match_reference(self, method):
    simulation = _simulation(self.task, method)
    state = simulation.initial_state()
    w = [np.asarray(p, np.float64) for p in state['model']['trainable']]
    personal = {}
    for round_num in range(2):
      state, metrics = simulation.run_round(state, round_num)
      w, personal = ls.reference_round(method, w, personal, self.clients, lam=2.0)
      ls.assert_weights_close(self, state['model']['trainable'], w)
      stored = client_work._unpack_personal(state['client_work'])  # pylint: disable=protected-access
      self.assertCountEqual(stored, self.clients)
      for client_id, expected in personal.items():
        ls.assert_weights_close(self, stored[client_id], expected)
    self.assertEqual(metrics['num_clients'], len(self.clients))
    self.assertEqual(metrics['secure_average_calls'], 1)
    self.assertTrue(np.isfinite(metrics['train_loss']))

  def test_personal_models_of_personalized_rfa_add_global_model(self):
    work = client_work.PersonalizedRfaClientWork(self.task)
    simulation = loop.Simulation(self.task, registry.aggregator_from_name('mean'), work,
                                 clients_per_round=3)
    state, _ = simulation.run_round(simulation.initial_state(), 0)
    trainable = state['model']['trainable']
    offsets = client_work._unpack_personal(state['client_work'])  # pylint: disable=protected-access
    for client_id, model in work.personal_models(state['client_work'],
                                                 trainable).items():
      ls.assert_weights_close(self, model, [w + u for w, u in zip(
          trainable, offsets[client_id])], atol=0)

  def test_unselected_clients_have_no_personal_state(self):
    simulation = _simulation(self.task, 'ditto', aggregator='gm', clients_per_round=1)
    state, metrics = simulation.run_round(simulation.initial_state(), 0)
    self.assertLen(state['client_work']['client_ids'], 1)
    self.assertEqual(metrics['num_personalized_clients'], 1)
    self.assertEqual(metrics['secure_average_calls'], 3)  # GM: R = 3 passes.

  @parameterized.named_parameters(('ditto', 'ditto'),
                                  ('personalized_rfa', 'personalized_rfa'))
  def test_personal_state_round_trips_through_checkpoint(self, method):
    # Centered clipping has a non-empty aggregator state (its momentum) to restore;
    # server momentum and a decaying client rate work with personal client work too.
    simulation = _simulation(
        self.task, method, aggregator='centered_clipping', clients_per_round=2,
        server_optimizer=tff.learning.optimizers.build_sgdm(1.0, momentum=0.9))
    _assert_checkpoint_resumes(simulation, 3, _comparable)

  def test_rejects_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, 'client work'):
      client_work.client_work_from_name('fedprox', self.task)
    with self.assertRaisesRegex(ValueError, 'attack'):
      _simulation(self.task, 'ditto', attack='meteor')
    with self.assertRaisesRegex(ValueError, 'ditto_lambda'):
      client_work.DittoClientWork(self.task, ditto_lambda=-1.0)
    with self.assertRaisesRegex(ValueError, 'personal_steps'):
      client_work.DittoClientWork(self.task, personal_steps=0)
    # Refused here, not in the first round's personal update.
    with self.assertRaisesRegex(ValueError, 'ditto_lambda must be a finite number'):
      client_work.DittoClientWork(self.task, ditto_lambda=float('inf'))
    with self.assertRaisesRegex(TypeError, 'personal_steps must be an integer'):
      client_work.DittoClientWork(self.task, personal_steps=2.5)

  def test_client_statistics(self):
    results = [dict(accuracy=a, loss=1.0, num_examples=5)
               for a in np.linspace(0.0, 0.95, 20)]
    results.append(dict(accuracy=float('nan'), loss=float('nan'), num_examples=0))
    stats = evaluation.client_statistics('p', results)
    accuracies = np.linspace(0.0, 0.95, 20)
    self.assertAlmostEqual(stats['p/accuracy_mean'], accuracies.mean())
    self.assertAlmostEqual(stats['p/accuracy_std'], accuracies.std())
    self.assertAlmostEqual(stats['p/accuracy_worst10'], accuracies[:2].mean())
    self.assertEqual(stats['p/num_clients'], 20)


def _assert_checkpoint_resumes(simulation, num_rounds, comparable):
  """After `num_rounds` rounds, the state saved by TFF's program state manager loads
  equal (through `comparable`), and the next round from it equals continuing."""
  state = simulation.initial_state()
  for round_num in range(num_rounds):
    state, _ = simulation.run_round(state, round_num)
  with tempfile.TemporaryDirectory() as directory:
    manager = tff.program.FileProgramStateManager(directory)
    asyncio.run(manager.save(state, num_rounds))
    # The binary resumes with the initial state as structure: it must load.
    loaded, version = asyncio.run(manager.load_latest(simulation.initial_state()))
  np.testing.assert_equal(version, num_rounds)
  tf.nest.map_structure(np.testing.assert_array_equal, comparable(loaded),
                        comparable(state))
  continued, _ = simulation.run_round(state, num_rounds)
  resumed, _ = simulation.run_round(loaded, num_rounds)
  tf.nest.map_structure(np.testing.assert_array_equal, comparable(resumed),
                        comparable(continued))


def _comparable(state):
  """The state with client ids as bytes (a loaded state holds bytes objects)."""
  state = collections.OrderedDict(state)
  state['client_work'] = _ids_as_bytes(state['client_work'])
  return state


class WorkerMomentumTest(tf.test.TestCase, parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.clients = ls.least_squares_clients(seed=4)
    cls.task = ls.least_squares_task(cls.clients)

  def _simulation(self, name='fedavg', beta=0.6, aggregator='mean', **kwargs):
    work = client_work.client_work_from_name(name, self.task, worker_momentum=beta,
                                             ditto_lambda=1.0, personal_steps=None)
    return loop.Simulation(
        self.task, registry.aggregator_from_name(aggregator), work, clients_per_round=2,
        client_learning_rate=loop.StepSchedule(ls.LEARNING_RATE), **kwargs)

  def test_three_rounds_match_numpy(self):
    beta = 0.6
    simulation = self._simulation(beta=beta)
    state = simulation.initial_state()
    w = [np.asarray(p, np.float64) for p in state['model']['trainable']]
    momenta = {}
    for round_num in range(3):
      selected = simulation.sample_clients(round_num)
      sent, weights = [], []
      for client_id in selected:
        x, y = self.clients[client_id]
        trained = ls.gradient_descent(w, ls.batches(x, y, ls.STEPS, ls.BATCH_SIZE),
                                      ls.LEARNING_RATE)
        update = [a - b for a, b in zip(w, trained)]  # TFF's sign: initial − trained.
        previous = momenta.get(client_id, [np.zeros_like(u) for u in update])
        momenta[client_id] = [beta * m + (1 - beta) * u
                              for m, u in zip(previous, update)]
        sent.append(momenta[client_id])
        weights.append(len(y))
      weights = np.array(weights, np.float64) / np.sum(weights)
      w = [p - sum(a * m[i] for a, m in zip(weights, sent)) for i, p in enumerate(w)]
      state, metrics = simulation.run_round(state, round_num)
      ls.assert_weights_close(self, state['model']['trainable'], w)
      stored = client_work._unpack_personal(state['client_work']['momentum'])  # pylint: disable=protected-access
      self.assertCountEqual(stored, momenta)
      for client_id, expected in momenta.items():
        ls.assert_weights_close(self, stored[client_id], expected)
      self.assertEqual(metrics['num_momentum_clients'], len(momenta))
    # Three rounds of two out of three clients: someone skipped a round and kept m_i.
    self.assertLen(momenta, 3)

  def test_zero_momentum_is_plain_fedavg(self):
    fedavg = client_work.fedavg_client_work(self.task)
    self.assertIs(client_work.client_work_from_name('fedavg', self.task), fedavg)
    self.assertIs(client_work.client_work_from_name('fedavg', self.task,
                                                    worker_momentum=0.0), fedavg)
    wrapped = client_work.client_work_from_name('ditto', self.task, worker_momentum=0.9)
    self.assertIsInstance(wrapped, client_work.WorkerMomentumClientWork)
    self.assertIsInstance(wrapped.inner, client_work.DittoClientWork)

  @parameterized.named_parameters(('fedavg', 'fedavg'), ('ditto', 'ditto'))
  def test_momentum_round_trips_through_checkpoint(self, name):
    simulation = self._simulation(name, aggregator='centered_clipping')
    _assert_checkpoint_resumes(simulation, 2, _momentum_comparable)

  @parameterized.parameters(1.0, -0.1, float('nan'))
  def test_rejects_bad_momentum(self, beta):
    with self.assertRaisesRegex(ValueError, 'worker_momentum must be in'):
      client_work.client_work_from_name('fedavg', self.task, worker_momentum=beta)

  @parameterized.parameters(True, '0.9')
  def test_rejects_momentum_that_is_not_a_number(self, beta):
    with self.assertRaisesRegex(TypeError, 'worker_momentum must be a number'):
      client_work.client_work_from_name('fedavg', self.task, worker_momentum=beta)


def _momentum_comparable(state):
  """The state with every client-id array as bytes (a loaded state holds bytes)."""
  state = collections.OrderedDict(state)
  work = collections.OrderedDict(state['client_work'])
  work['momentum'] = _ids_as_bytes(work['momentum'])
  if 'inner' in work:
    work['inner'] = _ids_as_bytes(work['inner'])
  state['client_work'] = work
  return state


def _ids_as_bytes(store):
  store = collections.OrderedDict(store)
  store['client_ids'] = np.array([bytes(c) for c in store['client_ids']])
  return store


@pytest.mark.slow  # Trains end to end: rounds and evaluation on bundled data.
class BundledEndToEndTest(tf.test.TestCase, parameterized.TestCase):
  """A short run on the bundled MNIST digits (Dirichlet label skew, 10 classes)."""

  @parameterized.named_parameters(
      ('ditto_gm_data', 'ditto', 'data'),
      ('personalized_rfa_gm_omniscient', 'personalized_rfa', 'omniscient'))
  def test_runs_and_evaluates(self, method, attack):
    task = builders.build_task(
        'emnist', 'linear', 'bundled', num_clients=12,
        client_spec=builders.ClientSpec(num_epochs=1, batch_size=20))
    work = client_work.client_work_from_name(method, task, personal_steps=3)
    simulation = loop.Simulation(task, registry.aggregator_from_name('gm'), work,
                                 clients_per_round=4, attack=attack, rho=0.25)
    self.assertNotEmpty(simulation.corrupted_clients)
    state = simulation.initial_state()
    for round_num in range(2):
      state, metrics = simulation.run_round(state, round_num)
    self.assertTrue(np.isfinite(metrics['train_loss']))
    self.assertEqual(metrics['secure_average_calls'], 3)
    results = simulation.evaluate(state)
    benign_with_test = [c for c in task.train_data.client_ids
                        if c not in simulation.corrupted_clients
                        and c in set(task.test_data.client_ids)]
    self.assertEqual(results['personalized/num_clients'], len(benign_with_test))
    for key in ('test_accuracy', 'test_loss', 'personalized/accuracy_mean',
                'personalized/accuracy_std', 'personalized/accuracy_worst10',
                'global_per_client/accuracy_mean'):
      self.assertTrue(np.isfinite(results[key]), key)
    self.assertBetween(results['personalized/accuracy_mean'], 0.0, 1.0)
    self.assertLessEqual(results['personalized/accuracy_worst10'],
                         results['personalized/accuracy_mean'])


if __name__ == '__main__':
  tf.test.main()


@pytest.mark.slow  # Trains each task's model (an LSTM among them, a ConvNet).
class SimulationLoopTest(parameterized.TestCase):
  """The simulation's FedAvg loop gives what TFF's default loop gives, to the bit."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.enterClassContext(compilation.deployed())

  @parameterized.named_parameters(
      ('emnist_linear', 'emnist', 'linear', None),
      ('emnist_small_cnn', 'emnist', 'small_cnn', 3),
      ('shakespeare_lstm', 'shakespeare', 'lstm', 3),
      ('sent140_linear', 'sent140', 'linear', 3))
  def test_updates_and_metrics_equal_tff_default_loop(self, task, model, num_clients):
    # Shuffled, two epochs of several batches: the loops differ in how they iterate.
    task = builders.build_task(
        task, model, source='synthetic', num_clients=num_clients,
        client_spec=builders.ClientSpec(2, 3, max_elements=12, shuffle_buffer_size=8))
    default_loop = client_work.ProcessClientWork(
        tff.learning.templates.build_model_delta_client_work(
            task.model_fn, tff.learning.optimizers.build_sgdm(learning_rate=1.0),
            tff.learning.ClientWeighting.NUM_EXAMPLES))
    self.assertNotEqual(client_work.SIMULATION_LOOP,
                        tff.learning.LoopImplementation.DATASET_REDUCE)
    with mock.patch.object(
        tff.learning.templates, 'build_model_delta_client_work',
        wraps=tff.learning.templates.build_model_delta_client_work) as build:
      ours = client_work.fedavg_client_work(task)
    # Traced once: with two, TFF's client update branched on a tensor in a module
    # tff_private._TFF_MODULES_WITH_TENSOR_CONTROL_FLOW leaves unconverted (a TFF
    # release moved it), and the trace fell back to AutoGraph's own, slower, rules.
    self.assertEqual(build.call_count, 1)
    weights = loop.initial_model(task.keras_model_fn, 0)
    client_ids = list(task.train_data.client_ids)[:3]
    outputs = []
    for work in (default_loop, ours):
      loop.seed_unseeded_operations(7)  # The same shuffles.
      outputs.append(work.train(default_loop.initial_state(), weights, client_ids,
                                task.client_dataset, 0.1))
    theirs, ours = outputs
    for a, b in zip(tf.nest.flatten(theirs.updates), tf.nest.flatten(ours.updates),
                    strict=True):
      np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(theirs.weights, ours.weights)
    self.assertEqual(theirs.metrics, ours.metrics)
    self.assertGreater(np.abs(np.concatenate(
        [np.ravel(u) for u in tf.nest.flatten(ours.updates)])).max(), 0)
