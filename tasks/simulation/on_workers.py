"""The simulation with its clients spread over TFF worker_binary processes.

`DistributedSimulation` is `tasks.simulation.loop.Simulation` (same rounds, state,
checkpoints and metrics) whose client-side work runs on the workers of a
`tff_robust.distributed.DistributedContext`:

*   Local training: FedAvg's client update as one computation with no aggregation
    (`MergeableFedAvgClientWork`), each worker training a contiguous shard of the
    round's clients. (TFF's own client work aggregates its metrics in the same
    computation; the mergeable context would then train every client twice, once
    before the aggregation and once after it for the per-client updates.) The
    workers build the clients' datasets by client id from an export of the task's
    data (`tasks.simulation.worker_data`); the driver sends ids, not datasets.
*   Aggregation: `tff_robust.distributed.passwise`, one single-aggregate computation
    per secure average, so RFA, one-step RFA, the γ-mean and secure centered
    clipping run like FedAvg and GMA. The updates the attacks acted on (the
    driver's copy) go to the workers once per round, each worker its clients'
    (`DistributedContext.keep_on_workers`); every pass sends the estimate only.

Server-only computations (the aggregator's `initialize`, the server optimizer) run in
this process's own TFF context: they involve no client, and on the workers their
arguments would be copied to every worker.

A worker that fails during a round raises `WorkerRoundError` naming the worker and the
round; the experiment runner has then checkpointed every finished round, so rerunning
the same command (after restarting the worker) resumes there.
"""

import collections
import contextlib
import ipaddress
from typing import Optional

import numpy as np
import tensorflow_federated as tff

from tasks import registry
from tasks.builders import task as task_lib
from tasks.simulation import client_work as client_work_lib
from tasks.simulation import loop
from tasks.simulation import worker_data
from tff_robust import distributed
from tff_robust.common import tff_private
from tff_robust.distributed import passwise
from tff_robust.learning import client_update as client_update_lib


class WorkerRoundError(RuntimeError):
  """A worker failed during a round; names the worker (`address`) and `round_num`."""

  def __init__(self, round_num: int, error: distributed.WorkerError):
    super().__init__(
        f'Round {round_num} failed: {error} Rounds before {round_num} are '
        'checkpointed; restart the worker and rerun the same command to resume from '
        f'round {round_num}.')
    self.round_num = round_num
    self.address = error.address


