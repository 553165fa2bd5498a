"""A differentially private weighted mean, to use as the inner mean of the iterative
secure aggregates (`GeometricMedianFactory`, `GammaMeanFactory`), and the declared
side channels: every client statistic those aggregates send to the server un-noised
beside it (`SIDE_CHANNELS`). Its ε: `tff_robust.aggregators.accounting`.
"""

import collections
import math
from typing import NamedTuple, Optional

import dp_accounting
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_robust.aggregators import robust_scale
from tff_robust.aggregators import weight_cap
from tff_robust.common import arguments
from tff_robust.iterative import iterative_mean
from tff_robust.common import numerics
from tff_robust.common import tff_private
from tff_robust.common import weighted_or_unweighted


_RECORD_DTYPE = tf.float32
# A record is β̃·(x̃/C, 1) with β̃ ∈ [0, 1] and ‖x̃‖ ≤ C: its L2 norm is at most √2.
RECORD_SENSITIVITY = math.sqrt(2.0)


class DifferentiallyPrivateWeightedMeanFactory(
    weighted_or_unweighted.WeightedOrUnweightedFactory):
  """Weighted mean Σ β_i x_i / Σ β_i of clipped updates from one Gaussian-mechanism sum.

  The record. Each client clips its value to L2 norm C, x̃_i = x_i·min(1, C/‖x_i‖),
  bounds its weight by the public `weight_bound` B, β̃_i = min(β_i, B)/B ∈ [0, 1],
  and sends

      r_i = β̃_i · (x̃_i / C, 1),      ‖r_i‖ ≤ √2·β̃_i ≤ √2,

  so the record's L2 sensitivity (add or remove one client) is √2 whatever the scale
  of β or of the updates: β enters only as a fraction of B, x only as a fraction of
  C. tensorflow-privacy's `GaussianSumQuery` (through
  `tff.aggregators.DifferentiallyPrivateFactory`) sums the records and adds
  N(0, (z_v·√2)² I): one Gaussian mechanism of noise multiplier z_v. The server
  returns C·(noised Σ β̃_i x̃_i/C) / max(noised Σ β̃_i, 2√2·z_v): the denominator
  floored at twice its noise's standard deviation, below which it is mostly noise
  (post-processing: no privacy cost; a non-positive denominator without noise gives
  0). Without noise, and with C and B above every update norm and weight, the
  result is the exact weighted mean.

  The noise on a call's result is about z_v·√2·C/Σβ̃_i per coordinate: it shrinks
  with the weight the call gives its clients in units of B. The geometric median's
  Weiszfeld weights β_i = α_i·ν/max(ν, d_i) are 1 (at α_i = B = 1) only for clients
  within ν of the estimate, so a larger `relative_nu` lowers the noise of its
  passes, at some cost in robustness.

  The clip C is fixed (`clip`) or adaptive (`adaptive`): TFF's
  `tff.aggregators.PrivateQuantileEstimationProcess` (tensorflow-privacy's
  `QuantileEstimatorQuery`, the mechanism behind
  `tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive`) moves C
  geometrically towards the `target_quantile` of the clients' update norms after every
  call, from a noised count of the clients with ‖x_i‖ ≤ C: records ±1/2, noise
  N(0, σ_c²), a Gaussian mechanism of multiplier z_c = 2σ_c. As in TFF, the
  `noise_multiplier` z of `adaptive` is the call's total: z_v = (z⁻² − z_c⁻²)^(-1/2),
  so the two mechanisms on the same clients compose to exactly one of multiplier z.

  Accounting (`tff_robust.aggregators.accounting`): one call is
  `dp_event()`, `GaussianDpEvent(z)` for a fixed clip and
  `ComposedDpEvent([GaussianDpEvent(z_v), GaussianDpEvent(z_c)])` for the adaptive
  one; an iterative aggregate with R passes calls it R times on the same clients,
  and `accounting.epsilon_of(factory, rounds, sampling_probability, delta)` composes
  the calls of a round and the sampled rounds into ε(δ). ε covers the values this
  mean returns and its clip (the state); the outer aggregates' other client
  statistics are `SIDE_CHANNELS`, outside ε.

  The guarantee is central DP, as TFF's `DifferentiallyPrivateFactory` gives it: the
  server adds the noise to the sum of the records (summed by
  `record_aggregation_factory`, plain or secure; the adaptive clip's counts by a plain
  sum), so ε holds for what the server releases (the aggregate, the model), not
  against the server's own operator, who sees the sums before their noise.

  Records are float32 whatever the value's dtypes (tensorflow-privacy's Gaussian
  query clips float32 records only); the result has the value's own dtypes.

  The process's `next` has type signature
  `(<state, {value}@CLIENTS, {weight}@CLIENTS> -> <state, value@SERVER, measurements>)`,
  state `<dp_sum=DifferentiallyPrivateFactory's state>` (plus `clip_estimate`, the
  quantile process's, when adaptive), and measurements `dp_sum` (the
  `DifferentiallyPrivateFactory` measurements) and `clip` (the C of the call).
  """

  def __init__(
      self,
      noise_multiplier: float,
      clip: float,
      weight_bound: float = 1.0,
      record_aggregation_factory: Optional[
          tff.aggregators.UnweightedAggregationFactory] = None,
  ):
    """A fixed clip (for the adaptive one: `adaptive`).

    Args:
      noise_multiplier: z >= 0, the noise standard deviation in units of the
        record's sensitivity √2.
      clip: C > 0, the L2 bound on each client's value x_i.
      weight_bound: B > 0, the public bound on the weights: β̃_i = min(β_i, B)/B (1
        for the unit weights of unweighted training, where the iterative aggregates'
        β_i ≤ α_i = 1 are never cut).
      record_aggregation_factory: how the records are summed, e.g.
        `tff.aggregators.SecureSumFactory(1.0, -1.0)` (a record's coordinates are
        in [-1, 1]); default a plain sum. TFF's `DistributedDpSumFactory` is
        refused (see the ValueError's message).

    Raises:
      TypeError: if an argument is not a number.
      ValueError: if `noise_multiplier` < 0, `clip` <= 0 or `weight_bound` <= 0, or
        `record_aggregation_factory` is TFF's distributed DP sum.
    """
    self._noise_multiplier = arguments.check_nonnegative_float('noise_multiplier',
                                                               noise_multiplier)
    self._clip = arguments.check_positive_float('clip', clip)
    self._value_noise_multiplier = self._noise_multiplier
    self._init(weight_bound, record_aggregation_factory, quantile=None)

  @classmethod
  def adaptive(
      cls,
      noise_multiplier: float,
      clients_per_round: float,
      initial_clip: float = 0.1,
      target_quantile: float = 0.5,
      learning_rate: float = 0.2,
      clipped_count_stddev: Optional[float] = None,
      weight_bound: float = 1.0,
      record_aggregation_factory: Optional[
          tff.aggregators.UnweightedAggregationFactory] = None,
  ) -> 'DifferentiallyPrivateWeightedMeanFactory':
    """The DP mean with the clip C adapted to a quantile of the update norms.

    Args:
      noise_multiplier: z >= 0, the total noise multiplier of a call (the records'
        Gaussian and the clip count's), as TFF's `gaussian_adaptive`.
      clients_per_round: n > 0, the expected clients of a call (the count is a
        fraction of n).
      initial_clip: C before the first call (TFF's default 0.1).
      target_quantile: the quantile of the update norms C moves towards, in [0, 1].
      learning_rate: > 0, C ← C·exp(−learning_rate·(fraction below C − quantile)).
      clipped_count_stddev: σ_c >= 0, the noise on the count; default max(0.05·n, z)
        (TFF's 0.05·n, raised to z when that would leave the records less than
        z/√(3/4) of noise: 2σ_c >= 2z keeps z_v <= 1.155·z); 0 when z = 0.
      weight_bound, record_aggregation_factory: as in the constructor.

    Raises:
      TypeError: if an argument is not a number.
      ValueError: if one is out of range, or z > 0 and 2σ_c <= z (no noise left
        for the records: raise `clipped_count_stddev`).
    """
    factory = cls.__new__(cls)
    z = arguments.check_nonnegative_float('noise_multiplier', noise_multiplier)
    n = arguments.check_positive_float('clients_per_round', clients_per_round)
    initial_clip = arguments.check_positive_float('initial_clip', initial_clip)
    target_quantile = arguments.check_number_in('target_quantile', target_quantile,
                                                0.0, 1.0, high_inclusive=True)
    learning_rate = arguments.check_positive_float('learning_rate', learning_rate)
    if clipped_count_stddev is None:
      stddev = 0.0 if z == 0 else max(0.05 * n, z)
    else:
      stddev = arguments.check_nonnegative_float('clipped_count_stddev',
                                                 clipped_count_stddev)
    if z > 0 and 2 * stddev <= z:
      raise ValueError(
          f'clipped_count_stddev={stddev} is too low for noise_multiplier={z}: the '
          f'count alone is a Gaussian of multiplier 2·σ_c = {2 * stddev}, at most the '
          'total z, which leaves no noise budget for the records. Raise '
          'clipped_count_stddev above z/2 (the default max(0.05·clients_per_round, z) '
          'leaves the records z/√(3/4)).')
    factory._noise_multiplier = z
    factory._clip = None
    factory._value_noise_multiplier = (
        0.0 if z == 0 else (z ** -2 - (2 * stddev) ** -2) ** -0.5 if stddev > 0 else z)
    factory._init(weight_bound, record_aggregation_factory, quantile=dict(
        initial_estimate=initial_clip, target_quantile=target_quantile,
        learning_rate=learning_rate, below_estimate_stddev=stddev,
        expected_num_records=n, geometric_update=True))
    return factory

  def _init(self, weight_bound, record_aggregation_factory, quantile):
    self._weight_bound = arguments.check_positive_float('weight_bound', weight_bound)
    self._quantile = quantile
    _check_record_sum(record_aggregation_factory)
    query = tfp.GaussianSumQuery(
        l2_norm_clip=RECORD_SENSITIVITY,
        stddev=RECORD_SENSITIVITY * self._value_noise_multiplier)
    self._sum_factory = tff.aggregators.DifferentiallyPrivateFactory(
        query, record_aggregation_factory)

  @property
  def noise_multiplier(self) -> float:
    """z: the call's noise multiplier (for the adaptive clip, the total of both
    mechanisms)."""
    return self._noise_multiplier

  @property
  def value_noise_multiplier(self) -> float:
    """z_v: the records' Gaussian, in units of the sensitivity √2 (z for a fixed
    clip)."""
    return self._value_noise_multiplier

  @property
  def count_noise_multiplier(self) -> Optional[float]:
    """z_c = 2σ_c of the adaptive clip's count (None for a fixed clip)."""
    return None if self._quantile is None else 2 * self._quantile[
        'below_estimate_stddev']

  @property
  def clip(self) -> Optional[float]:
    """C, the L2 bound on each value; None for the adaptive clip."""
    return self._clip

  @property
  def weight_bound(self) -> float:
    """B, the public bound of the weights."""
    return self._weight_bound

  def dp_event(self) -> dp_accounting.DpEvent:
    """One call: the records' Gaussian, and the adaptive clip's count's."""
    records = dp_accounting.GaussianDpEvent(self._value_noise_multiplier)
    if self._quantile is None:
      return records
    return dp_accounting.ComposedDpEvent(
        [records, dp_accounting.GaussianDpEvent(self.count_noise_multiplier)])

  @staticmethod
  def record_type(value_type) -> tff.Type:
    """The type of one client's record β̃_i·(x̃_i/C, 1) for values of `value_type`:
    `<weighted_value=value_type in float32, weight=float32>`, the member of the one
    client-to-server sum the Gaussian mechanism noises."""
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
    weight_bound = self._weight_bound
    if self._quantile is None:
      quantile_process = None
    else:
      quantile_process = tff.aggregators.PrivateQuantileEstimationProcess(
          tfp.QuantileEstimatorQuery(**self._quantile))
    fixed_clip = self._clip

    @tff.tensorflow.computation(value_type, weight_type, tf.float32)
    def to_record(value, weight, clip):
      return client_record(value, weight, clip, weight_bound)

    @tff.tensorflow.computation(value_type)
    def value_norm(value):
      return tf.cast(numerics.global_l2_norm(value), tf.float32)

    # The noised Σβ̃ is floored at twice its noise's standard deviation √2·z_v: below
    # that it is mostly noise, and dividing by it would blow the noised numerator up.
    floor = 2.0 * RECORD_SENSITIVITY * self._value_noise_multiplier

    @tff.tensorflow.computation(record_type, tf.float32)
    def divide(record_sum, clip):
      clip = tf.cast(clip, tf.float64)
      denominator = tf.maximum(tf.cast(record_sum['weight'], tf.float64), floor)
      return tf.nest.map_structure(
          lambda t, spec: tf.cast(tf.where(
              denominator > 0, tf.cast(t, tf.float64) * clip /
              tf.maximum(denominator, 1e-300), tf.zeros_like(t, tf.float64)),
                                  spec.dtype),
          numerics.as_nest(record_sum['weighted_value']), template, check_types=False)

    @tff.tensorflow.computation
    def constant_clip():
      return tf.constant(fixed_clip if fixed_clip is not None else 0.0, tf.float32)

    @tff.federated_computation()
    def init_fn():
      state = collections.OrderedDict(dp_sum=sum_process.initialize())
      if quantile_process is not None:
        state['clip_estimate'] = quantile_process.initialize()
      return tff.federated_zip(state)

    @tff.federated_computation(
        init_fn.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      if quantile_process is None:
        clip = tff.federated_eval(constant_clip, tff.SERVER)
      else:
        clip = quantile_process.report(state['clip_estimate'])
      records = tff.federated_map(to_record, (value, weight,
                                              tff.federated_broadcast(clip)))
      output = sum_process.next(state['dp_sum'], records)
      new_state = collections.OrderedDict(dp_sum=output.state)
      if quantile_process is not None:
        new_state['clip_estimate'] = quantile_process.next(
            state['clip_estimate'], tff.federated_map(value_norm, value))
      return tff.templates.MeasuredProcessOutput(
          state=tff.federated_zip(new_state),
          result=tff.federated_map(divide, (output.result, clip)),
          measurements=tff.federated_zip(
              collections.OrderedDict(dp_sum=output.measurements, clip=clip)),
      )

    return tff.templates.AggregationProcess(init_fn, next_fn)


def _check_record_sum(factory) -> None:
  """Refuses TFF's distributed DP as the records' sum, saying why and what to use."""
  if isinstance(factory, tff_private.distributed_dp.DistributedDpSumFactory):
    raise ValueError(
        "record_aggregation_factory is TFF's DistributedDpSumFactory (distributed DP, "
        'as in tff.learning.ddp_secure_aggregator), which the iterative aggregates '
        "cannot use in TFF 0.87: an aggregate around it fails to build (TFF's "
        'serialization of the nested computation exceeds protobuf\'s nesting limit, '
        'a DecodeError; TFF\'s own ddp_secure_aggregator fails the same way in its '
        'test context), its noise reports no DP event (UnsupportedDpEvent: no ε from '
        'dp_accounting), and this mean would add its central noise on top. For '
        'secure aggregation of the records use record_aggregation_factory='
        'tff.aggregators.SecureSumFactory(1.0, -1.0) (every coordinate of a record '
        'is in [-1, 1], so nothing is clipped), the server adding the accounted '
        'central noise to the secure sum.')


def client_record(value, weight, clip, weight_bound):
  """One client's record β̃·(x̃/C, 1) (TensorFlow): x̃ = x·min(1, C/‖x‖), β̃ =
  min(β, B)/B clipped to [0, 1], in float32, as an OrderedDict `weighted_value`
  (the structure of `value`), `weight`; zeros for β̃ = 0 or a non-finite value.
  L2 norm at most √2 (`RECORD_SENSITIVITY`)."""
  value = numerics.as_nest(value)
  clip = tf.cast(clip, tf.float64)
  norm = numerics.global_l2_norm(value)
  # x̃/C = x·min(1/C, 1/‖x‖).
  scale = tf.math.divide_no_nan(tf.constant(1.0, tf.float64), tf.maximum(norm, clip))
  beta = tf.clip_by_value(tf.cast(weight, tf.float64) / weight_bound, 0.0, 1.0)
  usable = tf.logical_and(beta > 0, tf.math.is_finite(norm))
  return collections.OrderedDict(
      weighted_value=tf.nest.map_structure(
          lambda t: tf.where(usable, tf.cast(tf.cast(t, tf.float64) * (beta * scale),
                                             _RECORD_DTYPE),
                             tf.zeros_like(t, _RECORD_DTYPE)), value),
      weight=tf.cast(tf.where(usable, beta, 0.0), _RECORD_DTYPE))


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
