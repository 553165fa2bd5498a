"""Ditto and personalized RFA (RFA paper Algorithm 4) against numpy references.

The reference problem is least squares with a linear model y = x·θ + b whose client
optima differ; plain SGD over fixed, unshuffled batches (full batches in the client
tests) makes the TensorFlow implementation and the numpy reference follow the same
trajectory.
"""

import asyncio
import collections
import tempfile

from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

import tasks
from tasks import data_utils
from tasks import personalization as simulation_lib
from tasks import task as task_lib
from tff_robust import personalization

DIM = 3
NUM_EXAMPLES = (6, 12, 18)  # Multiples of BATCH_SIZE: batches never straddle epochs.
BATCH_SIZE = 6
STEPS = 4  # Client tests: τ (and Ditto's s) full-batch steps; simulation: epochs.
LEARNING_RATE = 0.05


def _linear_model() -> tf.keras.Model:
  return tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(DIM,)),
                              tf.keras.layers.Dense(1)])


def _least_squares_clients(seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Clients whose optimal (θ, b) differ widely (heterogeneous optima)."""
  rng = np.random.default_rng(seed)
  clients = {}
  for i, n in enumerate(NUM_EXAMPLES):
    x = rng.normal(size=(n, DIM)).astype(np.float32)
    theta, bias = rng.normal(scale=2.0, size=DIM), rng.normal()
    y = x @ theta + bias + 0.1 * rng.normal(size=n)
    clients[f'client_{i}'] = (x, y.reshape(n, 1).astype(np.float32))
  return clients


def _full_batch(x, y, steps=STEPS) -> tf.data.Dataset:
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(len(x)).repeat(steps)


def _least_squares_task(clients) -> task_lib.Task:
  element_spec = (tf.TensorSpec([DIM], tf.float32), tf.TensorSpec([1], tf.float32))
  data = data_utils.from_client_arrays(clients, element_spec)
  return task_lib.Task(
      name='least_squares', keras_model_fn=_linear_model, model_fn=None,
      loss_fn=tf.keras.losses.MeanSquaredError, train_data=data, test_data=data,
      client_weights={c: float(len(y)) for c, (_, y) in clients.items()},
      # No shuffling: the batches are the reference's, in the same order.
      client_spec=task_lib.ClientSpec(num_epochs=STEPS, batch_size=BATCH_SIZE,
                                      shuffle_buffer_size=1),
      poison_fn=lambda dataset: dataset)


# ---- numpy references --------------------------------------------------------------


def _gradient(params, x, y):
  """∇ of mean((x θ + b − y)²) with respect to [θ (DIM×1), b (1,)]."""
  theta, bias = params
  residual = x @ theta + bias - y  # [n, 1]
  return [2.0 / len(x) * x.T @ residual, 2.0 / len(x) * residual.sum(axis=0)]


def _batches(x, y, steps=STEPS, batch_size=None):
  """`steps` epochs of consecutive batches (full batches by default)."""
  size = batch_size or len(x)
  return [(x[i:i + size], y[i:i + size]) for _ in range(steps)
          for i in range(0, len(x), size)]


def _gradient_descent(params, batches, lr, lam=0.0, anchor=None):
  """Plain SGD, one step per batch, with Ditto's pull λ(θ − anchor)."""
  params = [p.astype(np.float64) for p in params]
  for x, y in batches:
    grads = _gradient(params, x, y)
    if lam:
      grads = [g + lam * (p - a) for g, p, a in zip(grads, params, anchor)]
    params = [p - lr * g for p, g in zip(params, grads)]
  return params


def _reference_algorithm4(w, u, batches, lr):
  """Algorithm 4 literally: u with w fixed, then w with the new u fixed."""
  u = [p.astype(np.float64) for p in u]
  for x, y in batches:
    grads = _gradient([a + b for a, b in zip(w, u)], x, y)
    u = [p - lr * g for p, g in zip(u, grads)]
  w_local = [p.astype(np.float64) for p in w]
  for x, y in batches:
    grads = _gradient([a + b for a, b in zip(w_local, u)], x, y)
    w_local = [p - lr * g for p, g in zip(w_local, grads)]
  return [a - b for a, b in zip(w_local, w)], u


def _reference_round(method, w, personal, clients, lam):
  """One round with every client selected and the weighted-mean aggregator."""
  deltas, weights, new_personal = [], [], {}
  for client_id, (x, y) in clients.items():
    batches = _batches(x, y, STEPS, BATCH_SIZE)
    if method == 'ditto':
      deltas.append([a - b for a, b in zip(_gradient_descent(w, batches,
                                                             LEARNING_RATE), w)])
      start = personal.get(client_id, w)
      new_personal[client_id] = _gradient_descent(start, batches, LEARNING_RATE, lam, w)
    else:
      start = personal.get(client_id, [np.zeros_like(p) for p in w])
      delta, new_personal[client_id] = _reference_algorithm4(w, start, batches,
                                                             LEARNING_RATE)
      deltas.append(delta)
    weights.append(len(x))
  weights = np.array(weights, np.float64) / np.sum(weights)
  mean = [sum(wt * d[i] for wt, d in zip(weights, deltas)) for i in range(len(w))]
  return [p + m for p, m in zip(w, mean)], new_personal


def _random_params(rng, scale=1.0):
  return [rng.normal(scale=scale, size=(DIM, 1)).astype(np.float32),
          rng.normal(scale=scale, size=(1,)).astype(np.float32)]


def _assert_weights_close(test, actual, expected, atol=1e-5):
  test.assertLen(actual, len(expected))
  for a, e in zip(actual, expected):
    np.testing.assert_allclose(a, e, atol=atol, rtol=1e-5)


# ---- the client algorithm (tff_robust.personalization) -----------------------------


class PersonalizationClientTest(tf.test.TestCase, parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.clients = _least_squares_clients()
    cls.client = personalization.PersonalizationClient(
        _linear_model, tf.keras.losses.MeanSquaredError)

  def test_personalized_rfa_matches_algorithm4(self):
    rng = np.random.default_rng(1)
    w, u = _random_params(rng), _random_params(rng, 0.5)
    x, y = self.clients['client_1']
    update = self.client.personalized_rfa_update(
        u, w, _full_batch(x, y), _full_batch(x, y), LEARNING_RATE)
    expected_delta, expected_u = _reference_algorithm4(w, u, _batches(x, y),
                                                       LEARNING_RATE)
    _assert_weights_close(self, update.shared_delta, expected_delta)
    _assert_weights_close(self, update.personal_offset, expected_u)
    self.assertEqual(update.personal_stats.num_steps, STEPS)
    self.assertEqual(update.shared_stats.num_examples, STEPS * len(x))

  def test_personalized_rfa_separate_personal_learning_rate(self):
    rng = np.random.default_rng(2)
    w, u = _random_params(rng), _random_params(rng)
    x, y = self.clients['client_0']
    update = self.client.personalized_rfa_update(
        u, w, _full_batch(x, y, 2), _full_batch(x, y, 3), learning_rate=0.02,
        personal_learning_rate=0.07)
    expected_u = [a - b for a, b in zip(_gradient_descent(
        [p + q for p, q in zip(w, u)], _batches(x, y, 2), 0.07), w)]
    expected_w = _gradient_descent([p + q for p, q in zip(w, expected_u)],
                                   _batches(x, y, 3), 0.02)
    _assert_weights_close(self, update.personal_offset, expected_u)
    _assert_weights_close(self, update.shared_delta,
                          [a - b - c for a, b, c in zip(expected_w, expected_u, w)])

  @parameterized.named_parameters(('lambda_0', 0.0), ('lambda_1', 1.0),
                                  ('lambda_5', 5.0))
  def test_ditto_personal_update_matches_reference(self, lam):
    rng = np.random.default_rng(3)
    w, v = _random_params(rng), _random_params(rng)
    x, y = self.clients['client_2']
    update = self.client.ditto_personal_update(v, w, _full_batch(x, y), LEARNING_RATE,
                                               lam)
    _assert_weights_close(self, update.personal_weights,
                          _gradient_descent(v, _batches(x, y), LEARNING_RATE, lam, w))

  def test_local_sgd_matches_gradient_descent(self):
    rng = np.random.default_rng(4)
    w = _random_params(rng)
    x, y = self.clients['client_0']
    update = self.client.local_sgd(w, _full_batch(x, y), LEARNING_RATE)
    expected = _gradient_descent(w, _batches(x, y), LEARNING_RATE)
    _assert_weights_close(self, update.shared_delta,
                          [a - b for a, b in zip(expected, w)])

  def test_ditto_lambda_zero_is_local_training_only(self):
    rng = np.random.default_rng(5)
    v, w_one, w_two = (_random_params(rng) for _ in range(3))
    x, y = self.clients['client_1']
    with_one = self.client.ditto_personal_update(v, w_one, _full_batch(x, y),
                                                 LEARNING_RATE, 0.0).personal_weights
    with_two = self.client.ditto_personal_update(v, w_two, _full_batch(x, y),
                                                 LEARNING_RATE, 0.0).personal_weights
    local = self.client.local_sgd(v, _full_batch(x, y), LEARNING_RATE).shared_delta
    _assert_weights_close(self, with_one, with_two, atol=0)
    _assert_weights_close(self, with_one, [a + b for a, b in zip(v, local)])

  def test_ditto_large_lambda_pins_personal_model_to_global(self):
    rng = np.random.default_rng(6)
    v, w = _random_params(rng, 3.0), _random_params(rng)
    x, y = self.clients['client_2']
    # ηλ = 0.5 keeps the iteration stable; the fixed point is w − ∇F(v)/λ ≈ w.
    lam = 1e6
    update = self.client.ditto_personal_update(v, w, _full_batch(x, y, 40),
                                               0.5 / lam, lam)
    _assert_weights_close(self, update.personal_weights, w, atol=1e-4)
    self.assertGreater(np.abs(v[0] - w[0]).max(), 0.5)  # It did move all the way.

  def test_rejects_negative_lambda_and_wrong_shapes(self):
    rng = np.random.default_rng(7)
    w = _random_params(rng)
    x, y = self.clients['client_0']
    with self.assertRaisesRegex(ValueError, 'lambda'):
      self.client.ditto_personal_update(w, w, _full_batch(x, y), 0.1, -1.0)
    with self.assertRaisesRegex(ValueError, 'do not match'):
      self.client.local_sgd([w[0]], _full_batch(x, y), 0.1)


# ---- the simulation (tasks.personalization) ----------------------------------------


class PersonalizedSimulationTest(tf.test.TestCase, parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.clients = _least_squares_clients(seed=10)
    cls.task = _least_squares_task(cls.clients)

  def _simulation(self, method, lam=2.0, **kwargs):
    return simulation_lib.PersonalizedSimulation(
        self.task, method, aggregator_factory='mean',
        clients_per_round=len(self.clients), client_learning_rate=LEARNING_RATE,
        ditto_lambda=lam, **kwargs)

  @parameterized.named_parameters(('ditto', 'ditto'),
                                  ('personalized_rfa', 'personalized_rfa'))
  def test_two_rounds_match_reference(self, method):
    simulation = self._simulation(method)
    state = simulation.initial_state()
    w = [np.asarray(p, np.float64) for p in state['global_weights']]
    personal = {}
    for round_num in range(2):
      state, metrics = simulation.run_round(state, round_num)
      w, personal = _reference_round(method, w, personal, self.clients, lam=2.0)
      _assert_weights_close(self, state['global_weights'], w)
      stored = simulation.personal_parameters(state)
      self.assertCountEqual(stored, self.clients)
      for client_id, expected in personal.items():
        _assert_weights_close(self, stored[client_id], expected)
    self.assertEqual(metrics['num_clients'], len(self.clients))
    self.assertEqual(metrics['secure_average_calls'], 1)
    self.assertTrue(np.isfinite(metrics['train_loss']))

  def test_personal_models_of_personalized_rfa_add_global_model(self):
    simulation = self._simulation('personalized_rfa')
    state, _ = simulation.run_round(simulation.initial_state(), 0)
    offsets = simulation.personal_parameters(state)
    for client_id, model in simulation.personal_models(state).items():
      _assert_weights_close(self, model, [w + u for w, u in zip(
          state['global_weights'], offsets[client_id])], atol=0)

  def test_unselected_clients_have_no_personal_state(self):
    simulation = simulation_lib.PersonalizedSimulation(
        self.task, 'ditto', aggregator_factory='gm', clients_per_round=1,
        client_learning_rate=LEARNING_RATE)
    state, metrics = simulation.run_round(simulation.initial_state(), 0)
    self.assertLen(simulation.personal_parameters(state), 1)
    self.assertEqual(metrics['num_personalized_clients'], 1)
    self.assertEqual(metrics['secure_average_calls'], 3)  # GM: R = 3 passes.

  @parameterized.named_parameters(('ditto', 'ditto'),
                                  ('personalized_rfa', 'personalized_rfa'))
  def test_personal_state_round_trips_through_checkpoint(self, method):
    # Centered clipping has a non-empty aggregator state (its momentum) to restore.
    simulation = simulation_lib.PersonalizedSimulation(
        self.task, method, aggregator_factory='centered_clipping',
        clients_per_round=2, client_learning_rate=LEARNING_RATE)
    state = simulation.initial_state()
    for round_num in range(3):
      state, _ = simulation.run_round(state, round_num)
    with tempfile.TemporaryDirectory() as directory:
      manager = tff.program.FileProgramStateManager(directory)
      asyncio.run(manager.save(state, 3))
      # The binary resumes with the initial state as structure: it must load.
      loaded, version = asyncio.run(manager.load_latest(simulation.initial_state()))
    self.assertEqual(version, 3)
    self.assertEqual(simulation.personal_parameters(loaded).keys(),
                     simulation.personal_parameters(state).keys())
    tf.nest.map_structure(np.testing.assert_array_equal,
                          _comparable(loaded), _comparable(state))
    # Resuming gives the same next round as continuing.
    continued, _ = simulation.run_round(state, 3)
    resumed, _ = simulation.run_round(loaded, 3)
    tf.nest.map_structure(np.testing.assert_array_equal,
                          _comparable(resumed), _comparable(continued))

  def test_rejects_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, 'personalization method'):
      simulation_lib.PersonalizedSimulation(self.task, 'fedprox')
    with self.assertRaisesRegex(ValueError, 'attack'):
      simulation_lib.PersonalizedSimulation(self.task, 'ditto', attack='meteor')
    with self.assertRaisesRegex(ValueError, 'ditto_lambda'):
      simulation_lib.PersonalizedSimulation(self.task, 'ditto', ditto_lambda=-1.0)
    with self.assertRaisesRegex(TypeError, 'WeightedAggregationFactory'):
      simulation_lib.PersonalizedSimulation(self.task, 'ditto', aggregator_factory=3)

  def test_client_statistics(self):
    results = [dict(accuracy=a, loss=1.0, num_examples=5)
               for a in np.linspace(0.0, 0.95, 20)]
    results.append(dict(accuracy=float('nan'), loss=float('nan'), num_examples=0))
    stats = simulation_lib.client_statistics('p', results)
    accuracies = np.linspace(0.0, 0.95, 20)
    self.assertAlmostEqual(stats['p/accuracy_mean'], accuracies.mean())
    self.assertAlmostEqual(stats['p/accuracy_std'], accuracies.std())
    self.assertAlmostEqual(stats['p/accuracy_worst10'], accuracies[:2].mean())
    self.assertEqual(stats['p/num_clients'], 20)


def _comparable(state):
  """The state with client ids as bytes (a loaded state holds bytes objects)."""
  state = collections.OrderedDict(state)
  personal = collections.OrderedDict(state['personal'])
  personal['client_ids'] = np.array([bytes(c) for c in personal['client_ids']])
  state['personal'] = personal
  return state


class BundledEndToEndTest(tf.test.TestCase, parameterized.TestCase):
  """A short run on the bundled MNIST digits (Dirichlet label skew, 10 classes)."""

  @parameterized.named_parameters(
      ('ditto_gm_data', 'ditto', 'gm', 'data'),
      ('personalized_rfa_gm_omniscient', 'personalized_rfa', 'gm', 'omniscient'))
  def test_runs_and_evaluates(self, method, aggregator, attack):
    tf.keras.utils.set_random_seed(0)
    task = tasks.build_task(
        'emnist', 'linear', 'bundled', num_clients=12,
        client_spec=task_lib.ClientSpec(num_epochs=1, batch_size=20))
    simulation = simulation_lib.PersonalizedSimulation(
        task, method, aggregator_factory=aggregator, clients_per_round=4,
        client_learning_rate=0.1, personal_steps=3, attack=attack, rho=0.25)
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
