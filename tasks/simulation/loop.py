"""The simulation's one round loop: sampling, corruption, aggregation, evaluation.

Everything that belongs to *simulating* an attack lives here, never inside an
aggregation factory a user deploys (docs/design.md): the corrupted set C is drawn once per
run (`attacks.select_corrupted_clients`), the clients of a round are sampled here,
corrupted clients train on poisoned data or have their updates replaced here, and the
model is always evaluated on clean test data.

One round of `Simulation` is one `tasks.simulation.rounds.Round` (the pieces of
`tff.learning.algorithms.build_weighted_fed_avg`, called one at a time so the harness
can reach the per-client updates; public, for any TFF learning setup):

1. The client-work variant (`tasks.simulation.client_work`: FedAvg's local SGD, Ditto or
   personalized RFA) trains the round's clients from the server model and returns one
   update and one weight per client.
2. An update attack replaces the corrupted clients' updates in numpy
   (`tasks.simulation.attacks`); a data attack instead poisoned their data in step 1.
3. The aggregator's `AggregationProcess.next(state, updates, weights)` runs, in this
   process on the updates held here, with the runtime's results
   (`tasks.simulation.in_process`; for a gathering baseline its server step:
   `tasks.simulation.gathered`).
4. TFF's `build_apply_optimizer_finalizer` applies the aggregate with the server
   optimizer (it rejects a non-finite aggregate, as in FedAvg).

The client learning-rate schedule γ_t = γ0·C^⌊t/t0⌋ (RFA paper D.2.3) is the
`client_learning_rate` `StepSchedule`.
"""

import collections
import dataclasses
import math
import random
from typing import Any, Callable, Mapping, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tff_robust.common import tff_private

from tasks.builders import task as task_lib
from tasks.simulation import attacks
from tasks.simulation import client_work as client_work_lib
from tasks.simulation import evaluation
from tasks.simulation import pass_attacks
from tasks.simulation import rounds

Metrics = collections.OrderedDict


