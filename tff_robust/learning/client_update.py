"""FedAvg's client side as TFF's learning processes compute it, for the rounds composed
outside one TFF computation (`processes.PasswiseLearningNext` and the simulation's
rounds on workers, `tasks.simulation.on_workers`): the per-client update TFF's
`tff.learning.templates.build_model_delta_client_work` maps over the clients, and
the aggregation of the clients' metrics `build_weighted_fed_avg` applies, so a round
composed here trains and reports exactly as TFF's FedAvg does.
"""

import tensorflow as tf
import tensorflow_federated as tff

# TFF 0.87 exports no public name for the function.
from tff_robust.common.tff_private import model_delta_client_work


def fedavg_client_update(model_fn, client_optimizer, client_weighting,
                         loop_implementation, hparams_type, weights_type,
                         dataset_type) -> tff.Computation:
  """`(hparams, initial model weights, dataset) → (ClientResult(update,
  update_weight), unfinalized metrics)` at one client, as
  `build_model_delta_client_work(model_fn, client_optimizer, client_weighting)`
  computes it (`client_optimizer` a `tff.learning.optimizers.Optimizer`, its
  hyperparameters `hparams`)."""

  @tff.tensorflow.computation(hparams_type, weights_type, dataset_type)
  def client_update(hparams, initial_weights, dataset):
    update = model_delta_client_work.build_model_delta_update_with_tff_optimizer(
        model_fn=model_fn, weighting=client_weighting,
        loop_implementation=loop_implementation)
    return update(client_optimizer, initial_weights, dataset, hparams)

  return client_update


def metrics_aggregation(model_fn, metrics_aggregator=None) -> tff.Computation:
  """`unfinalized metrics@CLIENTS → finalized metrics@SERVER`, as
  `build_weighted_fed_avg(model_fn, ..., metrics_aggregator=metrics_aggregator)`
  aggregates its clients' training metrics (default
  `tff.learning.metrics.sum_then_finalize`: summed over clients, then finalized)."""
  if metrics_aggregator is None:
    metrics_aggregator = tff.learning.metrics.sum_then_finalize
  with tf.Graph().as_default():  # As TFF: no variables in the global graph.
    return metrics_aggregator(model_fn().metric_finalizers())