class MergeableFedAvgClientWork:
  """`tasks.simulation.client_work.FedAvgClientWork` as one aggregation-free
  computation: every client's update, weight and unfinalized metrics stay at CLIENTS;
  the metrics are summed over clients and finalized here, by TFF's
  `sum_then_finalize` (`tff_robust.learning.client_update.metrics_aggregation`).

  Round metrics: `train_loss`, `train_accuracy`, as `FedAvgClientWork`'s.

  The client step runs in `context` (the workers) when given, else in the current
  context; the finalization, server-side, in the current context.

  With `client_data` (a `worker_data.ClientDataDirectory` of the task) the workers
  build the clients' datasets themselves: the client step is composed behind its
  `dataset_computation` (TFF's `compose_dataset_computation_with_computation`), so a
  round sends every worker the model, and per client an id, a data-attack index and
  two shuffle seeds, instead of the datasets. The batches are the same: the seeds
  are those of the dataset the driver would have sent.
  """

  def __init__(self, task: task_lib.Task,
               context: Optional[distributed.DistributedContext] = None,
               client_data: Optional[worker_data.ClientDataDirectory] = None):
    weighting = tff.learning.ClientWeighting.NUM_EXAMPLES
    self._shuffles = task.client_spec.shuffle_buffer_size > 1
    loop_implementation = client_work_lib.SIMULATION_LOOP
    optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0)

    def trace():
      # TFF's process, for its initial hyperparameters and types (never run).
      reference = tff.learning.templates.build_model_delta_client_work(
          task.model_fn, optimizer, weighting)
      types = (reference.initialize.type_signature.result.member,
               reference.next.type_signature.parameter[1].member,
               reference.next.type_signature.parameter[2].member)
      # TFF's own FedAvg client update: distributed training is numerically FedAvg's.
      return reference, types, client_update_lib.fedavg_client_update(
          task.model_fn, optimizer, weighting, loop_implementation, *types)

    reference, types, client_update = tff_private.traced_with_little_autograph(trace)
    self._hparams = reference.initialize()
    hparams_type, weights_type, data_type = types

    @tff.federated_computation(tff.FederatedType(hparams_type, tff.SERVER),
                               tff.FederatedType(weights_type, tff.SERVER),
                               tff.FederatedType(data_type, tff.CLIENTS))
    def client_step(hparams, server_weights, client_data):
      result, unfinalized = tff.federated_map(
          client_update, (tff.federated_broadcast(hparams),
                          tff.federated_broadcast(server_weights), client_data))
      return result.update, result.update_weight, unfinalized

    # The clients' metrics summed and finalized here, as TFF's FedAvg does.
    metrics_aggregation = client_update_lib.metrics_aggregation(task.model_fn)

    @tff.federated_computation(tff.FederatedType(
        client_update.type_signature.result[1], tff.CLIENTS))
    def aggregate_metrics(unfinalized):
      return metrics_aggregation(unfinalized)

    if client_data is not None:
      client_step = tff.simulation.compose_dataset_computation_with_computation(
          client_data.dataset_computation, client_step)
    self._client_step = client_step
    self._aggregate_metrics = aggregate_metrics
    self._context = context
    self._client_data = client_data
    # Client id → the name of its data attack (None: clean); the simulation sets it.
    self.data_attack_of = lambda client_id: None

  def initial_state(self) -> None:
    return None

  def train(self, state, model_weights, client_ids, client_dataset, learning_rate):
    hparams = collections.OrderedDict(self._hparams)
    hparams['learning_rate'] = np.float32(learning_rate)
    datasets = [client_dataset(c) for c in client_ids]
    if self._client_data is not None:
      datasets = self._dataset_keys(client_ids, datasets)
    with (tff.framework.get_context_stack().install(self._context)
          if self._context is not None else contextlib.nullcontext()):
      # In client order (`DistributedContext` returns the workers' shards in it).
      updates, weights, unfinalized = self._client_step(hparams, model_weights,
                                                        datasets)
    metrics = self._aggregate_metrics(unfinalized)
    return client_work_lib.ClientOutputs(
        updates=list(updates), weights=np.asarray(weights, np.float32),
        metrics=loop.Metrics(
            train_loss=float(metrics['loss']),
            train_accuracy=float(metrics.get('sparse_categorical_accuracy',
                                             float('nan')))),
        state=state)

  def _dataset_keys(self, client_ids, datasets):
    """What the workers' dataset computation takes instead of `datasets`."""
    self._client_data.export(client_ids)
    keys = []
    for client_id, dataset in zip(client_ids, datasets):
      # The seeds TF drew for this dataset's shuffle (none: the task does not shuffle).
      seeds = task_lib.shuffle_seeds(dataset)
      if seeds is None and self._shuffles:
        raise RuntimeError(
            f'Client {client_id!r}: its dataset shuffles, but its shuffle seeds could '
            'not be read (tasks.builders.task.shuffle_seeds found no _ShuffleDataset: '
            'has TensorFlow renamed it?); the workers would train on other batches. '
            'Port shuffle_seeds to this TensorFlow, or run without client_data.')
      seed, seed2 = seeds or (0, 0)
      keys.append(collections.OrderedDict(
          client_id=client_id,
          data_attack=np.int32(self._client_data.data_attack_index(
              self.data_attack_of(client_id))),
          seed=np.int64(seed), seed2=np.int64(seed2)))
    return keys

  def evaluate(self, state, trainable, client_ids) -> loop.Metrics:
    del state, trainable, client_ids
    return loop.Metrics()


class _ClientWorkOnWorkers:
  """A client-work variant whose `train` runs in the workers' context."""

  def __init__(self, inner, context):
    self._inner, self._context = inner, context

  def initial_state(self):
    return self._inner.initial_state()

  def train(self, *args, **kwargs):
    with tff.framework.get_context_stack().install(self._context):
      return self._inner.train(*args, **kwargs)

  def evaluate(self, *args, **kwargs):
    return self._inner.evaluate(*args, **kwargs)


