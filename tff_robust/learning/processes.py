"""Drop-in robust replacements for `tff.learning.algorithms.build_weighted_fed_avg`.

Every builder returns the `tff.learning.templates.LearningProcess` that
`build_weighted_fed_avg` returns for the robust aggregator: `next` is one TFF
computation, the same in every context. Its multi-pass aggregators (RFA, the γ-mean,
secure centered clipping) make it a chain of dependent aggregations, which TFF's
mergeable multi-worker context cannot run as one computation; so each builder also
registers a pass-by-pass equivalent of `next` (`tff_robust.distributed.passwise.
register_equivalent`), which `tff_robust.distributed.DistributedContext` runs
instead:

    training (distributor, local training; per-client updates, weights and
              unfinalized metrics at CLIENTS, no aggregation)
    → the aggregator's passes (`tff_robust.distributed.passwise.PasswiseFactory`: one
      computation per pass, each one round of (secure) sums)
    → finish (the metrics' sum and finalization, the server optimizer, the new state)

It returns what `next` returns, of its type, from the same TF code (tested against
the single computation to 1e-6 over two workers). In any other context `next` runs
as the single computation; the equivalent is built on its first use only.
"""

import collections
from typing import Optional

import numpy as np
import tensorflow_federated as tff

from tff_robust.aggregators import geometric_median
from tff_robust.aggregators import nonfinite
from tff_robust.aggregators import trust_region
from tff_robust.aggregators import weight_cap
from tff_robust.distributed import passwise
from tff_robust.learning import client_update as client_update_lib

_DEFAULT_CLIENT_WEIGHTING = tff.learning.ClientWeighting.NUM_EXAMPLES
_DEFAULT_LOOP = tff.learning.LoopImplementation.DATASET_REDUCE


def _check_optimizer(name: str, optimizer) -> None:
  if optimizer is not None and not isinstance(optimizer, tff.learning.optimizers.Optimizer):
    raise TypeError(
        f'{name} must be a tff.learning.optimizers.Optimizer, e.g. '
        'tff.learning.optimizers.build_sgdm(learning_rate=0.1); TFF 0.87 no longer '
        f'takes Keras optimizers or functions returning them (got {optimizer!r}).')


