"""Client-work variants of the simulation's round loop: FedAvg, Ditto, personalized RFA.

`tasks.simulation.loop.Simulation` owns everything the variants share (client
sampling, seeding, the corrupted set, data and update attacks, the aggregator, the
server optimizer, metric flattening, the global model's evaluation). A variant only
says what a selected client computes:

  initial_state()                        checkpointable per-run client-side state, or
                                         None (FedAvg keeps nothing between rounds)
  train(state, weights, client_ids, client_dataset, learning_rate)
                                         → ClientOutputs: one model update and weight
                                         per client, round metrics, the new state
  evaluate(state, trainable, client_ids) extra evaluation metrics (personal models)

`WorkerMomentumClientWork` wraps any variant: clients send a momentum of their updates
kept across rounds (`client_work_from_name(..., worker_momentum=β)`).
`ProcessClientWork` makes any `tff.learning.templates.ClientWorkProcess` a variant
(FedAvg's is TFF's model-delta client work); `tasks.simulation.rounds.Round` takes
either.

Personal state (Ditto's v_k, Algorithm 4's u_i) stays in the variant's state and never
reaches the aggregator. It is a fixed tree (client ids + one stacked array per variable)
because `tff.program.FileProgramStateManager.load` needs the saved structure to match
`initial_state()`'s; rows are added as clients are first selected, so memory is
(clients ever selected) × (model size): fine for the linear and LSTM tasks.
"""

import collections
import dataclasses
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks.builders import data_utils
from tasks.builders import task as task_lib
from tasks.simulation import evaluation
from tff_robust.common import arguments
from tff_robust.common import tff_private
from tff_robust.learning import personalization

Metrics = collections.OrderedDict
ClientDatasetFn = Callable[[str], tf.data.Dataset]


@dataclasses.dataclass
class ClientOutputs:
  """What the round's clients send, plus what stays on them.

  Attributes:
    updates: One model update per client (a list of numpy arrays, trainable variables
      in Keras order), in the order of the round's client ids, in TFF's convention:
      initial − trained weights, which the server optimizer applies as a gradient.
    weights: `[n]` float32 α of the clients.
    metrics: Flat scalar round metrics; at least `train_loss`.
    state: The variant's new state (None for stateless variants).
  """
  updates: list
  weights: np.ndarray
  metrics: Metrics
  state: Any


class ClientWork(Protocol):
  """A client-work variant of `Simulation` (see the module docstring)."""

  def initial_state(self) -> Any:
    ...

  def train(self, state: Any, model_weights: tff.learning.models.ModelWeights,
            client_ids: Sequence[str], client_dataset: ClientDatasetFn,
            learning_rate: float) -> ClientOutputs:
    ...

  def evaluate(self, state: Any, trainable: Sequence[np.ndarray],
               client_ids: Sequence[str]) -> Metrics:
    ...


