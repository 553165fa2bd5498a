"""The simulation harness: sampling, corruption and evaluation around an aggregator.

Everything that belongs to *simulating* an attack lives here, never inside an
aggregation factory a user deploys (DESIGN.md): the corrupted set C is drawn once per
run (`tasks.corruption.select_corrupted_clients`), the clients of a round are sampled
here, corrupted clients train on poisoned data or have their updates replaced here,
and the model is always evaluated on clean test data.

The `Simulation` protocol is what the experiment binaries (`tasks.train`,
`tasks.sweep`, `tasks.main_job`) drive; `FederatedSimulation` implements it for
federated averaging with any aggregator, and `tasks.personalization`'s
`PersonalizedSimulation` implements it for Ditto and personalized RFA.

How one round of `FederatedSimulation` runs (the pieces of
`tff.learning.algorithms.build_weighted_fed_avg`, called one at a time so the harness
can reach the per-client updates):

1. A TFF computation broadcasts the server model and runs TFF's own client work
   (`model_delta_client_work.build_model_delta_client_work`: local SGD, the update is
   the model delta, the weight the number of examples, a non-finite delta gets weight
   0). Its result is placed at CLIENTS, so it comes back to Python as one update (a
   list of numpy arrays) and one weight per client.
2. Update attacks replace the corrupted clients' updates in numpy
   (`tasks.corruption.corrupt_updates`).
3. The aggregator's `AggregationProcess.next(state, updates, weights)` runs.
4. TFF's `apply_optimizer_finalizer` applies the aggregate with the server optimizer
   (it rejects a non-finite aggregate, as in FedAvg).

The client learning-rate schedule γ_t = γ0·C^⌊t/t0⌋ (RFA paper D.2.3) is applied
through the client work's state, which in TFF 0.87 *is* the client optimizer's
hyperparameters (`ClientWorkProcess.set_hparams` simply replaces it), so nothing is
re-traced per round.
"""

import collections
import dataclasses
import math
from typing import Any, Mapping, Optional, Protocol

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.learning.models import model_weights as model_weights_lib
from tensorflow_federated.python.learning.templates import apply_optimizer_finalizer
from tensorflow_federated.python.learning.templates import model_delta_client_work

from tasks import corruption
from tasks import evaluation
from tasks import task as task_lib

Metrics = collections.OrderedDict


class Simulation(Protocol):
  """What the experiment binaries need from a simulation.

  The state is a nested structure (OrderedDicts, lists, tuples) of numpy arrays and
  Python scalars whose *structure does not change* between rounds (e.g. personal
  models are allocated for every client up front): the binaries checkpoint it with
  `tff.program.FileProgramStateManager` and, on resume, pack the loaded leaves back
  into the structure of `initial_state()`.

  `run_round` must be deterministic given (state, round_num) up to TensorFlow's
  unseeded data shuffling, so that a resumed run samples the same clients.
  """

  def initial_state(self) -> Any:
    """The state before round 0."""

  def run_round(self, state: Any, round_num: int) -> tuple[Any, Metrics]:
    """Runs round `round_num` (0-based) and returns the new state and flat metrics.

    The metrics are scalar-valued with '/'-joined names and include at least
    `train_loss` and `secure_average_calls` (calls of the secure-average oracle this
    round); aggregator measurements appear as `aggregator/<name>`.
    """

  def evaluate(self, state: Any) -> Metrics:
    """Clean test metrics of `state`: at least `test_accuracy` and `test_loss`
    (personalized simulations add mean / std / worst-10% over benign clients)."""


