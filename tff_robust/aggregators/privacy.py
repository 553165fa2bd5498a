"""A differentially private weighted mean, to use as the inner mean of the iterative
secure aggregates (`GeometricMedianFactory`, `GammaMeanFactory`), and the declared
side channels: every client statistic those aggregates send to the server un-noised
beside it (`SIDE_CHANNELS`). Its ε: `tff_robust.aggregators.accounting`.
"""

import collections
from typing import NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_robust.aggregators import robust_scale
from tff_robust.aggregators import weight_cap
from tff_robust.common import arguments
from tff_robust.iterative import iterative_mean
from tff_robust.common import numerics
from tff_robust.common import unit_weights


_RECORD_DTYPE = tf.float32


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
  mechanisms compose like one with noise multiplier `noise_multiplier / sqrt(R)`.
  `tff_robust.aggregators.accounting` composes the R calls of a round and the sampled
  rounds into ε(δ): `accounting.epsilon(noise_multiplier, passes=R, rounds=T,
  sampling_probability=clients_per_round / total_clients, delta=δ)`, or
  `accounting.epsilon_of(factory, ...)`, which counts the calls of a factory.

  What ε covers: the values this mean returns, nothing else. The outer aggregates
  send other client statistics to the server un-noised; in a DP configuration of
  `GeometricMedianFactory` and `GammaMeanFactory` (and their wrappers) these are
  exactly `SIDE_CHANNELS`, each with what one client can change it by (add or
  remove one client of weight α_i, distance d_i to the broadcast estimate):

  *   `nu_histogram` (GM, relative ν, the default): α_i and α_i·log2 d_i in one of
      the [2, 320] buckets, before each Weiszfeld step; L1 ≤ α_i·(1 + |log2 d_i|),
      ≤ 151·α_i for float32 models. Gone with an absolute `nu`.
  *   `radius_histogram` (GM, 'trimmed' start): α_i in one of 512 buckets of
      d_i / D̄, once or twice a round; α_i.
  *   `distance_sum` (GM, 'trimmed' start): Σ α_i d_i to the mean; α_i·d_i,
      unbounded.
  *   `weight_sum` (GM, R ≥ 2): Σ α_i; α_i (1 with unit weights: the client count).
  *   `beta_sum_and_objective` (GM, every Weiszfeld step from a broadcast estimate,
      whatever `tolerance` and the reports): Σ β_i, ≤ α_i, and g_ν(v) =
      Σ α_i ‖v − w_i‖_ν, α_i·‖v − w_i‖_ν, unbounded.
  *   `objective` (GM, `report_objective=True`): g_ν at the result; unbounded.
  *   `first_beta_sum` and `max_weight` (GM, `report_max_effective_weight=True`):
      Σ β_i of pass 1 (and 2), ≤ α_i; `federated_max` of β_i every pass, which one
      client sets to its own β_i ≤ α_i (a maximum is one client's value).
  *   `gamma_start_sums` (γ-mean): Σ α_i‖x_i − c‖² (c = 0 or the median start) and
      Σ α_i; α_i‖x_i − c‖², unbounded, and α_i.
  *   `gamma_iteration_sums` (γ-mean, every iteration): Σ of the γ-weight (≤ α_i),
      weight·D_i (≤ 2α_i/(e·γ') at the default shift 0; times σ² for 'identity'),
      the capped flag (≤ 1), α_i, and α_i·D_i (unbounded).
  *   `weight_cap_histogram`, `num_capped` (`WeightCappingFactory`): a one-hot of
      α_i's bucket and a 0/1 flag; 1 each.
  *   `num_nonfinite` (`NonfiniteFilteringFactory`): a 0/1 flag; 1.

  A record's sensitivity `clip` does not depend on α_i, these do: they are the
  client statistics the robust aggregates need, outside the DP guarantee.
  tests/tff_robust/aggregators/test_privacy.py walks the compiled computation of
  each DP configuration and fails on any client-to-server aggregation that is
  neither this mean's noised sum nor in `SIDE_CHANNELS`.

  The guarantee is central DP, as TFF's `DifferentiallyPrivateFactory` gives it: the
  server adds the noise to the sum of the clipped records (summed by
  `record_aggregation_factory`, plain or secure), so ε holds for what the server
  releases (the aggregate, the model), not against the server's own operator, who
  sees that sum before its noise.

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
    self._noise_multiplier = arguments.check_nonnegative_float('noise_multiplier',
                                                               noise_multiplier)
    self._clip = arguments.check_positive_float('clip', clip)
    query = tfp.GaussianSumQuery(l2_norm_clip=self._clip,
                                 stddev=self._clip * self._noise_multiplier)
    self._sum_factory = tff.aggregators.DifferentiallyPrivateFactory(
        query, record_aggregation_factory)

  @property
  def noise_multiplier(self) -> float:
    """z: the noise standard deviation in units of `clip` (what the accountant takes)."""
    return self._noise_multiplier

  @property
  def clip(self) -> float:
    """C: the L2 bound on each record, the Gaussian mechanism's sensitivity."""
    return self._clip

  @staticmethod
  def record_type(value_type) -> tff.Type:
    """The type of one client's record (β_i x_i, β_i) for values of `value_type`:
    `<weighted_value=value_type in float32, weight=float32>`, the member of the one
    client-to-server sum the Gaussian mechanism noises."""
    # tensorflow-privacy clips with a float32 bound over tensors of one dtype: float64
    # and mixed-precision records would not build. Records are float32; the result
    # has the value's own dtypes.
    dtype = _RECORD_DTYPE
    template = iterative_mean.type_template(value_type)
    return tff.types.to_type(collections.OrderedDict(
        weighted_value=tf.nest.map_structure(
            lambda spec: tff.TensorType(dtype.as_numpy_dtype, spec.shape), template),
        weight=tff.TensorType(dtype.as_numpy_dtype)))

  def create_weighted(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    iterative_mean.check_float_structure(value_type)
    dtype = _RECORD_DTYPE
    template = iterative_mean.type_template(value_type)
    record_type = self.record_type(value_type)
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


class SideChannel(NamedTuple):
  """A client statistic that reaches the server un-noised in a DP configuration.

  `intrinsic` is the client-to-server intrinsic that carries it, `members` the client
  member's type (one per float width of the model where it differs), `source` the
  factory and pass that sends it, `contribution` what one client adds, `sensitivity`
  what adding or removing one client (weight α_i, distance d_i to the broadcast
  estimate) changes it by.
  """
  name: str
  intrinsic: str
  members: tuple
  source: str
  contribution: str
  sensitivity: str


_F64 = tff.TensorType(np.float64)
_I32 = tff.TensorType(np.int32)


def _scalars(*names):
  return tff.StructWithPythonType([(n, np.float64) for n in names],
                                  collections.OrderedDict)


# Every un-noised client-to-server aggregation of GeometricMedianFactory,
# GammaMeanFactory, WeightCappingFactory and NonfiniteFilteringFactory with
# DifferentiallyPrivateWeightedMeanFactory as the inner mean (docs/aggregators.md has
# the same table; tests/tff_robust/aggregators/test_privacy.py holds the compiled
# computations to it).
SIDE_CHANNELS = (
    SideChannel(
        'nu_histogram', 'federated_sum',
        (tff.TensorType(np.float64, [2, robust_scale.NUM_BUCKETS]),
         tff.TensorType(np.float64, [2, robust_scale.FLOAT64_NUM_BUCKETS])),
        'GM with a relative ν (the default): before every Weiszfeld step from an '
        'estimate (and before pass 1 of the zero and previous starts)',
        'α_i in bucket ⌊log2 d_i⌋ of row 0, α_i·log2 d_i in the same bucket of row 1',
        'L1 α_i·(1 + |log2 d_i|): ≤ 151·α_i for float32 models, ≤ 1100·α_i for '
        'float64 ones; reveals the octave of d_i'),
    SideChannel(
        'radius_histogram', 'federated_sum',
        (tff.TensorType(np.float64, [robust_scale.RADIUS_NUM_BUCKETS]),),
        "GM, 'trimmed' start: the trim radius (pass 2) and, for R ≥ 3, the "
        'restricted step (pass 3)',
        'α_i in the quarter-octave bucket of d_i / D̄',
        'α_i (L1 and L2); reveals d_i / D̄ to a factor 2^(1/4)'),
    SideChannel(
        'distance_sum', 'federated_sum', (_F64,),
        "GM, 'trimmed' start: the unit D̄ (pass 2)",
        'α_i·d_i, d_i the distance to the mean',
        'α_i·d_i: unbounded'),
    SideChannel(
        'weight_sum', 'federated_sum', (tff.TensorType(np.float32),),
        'GM with R ≥ 2: Σα, the relative gradient\'s denominator (pass 1)',
        'α_i',
        'α_i (1 under unit weights: the number of clients)'),
    SideChannel(
        'beta_sum_and_objective', 'federated_sum', (tff.StructType([_F64, _F64]),),
        'GM, every Weiszfeld step from a broadcast estimate (passes 2..R, 3..R for '
        "'trimmed'), whatever `tolerance` and the reports",
        'β_i = α_i·ν/max(ν, d_i) and α_i·‖v − w_i‖_ν',
        'Σβ: ≤ α_i; the objective: α_i·‖v − w_i‖_ν, unbounded'),
    SideChannel(
        'objective', 'federated_sum', (_F64,),
        'GM with report_objective=True (the default): g_ν at the result',
        'α_i·‖v − w_i‖_ν',
        'unbounded'),
    SideChannel(
        'first_beta_sum', 'federated_sum', (_F64,),
        'GM with report_max_effective_weight=True (the default): Σβ of pass 1 (and '
        "of pass 2 for 'trimmed')",
        'β_i',
        '≤ α_i'),
    SideChannel(
        'max_weight', 'federated_max', (_F64,),
        'GM with report_max_effective_weight=True (the default): every pass',
        'β_i',
        'one client sets the maximum to its own β_i ≤ α_i: it reveals one client\'s '
        'value'),
    SideChannel(
        'gamma_start_sums', 'federated_sum', (_scalars('moment', 'alpha'),),
        "γ-mean: with the mean (same round) or after the 'geometric_median' start",
        'α_i·‖x_i − c‖² (c = 0, or the median start) and α_i',
        'α_i·‖x_i − c‖²: unbounded; α_i'),
    SideChannel(
        'gamma_iteration_sums', 'federated_sum',
        (_scalars('weight', 'weighted_distance', 'capped', 'alpha', 'alpha_distance'),),
        'γ-mean: every iteration',
        'the γ-weight a_i = α_i·exp(min(0, −γ\'/2·(D_i − t))), a_i·D_i (a_i·‖x_i − μ‖² '
        "for 'identity'), the capped flag, α_i, α_i·D_i (α_i·‖x_i − μ‖²)",
        'a_i ≤ α_i; a_i·D_i ≤ α_i·2/(e·γ\') at the default shift t = 0 (times σ² for '
        "'identity'); the flag ≤ 1; α_i; α_i·D_i unbounded"),
    SideChannel(
        'weight_cap_histogram', 'federated_sum',
        (tff.TensorType(np.int32, [weight_cap.NUM_BUCKETS]),),
        'WeightCappingFactory: before the inner aggregate',
        'a one-hot of α_i\'s bucket (8 a factor 2)',
        '1 (L1); reveals α_i to a factor 1.09'),
    SideChannel(
        'num_capped', 'federated_sum', (_I32,),
        'WeightCappingFactory: with its first inner pass',
        '1 if α_i is above the cap', '1'),
    SideChannel(
        'num_nonfinite', 'federated_sum', (_I32,),
        'NonfiniteFilteringFactory: before the inner aggregate',
        '1 for a non-finite update or an unusable weight', '1'),
)