class ProcessClientWork:
  """Any `tff.learning.templates.ClientWorkProcess` as a client-work variant: the
  clients' results reach Python one per client, for the attacks to act on.

  The process's `next` runs in one TFF computation for the whole round whose results
  stay at CLIENTS (`tasks.simulation.rounds.Round` wraps a process given to it in
  this). Its state (for TFF's own client works, the optimizer's hyperparameters) is
  this variant's state; a round's `learning_rate`, when given, is written into its
  hyperparameters (`set_hparams`), so nothing is re-traced per round.

  Round metrics: `train_loss`, `train_accuracy` (the process's `train` measurements
  `loss` and `sparse_categorical_accuracy`, NaN when it has none); `measurements`
  of the last `train` call holds all of them.
  """

  def __init__(self, process: tff.learning.templates.ClientWorkProcess):
    if not isinstance(process, tff.learning.templates.ClientWorkProcess):
      raise TypeError('process must be a tff.learning.templates.ClientWorkProcess '
                      '(e.g. tff.learning.templates.build_model_delta_client_work(...)), '
                      f'got {type(process).__name__}.')
    self._process = process
    state_type = process.initialize.type_signature.result
    weights_type = process.next.type_signature.parameter[1].member
    data_type = process.next.type_signature.parameter[2]

    @tff.federated_computation(state_type, tff.FederatedType(weights_type, tff.SERVER),
                               data_type)
    def client_step(client_state, server_weights, client_data):
      output = process.next(client_state, tff.federated_broadcast(server_weights),
                            client_data)
      return (output.result.update, output.result.update_weight,
              output.measurements, output.state)

    self._client_step = client_step
    self.model_weights_type = weights_type
    self.measurements = None

  @property
  def process(self) -> tff.learning.templates.ClientWorkProcess:
    return self._process

  def initial_state(self) -> Any:
    return self._process.initialize()

  def with_learning_rate(self, state: Any, learning_rate: Optional[float]) -> Any:
    """`state` with the client optimizer's learning rate set (unchanged for None)."""
    if learning_rate is None:
      return state
    rate = np.float32(learning_rate)
    if isinstance(state, Mapping) and 'learning_rate' in state:
      # TFF's own client works: the state is the optimizer's hyperparameters.
      state = collections.OrderedDict(state)
      state['learning_rate'] = rate
      return state
    if (self._process.get_hparams is not None and
        self._process.set_hparams is not None):
      hparams = self._process.get_hparams(state)
      if isinstance(hparams, Mapping) and 'learning_rate' in hparams:
        hparams = collections.OrderedDict(hparams)
        hparams['learning_rate'] = rate
        return self._process.set_hparams(state, hparams)
    raise ValueError('This client work has no learning_rate hyperparameter to set per '
                     'round; pass learning_rate=None (its optimizer keeps its own).')

  def train(self, state, model_weights, client_ids, client_dataset, learning_rate):
    state = self.with_learning_rate(state, learning_rate)
    datasets = [client_dataset(c) for c in client_ids]
    updates, weights, measurements, new_state = self._client_step(
        state, model_weights, datasets)
    self.measurements = measurements
    return ClientOutputs(updates=list(updates), weights=np.asarray(weights, np.float32),
                         metrics=_train_metrics(measurements), state=new_state)

  def evaluate(self, state, trainable, client_ids) -> Metrics:
    del state, trainable, client_ids
    return Metrics()


def _train_metrics(measurements) -> Metrics:
  train = measurements.get('train', {}) if isinstance(measurements, Mapping) else {}
  return Metrics(train_loss=float(train.get('loss', float('nan'))),
                 train_accuracy=float(train.get('sparse_categorical_accuracy',
                                                float('nan'))))


# The local SGD loop of the simulation's FedAvg client work. TFF's default,
# DATASET_REDUCE, runs the training step as the function of a `reduce` over the
# dataset, which TFF's runtime sets up again for every client of every call: ~12 ms
# of the worker's CPU per client whatever the client's data (146 ms a 10-client
# call, against 35 ms with this loop: the step inlined in a while loop over an
# iterator). The updates and metrics are the same to the bit
# (tests/tasks/simulation/test_client_work.py, every task).
SIMULATION_LOOP = tff.learning.LoopImplementation.DATASET_ITERATOR


class FedAvgClientWork(ProcessClientWork):
  """FedAvg's client update: TFF's own model-delta client work (local SGD; the update is
  the model delta, the weight the number of examples, a non-finite delta weight 0).

  A `ProcessClientWork` of `tff.learning.templates.build_model_delta_client_work`
  that keeps no state between rounds (its hyperparameters are set from the round's
  client learning rate).

  Round metrics: `train_loss`, `train_accuracy` (TFF's `client_work/train` metrics, on
  poisoned data for data-poisoned clients).
  """

  def __init__(self, task: task_lib.Task):
    super().__init__(_model_delta_client_work(task.model_fn))
    self._hparams = self._process.initialize()

  def initial_state(self) -> None:
    return None

  def train(self, state, model_weights, client_ids, client_dataset, learning_rate):
    outputs = super().train(self._hparams, model_weights, client_ids, client_dataset,
                            learning_rate)
    outputs.state = state
    return outputs


def _model_delta_client_work(model_fn) -> tff.learning.templates.ClientWorkProcess:
  """TFF's model-delta client work (SGD, example-count weights), traced with little
  AutoGraph (`tff_private.traced_with_little_autograph`: the same graph)."""
  # The learning rate here is a placeholder: `train` sets the round's rate.
  return tff_private.traced_with_little_autograph(
      lambda: tff.learning.templates.build_model_delta_client_work(
          model_fn, tff.learning.optimizers.build_sgdm(learning_rate=1.0),
          tff.learning.ClientWeighting.NUM_EXAMPLES,
          loop_implementation=SIMULATION_LOOP))


