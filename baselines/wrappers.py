"""FedAvg's mean and norm clipping: TFF's own factories, made overflow-safe."""

from typing import Optional, Union

import tensorflow as tf
import tensorflow_federated as tff

from tff_robust import arguments
from tff_robust import iterative_mean
from tff_robust import numerics
from tff_robust import unit_weights

# Updates are scaled down to this norm before TFF's clipping sees them: TFF computes the
# norm in float32, which overflows to inf from ~1e19 on, and x / inf = 0 would drop the
# client instead of clipping it. At norm 1e18 the float32 sum of squares (1e36) fits.
NORM_BEFORE_CLIPPING = 1e18


class NormBoundingFactory(unit_weights.WeightedOrUnweightedFactory):
  """Scales a client update of L2 norm (computed in float64, rescaled) above
  `max_norm` down to norm `max_norm` on its client, then aggregates with `inner`:
  direction kept, norm still far above any clipping bound. TFF's clipping computes the
  norm in float32, which overflows from ~1e19 on, and x / inf = 0 would drop the client
  instead of clipping it.

  The created process has the inner process's type signature, state and measurements.
  """

  # A client-side map in front of the inner factory, which aggregates by sums.
  secure_compatible = True

  def __init__(self, inner: tff.aggregators.WeightedAggregationFactory,
               max_norm: float = NORM_BEFORE_CLIPPING):
    self._inner = iterative_mean.check_inner_mean_factory(inner)
    self._max_norm = arguments.check_positive_float('max_norm', max_norm)

  def create_weighted(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    iterative_mean.check_float_structure(value_type)
    inner = self._inner.create(value_type, weight_type)
    max_norm = self._max_norm

    @tff.tensorflow.computation(value_type)
    def bound_norm(value):
      norm = numerics.global_l2_norm(value)
      return tf.cond(norm > max_norm,
                     lambda: numerics.scale(value, max_norm / norm),
                     lambda: numerics.as_nest(value))

    @tff.federated_computation()
    def init_fn():
      return inner.initialize()

    @tff.federated_computation(
        init_fn.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      return inner.next(state, tff.federated_map(bound_norm, value), weight)

    return tff.templates.AggregationProcess(init_fn, next_fn)


def mean_factory(inner_mean_factory: Optional[
    tff.aggregators.WeightedAggregationFactory] = None
                 ) -> tff.aggregators.WeightedAggregationFactory:
  """The weighted mean (FedAvg's aggregator): `inner_mean_factory`, by default
  `tff_robust.iterative_mean.Float64MeanFactory()` (products and sums in float64)."""
  return iterative_mean.check_inner_mean_factory(inner_mean_factory)


def norm_clipping_factory(
    clip_norm: Union[float, tff.templates.EstimationProcess] = 1.0,
    inner_mean_factory: Optional[tff.aggregators.WeightedAggregationFactory] = None,
) -> NormBoundingFactory:
  """ℓ2 norm clipping (Sun et al. 2019, ref. [82] of the RFA paper): every client
  update is scaled to norm at most `clip_norm` (over the whole model), then averaged.

  A thin constructor around `tff.aggregators.clipping_factory`, so it is as private as
  `inner_mean_factory` (secure compatible with a secure inner mean). Updates of norm
  above 1e18 are scaled to norm 1e18 first (`NORM_BEFORE_CLIPPING`):
  TFF's float32 norm overflows beyond ~1e19 and its clipping would then zero the
  update instead of clipping it. Such clients are still clipped and counted; the norm
  an adaptive `clip_norm` process sees for them is 1e18.

  Args:
    clip_norm: the clipping bound, a float > 0 or a `tff.templates.EstimationProcess`
      for adaptive clipping (e.g.
      `tff.aggregators.PrivateQuantileEstimationProcess.no_noise(...)`).
    inner_mean_factory: the weighted mean applied to the clipped updates; default
      `tff_robust.iterative_mean.Float64MeanFactory()`.

  Returns:
    A weighted factory with the clipping factory's measurements (`clipping`,
    `clipping_norm`, `clipped_count`).
  """
  if not isinstance(clip_norm, tff.templates.EstimationProcess):
    clip_norm = arguments.check_positive_float('clip_norm', clip_norm)
  inner = iterative_mean.check_inner_mean_factory(inner_mean_factory)
  return NormBoundingFactory(tff.aggregators.clipping_factory(clip_norm, inner))