def build_robust_federated_aggregation_process(
    model_fn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    num_communication_passes: int = 3,
    nu: Optional[float] = None,
    tolerance: Optional[float] = None,
    initial_point: str = geometric_median.DEFAULT_INITIAL_POINT,
    relative_nu: Optional[float] = None,
    inner_mean_factory: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    report_max_effective_weight: bool = True,
    report_objective: bool = True,
    cap_weights: bool = True,
    bound_by_recent_steps: bool = True,
    client_weighting: Optional[tff.learning.ClientWeighting] = _DEFAULT_CLIENT_WEIGHTING,
    model_distributor: Optional[tff.learning.templates.DistributionProcess] = None,
    metrics_aggregator=None,
    loop_implementation: tff.learning.LoopImplementation = _DEFAULT_LOOP,
) -> tff.learning.templates.LearningProcess:
  """RFA (paper Algorithm 1): federated averaging with the geometric median of updates.

  Takes every argument of `tff.learning.algorithms.build_weighted_fed_avg`, so swapping
  one for the other is a one-line change, plus the arguments of
  `tff_robust.GeometricMedianFactory`, which replaces the weighted mean of the client
  model updates. The returned `tff.learning.templates.LearningProcess` has the usual
  `initialize`, `next`, `get_model_weights` and `set_model_weights`; the aggregator's
  measurements appear under `metrics['aggregator']`. Inside
  `tff_robust.distributed.distributed_execution` the same `next(state, client_data)`
  runs on the workers, one computation per pass (see the module docstring).

  Args:
    model_fn: as for `build_weighted_fed_avg`.
    client_optimizer_fn: a `tff.learning.optimizers.Optimizer` for local training.
    server_optimizer_fn: a `tff.learning.optimizers.Optimizer` applying the aggregate;
      defaults to SGD with learning rate 1 (the aggregate becomes the model delta).
    num_communication_passes: secure-average calls per round (paper default 3).
    nu: an absolute smoothing floor ν on distances (the paper's: 1e-6). At most one
      of `nu` and `relative_nu`.
    tolerance: relative gradient ‖∇g_ν‖/Σα at which the estimate freezes (0: every
      pass is applied; None: 1e-6); see `GeometricMedianFactory`. Not the original
      TFF RFA's `tolerance` (which is ν): a positive value without a ν raises.
    initial_point: 'trimmed' (default: the mean, then the mean of the clients
      nearest to it; translation-equivariant), 'mean' (the paper's start), 'zero'
      (the zero update, i.e. the current model) or 'previous' (the previous round's
      aggregate, i.e. model delta, kept in the aggregator state); see
      `GeometricMedianFactory`.
    relative_nu: ν relative to the clients' robust typical distance to each pass's
      estimate (None and no `nu`: 0.2); see `GeometricMedianFactory`.
    inner_mean_factory: the weighted mean each pass goes through (secure sum, DP).
    report_max_effective_weight: see `GeometricMedianFactory`.
    report_objective: see `GeometricMedianFactory` (False saves the scalar-only call
      that completes the `objective` measurement on workers).
    cap_weights: cap every client's weight α_i at 2 × the clients' median weight
      (`tff_robust.aggregators.weight_cap.WeightCappingFactory`, one more secure sum
      of a weight histogram per round, measured as `weight_cap` and
      `num_capped_clients`): α_i is what a client reports, and one client reporting
      the others' total owns the median. False: the weights as reported.
    bound_by_recent_steps: scale the aggregate down to at most 2 × the median norm
      of the last 5 rounds' aggregates (`tff_robust.TrustRegionFactory`, server-side,
      no communication; measured as `trust_radius` and `trust_scale`): the median
      breaks down in a round whose sampled weight is mostly corrupted, and this
      keeps that round's step of the usual length. False: the median as computed.
    client_weighting: α_i: `tff.learning.ClientWeighting.NUM_EXAMPLES` (paper) or
      `UNIFORM`, or a callable of the local training outputs.
    model_distributor: as for `build_weighted_fed_avg`.
    metrics_aggregator: as for `build_weighted_fed_avg`.
    loop_implementation: as for `build_weighted_fed_avg`.

  Returns:
    A `tff.learning.templates.LearningProcess`.
  """
  _check_optimizer('client_optimizer_fn', client_optimizer_fn)
  _check_optimizer('server_optimizer_fn', server_optimizer_fn)
  aggregator = _robust(
      geometric_median.GeometricMedianFactory(
          num_communication_passes=num_communication_passes,
          nu=nu,
          relative_nu=relative_nu,
          tolerance=tolerance,
          inner_mean_factory=inner_mean_factory,
          initial_point=initial_point,
          report_max_effective_weight=report_max_effective_weight,
          report_objective=report_objective,
      ), cap_weights, bound_by_recent_steps)
  return build_process_with_aggregator(
      model_fn, client_optimizer_fn, server_optimizer_fn, aggregator,
      client_weighting=client_weighting,
      model_distributor=model_distributor,
      metrics_aggregator=metrics_aggregator,
      loop_implementation=loop_implementation,
  )


def build_one_step_robust_federated_aggregation_process(
    model_fn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    nu: Optional[float] = None,
    relative_nu: Optional[float] = None,
    inner_mean_factory: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    report_max_effective_weight: bool = True,
    report_objective: bool = True,
    cap_weights: bool = True,
    bound_by_recent_steps: bool = False,
    client_weighting: Optional[
        tff.learning.ClientWeighting] = _DEFAULT_CLIENT_WEIGHTING,
    model_distributor: Optional[tff.learning.templates.DistributionProcess] = None,
    metrics_aggregator=None,
    loop_implementation: tff.learning.LoopImplementation = _DEFAULT_LOOP,
) -> tff.learning.templates.LearningProcess:
  """One-step RFA (paper Algorithm 3): one secure-average call per round, like FedAvg.

  The arguments of `build_robust_federated_aggregation_process` that make sense for
  one Weiszfeld step from the zero update (all but `num_communication_passes`,
  `tolerance` and `initial_point`; `cap_weights` on by default). `bound_by_recent_steps`
  is off by default here: the one step is anchored at the current model already, and
  an attack that shortens the steps (tiny updates) shortens the bound with them
  (docs/aggregators.md, "Trust region"). With the default relative ν a round makes one
  more (scalar-histogram) sum before the mean, and the weight cap one more (the weight
  histogram's); `nu=1e-6, cap_weights=False` is the paper's form, a single aggregation
  when `report_objective=False` (the `objective` needs the step's result).

  Returns:
    A `tff.learning.templates.LearningProcess`.
  """
  _check_optimizer('client_optimizer_fn', client_optimizer_fn)
  _check_optimizer('server_optimizer_fn', server_optimizer_fn)
  aggregator = _robust(
      geometric_median.one_step_geometric_median_factory(
          nu=nu, relative_nu=relative_nu, inner_mean_factory=inner_mean_factory,
          report_max_effective_weight=report_max_effective_weight,
          report_objective=report_objective), cap_weights, bound_by_recent_steps)
  return build_process_with_aggregator(
      model_fn, client_optimizer_fn, server_optimizer_fn, aggregator,
      client_weighting=client_weighting,
      model_distributor=model_distributor,
      metrics_aggregator=metrics_aggregator,
      loop_implementation=loop_implementation,
  )