# Tracing the client work takes seconds and a sweep runs dozens of simulations of one
# task: one FedAvgClientWork per task (kept in the value, so the id is not reused).
_FEDAVG_CACHE: dict[int, tuple[task_lib.Task, FedAvgClientWork]] = {}


def fedavg_client_work(task: task_lib.Task) -> FedAvgClientWork:
  """The (cached) `FedAvgClientWork` of `task`."""
  if id(task) not in _FEDAVG_CACHE:
    _FEDAVG_CACHE[id(task)] = (task, FedAvgClientWork(task))
  return _FEDAVG_CACHE[id(task)][1]


class _PersonalizedClientWork:
  """The shared part of Ditto and personalized RFA: the personal store and its
  per-client evaluation (Ditto's fairness metrics).

  Round metrics: `train_loss` (mean loss of the shared-model phase over the round's
  examples, poisoned data included), `personal_train_loss`,
  `num_personalized_clients` (clients with personal state so far).

  Evaluation metrics, over the benign clients given (their held-out data, unweighted
  over clients, as in Ditto): `personalized/accuracy_mean`, `_std` (population),
  `_worst10` (mean of the worst 10%, at least one client), `personalized/loss_mean`,
  `personalized/num_clients`, and the same of the global model on the same clients as
  `global_per_client/...`, the fair comparison.
  """

  def __init__(self, task: task_lib.Task, personal_steps: Optional[int],
               personal_learning_rate: Optional[float]):
    self._task = task
    self._personal_steps = (None if personal_steps is None else
                            arguments.check_positive_int('personal_steps', personal_steps))
    self._personal_learning_rate = (
        None if personal_learning_rate is None else
        arguments.check_positive_float('personal_learning_rate', personal_learning_rate))
    self._client = personalization.PersonalizationClient(task.keras_model_fn,
                                                         task.loss_fn)
    variables = self._client.keras_model.trainable_variables
    self._shapes = [tuple(v.shape) for v in variables]
    self._dtypes = [v.dtype.as_numpy_dtype for v in variables]
    self._evaluator = evaluation.TensorEvaluator(task.keras_model_fn, task.loss_fn)
    self._eval_cache = {}

  def initial_state(self) -> collections.OrderedDict:
    return _pack_personal({}, self._shapes, self._dtypes)

  def train(self, state, model_weights, client_ids, client_dataset, learning_rate):
    global_weights = [np.asarray(w) for w in model_weights.trainable]
    personal = _unpack_personal(state)
    personal_rate = self._personal_learning_rate or learning_rate
    updates, shared_stats, personal_stats = [], [], []
    for client_id in client_ids:
      shared_data = client_dataset(client_id)
      personal_data = client_dataset(client_id)
      if self._personal_steps is not None:
        personal_data = personal_data.repeat().take(self._personal_steps)
      delta, personal[client_id], shared, own = self._client_update(
          global_weights, personal.get(client_id), shared_data, personal_data,
          learning_rate, personal_rate)
      updates.append([-d for d in delta])  # TFF's sign: initial − trained.
      shared_stats.append(shared)
      personal_stats.append(own)
    weights = np.array([self._task.client_weights[c] for c in client_ids], np.float32)
    metrics = Metrics(train_loss=_mean_loss(shared_stats),
                      personal_train_loss=_mean_loss(personal_stats),
                      num_personalized_clients=len(personal))
    return ClientOutputs(updates, weights, metrics,
                         _pack_personal(personal, self._shapes, self._dtypes))

  def _client_update(self, global_weights, personal, shared_data, personal_data,
                     learning_rate, personal_rate):
    """(shared delta, new personal parameters, shared stats, personal stats)."""
    raise NotImplementedError

  def personal_models(self, state, trainable) -> dict[str, personalization.Weights]:
    """Client id → the model the client predicts with."""
    raise NotImplementedError

  def evaluate(self, state, trainable, client_ids) -> Metrics:
    global_weights = [np.asarray(w) for w in trainable]
    models = self.personal_models(state, global_weights)
    personal_results, global_results = [], []
    for client_id, x, y in self._eval_tensors(client_ids):
      personal_results.append(self._evaluator(models.get(client_id, global_weights), x, y))
      global_results.append(self._evaluator(global_weights, x, y))
    metrics = evaluation.client_statistics('personalized', personal_results)
    metrics.update(evaluation.client_statistics('global_per_client', global_results))
    return metrics

  def _eval_tensors(self, client_ids):
    """The clients' held-out examples as tensors, read once and reused: one tensor call
    per client is ~20× cheaper than iterating a dataset in a tf.function."""
    with_test_data = set(self._task.test_data.client_ids)
    for client_id in client_ids:
      if client_id not in with_test_data:
        continue
      if client_id not in self._eval_cache:
        examples = data_utils.batch_all(
            self._task.test_data.create_tf_dataset_for_client(client_id))
        self._eval_cache[client_id] = (None if examples is None else
                                       tuple(tf.constant(t) for t in examples))
      if self._eval_cache[client_id] is not None:
        yield (client_id, *self._eval_cache[client_id])