@dataclasses.dataclass(frozen=True)
class StepSchedule:
  """γ_t = initial · decay^⌊t / period⌋ (RFA paper D.2.3); decay 1 = constant."""
  initial: float
  decay: float = 1.0
  period: int = 1

  def __post_init__(self):
    if not self.initial > 0 or not math.isfinite(self.initial):
      raise ValueError(f'The initial learning rate must be > 0, got {self.initial}.')
    if not self.decay > 0:
      raise ValueError(f'The learning-rate decay must be > 0, got {self.decay}.')
    if self.period < 1:
      raise ValueError(f'The learning-rate period must be ≥ 1, got {self.period}.')

  def __call__(self, round_num: int) -> float:
    return self.initial * self.decay ** (round_num // self.period)


def flatten_metrics(structure: Any, prefix: str = '') -> Metrics:
  """Flattens nested measurements to scalar metrics named 'a/b/c'.

  Vectors become one metric per element ('objective/0', 'objective/1', ...); empty
  structures (e.g. a mean factory's `()` measurements) disappear.
  """
  flat = Metrics()
  if isinstance(structure, Mapping):
    items = structure.items()
  elif isinstance(structure, (list, tuple)) and not _is_array_like(structure):
    items = ((str(i), v) for i, v in enumerate(structure))
  else:
    array = np.asarray(structure)
    if array.ndim == 0:
      flat[prefix] = array.item()
    else:
      for i, value in enumerate(array.ravel()):
        flat[f'{prefix}/{i}'] = value.item()
    return flat
  for name, value in items:
    flat.update(flatten_metrics(value, f'{prefix}/{name}' if prefix else str(name)))
  return flat


def _is_array_like(value) -> bool:
  return bool(value) and all(np.isscalar(v) for v in value)


def all_finite(structure: Any) -> bool:
  """True when every floating-point leaf of `structure` is finite."""
  for leaf in tf.nest.flatten(structure):
    array = np.asarray(leaf)
    if array.dtype.kind == 'f' and not np.all(np.isfinite(array)):
      return False
  return True


@dataclasses.dataclass
class _TaskComputations:
  """The TFF computations shared by every simulation of one task (traced once)."""
  weights_type: Any
  client_step: tff.Computation
  client_hparams: Mapping[str, Any]


# Tracing the client work takes seconds; a sweep runs dozens of simulations of one
# task, so the computations are cached per task (the task object is kept alive in
# the value so its id cannot be reused).
_TASK_COMPUTATIONS: dict[int, tuple[task_lib.Task, _TaskComputations]] = {}


def _task_computations(task: task_lib.Task) -> _TaskComputations:
  """Builds (or reuses) the broadcast + client-work computation of `task`."""
  if id(task) in _TASK_COMPUTATIONS:
    return _TASK_COMPUTATIONS[id(task)][1]
  with tf.Graph().as_default():
    weights_type = model_weights_lib.weights_type_from_model(task.model_fn())
  # The learning rate passed here is a placeholder: the round's rate is written into
  # the client work state (the optimizer's hyperparameters) every round.
  client_work = model_delta_client_work.build_model_delta_client_work(
      task.model_fn, tff.learning.optimizers.build_sgdm(learning_rate=1.0),
      tff.learning.ClientWeighting.NUM_EXAMPLES)
  state_type = client_work.initialize.type_signature.result
  data_type = client_work.next.type_signature.parameter[2]

  @tff.federated_computation(state_type, tff.FederatedType(weights_type, tff.SERVER),
                             data_type)
  def client_step(client_state, server_weights, client_data):
    output = client_work.next(client_state, tff.federated_broadcast(server_weights),
                              client_data)
    # Results at CLIENTS reach Python as one entry per client: the harness needs them.
    return (output.result.update, output.result.update_weight,
            output.measurements)

  computations = _TaskComputations(weights_type, client_step,
                                   client_work.initialize())
  _TASK_COMPUTATIONS[id(task)] = (task, computations)
  return computations


class FederatedSimulation:
  """Federated averaging with any aggregator, under a corruption model.

  Implements `Simulation`. State: `OrderedDict(model=OrderedDict(trainable=[...],
  non_trainable=[...]), aggregator=<aggregation process state>,
  server_optimizer=<finalizer state>)`, all numpy.

  Round metrics: `train_loss` and `train_accuracy` (reported by the round's clients
  during local training, i.e. on poisoned data for data-poisoned clients, as TFF's
  `client_work/train` metrics), `num_examples`, `num_clients`,
  `num_corrupted_clients` (corrupted clients sampled this round),
  `client_learning_rate` (γ_t), `secure_average_calls` (the aggregator's
  `num_secure_average_calls` measurement, 1 if it has none: one communication round),
  `aggregator/<measurement>` and `server_optimizer/update_non_finite` (1 when the
  finalizer rejected a non-finite aggregate and kept the model).
  """

  def __init__(self, task: task_lib.Task,
               aggregator_factory: tff.aggregators.WeightedAggregationFactory,
               *,
               attack: str = 'none',
               rho: float = 0.0,
               clients_per_round: int = 10,
               client_learning_rate: StepSchedule = StepSchedule(0.1),
               server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
               seed: int = 0,
               attack_params: Optional[Mapping[str, float]] = None,
               eval_max_examples: Optional[int] = None):
    """Builds the simulation (traces its TFF computations).

    Args:
      task: A `tasks.task.Task`.
      aggregator_factory: A `tff.aggregators.WeightedAggregationFactory` for the model
        updates, e.g. `baselines.registry.aggregator_from_name('gm')`.
      attack: A name of `tasks.corruption.ATTACKS`.
      rho: Corruption level in [0, 0.5): weight share of the corrupted set.
      clients_per_round: Clients sampled uniformly without replacement every round
        (capped at the number of clients).
      client_learning_rate: The client step schedule γ_t.
      server_optimizer: Applies the aggregate; default SGD with learning rate 1.
      seed: Seeds the model initialization, the corrupted set, client sampling
        (with the round number) and the Gaussian attack noise.
      attack_params: `z` (ALIE), `epsilon` (IPM).
      eval_max_examples: Evaluate on the first this many clean test examples.
    """
    corruption.attack_kind(attack)  # Raises for unknown attacks, listing them.
    if not 0.0 <= rho < 0.5:
      raise ValueError(f'rho must be in [0, 0.5), got {rho}.')
    if clients_per_round < 1:
      raise ValueError(f'clients_per_round must be ≥ 1, got {clients_per_round}.')
    self._task = task
    self._attack = attack
    self._attack_params = dict(attack_params or {})
    self._seed = seed
    self._schedule = client_learning_rate
    self._client_ids = sorted(task.train_data.client_ids)
    self._clients_per_round = min(clients_per_round, len(self._client_ids))
    self.corrupted_clients = (corruption.select_corrupted_clients(
        task.client_weights, rho, seed) if attack != 'none' else frozenset())
    self._computations = _task_computations(task)
    weights_type = self._computations.weights_type
    self._aggregation = aggregator_factory.create(weights_type.trainable,
                                                  tff.TensorType(np.float32))
    self._finalizer = apply_optimizer_finalizer.build_apply_optimizer_finalizer(
        server_optimizer or tff.learning.optimizers.build_sgdm(learning_rate=1.0),
        weights_type)
    self._test_dataset = task.centralized_test_dataset(max_examples=eval_max_examples)

  def initial_state(self) -> collections.OrderedDict:
    # The paper's w⁽⁰⁾ is Keras' glorot-uniform initialization; seeded per run.
    tf.keras.utils.set_random_seed(self._seed)
    keras_model = self._task.keras_model_fn()
    model = collections.OrderedDict(
        trainable=[v.numpy() for v in keras_model.trainable_variables],
        non_trainable=[v.numpy() for v in keras_model.non_trainable_variables])
    return collections.OrderedDict(model=model,
                                   aggregator=self._aggregation.initialize(),
                                   server_optimizer=self._finalizer.initialize())

  def sample_clients(self, round_num: int) -> list[str]:
    """The clients of round `round_num` (a function of the seed and the round only)."""
    rng = np.random.default_rng([self._seed, round_num])
    chosen = rng.choice(len(self._client_ids), self._clients_per_round, replace=False)
    return [self._client_ids[i] for i in sorted(chosen)]

  def run_round(self, state, round_num: int):
    # Seeds the local shuffles, so a rerun of a round sees the same batches.
    tf.random.set_seed(self._seed * 1_000_003 + round_num)
    client_ids = self.sample_clients(round_num)
    corrupted = np.array([c in self.corrupted_clients for c in client_ids])
    poison = corruption.attack_kind(self._attack) == 'data'
    datasets = [self._task.client_dataset(c, poisoned=poison and bad)
                for c, bad in zip(client_ids, corrupted)]
    learning_rate = self._schedule(round_num)
    client_state = collections.OrderedDict(self._computations.client_hparams)
    client_state['learning_rate'] = np.float32(learning_rate)
    weights = _model_weights(state['model'])

    updates, update_weights, client_measurements = self._computations.client_step(
        client_state, weights, datasets)
    updates = corruption.corrupt_updates(
        self._attack, list(updates), np.asarray(update_weights), corrupted,
        np.random.default_rng([self._seed, round_num, 1]), **self._attack_params)
    aggregate = self._aggregation.next(state['aggregator'], updates,
                                       [np.float32(w) for w in update_weights])
    applied = self._finalizer.next(state['server_optimizer'], weights,
                                   aggregate.result)

    new_state = collections.OrderedDict(
        model=collections.OrderedDict(trainable=list(applied.result.trainable),
                                      non_trainable=list(applied.result.non_trainable)),
        aggregator=aggregate.state, server_optimizer=applied.state)
    train = client_measurements['train']
    measurements = flatten_metrics(aggregate.measurements)
    metrics = Metrics(
        train_loss=float(train['loss']),
        train_accuracy=float(train.get('sparse_categorical_accuracy', float('nan'))),
        num_examples=int(np.sum(update_weights)),
        num_clients=len(client_ids),
        num_corrupted_clients=int(corrupted.sum()),
        client_learning_rate=learning_rate,
        secure_average_calls=int(measurements.get('num_secure_average_calls', 1)),
    )
    metrics.update((f'aggregator/{k}', v) for k, v in measurements.items())
    metrics.update((f'server_optimizer/{k}', v)
                   for k, v in flatten_metrics(applied.measurements).items())
    return new_state, metrics

  def evaluate(self, state) -> Metrics:
    result = evaluation.evaluate(self._task.keras_model_fn,
                                 _model_weights(state['model']), self._test_dataset)
    return Metrics(test_accuracy=result['accuracy'], test_loss=result['loss'])


def _model_weights(model: Mapping[str, Any]) -> tff.learning.models.ModelWeights:
  return tff.learning.models.ModelWeights(trainable=list(model['trainable']),
                                          non_trainable=list(model['non_trainable']))