def _robust(factory, cap_weights: bool, bound_by_recent_steps: bool):
  """`factory` inside the weight cap and the trust region (each if asked), inside
  the non-finite filter."""
  for name, value in (('cap_weights', cap_weights),
                      ('bound_by_recent_steps', bound_by_recent_steps)):
    if not isinstance(value, bool):
      raise TypeError(f'{name} must be True or False, got {value!r}.')
  if cap_weights:
    factory = weight_cap.WeightCappingFactory(factory)
  if bound_by_recent_steps:
    factory = trust_region.TrustRegionFactory(factory)
  return nonfinite.NonfiniteFilteringFactory(factory)


def build_process_with_aggregator(
    model_fn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    *,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    client_weighting: Optional[
        tff.learning.ClientWeighting] = _DEFAULT_CLIENT_WEIGHTING,
    model_distributor: Optional[tff.learning.templates.DistributionProcess] = None,
    metrics_aggregator=None,
    loop_implementation: tff.learning.LoopImplementation = _DEFAULT_LOOP,
) -> tff.learning.templates.LearningProcess:
  """`build_weighted_fed_avg` with `aggregator` for the model updates.

  Takes `build_weighted_fed_avg`'s arguments with its names and defaults
  (`model_aggregator=`, TFF's `MeanFactory` when absent; `server_optimizer_fn`
  SGD with learning rate 1); `aggregator`, positional, is the same argument. For a
  `model_fn` that builds a `tff.learning.models.VariableModel`, `next` also runs on
  workers (`tff_robust.distributed`) whatever the aggregator's passes (see the
  module docstring); a `tff.learning.models.FunctionalModel` runs there only with an
  aggregator TFF can merge as one computation.

  Raises:
    TypeError: if both `aggregator` and `model_aggregator` are given.
  """
  if aggregator is not None and model_aggregator is not None:
    raise TypeError(
        'build_process_with_aggregator got both `aggregator` and `model_aggregator`: '
        'they are the same argument (`model_aggregator` is TFF\'s name); give one.')
  aggregator = aggregator if aggregator is not None else model_aggregator
  if aggregator is None:
    aggregator = tff.aggregators.MeanFactory()  # build_weighted_fed_avg's default.
  if server_optimizer_fn is None:
    server_optimizer_fn = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
  process = tff.learning.algorithms.build_weighted_fed_avg(
      model_fn,
      client_optimizer_fn=client_optimizer_fn,
      server_optimizer_fn=server_optimizer_fn,
      model_aggregator=aggregator,
      client_weighting=client_weighting,
      model_distributor=model_distributor,
      metrics_aggregator=metrics_aggregator,
      loop_implementation=loop_implementation,
  )
  if callable(model_fn):
    passwise.register_equivalent(process.next, lambda: PasswiseLearningNext(
        process, model_fn, client_optimizer_fn, server_optimizer_fn, aggregator,
        client_weighting=client_weighting, model_distributor=model_distributor,
        metrics_aggregator=metrics_aggregator,
        loop_implementation=loop_implementation))
  return process