class DittoClientWork(_PersonalizedClientWork):
  """Ditto (Li et al., ICML 2021): the global model by FedAvg's local SGD, and on every
  selected client `personal_steps` steps of v_k ← v_k − η(∇F_k(v_k) + λ(v_k − w)).

  A client never selected predicts with w.
  """

  def __init__(self, task: task_lib.Task, ditto_lambda: float = 0.1,
               personal_steps: Optional[int] = 5,
               personal_learning_rate: Optional[float] = None):
    """Args:
      task: The benchmark.
      ditto_lambda: λ ≥ 0 (0: local training; large: v_k = w).
      personal_steps: Batches of the personal phase, s; None: one pass of the client's
        preprocessed data.
      personal_learning_rate: η; default the round's client learning rate.
    """
    self._lambda = arguments.check_nonnegative_float('ditto_lambda', ditto_lambda)
    super().__init__(task, personal_steps, personal_learning_rate)

  def _client_update(self, global_weights, personal, shared_data, personal_data,
                     learning_rate, personal_rate):
    shared = self._client.local_sgd(global_weights, shared_data, learning_rate)
    own = self._client.ditto_personal_update(
        global_weights if personal is None else personal, global_weights,
        personal_data, personal_rate, self._lambda)
    return shared.shared_delta, own.personal_weights, shared.stats, own.stats

  def personal_models(self, state, trainable):
    return _unpack_personal(state)


class PersonalizedRfaClientWork(_PersonalizedClientWork):
  """Personalized RFA (RFA paper Algorithm 4): τ steps on the personal offset u_i with
  w fixed, then τ steps on w with u_i fixed; the model of client i is w + u_i (w for a
  client never selected)."""

  def __init__(self, task: task_lib.Task, personal_steps: Optional[int] = None,
               personal_learning_rate: Optional[float] = None):
    """Args: as `DittoClientWork`'s; personal_steps None makes τ equal for both phases,
    as in the paper."""
    super().__init__(task, personal_steps, personal_learning_rate)

  def _client_update(self, global_weights, personal, shared_data, personal_data,
                     learning_rate, personal_rate):
    update = self._client.personalized_rfa_update(
        self._client.zeros_like_weights() if personal is None else personal,
        global_weights, personal_data, shared_data, learning_rate, personal_rate)
    return (update.shared_delta, update.personal_offset, update.shared_stats,
            update.personal_stats)

  def personal_models(self, state, trainable):
    return {c: [w + u for w, u in zip(trainable, offset)]
            for c, offset in _unpack_personal(state).items()}


