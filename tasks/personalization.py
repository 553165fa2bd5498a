"""Simulation of Ditto and personalized RFA with any aggregator and corruption model.

`PersonalizedSimulation` implements the `Simulation` interface of the experiment binary
(`initial_state`, `run_round`, `evaluate`). Each round it samples clients, runs the
client algorithm of `tff_robust.personalization` on each, corrupts the shared updates of
corrupted clients (`tasks.corruption`), aggregates them with the given
`tff.aggregators.WeightedAggregationFactory` and applies the aggregate to the global
model. Personal parameters stay in a per-client store inside the state and are never
given to the aggregator.

State (a structure `tff.program.FileProgramStateManager` saves and loads):

  OrderedDict(
      global_weights=[array, ...],          # w, trainable variables in Keras order
      aggregator_state=...,                 # the aggregation process's state
      personal=OrderedDict(
          client_ids=array of bytes,        # clients that have personal parameters
          parameters=[array [n, *shape], ...]))  # row j belongs to client_ids[j]

The personal store is a fixed *tree* (two leaves plus one per variable) whose array
lengths grow as clients are first selected, because `FileProgramStateManager.load`
requires the saved tree to match the structure it is given: a dict keyed by client id
would not load with `initial_state()` as structure. `personal_parameters(state)` gives
the client id → parameters view. Parameters are v_k for Ditto and u_i for personalized
RFA; a client never selected has v_k = w / u_i = 0, i.e. it uses the global model.
Memory is (clients ever selected) × (model size), fine for the linear and LSTM tasks.

Client data, local epochs and batches come from the task (`Task.client_dataset`); the
personal phase runs `personal_steps` batches of the client's data (repeated if needed),
or one more pass of its preprocessed data when `personal_steps` is None (τ of
Algorithm 4 equal for both phases, as in the paper). Shuffling is unseeded like the
rest of the harness: call `tf.keras.utils.set_random_seed` for reproducible runs.
"""

import collections
from typing import Any, Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from baselines import registry
from tasks import corruption
from tasks import data_utils
from tasks import evaluation
from tasks import simulation as simulation_lib
from tasks import task as task_lib
from tff_robust import personalization

METHODS = ('ditto', 'personalized_rfa')
# Without an explicit aggregator: RFA's geometric median for personalized RFA (paper
# Algorithm 4), FedAvg's weighted mean as Ditto's default global solver.
DEFAULT_AGGREGATORS = {'ditto': 'mean', 'personalized_rfa': 'gm'}
WORST_FRACTION = 0.1