@dataclasses.dataclass(frozen=True)
class StepSchedule:
  """γ_t = initial · decay^⌊t / period⌋ (RFA paper D.2.3); decay 1 = constant."""
  initial: float
  decay: float = 1.0
  period: int = 1

  def __post_init__(self):
    if not self.initial > 0 or not math.isfinite(self.initial):
      raise ValueError(f'The initial learning rate must be > 0, got {self.initial}.')
    if not self.decay > 0 or not math.isfinite(self.decay):
      raise ValueError(f'The learning-rate decay must be > 0, got {self.decay}.')
    if self.period < 1:
      raise ValueError(f'The learning-rate period must be ≥ 1, got {self.period}.')

  def __call__(self, round_num: int) -> float:
    return self.initial * self.decay ** (round_num // self.period)


def set_random_seed(seed: int) -> None:
  """Seeds Python's, NumPy's and TensorFlow's generators, as
  `tf.keras.utils.set_random_seed` does, without also setting Keras' own seed
  generator: that one draws initializer seeds with `randint(1, 1e9)`, a float bound
  (a DeprecationWarning on Python 3.11, a TypeError on 3.12). Keras then draws them
  from `random`, seeded here with the same seed, so the initial models are unchanged."""
  random.seed(seed)
  np.random.seed(seed)
  tf.random.set_seed(seed)


def seed_unseeded_operations(seed: int) -> None:
  """Sets the global seed TensorFlow derives the seeds of operations created without
  one from (the client datasets' shuffles), to the seeds `tf.random.set_seed(seed)`
  gives them, without what `tf.random.set_seed` also does: clear this process's
  eager kernel cache. A round that cleared it re-instantiated every TensorFlow
  function of the in-process aggregation (GM at 10 clients: 0.6 s a round against
  3 ms warm). Nothing a round runs in this process needs the reset: the clients
  train in TFF's runtime, the attacks draw from numpy, and the aggregators' random
  operations are stateless (bucketing) or unseeded (the DP noise)."""
  tff_private.set_eager_global_seed(seed)


# `initial_model`'s results by (keras_model_fn, seed): the model and the generators'
# states right after drawing it.
_INITIAL_MODELS: dict = {}
_MAX_INITIAL_MODELS = 16


def initial_model(keras_model_fn: Callable[[], tf.keras.Model],
                  seed: int) -> tff.learning.models.ModelWeights:
  """The paper's w⁽⁰⁾ for a run seeded `seed`: Keras' initialization of
  `keras_model_fn()` right after `set_random_seed(seed)`, the same in every process
  (read-only arrays, shared by the calls of one process).

  Drawn once per process and seed; a later call restores Python's, NumPy's and
  TensorFlow's generators as the draw left them, but not what `set_random_seed` also
  does: clear the eager kernel cache, so a seeded stateful random kernel that ran
  here since goes on with its stream instead of restarting it. Nothing a run does in
  this process draws from one (`seed_unseeded_operations`), and the clear made the
  first round of every run re-instantiate each TensorFlow function it calls here (the
  in-process aggregation, the evaluation): ~0.3 s a run.
  """
  key = (keras_model_fn, seed)
  if key not in _INITIAL_MODELS:
    if len(_INITIAL_MODELS) >= _MAX_INITIAL_MODELS:
      _INITIAL_MODELS.clear()
    set_random_seed(seed)
    keras_model = keras_model_fn()
    weights = ([_read_only(v.numpy()) for v in keras_model.trainable_variables],
               [_read_only(v.numpy()) for v in keras_model.non_trainable_variables])
    _INITIAL_MODELS[key] = (weights, random.getstate(), np.random.get_state(),
                            tff_private.eager_seed_state())
  (trainable, non_trainable), python_state, numpy_state, tf_state = (
      _INITIAL_MODELS[key])
  random.setstate(python_state)
  np.random.set_state(numpy_state)
  tff_private.set_eager_seed_state(tf_state)
  return tff.learning.models.ModelWeights(trainable=list(trainable),
                                          non_trainable=list(non_trainable))


def _read_only(array: np.ndarray) -> np.ndarray:
  array.flags.writeable = False
  return array


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


all_finite = rounds.all_finite
NonFiniteUpdatesError = rounds.NonFiniteUpdatesError


class Simulation:
  """Federated training with any aggregator and client-work variant, under attack.

  State (numpy, a structure that does not change between rounds, so
  `tff.program.FileProgramStateManager` can checkpoint it):
  `OrderedDict(model=OrderedDict(trainable=[...], non_trainable=[...]),
  [client_work=<the variant's state, if any>,] aggregator=<aggregation process state>,
  server_optimizer=<finalizer state>)`.

  `run_round` is deterministic given (state, round_num) up to TensorFlow's threading, so
  a resumed run samples the same clients and batches.

  Round metrics: the variant's (`train_loss`, ...), `num_examples`, `num_clients`,
  `num_corrupted_clients` (corrupted clients sampled this round),
  `client_learning_rate` (γ_t), `secure_average_calls` (the aggregator's
  `num_secure_average_calls` measurement, 1 if it has none: one communication round),
  `aggregator/<measurement>` and `server_optimizer/update_non_finite` (1 when the
  finalizer rejected a non-finite aggregate and kept the model).

  Evaluation metrics: `test_accuracy`, `test_loss` of the global model on the clean
  test data, plus the variant's (e.g. personalized accuracy over benign clients).
  """

  def __init__(self, task: task_lib.Task,
               aggregator_factory: tff.aggregators.WeightedAggregationFactory,
               client_work: Optional[client_work_lib.ClientWork] = None,
               *,
               attack: str = attacks.NO_ATTACK,
               attack_params: Optional[Mapping[str, Any]] = None,
               rho: float = 0.0,
               clients_per_round: int = 10,
               client_learning_rate: StepSchedule = StepSchedule(0.1),
               server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
               seed: int = 0,
               eval_max_examples: Optional[int] = None,
               max_personal_eval_clients: Optional[int] = None,
               protocol: Optional[pass_attacks.Protocol] = None):
    """Builds the simulation (traces its TFF computations).

    Args:
      task: A `tasks.builders.Task`.
      aggregator_factory: A `tff.aggregators.WeightedAggregationFactory` for the model
        updates, e.g. `tasks.registry.aggregator_from_name('gm')`.
      client_work: The client-work variant; default FedAvg's local SGD.
      attack: 'none', a data attack of the task (`task.data_attacks`, e.g. 'data') or
        an update attack of `tasks.simulation.attacks.UPDATE_ATTACKS`.
      attack_params: The update attack's constructor arguments, e.g. `{'z': 1.5}`.
      rho: Corruption level in [0, 0.5): weight share of the corrupted set.
      clients_per_round: Clients sampled uniformly without replacement every round
        (capped at the number of clients).
      client_learning_rate: The client step schedule γ_t.
      server_optimizer: Applies the aggregate; default SGD with learning rate 1.
      seed: Seeds the model initialization, the corrupted set, client sampling and
        local shuffling (with the round number) and the attacks' randomness.
      eval_max_examples: Evaluate on the first this many clean test examples.
      max_personal_eval_clients: Give the variant's evaluation at most this many
        benign clients (a fixed random subset); None: all.
      protocol: A protocol attack on an iterative aggregator and the bounds
        (`tasks.simulation.pass_attacks.Protocol`; `rounds.Round`), its corrupted
        clients drawn at `rho` as an update attack's are.
    """
    task_lib.check_task(task, 'the task of the simulation',
                        reserved_attack_names=attacks.known_attacks())
    known = attacks.known_attacks(tuple(task.data_attacks))
    if attack not in known:
      raise ValueError(f'Unknown attack {attack!r} for task {task.name}; known: '
                       f'{", ".join(known)}.')
    if not 0.0 <= rho < 0.5:
      raise ValueError(f'rho must be in [0, 0.5), got {rho}.')
    if clients_per_round < 1:
      raise ValueError(f'clients_per_round must be ≥ 1, got {clients_per_round}.')
    self._task = task
    self._attack = attack
    self._update_attack = attacks.build_update_attack(attack, **(attack_params or {}))
    self._data_attack = attack if attack in task.data_attacks else None
    self._seed = seed
    self._schedule = client_learning_rate
    self._client_ids = sorted(task.train_data.client_ids)
    self._clients_per_round = min(clients_per_round, len(self._client_ids))
    attacked = attack != attacks.NO_ATTACK or (
        protocol is not None and protocol.attack is not None)
    self.corrupted_clients = (
        attacks.select_corrupted_clients(task.client_weights, rho, seed) if attacked
        else frozenset())
    self._client_work = client_work or client_work_lib.fedavg_client_work(task)
    # Built eagerly: building a Keras model switches Keras' model classes (their
    # `__bases__`, for every model) to the current mode's, and one built in a graph
    # leaves them in graph mode, where the eager models built before refuse to be
    # called (the personalized client works keep one across rounds). So the last
    # model built before a round must be an eager one; the initial model, drawn once
    # per process, no longer is.
    weights_type = tff.learning.models.weights_type_from_model(task.model_fn())
    self._round = rounds.Round(
        self._client_work, aggregator_factory,
        server_optimizer or tff.learning.optimizers.build_sgdm(learning_rate=1.0),
        model_weights_type=weights_type, protocol=protocol)
    self._aggregation = self._round.aggregation
    self._aggregate = self._round.aggregate
    self._loss = task.loss_fn()
    self._test_dataset = task.centralized_test_dataset(max_examples=eval_max_examples)
    self._eval_client_ids = self._benign_eval_clients(max_personal_eval_clients)

  def initial_state(self) -> collections.OrderedDict:
    return self._round.initialize(initial_model(self._task.keras_model_fn,
                                                self._seed))

  def sample_clients(self, round_num: int) -> list[str]:
    """The clients of round `round_num` (a function of the seed and the round only)."""
    rng = np.random.default_rng([self._seed, round_num])
    chosen = rng.choice(len(self._client_ids), self._clients_per_round, replace=False)
    return [self._client_ids[i] for i in sorted(chosen)]

  def run_round(self, state, round_num: int):
    """Runs round `round_num` (0-based); returns the new state and flat metrics."""
    # Seeds the local shuffles, so a rerun of a round sees the same batches.
    seed_unseeded_operations(self._seed * 1_000_003 + round_num)
    client_ids = self.sample_clients(round_num)
    corrupted = np.array([c in self.corrupted_clients for c in client_ids])

    def client_dataset(client_id):
      poisoned = client_id in self.corrupted_clients
      return self._task.client_dataset(client_id,
                                       self._data_attack if poisoned else None)

    learning_rate = self._schedule(round_num)
    try:
      output = self._round.next(
          state, client_dataset, client_ids=client_ids, attack=self._update_attack,
          corrupted=corrupted, rng=np.random.default_rng([self._seed, round_num, 1]),
          learning_rate=learning_rate, keep_updates=False)
    except rounds.NonFiniteUpdatesError as e:
      raise NonFiniteUpdatesError(f'Round {round_num}: {e}') from e.__cause__
    measurements = flatten_metrics(output.measurements['aggregator'])
    metrics = Metrics(output.client_metrics)
    metrics.update(
        num_examples=int(np.sum(output.weights)),
        num_clients=len(client_ids),
        num_corrupted_clients=int(corrupted.sum()),
        client_learning_rate=learning_rate,
        secure_average_calls=int(measurements.get('num_secure_average_calls', 1)))
    metrics.update((f'aggregator/{k}', v) for k, v in measurements.items())
    metrics.update((f'server_optimizer/{k}', v) for k, v in flatten_metrics(
        output.measurements['server_optimizer']).items())
    return output.state, metrics

  def evaluate(self, state) -> Metrics:
    """Clean test metrics of the global model, then the variant's."""
    result = evaluation.evaluate(self._task.keras_model_fn,
                                 rounds.model_weights(state), self._test_dataset,
                                 self._loss)
    metrics = Metrics(test_accuracy=result['accuracy'], test_loss=result['loss'])
    metrics.update(self._client_work.evaluate(
        state.get('client_work'), state['model']['trainable'], self._eval_client_ids))
    return metrics

  def _benign_eval_clients(self, limit: Optional[int]) -> list[str]:
    benign = [c for c in self._client_ids if c not in self.corrupted_clients]
    if limit is not None and len(benign) > limit:
      chosen = np.random.default_rng([self._seed, 2]).choice(len(benign), limit,
                                                             replace=False)
      benign = [benign[i] for i in sorted(chosen)]
    return benign