class PasswiseLearningNext:
  """The `next` of a `build_weighted_fed_avg` process, as one computation for the
  training, one per pass of the aggregator and one to finish (module docstring).

  `PasswiseLearningNext(process, <the arguments process was built with>)(arg)` with
  `arg = (state, client_data)` returns `process.next(state, client_data)`'s value.
  Per-client values (updates, weights, unfinalized metrics) pass between the
  computations as the clients would keep them; the server-side code sees their sums
  only. On `tff_robust.distributed.DistributedContext`'s workers they stay on the
  workers that trained them for the whole round (`invoke_keeping`); elsewhere they
  pass through the caller.

  Attributes:
    computations_per_call: TFF computations one call invokes.
  """

  def __init__(self, process: tff.learning.templates.LearningProcess, model_fn,
               client_optimizer_fn, server_optimizer_fn, aggregator, *,
               client_weighting, model_distributor, metrics_aggregator,
               loop_implementation):
    state_type = process.next.type_signature.parameter[0].member
    data_type = process.next.type_signature.parameter[1]
    weights_type = state_type.global_model_weights
    update_type = weights_type.trainable
    if model_distributor is None:
      model_distributor = tff.learning.templates.build_broadcast_process(weights_type)
    metrics_aggregation_fn = client_update_lib.metrics_aggregation(
        model_fn, metrics_aggregator)
    finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
        server_optimizer_fn, weights_type)

    client_update = client_update_lib.fedavg_client_update(
        model_fn, client_optimizer_fn, client_weighting, loop_implementation,
        state_type.client_work, weights_type, data_type.member)

    @tff.federated_computation(tff.FederatedType(state_type, tff.SERVER), data_type)
    def train(state, client_data):
      # `build_model_delta_client_work`'s next up to its metrics' aggregation, which
      # `finish` does: an aggregation here would make TFF's mergeable form train
      # twice (its after-merge part recomputes the clients' values from the inputs).
      distributed = model_distributor.next(state.distributor,
                                           state.global_model_weights)
      result, model_outputs = tff.federated_map(
          client_update, (tff.federated_broadcast(state.client_work),
                          distributed.result, client_data))
      return collections.OrderedDict(
          update=result.update, update_weight=result.update_weight,
          model_outputs=model_outputs, distributor_state=distributed.state,
          distributor_measurements=distributed.measurements)

    trained = train.type_signature.result
    fused_aggregator_type = process.next.type_signature.result.metrics.member
    server = lambda t: tff.FederatedType(t, tff.SERVER)  # pylint: disable=g-long-lambda

    @tff.federated_computation(
        server(state_type), trained.model_outputs, trained.distributor_state,
        trained.distributor_measurements, server(state_type.aggregator),
        server(update_type), server(fused_aggregator_type.aggregator))
    def finish(state, model_outputs, distributor_state, distributor_measurements,
               aggregator_state, aggregate, aggregator_measurements):
      # `tff.learning.templates.compose_learning_process`'s next after the
      # aggregator, and the client work's metrics.
      train_metrics = metrics_aggregation_fn(model_outputs)
      finalized = finalizer.next(state.finalizer, state.global_model_weights,
                                 aggregate)
      new_state = tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
          finalized.result, distributor_state, state.client_work, aggregator_state,
          finalized.state))
      metrics = tff.federated_zip(collections.OrderedDict(
          distributor=distributor_measurements,
          client_work=tff.federated_zip(collections.OrderedDict(train=train_metrics)),
          aggregator=aggregator_measurements,
          finalizer=finalized.measurements))
      return tff.learning.templates.LearningProcessOutput(new_state, metrics)

    if not finish.type_signature.result.is_equivalent_to(
        process.next.type_signature.result):
      raise TypeError(  # Only if TFF's composition changed under us.
          'The pass-by-pass round returns '
          f'{finish.type_signature.result}, the process '
          f'{process.next.type_signature.result}.')
    self._train = train
    # The state may come in any container `next` takes (an OrderedDict, a Struct):
    # its aggregator's is read by position, as TFF converts it.
    self._aggregator_index = tff.structure.name_list(state_type).index('aggregator')
    self._aggregation = passwise.PasswiseFactory(aggregator).create(
        update_type, tff.TensorType(np.float32))
    self._finish = finish
    self.computations_per_call = 2 + self._aggregation.computations_per_call

  def __call__(self, arg):
    state, client_data = arg[0], arg[1]
    context = tff.framework.get_context_stack().current
    if hasattr(context, 'invoke_keeping'):
      # The workers keep what training computed per client, for the passes and the
      # metrics: none of it goes to the driver and back
      # (`DistributedContext.invoke_keeping`).
      trained = context.invoke_keeping(self._train, (state, client_data),
                                       keep=_PER_CLIENT)
    else:
      trained = self._train(state, client_data)
    try:
      aggregator_state = tff.structure.from_container(state)[self._aggregator_index]
      aggregated = self._aggregation.next(
          aggregator_state, trained['update'], trained['update_weight'])
      return self._finish(state, trained['model_outputs'],
                          trained['distributor_state'],
                          trained['distributor_measurements'], aggregated.state,
                          aggregated.result, aggregated.measurements)
    finally:
      for name in _PER_CLIENT:
        getattr(trained[name], 'release', lambda: None)()


# What training computes per client.
_PER_CLIENT = ('update', 'update_weight', 'model_outputs')