class PersonalizedSimulation:
  """Ditto or personalized RFA on a `Task`, with corruption, for the experiment binary.

  Metrics of `run_round` (flat): `train_loss` (mean loss of the shared-model phase over
  the round's examples, poisoned data included), `personal_train_loss`,
  `num_examples` (Σα of the round's clients), `secure_average_calls` (the aggregator's
  `num_secure_average_calls`, else 1), `num_clients`, `num_corrupted_clients` (this
  round), `num_personalized_clients` (clients with personal state so far) and the
  aggregator's measurements as `aggregator/<name>` (vectors as `aggregator/<name>/<i>`).

  Metrics of `evaluate`: `test_accuracy`, `test_loss` (global model, all clients' clean
  test data, as in `tasks.simulation.FederatedSimulation`);
  `personalized/accuracy_mean`, `_std` (population std), `_worst10` (mean of the worst
  10% of clients, at least one), `personalized/loss_mean`, `personalized/num_clients`
  (benign clients with test data), and the same statistics of the global model on the
  same clients as `global_per_client/...`, the fair comparison for Ditto's fairness
  metrics. Accuracy is per client (unweighted over clients), as in Ditto.
  """

  def __init__(self, task: task_lib.Task, method: str,
               aggregator_factory: Union[None, str,
                                         tff.aggregators.WeightedAggregationFactory] = None,
               clients_per_round: int = 10, client_learning_rate: float = 0.1,
               server_learning_rate: float = 1.0, ditto_lambda: float = 1.0,
               personal_steps: Optional[int] = None,
               personal_learning_rate: Optional[float] = None, attack: str = 'none',
               rho: float = 0.0, seed: int = 0,
               attack_params: Optional[dict[str, Any]] = None,
               max_personal_eval_clients: Optional[int] = None,
               max_test_examples: Optional[int] = None, eval_batch_size: int = 500):
    """Configures the simulation.

    Args:
      task: The benchmark (model, client data, weights, poisoning).
      method: 'ditto' or 'personalized_rfa'.
      aggregator_factory: A `tff.aggregators.WeightedAggregationFactory`, or a name of
        `baselines.registry.aggregator_from_name`; default `DEFAULT_AGGREGATORS`.
      clients_per_round: Clients sampled uniformly without replacement each round.
      client_learning_rate: Local SGD rate of the shared model (γ).
      server_learning_rate: w ← w + rate · aggregate.
      ditto_lambda: Ditto's λ ≥ 0 (ignored by personalized RFA).
      personal_steps: Batches of the personal phase (Ditto's s, Algorithm 4's τ for u);
        None: one pass of the client's preprocessed data.
      personal_learning_rate: η of the personal phase; default `client_learning_rate`.
      attack: A name of `tasks.corruption.ATTACKS`.
      rho: Corrupted share of the total client weight (paper D.2.1).
      seed: Seeds the corrupted set, client sampling and update attacks.
      attack_params: E.g. `{'z': 1.0}` (alie), `{'epsilon': 0.1}` (ipm).
      max_personal_eval_clients: Evaluate personal models on at most this many benign
        clients (a fixed random subset); None: all.
      max_test_examples: Cap on the central test set of the global model.
      eval_batch_size: Batch size of the central (global model) evaluation.
    """
    if method not in METHODS:
      raise ValueError(f'Unknown personalization method {method!r}; known: '
                       f'{", ".join(METHODS)}.')
    _check_positive('clients_per_round', clients_per_round)
    _check_positive('client_learning_rate', client_learning_rate)
    if ditto_lambda < 0:
      raise ValueError(f'ditto_lambda must be >= 0, got {ditto_lambda}.')
    if personal_steps is not None:
      _check_positive('personal_steps', personal_steps)
    self._attack_kind = corruption.attack_kind(attack)
    self._task = task
    self._method = method
    self._aggregator_factory = _resolve_aggregator(aggregator_factory, method)
    self._clients_per_round = int(clients_per_round)
    self._client_learning_rate = float(client_learning_rate)
    self._server_learning_rate = float(server_learning_rate)
    self._ditto_lambda = float(ditto_lambda)
    self._personal_steps = personal_steps
    self._personal_learning_rate = float(
        client_learning_rate if personal_learning_rate is None else personal_learning_rate)
    self._attack = attack
    self._attack_params = dict(attack_params or {})
    self._seed = seed
    self._client_ids = sorted(task.train_data.client_ids)
    self._corrupted = (frozenset() if self._attack_kind == 'none' else
                       corruption.select_corrupted_clients(task.client_weights, rho, seed))
    self._client = personalization.PersonalizationClient(task.keras_model_fn,
                                                         task.loss_fn)
    self._shapes = [tuple(v.shape) for v in self._client.keras_model.trainable_variables]
    self._dtypes = [v.dtype.as_numpy_dtype
                    for v in self._client.keras_model.trainable_variables]
    self._aggregation_process = self._aggregator_factory.create(
        tff.types.to_type([tff.TensorType(d, s) for d, s in zip(self._dtypes,
                                                                 self._shapes)]),
        tff.TensorType(np.float32))
    self._eval_client_ids = self._benign_eval_clients(max_personal_eval_clients)
    self._max_test_examples = max_test_examples
    self._eval_batch_size = eval_batch_size
    self._eval_cache = None
    self._evaluator = _TensorEvaluator(task.keras_model_fn, task.loss_fn)

  @property
  def corrupted_clients(self) -> frozenset[str]:
    """The corrupted set C of the run."""
    return self._corrupted

  def initial_state(self) -> collections.OrderedDict:
    """w from Keras's initialization, the aggregator's state, no personal state."""
    return collections.OrderedDict(
        global_weights=self._client.initial_weights(),
        aggregator_state=self._aggregation_process.initialize(),
        personal=_pack_personal({}, self._shapes, self._dtypes))

  def run_round(self, state, round_num: int):
    """One round; returns the new state and the round's flat metrics."""
    # Seeds the local shuffles as tasks.simulation does: a resumed round sees the same
    # batches as the original.
    tf.random.set_seed(self._seed * 1_000_003 + round_num)
    global_weights = [np.asarray(w) for w in state['global_weights']]
    personal = _unpack_personal(state['personal'])
    client_ids = self.sample_clients(round_num)
    corrupted = np.array([c in self._corrupted for c in client_ids])
    weights = np.array([self._task.client_weights[c] for c in client_ids], np.float32)

    updates, shared_stats, personal_stats = [], [], []
    for client_id, is_corrupted in zip(client_ids, corrupted):
      delta, new_personal, shared, own = self._train_client(
          client_id, bool(is_corrupted), global_weights, personal.get(client_id))
      updates.append(delta)
      personal[client_id] = new_personal  # Kept in the client's store, never sent.
      shared_stats.append(shared)
      personal_stats.append(own)

    updates = corruption.corrupt_updates(
        self._attack, updates, weights, corrupted,
        np.random.default_rng([self._seed, round_num, 1]), **self._attack_params)
    output = self._aggregation_process.next(state['aggregator_state'], updates,
                                            list(weights))
    new_global = [(w + self._server_learning_rate * np.asarray(a)).astype(w.dtype)
                  for w, a in zip(global_weights, output.result)]
    new_state = collections.OrderedDict(
        global_weights=new_global, aggregator_state=output.state,
        personal=_pack_personal(personal, self._shapes, self._dtypes))
    metrics = self._round_metrics(output.measurements, shared_stats, personal_stats,
                                  corrupted, len(personal))
    metrics['num_examples'] = int(np.sum(weights))  # Σα of the round.
    return new_state, metrics

  def evaluate(self, state) -> collections.OrderedDict:
    """Global clean test metrics and per-client personal / global statistics."""
    global_weights = [np.asarray(w) for w in state['global_weights']]
    metrics = collections.OrderedDict()
    central = evaluation.evaluate(
        self._task.keras_model_fn, self._model_weights(global_weights),
        self._task.centralized_test_dataset(self._eval_batch_size,
                                            self._max_test_examples))
    metrics['test_accuracy'] = central['accuracy']
    metrics['test_loss'] = central['loss']
    personal_models = self.personal_models(state)
    personal_results, global_results = [], []
    for client_id, x, y in self._eval_tensors():
      personal_results.append(self._evaluator(personal_models.get(client_id,
                                                                  global_weights), x, y))
      global_results.append(self._evaluator(global_weights, x, y))
    metrics.update(client_statistics('personalized', personal_results))
    metrics.update(client_statistics('global_per_client', global_results))
    return metrics

  def personal_parameters(self, state) -> dict[str, personalization.Weights]:
    """Client id → stored personal parameters (v_k for Ditto, u_i for RFA)."""
    return _unpack_personal(state['personal'])

  def personal_models(self, state) -> dict[str, personalization.Weights]:
    """Client id → the model the client predicts with (v_k, or w + u_i)."""
    stored = self.personal_parameters(state)
    if self._method == 'ditto':
      return stored
    global_weights = [np.asarray(w) for w in state['global_weights']]
    return {c: [w + u for w, u in zip(global_weights, offset)]
            for c, offset in stored.items()}

  def _train_client(self, client_id, is_corrupted, global_weights, personal):
    """The client algorithm; returns (shared delta, new personal, stats, stats)."""
    poisoned = is_corrupted and self._attack_kind == 'data'
    shared_data = self._task.client_dataset(client_id, poisoned=poisoned)
    personal_data = self._personal_dataset(client_id, poisoned)
    if self._method == 'ditto':
      shared = self._client.local_sgd(global_weights, shared_data,
                                      self._client_learning_rate)
      own = self._client.ditto_personal_update(
          global_weights if personal is None else personal, global_weights,
          personal_data, self._personal_learning_rate, self._ditto_lambda)
      return shared.shared_delta, own.personal_weights, shared.stats, own.stats
    update = self._client.personalized_rfa_update(
        self._client.zeros_like_weights() if personal is None else personal,
        global_weights, personal_data, shared_data, self._client_learning_rate,
        self._personal_learning_rate)
    return (update.shared_delta, update.personal_offset, update.shared_stats,
            update.personal_stats)

  def _personal_dataset(self, client_id, poisoned):
    """s batches of the client's data (repeated), or one preprocessed pass."""
    dataset = self._task.client_dataset(client_id, poisoned=poisoned)
    if self._personal_steps is None:
      return dataset
    return dataset.repeat().take(self._personal_steps)

  def sample_clients(self, round_num: int) -> list[str]:
    """The clients of round `round_num`: the same rule (and so the same clients) as
    `tasks.simulation.FederatedSimulation.sample_clients`, a function of seed and round
    only, so a resumed run samples what the original would have."""
    rng = np.random.default_rng([self._seed, round_num])
    count = min(self._clients_per_round, len(self._client_ids))
    chosen = rng.choice(len(self._client_ids), count, replace=False)
    return [self._client_ids[i] for i in sorted(chosen)]

  def _benign_eval_clients(self, limit: Optional[int]) -> list[str]:
    with_test_data = set(self._task.test_data.client_ids)
    benign = [c for c in self._client_ids
              if c not in self._corrupted and c in with_test_data]
    if limit is not None and len(benign) > limit:
      chosen = np.random.default_rng([self._seed, 2]).choice(len(benign), limit,
                                                             replace=False)
      benign = [benign[i] for i in sorted(chosen)]
    return benign

  def _eval_tensors(self) -> list[tuple[str, tf.Tensor, tf.Tensor]]:
    """The benign clients' held-out examples as tensors, read once and reused.

    Held-out sets are small; one tensor call per client is ~20× cheaper than iterating
    a dataset inside a tf.function, which dominates evaluating hundreds of clients.
    """
    if self._eval_cache is None:
      self._eval_cache = []
      for client_id in self._eval_client_ids:
        examples = data_utils.batch_all(
            self._task.test_data.create_tf_dataset_for_client(client_id))
        if examples is not None:
          x, y = examples
          self._eval_cache.append((client_id, tf.constant(x), tf.constant(y)))
    return self._eval_cache

  def _model_weights(self, trainable) -> tff.learning.models.ModelWeights:
    non_trainable = [v.numpy() for v in
                     self._client.keras_model.non_trainable_variables]
    return tff.learning.models.ModelWeights(trainable=list(trainable),
                                            non_trainable=non_trainable)

  def _round_metrics(self, measurements, shared_stats, personal_stats, corrupted,
                     num_personalized):
    metrics = collections.OrderedDict(
        train_loss=_mean_loss(shared_stats),
        personal_train_loss=_mean_loss(personal_stats),
        secure_average_calls=int(measurements.get('num_secure_average_calls', 1))
        if isinstance(measurements, dict) else 1,
        num_clients=len(corrupted),
        num_corrupted_clients=int(np.sum(corrupted)),
        num_personalized_clients=num_personalized)
    metrics.update((f'aggregator/{k}', v)
                   for k, v in simulation_lib.flatten_metrics(measurements).items())
    return metrics


