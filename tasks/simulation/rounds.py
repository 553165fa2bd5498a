"""One federated round opened up, for attacks: client work → per-client updates →
update attack → aggregator → server update.

TFF's learning processes (`tff.learning.algorithms.build_weighted_fed_avg`,
`tff.learning.templates.compose_learning_process`) run a round as one computation, so
the clients' updates never reach Python and no attack can act on them. `Round` runs
the same pieces one at a time, with the updates in Python in between:

  from tasks.simulation import attacks, rounds

  client_work = tff.learning.templates.build_model_delta_client_work(
      model_fn, tff.learning.optimizers.build_sgdm(learning_rate=0.1),
      tff.learning.ClientWeighting.NUM_EXAMPLES)
  round_ = rounds.Round(client_work, tff_robust.GeometricMedianFactory(),
                        tff.learning.optimizers.build_sgdm(learning_rate=1.0))
  state = round_.initialize(initial_model_weights)
  attack = attacks.build_update_attack('alie', z=1.5)
  for round_num in range(num_rounds):
    output = round_.next(state, client_datasets, attack=attack,
                         corrupted=[c in corrupted_ids for c in client_ids],
                         rng=np.random.default_rng(round_num))
    state = output.state
    output.updates, output.weights        # what each client sent, the attack applied
    output.aggregate                      # the aggregator's result
    output.measurements['aggregator']     # e.g. the GM's objective per pass
  weights = rounds.model_weights(state)   # a tff.learning.models.ModelWeights

A round is (steps 1–4 of `tff.learning.templates.compose_learning_process`, with the
attack between 1 and 2):

1. the client work trains every client from the server model: one update and one
   weight per client (a `tff.learning.templates.ClientWorkProcess`, or a client-work
   variant of `tasks.simulation.client_work`: FedAvg, Ditto, personalized RFA, worker
   momentum);
2. the update attack replaces the updates of the clients marked corrupted, in numpy
   (`tasks.simulation.attacks`; a data attack instead poisons the datasets you pass);
3. the aggregator's `AggregationProcess.next(state, updates, weights)` runs on them,
   in this process with the runtime's results (`tasks.simulation.in_process`; for a
   gathering baseline of `tasks.registry`, its server step:
   `tasks.simulation.gathered`); before it, an
   aggregator with a condition on its number of clients (Krum's n > 2f + 2) is asked
   whether the round's finite updates meet it (`NonFiniteUpdatesError`, a
   `ValueError` for too few clients at all);
4. the server update (a `tff.learning.templates.FinalizerProcess`; TFF's
   `build_apply_optimizer_finalizer` of a server optimizer by default) applies the
   aggregate to the model, rejecting a non-finite one as FedAvg does (in this
   process too; `Round(..., in_process=False)` calls both through TFF's runtime).

The state is a checkpointable nested `OrderedDict` of numpy values,
`OrderedDict(model=OrderedDict(trainable=[...], non_trainable=[...]),
[client_work=...,] aggregator=..., server_optimizer=...)`: save it with
`tff.program.FileProgramStateManager`. `tasks.simulation.loop.Simulation` is this
round plus client sampling, seeding, the corrupted set, data attacks and evaluation:
its `run_round` calls `Round.next`.
"""

import collections
import dataclasses
import weakref
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import registry
from tasks.simulation import attacks
from tasks.simulation import client_work as client_work_lib
from tasks.simulation import gathered
from tasks.simulation import in_process as in_process_lib
from tasks.simulation import pass_attacks
from tff_robust.common import numerics

State = collections.OrderedDict
ClientData = Union[Sequence[tf.data.Dataset], Callable[[str], tf.data.Dataset]]


class NonFiniteUpdatesError(RuntimeError):
  """Too few clients of a round sent a finite update of weight > 0 for an aggregator
  with a condition on their number (Krum's n > 2f + 2): the model has diverged."""


def all_finite(structure: Any) -> bool:
  """True when every floating-point leaf of `structure` is finite."""
  for leaf in tf.nest.flatten(structure):
    array = np.asarray(leaf)
    if array.dtype.kind == 'f' and not np.all(np.isfinite(array)):
      return False
  return True


def model_weights(state: State) -> tff.learning.models.ModelWeights:
  """The server model of a round state, as TFF's `ModelWeights`."""
  model = state['model']
  return tff.learning.models.ModelWeights(trainable=list(model['trainable']),
                                          non_trainable=list(model['non_trainable']))