class _PasswiseOnWorkers:
  """`passwise.PasswiseFactory` whose processes run `next` in the workers' context
  (and `initialize`, server-only, here)."""

  def __init__(self, factory, context):
    self._factory, self._context = passwise.PasswiseFactory(factory), context
    self._aggregator_factory = factory

  def check_num_clients(self, num_clients: int) -> None:
    """The aggregator's own early check (`registry.check_num_clients`)."""
    registry.check_num_clients(self._aggregator_factory, num_clients)

  def create(self, value_type, weight_type):
    process = self._factory.create(value_type, weight_type)
    context = self._context

    def next_fn(state, values, weights):
      with tff.framework.get_context_stack().install(context):
        return process.next(state, values, weights)

    return passwise.PasswiseProcess(process.initialize, next_fn,
                                    process.computations_per_call)


class DistributedSimulation(loop.Simulation):
  """`loop.Simulation` with local training and aggregation on TFF workers.

  Takes `loop.Simulation`'s arguments plus `context`, a
  `tff_robust.distributed.DistributedContext` (the caller owns and closes it). The
  default client work is `MergeableFedAvgClientWork`; the personalized variants
  train in this process (they are eager Keras code), their aggregation still runs on
  the workers. Results equal `loop.Simulation`'s up to the order of floating-point
  sums across workers.

  With the default client work the workers read their clients' data themselves
  (`data_on_workers=True`): the task's training clients are exported, as they are
  sampled, to `client_data_dir` (default a new temporary directory, which workers
  on this machine read; workers on other machines need it at the same path, see
  `worker_data`), and the driver sends client ids. `data_on_workers=False` sends
  every client's dataset with every round (for workers that cannot read the
  export).

  Raises (from `run_round`):
    WorkerRoundError: a worker failed or became unreachable during the round.
  """

  def __init__(self, task: task_lib.Task,
               aggregator_factory: tff.aggregators.WeightedAggregationFactory,
               client_work: Optional[client_work_lib.ClientWork] = None, *,
               context: distributed.DistributedContext, data_on_workers: bool = True,
               client_data_dir: Optional[str] = None, **kwargs):
    if not isinstance(context, distributed.DistributedContext):
      raise TypeError('context must be a tff_robust.distributed.DistributedContext, '
                      f'got {type(context).__name__}.')
    if client_work is None or isinstance(client_work,
                                         client_work_lib.FedAvgClientWork):
      client_data = (worker_data.ClientDataDirectory(task, client_data_dir)
                     if data_on_workers else None)
      client_work = MergeableFedAvgClientWork(task, context, client_data)
    elif not isinstance(client_work, MergeableFedAvgClientWork):
      client_work = _ClientWorkOnWorkers(client_work, context)
    super().__init__(task, _PasswiseOnWorkers(aggregator_factory, context),
                     client_work, **kwargs)
    if isinstance(client_work, MergeableFedAvgClientWork):
      client_work.data_attack_of = self._data_attack_of
    self.context = context

  def _data_attack_of(self, client_id: str) -> Optional[str]:
    return self._data_attack if client_id in self.corrupted_clients else None

  def run_round(self, state, round_num: int):
    try:
      return super().run_round(state, round_num)
    except distributed.WorkerError as e:
      raise WorkerRoundError(round_num, e) from e


def build_simulation(task: task_lib.Task,
                     aggregator_factory: tff.aggregators.WeightedAggregationFactory,
                     client_work: Optional[client_work_lib.ClientWork] = None, *,
                     context: Optional[distributed.DistributedContext] = None,
                     client_data_dir: Optional[str] = None,
                     **kwargs) -> loop.Simulation:
  """`loop.Simulation`, or `DistributedSimulation` on `context` when one is given.

  On workers, the workers read their clients' data from `client_data_dir` (an export
  present at that path on every worker, see `worker_data`) when given; else from a
  temporary export if every worker is on this machine; else (workers elsewhere, no
  directory) the driver sends the datasets.
  """
  if context is None:
    if client_data_dir is not None:
      raise ValueError('client_data_dir is where workers read client data: give a '
                       'context of workers too.')
    return loop.Simulation(task, aggregator_factory, client_work, **kwargs)
  data_on_workers = client_data_dir is not None or all(
      _on_this_machine(address) for address in context.addresses)
  return DistributedSimulation(task, aggregator_factory, client_work, context=context,
                               data_on_workers=data_on_workers,
                               client_data_dir=client_data_dir, **kwargs)


def _on_this_machine(address: str) -> bool:
  host = address.rpartition(':')[0].strip('[]')
  try:
    return host == 'localhost' or ipaddress.ip_address(host).is_loopback
  except ValueError:
    return False
