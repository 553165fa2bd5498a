"""A least-squares federated problem with heterogeneous client optima, and numpy
references of Ditto and personalized RFA (RFA paper Algorithm 4) on it.

Plain SGD over fixed, unshuffled batches (full batches in the client tests) makes the
TensorFlow implementations and these references follow the same trajectory.
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks.builders import data_utils
from tasks.builders import task as task_lib

DIM = 3
NUM_EXAMPLES = (6, 12, 18)  # Multiples of BATCH_SIZE: batches never straddle epochs.
BATCH_SIZE = 6
STEPS = 4  # Client tests: τ (and Ditto's s) full-batch steps; simulation: epochs.
LEARNING_RATE = 0.05


def linear_model() -> tf.keras.Model:
  return tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(DIM,)),
                              tf.keras.layers.Dense(1)])


def least_squares_clients(seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Clients whose optimal (θ, b) differ widely (heterogeneous optima)."""
  rng = np.random.default_rng(seed)
  clients = {}
  for i, n in enumerate(NUM_EXAMPLES):
    x = rng.normal(size=(n, DIM)).astype(np.float32)
    theta, bias = rng.normal(scale=2.0, size=DIM), rng.normal()
    y = x @ theta + bias + 0.1 * rng.normal(size=n)
    clients[f'client_{i}'] = (x, y.reshape(n, 1).astype(np.float32))
  return clients


def full_batch(x, y, steps=STEPS) -> tf.data.Dataset:
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(len(x)).repeat(steps)


def least_squares_task(clients) -> task_lib.Task:
  element_spec = (tf.TensorSpec([DIM], tf.float32), tf.TensorSpec([1], tf.float32))
  data = data_utils.from_client_arrays(clients, element_spec)
  input_spec = (tf.TensorSpec([None, DIM], tf.float32),
                tf.TensorSpec([None, 1], tf.float32))

  def model_fn():
    return tff.learning.models.from_keras_model(
        linear_model(), loss=tf.keras.losses.MeanSquaredError(), input_spec=input_spec)

  return task_lib.Task(
      name='least_squares', keras_model_fn=linear_model, model_fn=model_fn,
      loss_fn=tf.keras.losses.MeanSquaredError, train_data=data, test_data=data,
      client_weights={c: float(len(y)) for c, (_, y) in clients.items()},
      # No shuffling: the batches are the reference's, in the same order.
      client_spec=task_lib.ClientSpec(num_epochs=STEPS, batch_size=BATCH_SIZE,
                                      shuffle_buffer_size=1),
      data_attacks={'data': lambda dataset: dataset})


# ---- numpy references --------------------------------------------------------------


def gradient(params, x, y):
  """∇ of mean((x θ + b − y)²) with respect to [θ (DIM×1), b (1,)]."""
  theta, bias = params
  residual = x @ theta + bias - y  # [n, 1]
  return [2.0 / len(x) * x.T @ residual, 2.0 / len(x) * residual.sum(axis=0)]


def batches(x, y, steps=STEPS, batch_size=None):
  """`steps` epochs of consecutive batches (full batches by default)."""
  size = batch_size or len(x)
  return [(x[i:i + size], y[i:i + size]) for _ in range(steps)
          for i in range(0, len(x), size)]


def gradient_descent(params, batches, lr, lam=0.0, anchor=None):
  """Plain SGD, one step per batch, with Ditto's pull λ(θ − anchor)."""
  params = [p.astype(np.float64) for p in params]
  for x, y in batches:
    grads = gradient(params, x, y)
    if lam:
      grads = [g + lam * (p - a) for g, p, a in zip(grads, params, anchor)]
    params = [p - lr * g for p, g in zip(params, grads)]
  return params


def reference_algorithm4(w, u, batches, lr):
  """Algorithm 4 literally: u with w fixed, then w with the new u fixed."""
  u = [p.astype(np.float64) for p in u]
  for x, y in batches:
    grads = gradient([a + b for a, b in zip(w, u)], x, y)
    u = [p - lr * g for p, g in zip(u, grads)]
  w_local = [p.astype(np.float64) for p in w]
  for x, y in batches:
    grads = gradient([a + b for a, b in zip(w_local, u)], x, y)
    w_local = [p - lr * g for p, g in zip(w_local, grads)]
  return [a - b for a, b in zip(w_local, w)], u


def reference_round(method, w, personal, clients, lam):
  """One round with every client selected and the weighted-mean aggregator."""
  deltas, weights, new_personal = [], [], {}
  for client_id, (x, y) in clients.items():
    local = batches(x, y, STEPS, BATCH_SIZE)
    if method == 'ditto':
      deltas.append([a - b for a, b in zip(gradient_descent(w, local, LEARNING_RATE),
                                           w)])
      start = personal.get(client_id, w)
      new_personal[client_id] = gradient_descent(start, local, LEARNING_RATE, lam, w)
    else:
      start = personal.get(client_id, [np.zeros_like(p) for p in w])
      delta, new_personal[client_id] = reference_algorithm4(w, start, local,
                                                            LEARNING_RATE)
      deltas.append(delta)
    weights.append(len(x))
  weights = np.array(weights, np.float64) / np.sum(weights)
  mean = [sum(wt * d[i] for wt, d in zip(weights, deltas)) for i in range(len(w))]
  return [p + m for p, m in zip(w, mean)], new_personal


def random_params(rng, scale=1.0):
  return [rng.normal(scale=scale, size=(DIM, 1)).astype(np.float32),
          rng.normal(scale=scale, size=(1,)).astype(np.float32)]


def assert_weights_close(test, actual, expected, atol=1e-5):
  test.assertLen(actual, len(expected))
  for a, e in zip(actual, expected):
    np.testing.assert_allclose(a, e, atol=atol, rtol=1e-5)


def one_round_with_a_huge_client(aggregator, seed,
                                 build=tff.learning.algorithms.build_weighted_fed_avg):
  """One round of `build` (a FedAvg builder's signature) with
  `model_aggregator=aggregator` on five clients of 6 examples, one (c2) with labels
  ×100 (a huge update).

  Returns (the model it trained, the plain-numpy updates of the clients as rows,
  the start, the round's aggregator measurements); the model must move from the
  start by the aggregate of those rows.
  """
  rng = np.random.default_rng(seed)
  clients = collections.OrderedDict()
  for i in range(5):
    x = rng.normal(size=(6, DIM)).astype(np.float32)
    y = x @ rng.normal(size=(DIM, 1)) + 0.3 * i
    clients[f'c{i}'] = (x, (y * (100.0 if i == 2 else 1.0)).astype(np.float32))
  task = least_squares_task(clients)
  start = random_params(rng)
  process = build(task.model_fn, tff.learning.optimizers.build_sgdm(LEARNING_RATE),
                  model_aggregator=aggregator)
  state = process.set_model_weights(
      process.initialize(),
      tff.learning.models.ModelWeights(trainable=start, non_trainable=[]))
  output = process.next(state, [full_batch(x, y) for x, y in clients.values()])
  deltas = []
  for x, y in clients.values():
    local = gradient_descent(start, batches(x, y), LEARNING_RATE)
    deltas.append(np.concatenate([np.ravel(p - s) for p, s in zip(local, start)]))
  return (process.get_model_weights(output.state).trainable, np.stack(deltas), start,
          output.metrics['aggregator'])


def assert_moved_by(test, trained, start, update, atol=1e-4):
  """`trained` is `start` moved by the flat `update` (θ then b)."""
  assert_weights_close(test, trained, [start[0] + update[:DIM, np.newaxis],
                                       start[1] + update[DIM:]], atol=atol)