class WorkerMomentumClientWork:
  """Worker (client) momentum (Karimireddy, He, Jaggi, "Learning from History for
  Byzantine Robust Optimization", ICML 2021, Section 4) around any client-work variant.

  Client i keeps a momentum m_i across rounds and sends it instead of its update:

    m_i ← β m_i + (1 − β) Δ_i,    m_i = 0 before client i is first selected,

  Δ_i the inner variant's update (TFF's sign, initial − trained). Averaging over rounds
  shrinks the honest clients' noise by about √((1 − β)/(1 + β)), which is what lets
  history-aware aggregators (centered clipping) tell them from attackers. A client of
  weight 0 (no examples, or a non-finite update that FedAvg zeroed) learned nothing:
  its momentum is kept and sent with weight 0. The round's update attacks replace what
  corrupted clients send; their stored momenta stay honest.

  State: `OrderedDict(momentum=<client ids + one stacked array per variable, the
  personal store's checkpointable form>[, inner=<the inner variant's state>])`; memory
  is (clients ever selected) × (model size).

  Round metrics: the inner variant's, plus `num_momentum_clients` (clients with a
  momentum so far).
  """

  def __init__(self, inner: ClientWork, task: task_lib.Task, momentum: float):
    """Args:
      inner: The client-work variant whose updates are averaged.
      task: The benchmark (for the model's variable shapes).
      momentum: β in [0, 1); 0 sends Δ_i itself.
    """
    self._inner = inner
    self._beta = arguments.check_number_in('worker_momentum', momentum, 0, 1,
                                           high_inclusive=False)
    variables = task.keras_model_fn().trainable_variables
    self._shapes = [tuple(v.shape) for v in variables]
    self._dtypes = [v.dtype.as_numpy_dtype for v in variables]

  @property
  def inner(self) -> ClientWork:
    return self._inner

  def initial_state(self) -> collections.OrderedDict:
    state = collections.OrderedDict(
        momentum=_pack_personal({}, self._shapes, self._dtypes))
    inner = self._inner.initial_state()
    if inner is not None:
      state['inner'] = inner
    return state

  def train(self, state, model_weights, client_ids, client_dataset, learning_rate):
    trained = self._inner.train(state.get('inner'), model_weights, client_ids,
                                client_dataset, learning_rate)
    store = _unpack_personal(state['momentum'])
    sent = []
    for client_id, update, weight in zip(client_ids, trained.updates, trained.weights):
      previous = store.get(client_id)
      if weight > 0:
        # In float64, then back to the variables' dtype for storage and sending.
        store[client_id] = [
            ((0.0 if m is None else self._beta * np.asarray(m, np.float64))
             + (1.0 - self._beta) * np.asarray(u, np.float64)).astype(dtype)
            for m, u, dtype in zip(previous or [None] * len(update), update,
                                   self._dtypes)]
      sent.append(store.get(client_id) or [np.zeros(shape, dtype) for shape, dtype in
                                           zip(self._shapes, self._dtypes)])
    new_state = collections.OrderedDict(
        momentum=_pack_personal(store, self._shapes, self._dtypes))
    if trained.state is not None:
      new_state['inner'] = trained.state
    metrics = Metrics(trained.metrics)
    metrics['num_momentum_clients'] = len(store)
    return ClientOutputs(sent, trained.weights, metrics, new_state)

  def evaluate(self, state, trainable, client_ids) -> Metrics:
    return self._inner.evaluate(state.get('inner'), trainable, client_ids)


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


def _fedavg(task, **unused_kwargs):
  del unused_kwargs  # FedAvg has no personal parameters.
  return fedavg_client_work(task)


CLIENT_WORKS = {
    'fedavg': _fedavg,
    'ditto': DittoClientWork,
    'personalized_rfa': PersonalizedRfaClientWork,
}


def client_work_from_name(name: str, task: task_lib.Task, worker_momentum: float = 0.0,
                          **kwargs) -> ClientWork:
  """The variant `name` of `CLIENT_WORKS` for `task`; `kwargs` are the personalized
  variants' arguments (ignored by FedAvg; Ditto alone takes `ditto_lambda`).

  `worker_momentum` β > 0 wraps the variant in `WorkerMomentumClientWork` (clients
  send m_i ← β m_i + (1 − β) Δ_i); 0, the default, returns the variant itself.
  """
  if name not in CLIENT_WORKS:
    raise ValueError(f'Unknown client work {name!r}; known: {", ".join(CLIENT_WORKS)}.')
  if name == 'personalized_rfa':
    kwargs.pop('ditto_lambda', None)
  work = CLIENT_WORKS[name](task, **kwargs)
  if worker_momentum != 0:  # A NaN or negative β goes to the constructor's check.
    work = WorkerMomentumClientWork(work, task, worker_momentum)
  return work