@dataclasses.dataclass
class RoundOutput:
  """What `Round.next` returns.

  Attributes:
    state: The state after the round (see the module docstring).
    updates: What every client sent, in the order of the round's clients, the
      attack applied (one structure of numpy arrays per client, the trainable
      variables; TFF's sign: initial − trained weights); None with
      `keep_updates=False`.
    weights: `[n]` float32 weight every client reported (0 for a client whose update
      the client work found non-finite; a weight attack's claim for a corrupted one).
    corrupted: `[n]` bool: the clients the attack controlled.
    client_metrics: The client work's flat round metrics (`train_loss`, ...).
    aggregate: The aggregator's result (the update the server applied).
    measurements: `OrderedDict(client_work=..., aggregator=..., server_optimizer=...)`:
      the client work's (None for the variants of `tasks.simulation.client_work`
      other than a `ClientWorkProcess`), the aggregator's and the server update's
      measurements, as their processes report them.
  """
  state: State
  updates: Optional[list]
  weights: np.ndarray
  corrupted: np.ndarray
  client_metrics: collections.OrderedDict
  aggregate: Any
  measurements: collections.OrderedDict

  @property
  def model_weights(self) -> tff.learning.models.ModelWeights:
    """The server model after the round."""
    return model_weights(self.state)


# The processes each factory created, weakly keyed by the factory (while it lives),
# then by (value type, weighted, in process): a sweep passes the same factory to run
# after run (`tasks.simulation.sweep`), and creating one traces its TFF computations
# and digests them for the in-process path (0.3–0.8 s for GM or the γ-mean).
_CREATED: 'weakref.WeakKeyDictionary[Any, dict]' = weakref.WeakKeyDictionary()


def _created(factory, value_type: tff.Type, weighted: bool, in_process: bool):
  """`(factory.create(value_type[, float32]), the function computing its next)`,
  shared by every `Round` of `factory`: like TFF's factories, ours are not changed
  after they are built."""
  key = (value_type, weighted, in_process)
  try:
    created = _CREATED.setdefault(factory, {})
  except TypeError:  # A factory that cannot be weakly referenced or hashed.
    created = {}
  if key not in created:
    aggregation = (factory.create(value_type, tff.TensorType(np.float32))
                   if weighted else factory.create(value_type))
    created[key] = (aggregation, aggregate_function(
        aggregation, in_process=in_process, weighted=weighted, factory=factory,
        value_type=value_type))
  return created[key]


def aggregate_function(aggregation: tff.templates.AggregationProcess, *,
                       in_process: bool, weighted: bool, factory=None,
                       value_type=None):
  """What a round calls to aggregate: with `in_process`, a `weighted` aggregation
  (created by `factory` for `value_type`, if given) evaluated here (a gathering
  baseline's server step on the updates held here, `tasks.simulation.gathered`:
  O(n·p) memory instead of TFF's ~8 copies; any other computation
  `tasks.simulation.in_process` can run); else, or where neither can, TFF's runtime
  or the process's own driver (`aggregation.next`)."""
  if in_process and weighted:
    evaluated = ((factory is not None and
                  gathered.in_process_aggregation(factory, value_type)) or
                 in_process_lib.aggregation(aggregation))
    if evaluated:
      return evaluated
  return aggregation.next


def _next_function(process: tff.templates.MeasuredProcess, in_process: bool):
  """`process.next`, evaluated here with `in_process` where
  `tasks.simulation.in_process` can run it, else by TFF's runtime."""
  return (in_process and in_process_lib.process_next(process)) or process.next