class _TensorEvaluator:
  """Accuracy and mean loss of given weights on in-memory examples (one Keras model)."""

  def __init__(self, keras_model_fn, loss_fn):
    self._model = keras_model_fn()
    loss = loss_fn()
    self._loss = type(loss).from_config({**loss.get_config(), 'reduction': 'none'})
    self._run = tf.function(self._evaluate, reduce_retracing=True)

  def __call__(self, trainable, x, y) -> dict[str, float]:
    for variable, value in zip(self._model.trainable_variables, trainable):
      variable.assign(value)
    loss_sum, correct, count = (t.numpy() for t in self._run(x, y))
    if count == 0:
      return dict(accuracy=float('nan'), loss=float('nan'), num_examples=0)
    return dict(accuracy=float(correct / count), loss=float(loss_sum / count),
                num_examples=int(count))

  def _evaluate(self, x, y):
    logits = self._model(x, training=False)
    losses = tf.cast(self._loss(y, logits), tf.float64)
    predictions = tf.cast(tf.argmax(logits, axis=-1), y.dtype)
    correct = tf.reduce_sum(tf.cast(tf.equal(predictions, tf.reshape(y, [-1])),
                                    tf.int64))
    return tf.reduce_sum(losses), correct, tf.cast(tf.size(y), tf.int64)


