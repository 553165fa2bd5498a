"""FedAvg's mean and norm clipping: TFF's own factories, made overflow-safe."""

from typing import Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
# TFF's clipping wrapper (state, measurements, adaptive norm) around a clip function of
# our own: the public `clipping_factory` fixes the float32 clip function.
from tff_robust.common.tff_private import robust as tff_robust_aggregators

from tff_robust.common import arguments
from tff_robust.iterative import iterative_mean
from tff_robust.common import numerics
from tff_robust.common import weighted_or_unweighted

# Updates are scaled down to this norm before TFF's clipping sees them: TFF computes the
# norm in float32, which overflows to inf from ~1e19 on, and x / inf = 0 would drop the
# client instead of clipping it. At norm 1e18 the float32 sum of squares (1e36) fits.
NORM_BEFORE_CLIPPING = 1e18


class NormBoundingFactory(weighted_or_unweighted.WeightedOrUnweightedFactory):
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


def holds_float64(value_type) -> bool:
  """True iff some tensor of `value_type` is float64."""
  return any(np.dtype(leaf.dtype) == np.float64
             for leaf in iterative_mean.tensor_types(value_type))


def clip_to_bound(value, norm, bound):
  """`value` scaled to norm `bound` (float64 scale) if its float64 `norm` is above it;
  unchanged otherwise, as in TFF's clipping."""
  value = numerics.as_nest(value)
  return tf.cond(norm > bound,
                 lambda: numerics.scaled(value, bound / norm),
                 lambda: tf.nest.map_structure(tf.identity, value))


def make_float64_clip_fn(value_type) -> tff.Computation:
  """TFF's clip function, same signature and outputs (clipped value, float32 norm for
  the clipping-norm process, int32 was-clipped flag), with the norm, the comparison
  and the scale in float64: TFF's float32 norm and divisor give a float64 update only
  float32 accuracy (~1e-8 relative)."""

  @tff.tensorflow.computation(value_type, tff_robust_aggregators.NORM_TF_TYPE)
  def clip_fn(value, clipping_norm):
    norm = numerics.global_l2_norm(value)
    bound = tf.cast(clipping_norm, tf.float64)
    return (clip_to_bound(value, norm, bound),
            tf.cast(norm, tff_robust_aggregators.NORM_TF_TYPE),
            tf.cast(norm > bound, tff_robust_aggregators.COUNT_TF_TYPE))

  return clip_fn


class L2ClippingFactory(weighted_or_unweighted.WeightedOrUnweightedFactory):
  """`tff.aggregators.clipping_factory(clip_norm, inner)`, in float64 for a value
  structure holding a float64 tensor.

  A structure without float64 tensors gets TFF's own factory (float32 norm; results
  bit for bit as before). One with a float64 tensor gets the same wrapper, state and
  measurements around `make_float64_clip_fn`. Either way the clipping-norm process
  sees float32 norms and reports a float32 bound, as TFF's interface requires.
  """

  def __init__(self, clip_norm: Union[float, tff.templates.EstimationProcess],
               inner: tff.aggregators.WeightedAggregationFactory):
    self._clip_norm = clip_norm
    self._inner = inner

  def create_weighted(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    if holds_float64(value_type):
      factory = tff_robust_aggregators._make_wrapper(  # pylint: disable=protected-access
          self._clip_norm, self._inner, tff.aggregators.SumFactory(),
          make_float64_clip_fn, 'clipp')
    else:
      factory = tff.aggregators.clipping_factory(self._clip_norm, self._inner)
    return factory.create(value_type, weight_type)


def mean_factory(inner_mean_factory: Optional[
    tff.aggregators.WeightedAggregationFactory] = None
                 ) -> tff.aggregators.WeightedAggregationFactory:
  """The weighted mean (FedAvg's aggregator): `inner_mean_factory`, by default
  `tff_robust.iterative.iterative_mean.Float64MeanFactory()` (products and sums in float64)."""
  return iterative_mean.check_inner_mean_factory(inner_mean_factory)


def norm_clipping_factory(
    clip_norm: Union[float, tff.templates.EstimationProcess] = 1.0,
    inner_mean_factory: Optional[tff.aggregators.WeightedAggregationFactory] = None,
) -> NormBoundingFactory:
  """ℓ2 norm clipping (Sun et al. 2019, ref. [82] of the RFA paper): every client
  update is scaled to norm at most `clip_norm` (over the whole model), then averaged.

  A thin constructor around `tff.aggregators.clipping_factory`, so it is as private as
  `inner_mean_factory` (secure compatible with a secure inner mean). A value
  structure holding a float64 tensor is clipped with a float64 norm and scale
  (`L2ClippingFactory`), others by TFF's float32 clipping as before. Updates of norm
  above 1e18 are scaled to norm 1e18 first (`NORM_BEFORE_CLIPPING`):
  TFF's float32 norm overflows beyond ~1e19 and its clipping would then zero the
  update instead of clipping it. Such clients are still clipped and counted; the norm
  an adaptive `clip_norm` process sees for them is 1e18.

  Args:
    clip_norm: the clipping bound, a float > 0 or a `tff.templates.EstimationProcess`
      for adaptive clipping (e.g.
      `tff.aggregators.PrivateQuantileEstimationProcess.no_noise(...)`).
    inner_mean_factory: the weighted mean applied to the clipped updates; default
      `tff_robust.iterative.iterative_mean.Float64MeanFactory()`.

  Returns:
    A weighted factory with the clipping factory's measurements (`clipping`,
    `clipping_norm`, `clipped_count`).
  """
  if not isinstance(clip_norm, tff.templates.EstimationProcess):
    clip_norm = arguments.check_positive_float('clip_norm', clip_norm)
  inner = iterative_mean.check_inner_mean_factory(inner_mean_factory)
  return NormBoundingFactory(L2ClippingFactory(clip_norm, inner))
