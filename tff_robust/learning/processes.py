"""Drop-in robust replacements for `tff.learning.algorithms.build_weighted_fed_avg`."""

from typing import Optional

import tensorflow_federated as tff

from tff_robust.aggregators import geometric_median
from tff_robust.aggregators import nonfinite

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
    initial_point: str = 'zero',
    relative_nu: Optional[float] = None,
    inner_mean_factory: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    report_max_effective_weight: bool = True,
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
  measurements appear under `metrics['aggregator']`.

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
    initial_point: 'zero' (the zero update, i.e. the current model; default, chosen
      by `benchmarks/gm_start_point.py` and `benchmarks/gm_start_study.py`), 'mean'
      (the paper's start) or 'previous' (the previous round's aggregate, i.e. model
      delta, kept in the aggregator state).
    relative_nu: ν relative to the clients' robust typical distance to each pass's
      estimate (None and no `nu`: 0.2); see `GeometricMedianFactory`.
    inner_mean_factory: the weighted mean each pass goes through (secure sum, DP).
    report_max_effective_weight: see `GeometricMedianFactory`.
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
  aggregator = nonfinite.NonfiniteFilteringFactory(
      geometric_median.GeometricMedianFactory(
          num_communication_passes=num_communication_passes,
          nu=nu,
          relative_nu=relative_nu,
          tolerance=tolerance,
          inner_mean_factory=inner_mean_factory,
          initial_point=initial_point,
          report_max_effective_weight=report_max_effective_weight,
      ))
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
    **fed_avg_kwargs,
) -> tff.learning.templates.LearningProcess:
  """One-step RFA (paper Algorithm 3): one secure-average call per round, like FedAvg.

  Same interface as `build_robust_federated_aggregation_process`; `fed_avg_kwargs` are
  `build_weighted_fed_avg`'s keyword arguments (client_weighting, ...). With the
  default relative ν a round makes one more (scalar-histogram) sum before the mean;
  `nu=1e-6` is the paper's single-aggregation form.
  """
  _check_optimizer('client_optimizer_fn', client_optimizer_fn)
  _check_optimizer('server_optimizer_fn', server_optimizer_fn)
  aggregator = nonfinite.NonfiniteFilteringFactory(
      geometric_median.one_step_geometric_median_factory(
          nu=nu, relative_nu=relative_nu, inner_mean_factory=inner_mean_factory))
  return build_process_with_aggregator(
      model_fn, client_optimizer_fn, server_optimizer_fn, aggregator, **fed_avg_kwargs)


def build_process_with_aggregator(
    model_fn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer],
    aggregator: tff.aggregators.WeightedAggregationFactory,
    **fed_avg_kwargs,
) -> tff.learning.templates.LearningProcess:
  """`build_weighted_fed_avg` with `aggregator` for the model updates."""
  if server_optimizer_fn is None:
    server_optimizer_fn = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
  return tff.learning.algorithms.build_weighted_fed_avg(
      model_fn,
      client_optimizer_fn=client_optimizer_fn,
      server_optimizer_fn=server_optimizer_fn,
      model_aggregator=aggregator,
      **fed_avg_kwargs,
  )
