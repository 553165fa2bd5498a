"""A differentially private weighted mean, to use as the inner mean of the iterative
secure aggregates (`GeometricMedianFactory`, `GammaMeanFactory`).
"""

import collections
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_robust.common import arguments
from tff_robust.iterative import iterative_mean
from tff_robust.common import numerics
from tff_robust.common import unit_weights


class DifferentiallyPrivateWeightedMeanFactory(unit_weights.WeightedOrUnweightedFactory):
  """Weighted mean Σ β_i x_i / Σ β_i from one Gaussian-mechanism sum.

  Every client sends the record (β_i x_i, β_i), clipped as a whole to L2 norm `clip`;
  tensorflow-privacy's `GaussianSumQuery` (through
  `tff.aggregators.DifferentiallyPrivateFactory`) sums the records and adds
  N(0, (noise_multiplier · clip)² I) to the sum; the server divides the noised
  numerator by the noised denominator.

  Clipping the joint record scales β_i x_i and β_i by the same factor: a clipped
  client keeps its direction and only loses weight, so clipping bounds each client's
  influence without biasing what it says. With `noise_multiplier=0` and a `clip` larger
  than every record, the result is the exact weighted mean.

  Accounting: one call is one Gaussian mechanism with L2 sensitivity `clip` and noise
  multiplier `noise_multiplier` on the round's records (add or remove one client). An
  iterative aggregate with R passes (e.g. `GeometricMedianFactory` with
  `num_communication_passes=R`) calls it R times on the same clients: R Gaussian
  mechanisms compose like one with noise multiplier `noise_multiplier / sqrt(R)`; with
  `dp_accounting`, account a round as
  `dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(noise_multiplier), R)`
  inside the client-sampling event of the experiment. The DP guarantee covers the
  values returned by the inner mean only: set `report_max_effective_weight=False` on the
  outer factory and treat its objective measurements as non-private.

  Records are float32 whatever the value's dtypes (tensorflow-privacy's Gaussian
  query clips float32 records only): float64 and mixed-precision models are summed in
  float32 (rounding far below any useful noise level) and the result has the value's
  own dtypes.

  The process's `next` has type signature
  `(<state, {value}@CLIENTS, {weight}@CLIENTS> -> <state, value@SERVER, measurements>)`
  and reports the `DifferentiallyPrivateFactory` measurements (`dp_query_metrics`,
  `dp`) under `dp_sum`.
  """

  def __init__(
      self,
      noise_multiplier: float,
      clip: float,
      record_aggregation_factory: Optional[
          tff.aggregators.UnweightedAggregationFactory] = None,
  ):
    """Initializes the factory.

    Args:
      noise_multiplier: z >= 0, the noise standard deviation in units of `clip`.
      clip: C > 0, the L2 bound on each client's record (β_i x_i, β_i).
      record_aggregation_factory: how the clipped records are summed, e.g.
        `tff.aggregators.SecureSumFactory(...)`; defaults to a plain sum.

    Raises:
      TypeError: if `noise_multiplier` or `clip` is not a number.
      ValueError: if `noise_multiplier` < 0 or `clip` <= 0.
    """
    noise_multiplier = arguments.check_nonnegative_float('noise_multiplier',
                                                         noise_multiplier)
    clip = arguments.check_positive_float('clip', clip)
    query = tfp.GaussianSumQuery(l2_norm_clip=clip, stddev=clip * noise_multiplier)
    self._sum_factory = tff.aggregators.DifferentiallyPrivateFactory(
        query, record_aggregation_factory)

  def create_weighted(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    iterative_mean.check_float_structure(value_type)
    # tensorflow-privacy clips with a float32 bound over tensors of one dtype: float64
    # and mixed-precision models failed to build. Records are float32; the result
    # has the value's own dtypes.
    dtype = tf.float32
    template = iterative_mean.type_template(value_type)
    record_type = tff.types.to_type(collections.OrderedDict(
        weighted_value=tf.nest.map_structure(
            lambda spec: tff.TensorType(dtype.as_numpy_dtype, spec.shape), template),
        weight=tff.TensorType(dtype.as_numpy_dtype)))
    sum_process = self._sum_factory.create(record_type)

    @tff.tensorflow.computation(value_type, weight_type)
    def to_record(value, weight):
      weight = tf.cast(weight, dtype)
      return collections.OrderedDict(
          weighted_value=tf.nest.map_structure(
              lambda t: tf.cast(t, dtype) * weight, numerics.as_nest(value)),
          weight=weight)

    @tff.tensorflow.computation(record_type)
    def divide(record_sum):
      return tf.nest.map_structure(
          lambda t, spec: tf.cast(
              tf.math.divide_no_nan(t, record_sum['weight']), spec.dtype),
          numerics.as_nest(record_sum['weighted_value']), template,
          check_types=False)

    @tff.federated_computation()
    def init_fn():
      return sum_process.initialize()

    @tff.federated_computation(
        init_fn.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      output = sum_process.next(state, tff.federated_map(to_record, (value, weight)))
      return tff.templates.MeasuredProcessOutput(
          state=output.state,
          result=tff.federated_map(divide, output.result),
          measurements=tff.federated_zip(
              collections.OrderedDict(dp_sum=output.measurements)),
      )

    return tff.templates.AggregationProcess(init_fn, next_fn)

