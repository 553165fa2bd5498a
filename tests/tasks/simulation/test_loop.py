"""The simulation harness: schedule, sampling, metrics and update attacks in a round."""

import collections
import random
import warnings

from absl.testing import parameterized
from keras.src import backend as keras_backend
import numpy as np
import tensorflow as tf
from tff_robust.common.tff_private import eager_context as context

from tasks import builders
from tasks import registry
from tasks.builders import task as task_lib
from tasks.simulation import loop


def _synthetic_task():
  # No shuffling: two simulations of the same round then train on identical batches.
  return builders.build_task('emnist', 'linear', source='synthetic',
                          client_spec=builders.ClientSpec(1, 10, shuffle_buffer_size=1))


def _delta(state, initial):
  return np.concatenate([np.ravel(a - b) for a, b in zip(state['model']['trainable'],
                                                          initial['model']['trainable'])])


def _blown_up(state):
  """`state` with every trainable weight at float32's limit: finite, but local
  training overflows (as after an attack drove the model away)."""
  state['model']['trainable'] = [np.full_like(a, 3e38)
                                 for a in state['model']['trainable']]
  return state


class StepScheduleTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('start', 0, 0.1), ('before_decay', 9, 0.1), ('first_decay', 10, 0.05),
      ('second_decay', 25, 0.025))
  def test_paper_schedule(self, round_num, expected):
    schedule = loop.StepSchedule(initial=0.1, decay=0.5, period=10)
    self.assertAlmostEqual(schedule(round_num), expected)

  @parameterized.named_parameters(('zero_rate', 0.0, 1.0, 1), ('zero_decay', 0.1, 0.0, 1),
                                  ('zero_period', 0.1, 1.0, 0))
  def test_rejects_bad_values(self, initial, decay, period):
    with self.assertRaises(ValueError):
      loop.StepSchedule(initial, decay, period)


class SeedUnseededOperationsTest(parameterized.TestCase):

  def _shuffle_seeds_after(self, set_seed, seed):
    set_seed(seed)
    data = tf.data.Dataset.range(10)
    return [task_lib.shuffle_seeds(data.shuffle(10)) for _ in range(3)]

  @parameterized.parameters(0, 7, 2**40 + 3)
  def test_gives_operations_the_seeds_tf_random_set_seed_gives(self, seed):
    self.assertEqual(self._shuffle_seeds_after(loop.seed_unseeded_operations, seed),
                     self._shuffle_seeds_after(tf.random.set_seed, seed))

  def test_keeps_the_eager_kernels(self):
    # tf.random.set_seed clears the kernel cache: a seeded stateful op starts over.
    # Kept, it goes on (and so do the in-process aggregation's instantiated functions).
    tf.random.set_seed(1)
    first = tf.random.uniform([2], seed=5).numpy()
    tf.random.set_seed(1)
    np.testing.assert_array_equal(tf.random.uniform([2], seed=5), first)
    loop.seed_unseeded_operations(1)
    self.assertFalse(np.array_equal(tf.random.uniform([2], seed=5), first))


class InitialModelTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.task = _synthetic_task()

  def _fresh_draw(self, seed):
    loop._INITIAL_MODELS.clear()  # pylint: disable=protected-access
    return self._draw(seed)

  def _draw(self, seed):
    weights = loop.initial_model(self.task.keras_model_fn, seed)
    generators = (random.random(), np.random.rand(),
                  context.internal_operation_seed())
    return weights, generators

  @parameterized.parameters(0, 3)
  def test_a_drawn_model_is_a_fresh_draw_after_other_runs(self, seed):
    expected, expected_generators = self._fresh_draw(seed)
    # What runs of other seeds leave behind: stateful random kernels part-way
    # through their streams (a fresh draw is needed after them), moved generators.
    self._draw(seed + 1)
    tf.random.uniform([3], seed=7)
    self.task.keras_model_fn()
    random.random()
    np.random.rand()
    again, generators = self._draw(seed)
    for a, b in zip(again.trainable + again.non_trainable,
                    expected.trainable + expected.non_trainable, strict=True):
      self.assertIs(a, b)  # Drawn once.
    self.assertEqual(generators, expected_generators)
    fresh, fresh_generators = self._fresh_draw(seed)
    for a, b in zip(fresh.trainable + fresh.non_trainable,
                    expected.trainable + expected.non_trainable, strict=True):
      np.testing.assert_array_equal(a, b)
    self.assertEqual(fresh_generators, expected_generators)

  def test_seeds_give_different_models(self):
    self.assertFalse(np.array_equal(self._fresh_draw(0)[0].trainable[0],
                                    self._draw(1)[0].trainable[0]))

  def test_a_drawn_model_cannot_be_changed_for_the_next_call(self):
    weights = loop.initial_model(self.task.keras_model_fn, 0)
    first = weights.trainable[0]
    with self.assertRaises(ValueError):
      first += 1
    weights.trainable[0] = np.zeros_like(first)
    self.assertIs(loop.initial_model(self.task.keras_model_fn, 0).trainable[0], first)