class Round:
  """One round of federated training whose per-client updates an attack can change.

  Build it once (it traces its TFF computations) and call `next` every round.
  """

  def __init__(self, client_work: Union[tff.learning.templates.ClientWorkProcess,
                                        client_work_lib.ClientWork],
               aggregator: Union[tff.aggregators.WeightedAggregationFactory,
                                 tff.aggregators.UnweightedAggregationFactory,
                                 tff.templates.AggregationProcess],
               server_update: Union[tff.learning.templates.FinalizerProcess,
                                    tff.learning.optimizers.Optimizer, None] = None,
               *, model_weights_type: Optional[tff.Type] = None,
               in_process: bool = True,
               protocol: Optional[pass_attacks.Protocol] = None):
    """Args:
      client_work: A `tff.learning.templates.ClientWorkProcess` (e.g.
        `tff.learning.templates.build_model_delta_client_work(model_fn, optimizer,
        weighting)`, FedAvg's), or a client-work variant of
        `tasks.simulation.client_work` (`FedAvgClientWork(task)`, `DittoClientWork`,
        ...).
      aggregator: An aggregation factory, weighted or unweighted (`tff_robust`'s,
        TFF's, `tasks.registry.aggregator_from_name(...)`), created here for the
        model's trainable weights; or an `AggregationProcess` already created for
        them (weighted: `next(state, values, weights)`; or unweighted).
      server_update: A `tff.learning.templates.FinalizerProcess`, or a TFF optimizer
        applied to the aggregate as a gradient (TFF's
        `build_apply_optimizer_finalizer`); default SGD with learning rate 1
        (FedAvg's: the model moves by the aggregate).
      in_process: Run the aggregator and the server update in this process, on the
        values held here (`tasks.simulation.in_process`, and
        `tasks.simulation.gathered` for a gathering baseline): the same results as
        TFF's runtime, without sending the round's updates into it. False: call
        their TFF processes (the reference).
      model_weights_type: The model's `ModelWeights` type
        (`tff.learning.models.weights_type_from_model(model_fn)`); default the
        client work process's. Needed with a variant of
        `tasks.simulation.client_work` other than `ProcessClientWork`.
      protocol: A `tasks.simulation.pass_attacks.Protocol`: the aggregator (an
        iterative aggregate of the registry) runs pass by pass, the corrupted
        clients of each round playing the protocol attack in every pass, the
        contributions' bounds applied if the protocol says so.
    """
    if isinstance(client_work, tff.learning.templates.ClientWorkProcess):
      client_work = client_work_lib.ProcessClientWork(client_work)
    if not callable(getattr(client_work, 'train', None)):
      raise TypeError('client_work must be a tff.learning.templates.ClientWorkProcess '
                      'or a client-work variant of tasks.simulation.client_work, got '
                      f'{type(client_work).__name__}.')
    self.client_work = client_work
    if model_weights_type is None:
      model_weights_type = getattr(client_work, 'model_weights_type', None)
    if model_weights_type is None:
      raise ValueError('Pass model_weights_type='
                       'tff.learning.models.weights_type_from_model(model_fn): it '
                       'cannot be read from this client work.')
    self.model_weights_type = model_weights_type
    self._factory = None
    if isinstance(aggregator, tff.templates.AggregationProcess):
      self.aggregation = aggregator
      self._weighted = len(aggregator.next.type_signature.parameter) == 3
      self.aggregate = aggregate_function(aggregator, in_process=in_process,
                                          weighted=self._weighted)
    elif callable(getattr(aggregator, 'create', None)):
      self._factory = aggregator
      self._weighted = not (
          isinstance(aggregator, tff.aggregators.UnweightedAggregationFactory) and
          not isinstance(aggregator, tff.aggregators.WeightedAggregationFactory))
      self.aggregation, self.aggregate = _created(
          aggregator, model_weights_type.trainable, self._weighted, in_process)
    else:
      raise TypeError('aggregator must be an aggregation factory (e.g. '
                      'tff_robust.GeometricMedianFactory()) or a '
                      'tff.templates.AggregationProcess, got '
                      f'{type(aggregator).__name__}.')
    if server_update is None:
      server_update = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
    if isinstance(server_update, tff.learning.optimizers.Optimizer):
      server_update = tff.learning.templates.build_apply_optimizer_finalizer(
          server_update, model_weights_type)
    if not isinstance(server_update, tff.learning.templates.FinalizerProcess):
      raise TypeError('server_update must be a tff.learning.templates.FinalizerProcess '
                      'or a tff.learning.optimizers.Optimizer, got '
                      f'{type(server_update).__name__}.')
    self.server_update = server_update
    self._server_next = _next_function(server_update, in_process)
    self._protocol, self._passes = protocol, None
    if protocol is not None:
      if self._factory is None or not self._weighted:
        raise TypeError('A protocol needs a weighted aggregation factory.')
      self._passes = pass_attacks.pass_by_pass(
          self._factory, model_weights_type.trainable,
          contribution_attack=(protocol.attack if isinstance(
              protocol.attack, pass_attacks.ContributionAttack) else None),
          bounds=protocol.bounds)

  def initialize(self, initial_model_weights: tff.learning.models.ModelWeights
                 ) -> State:
    """The state before round 0, from the initial model (e.g.
    `tff.learning.models.ModelWeights.from_model(keras_model)`, or a learning
    process's `get_model_weights(state)`)."""
    state = State(model=State(
        trainable=[np.asarray(v) for v in initial_model_weights.trainable],
        non_trainable=[np.asarray(v) for v in initial_model_weights.non_trainable]))
    client_state = self.client_work.initial_state()
    if client_state is not None:
      state['client_work'] = client_state
    state['aggregator'] = self.aggregation.initialize()
    state['server_optimizer'] = self.server_update.initialize()
    return state

  def next(self, state: State, client_data: ClientData, *,
           client_ids: Optional[Sequence[str]] = None,
           attack: Optional[attacks.UpdateAttack] = None,
           corrupted: Optional[Sequence[bool]] = None,
           rng: Optional[np.random.Generator] = None,
           learning_rate: Optional[float] = None,
           keep_updates: bool = True) -> RoundOutput:
    """Runs one round.

    Args:
      state: `initialize()`'s or the previous round's state.
      client_data: The round's clients' preprocessed (batched) datasets, one per
        client; or a function of a client id returning it (with `client_ids`).
      client_ids: The round's clients (default '0', '1', ...); the variants with a
        per-client state (Ditto, personalized RFA, worker momentum) keep it by id.
      attack: An update attack (`tasks.simulation.attacks.build_update_attack(name,
        **params)`, or any `UpdateAttack`); None sends the honest updates.
      corrupted: One bool per client: the clients the attack controls (required
        with an attack).
      rng: The attack's randomness; default an unseeded generator.
      learning_rate: The round's client learning rate; None keeps the client
        optimizer's (a `ClientWorkProcess`'s own hyperparameter). The variants of
        `tasks.simulation.client_work` need it.
      keep_updates: Return the updates in `RoundOutput.updates`. Without, a
        gathering aggregator drops each update once copied into its matrix, so they
        are never held twice (the simulation's memory bound for large models).

    Returns:
      A `RoundOutput`: the new state, the per-client updates and weights, the
      aggregate and every piece's measurements.

    Raises:
      NonFiniteUpdatesError: too few finite updates of weight > 0 for an aggregator
        with a condition on its number of clients (Krum's n > 2f + 2).
      ValueError: too few clients for such an aggregator at all; bad arguments.
    """
    if callable(client_data):
      if client_ids is None:
        raise ValueError('Pass client_ids= with a function of the client id.')
      client_dataset = client_data
    else:
      datasets = list(client_data)
      if client_ids is None:
        client_ids = [str(i) for i in range(len(datasets))]
      if len(client_ids) != len(datasets):
        raise ValueError(f'{len(datasets)} datasets for {len(client_ids)} client ids.')
      by_id = dict(zip(client_ids, datasets))
      client_dataset = by_id.__getitem__
    client_ids = list(client_ids)
    if corrupted is None:
      if attack is not None:
        raise ValueError('Pass corrupted=[...] (one bool per client) with an attack: '
                         'the clients whose updates it replaces.')
      corrupted = np.zeros(len(client_ids), bool)
    corrupted = np.asarray(corrupted, bool)
    if corrupted.shape != (len(client_ids),):
      raise ValueError(f'corrupted has shape {corrupted.shape}, one bool per client '
                       f'({len(client_ids)}) expected.')
    if learning_rate is None and not isinstance(self.client_work,
                                                client_work_lib.ProcessClientWork):
      raise ValueError(f'{type(self.client_work).__name__} needs the round\'s '
                       'learning_rate=.')

    weights = model_weights(state)
    trained = self.client_work.train(state.get('client_work'), weights, client_ids,
                                     client_dataset, learning_rate)
    # Only `updates` holds them from here on: a gathering baseline's in-process step
    # drops each update once copied into its matrix, so they are not held twice.
    updates, trained.updates = trained.updates, None
    reported = trained.weights
    if attack is not None:
      # A corrupted device sends any update and reports any weight.
      updates, reported = attack.attack_round(
          updates, trained.weights, corrupted,
          rng if rng is not None else np.random.default_rng())
      reported = np.asarray(reported, np.float32)
    self._check_num_clients(client_ids, updates, reported, corrupted, attack)
    sent = list(updates) if keep_updates else updates
    if self._passes is not None:
      aggregate = self._passes.aggregate(
          state['aggregator'], _flattened(updates), reported, corrupted,
          self._protocol.attack, rng)
    elif self._weighted:
      aggregate = self.aggregate(state['aggregator'], updates,
                                 [np.float32(w) for w in reported])
    else:
      aggregate = self.aggregate(state['aggregator'], updates)
    applied = self._server_next(state['server_optimizer'], weights, aggregate.result)

    new_state = State(model=State(trainable=list(applied.result.trainable),
                                  non_trainable=list(applied.result.non_trainable)))
    if trained.state is not None:
      new_state['client_work'] = trained.state
    new_state['aggregator'] = aggregate.state
    new_state['server_optimizer'] = applied.state
    return RoundOutput(
        state=new_state, updates=sent if keep_updates else None,
        weights=reported, corrupted=corrupted,
        client_metrics=collections.OrderedDict(trained.metrics),
        aggregate=aggregate.result,
        measurements=collections.OrderedDict(
            client_work=getattr(self.client_work, 'measurements', None),
            aggregator=aggregate.measurements, server_optimizer=applied.measurements))

  def _check_num_clients(self, client_ids, updates, weights, corrupted,
                         attack) -> None:
    """Fails the round before aggregating when the aggregator cannot take its clients
    (Krum's n > 2f + 2; named in Python rather than as TFF's gRPC INTERNAL error): a
    ValueError when it cannot take the round's clients at all, a
    `NonFiniteUpdatesError` when it could but too few sent a usable update. A rule
    without such a condition aggregates whatever is usable; with nothing usable its
    aggregate is not finite and TFF's finalizer keeps the model, as in
    `build_weighted_fed_avg`."""
    if self._factory is None:
      return  # A process says nothing of its conditions.
    registry.check_num_clients(self._factory, len(updates))
    usable = [w > 0 and numerics.is_usable_weight_value(w) and all_finite(u)
              for u, w in zip(updates, weights)]
    try:
      registry.check_num_clients(self._factory, sum(usable))
    except ValueError as e:
      unusable = [i for i, ok in enumerate(usable) if not ok]
      raise NonFiniteUpdatesError(
          f'only {sum(usable)} of {len(updates)} clients sent a finite update of '
          f'weight > 0. {_why_unusable(client_ids, unusable, corrupted, attack)} '
          f'{str(e).split(";")[0]}.') from e