def client_statistics(prefix: str, results: list[dict[str, float]]
                      ) -> collections.OrderedDict:
  """Mean, std, worst-10% mean of per-client accuracy (Ditto's fairness metrics)."""
  results = [r for r in results if r['num_examples'] > 0]
  accuracies = np.sort(np.array([r['accuracy'] for r in results], np.float64))
  losses = np.array([r['loss'] for r in results], np.float64)
  stats = collections.OrderedDict()
  if not len(accuracies):
    nan = float('nan')
    stats.update({f'{prefix}/accuracy_mean': nan, f'{prefix}/accuracy_std': nan,
                  f'{prefix}/accuracy_worst10': nan, f'{prefix}/loss_mean': nan})
  else:
    worst = max(1, int(np.ceil(WORST_FRACTION * len(accuracies))))
    stats[f'{prefix}/accuracy_mean'] = float(accuracies.mean())
    stats[f'{prefix}/accuracy_std'] = float(accuracies.std())
    stats[f'{prefix}/accuracy_worst10'] = float(accuracies[:worst].mean())
    stats[f'{prefix}/loss_mean'] = float(losses.mean())
  stats[f'{prefix}/num_clients'] = len(accuracies)
  return stats


def _pack_personal(store: dict[str, personalization.Weights], shapes, dtypes
                   ) -> collections.OrderedDict:
  """The fixed-tree, checkpointable form of client id → parameters."""
  ids = sorted(store)
  parameters = []
  for position, (shape, dtype) in enumerate(zip(shapes, dtypes)):
    rows = [np.asarray(store[c][position], dtype) for c in ids]
    parameters.append(np.stack(rows) if rows else np.zeros((0, *shape), dtype))
  return collections.OrderedDict(
      client_ids=np.array([c.encode() for c in ids], dtype=object),
      parameters=parameters)


def _unpack_personal(personal) -> dict[str, personalization.Weights]:
  ids = [c.decode() if isinstance(c, bytes) else str(c)
         for c in np.asarray(personal['client_ids'], dtype=object).ravel()]
  parameters = [np.asarray(p) for p in personal['parameters']]
  return {c: [p[row].copy() for p in parameters] for row, c in enumerate(ids)}


def _mean_loss(stats: list[personalization.TrainingStats]) -> float:
  count = sum(s.num_examples for s in stats)
  if not count:
    return float('nan')
  return float(sum(s.loss * s.num_examples for s in stats if s.num_examples) / count)


def _resolve_aggregator(aggregator, method):
  if aggregator is None:
    aggregator = DEFAULT_AGGREGATORS[method]
  if isinstance(aggregator, str):
    return registry.aggregator_from_name(aggregator)
  if not isinstance(aggregator, tff.aggregators.WeightedAggregationFactory):
    raise TypeError('aggregator_factory must be a tff.aggregators.'
                    f'WeightedAggregationFactory or an aggregator name, got {aggregator!r}.')
  return aggregator


def _check_positive(name, value):
  if value is None or value <= 0:
    raise ValueError(f'{name} must be positive, got {value!r}.')