class FlattenMetricsTest(parameterized.TestCase):

  def test_nested_vectors_and_empty_structures(self):
    measurements = collections.OrderedDict(
        objective=np.array([3.0, 2.0]), num_secure_average_calls=np.int32(2),
        inner=collections.OrderedDict(mean_value=(), mean_weight=()))
    self.assertEqual(
        loop.flatten_metrics(measurements),
        collections.OrderedDict([('objective/0', 3.0), ('objective/1', 2.0),
                                 ('num_secure_average_calls', 2)]))


class FederatedSimulationTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.task = _synthetic_task()

  def _simulation(self, aggregator='mean', **kwargs):
    kwargs.setdefault('clients_per_round', 4)
    return loop.Simulation(
        self.task, registry.aggregator_from_name(aggregator), seed=3, **kwargs)

  def test_sampling_is_a_function_of_seed_and_round(self):
    sim = self._simulation()
    first = sim.sample_clients(5)
    self.assertLen(set(first), 4)  # Without replacement.
    self.assertEqual(first, sim.sample_clients(5))
    self.assertNotEqual([sim.sample_clients(r) for r in range(4)], [first] * 4)

  def test_omniscient_attack_reaches_the_aggregator(self):
    clean = self._simulation(attack='none')
    attacked = self._simulation(attack='omniscient', rho=0.45)
    self.assertNotEmpty(attacked.corrupted_clients)
    initial = clean.initial_state()
    clean_state, clean_metrics = clean.run_round(initial, 0)
    attacked_state, attacked_metrics = attacked.run_round(attacked.initial_state(), 0)
    self.assertGreater(attacked_metrics['num_corrupted_clients'], 0)
    self.assertEqual(clean_metrics['num_corrupted_clients'], 0)
    # With the weighted mean, the omniscient attack negates the round's update.
    np.testing.assert_allclose(_delta(attacked_state, initial),
                               -_delta(clean_state, initial), rtol=1e-4, atol=1e-6)

  def test_round_metrics_and_evaluation(self):
    sim = self._simulation('gm', attack='nan', rho=0.3)
    state, metrics = sim.run_round(sim.initial_state(), 0)
    for name in ('train_loss', 'secure_average_calls', 'aggregator/objective/0',
                 'aggregator/num_nonfinite_clients', 'client_learning_rate'):
      self.assertIn(name, metrics)
    self.assertEqual(metrics['secure_average_calls'], 3)
    self.assertEqual(metrics['aggregator/num_nonfinite_clients'],
                     metrics['num_corrupted_clients'])
    self.assertTrue(loop.all_finite(state))
    evaluation = sim.evaluate(state)
    self.assertBetween(evaluation['test_accuracy'], 0.0, 1.0)
    self.assertTrue(np.isfinite(evaluation['test_loss']))

  def test_too_few_clients_for_krum_fail_before_the_round(self):
    sim = loop.Simulation(self.task, registry.aggregator_from_name(
        'krum', num_byzantine=1), seed=3, clients_per_round=4)
    with self.assertRaisesRegex(ValueError, r'n > 2f \+ 2.*n = 4 with f = 1'):
      sim.run_round(sim.initial_state(), 0)

  def test_a_blown_up_model_fails_krum_as_diverged(self):
    sim = loop.Simulation(self.task, registry.aggregator_from_name(
        'krum', num_byzantine=0), seed=3, clients_per_round=4)
    state = _blown_up(sim.initial_state())
    self.assertTrue(loop.all_finite(state))
    with self.assertRaisesRegex(loop.NonFiniteUpdatesError,
                                r'Round 0: only 0 of 4 clients .*diverged'):
      sim.run_round(state, 0)

  @parameterized.named_parameters(('mean', 'mean'), ('gm', 'gm'),
                                  ('bucketing_trimmed_mean', 'bucketing+trimmed_mean'))
  def test_a_blown_up_model_stays_under_a_rule_without_a_client_condition(
      self, aggregator):
    # As in build_weighted_fed_avg: no usable update, a non-finite aggregate, which
    # TFF's finalizer does not apply.
    sim = loop.Simulation(self.task, registry.aggregator_from_name(aggregator), seed=3,
                          clients_per_round=4)
    state = _blown_up(sim.initial_state())
    new_state, _ = sim.run_round(state, 0)
    for before, after in zip(state['model']['trainable'],
                             new_state['model']['trainable']):
      np.testing.assert_array_equal(after, before)

  def test_too_few_finite_updates_for_krum_fail_as_diverged(self):
    # 5 clients pass Krum's n > 2f + 2 with f = 1; a NaN update leaves too few.
    sim = loop.Simulation(self.task, registry.aggregator_from_name(
        'krum', num_byzantine=1), attack='nan', rho=0.3, seed=3, clients_per_round=5)
    round_num = next(r for r in range(100) if sim.corrupted_clients.intersection(
        sim.sample_clients(r)))
    with self.assertRaisesRegex(loop.NonFiniteUpdatesError,
                                r'only [0-4] of 5 clients .*n > 2f \+ 2'):
      sim.run_round(sim.initial_state(), round_num)

  @parameterized.named_parameters(('nan', 'nan'), ('inf', 'inf'))
  def test_injected_faults_that_leave_too_few_clients_are_named_as_dropped(
      self, fault):
    sim = loop.Simulation(self.task, registry.aggregator_from_name(
        'krum', num_byzantine=1), attack=fault, rho=0.3, seed=3, clients_per_round=5)
    round_num, faulty = next(
        (r, sorted(sim.corrupted_clients.intersection(sim.sample_clients(r))))
        for r in range(100) if sim.corrupted_clients.intersection(sim.sample_clients(r)))
    with self.assertRaises(loop.NonFiniteUpdatesError) as raised:
      sim.run_round(sim.initial_state(), round_num)
    message = str(raised.exception)
    self.assertIn(f'Clients {", ".join(faulty)} (corrupted by the {fault} attack) sent '
                  'non-finite updates and were dropped', message)
    self.assertNotIn('diverged', message)
    self.assertNotIn('learning rate', message)

  def test_the_initial_model_is_seeded_without_deprecated_calls(self):
    # Keras' own seeding calls randrange with a float: an error on Python 3.12.
    sim = self._simulation()
    loop._INITIAL_MODELS.clear()  # pylint: disable=protected-access
    with warnings.catch_warnings():
      warnings.simplefilter('error', DeprecationWarning)
      state = sim.initial_state()
    self.assertTrue(loop.all_finite(state))

  def test_the_initial_model_is_the_one_keras_seeding_gave(self):
    # Runs and results made before keep their initial models.
    sim = self._simulation()
    ours = sim.initial_state()['model']['trainable']
    with warnings.catch_warnings():
      warnings.simplefilter('ignore', DeprecationWarning)
      tf.keras.utils.set_random_seed(3)
      keras = [v.numpy() for v in self.task.keras_model_fn().trainable_variables]
    keras_backend._SEED_GENERATOR.generator = None  # pylint: disable=protected-access
    for a, b in zip(ours, keras, strict=True):
      np.testing.assert_array_equal(a, b)

  def test_rejects_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, 'rho'):
      self._simulation(attack='omniscient', rho=0.5)
    with self.assertRaisesRegex(ValueError, 'omniscient'):  # Lists the known attacks.
      self._simulation(attack='bogus')