def _flattened(updates) -> np.ndarray:
  """`[n, d]` float64: every client's update as one row."""
  return np.stack([np.concatenate([np.ravel(np.asarray(part, np.float64))
                                   for part in tf.nest.flatten(update)])
                   for update in updates])


def attack_name(attack: attacks.UpdateAttack) -> str:
  """The name an update attack is registered under (its class name if none)."""
  for name, cls in attacks.UPDATE_ATTACKS.items():
    if type(attack) is cls:  # pylint: disable=unidiomatic-typecheck
      return name
  return type(attack).__name__


def _why_unusable(client_ids, unusable: list[int], corrupted: np.ndarray,
                  attack) -> str:
  """Why the `unusable` clients (positions) sent no finite update of weight > 0, and
  the fix: faults the update attack injected, or local training that overflowed
  from a diverged model."""
  names = ', '.join(client_ids[i] for i in unusable)
  if attack is not None and all(corrupted[i] for i in unusable):
    # Not a divergence: the attack's faults were filtered out as they should be,
    # and too few clients are left for the aggregator's condition.
    return (f'Clients {names} (corrupted by the {attack_name(attack)} attack) sent '
            'non-finite updates and were dropped, leaving too few for the '
            'aggregator: sample more clients per round or assume fewer corrupted '
            'ones.')
  # TFF's client work sends a non-finite delta with weight 0: local training
  # overflowed from a blown-up model, and every later round would repeat it.
  return (f'Clients {names} sent non-finite updates or weight 0 (dropped): local '
          'training overflowed, the model has diverged. Lower the client learning '
          'rate or choose a robust aggregator.')
