"""Secure-aggregation compatibility and differential privacy of the iterative aggregates.

The compiled-computation check walks the `next` computation's building blocks and lists
every intrinsic that moves data from CLIENTS to SERVER: a secure-compatible aggregator
may only use sums there (and, for the one measurement that needs it, the maximum of a
scalar client weight), never an intrinsic that hands a client's value to the server.
With the DP inner mean, each of them must be that mean's noised sum or one of the
declared side channels (`tff_robust.aggregators.privacy.SIDE_CHANNELS`), as many times
as the configuration sends it.
"""

import collections
import pathlib

from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tff_robust.common.tff_private import building_blocks
from tff_robust.common.tff_private import distributed_dp
from tff_robust.common.tff_private import tree_analysis

from baselines import coordinatewise
import tensorflow_privacy as tfp

from tests.helpers import aggregator_cases
import tff_robust
from tff_robust.aggregators import accounting
from tff_robust.aggregators import privacy
from tff_robust.aggregators import robust_scale
from tff_robust.aggregators import weight_cap
from tff_robust.iterative import iterative_mean

VALUE_TYPE = tff.types.to_type(collections.OrderedDict(
    kernel=tff.TensorType(np.float32, [4, 3]), bias=tff.TensorType(np.float32, [3])))
WEIGHT_TYPE = tff.TensorType(np.float32)
SUMS = frozenset({
    'federated_sum', 'federated_secure_sum', 'federated_secure_sum_bitwidth',
    'federated_secure_modular_sum'})
SECURE_SUMS = SUMS - {'federated_sum'}


def secure_mean(bound=1e4):
  return tff.aggregators.MeanFactory(
      value_sum_factory=tff.aggregators.SecureSumFactory(bound),
      weight_sum_factory=tff.aggregators.SecureSumFactory(bound),
      no_nan_division=True)


def _at_clients(parameter):
  """The CLIENTS-placed operand of an intrinsic's parameter, or None. The operand is
  the parameter itself (`federated_sum`, `federated_max`) or the first element of a
  struct parameter (`federated_aggregate`'s value, the secure sums' value beside their
  bound)."""
  if isinstance(parameter, tff.StructType) and len(parameter) > 0:
    parameter = parameter[0]
  if isinstance(parameter, tff.FederatedType) and parameter.placement == tff.CLIENTS:
    return parameter
  return None


def client_to_server_intrinsics(computation):
  """(uri, type of the CLIENTS argument's member) of every CLIENTS → SERVER intrinsic."""
  found = []

  def visit(block):
    if not isinstance(block, building_blocks.Intrinsic):
      return
    signature = block.type_signature
    result = signature.result
    if not isinstance(result, tff.FederatedType) or result.placement != tff.SERVER:
      return
    operand = _at_clients(signature.parameter)
    if operand is not None:
      found.append((block.uri, operand.member))

  tree_analysis.visit_postorder(computation.to_building_block(), visit)
  return found


def only_scalars(member):
  """True if `member` is a scalar or a structure of scalars (sums of client weights and
  objective terms, never a model-sized value), or a histogram: the relative ν's and
  the trimmed start's of distances (`tff_robust.aggregators.robust_scale`), the weight
  cap's of client weights (`tff_robust.aggregators.weight_cap`); per-bucket weights,
  no model value."""
  if isinstance(member, tff.TensorType):
    return not member.shape or tuple(member.shape) in (
        (2, robust_scale.NUM_BUCKETS), (robust_scale.RADIUS_NUM_BUCKETS,),
        (weight_cap.NUM_BUCKETS,))
  return all(only_scalars(element) for _, element in tff.structure.iter_elements(member))


SECURE_COMPATIBLE = (
    ('gm', lambda inner, report: tff_robust.GeometricMedianFactory(
        inner_mean_factory=inner, report_max_effective_weight=report)),
    ('gm_warm_start', lambda inner, report: tff_robust.GeometricMedianFactory(
        inner_mean_factory=inner, report_max_effective_weight=report,
        initial_point='previous')),
    ('one_step_gm', lambda inner, report: tff_robust.one_step_geometric_median_factory(
        inner_mean_factory=inner, report_max_effective_weight=report)),
    # γ-mean and GMA reveal no maximum at all: `report` does not apply to them.
    ('gamma_mean', lambda inner, report: tff_robust.GammaMeanFactory(
        inner_mean_factory=inner)),
    ('gamma_mean_diagonal', lambda inner, report: tff_robust.GammaMeanFactory(
        covariance='diagonal', inner_mean_factory=inner)),
    ('gma', lambda inner, report: tff_robust.GradientMaskedAveragingFactory(
        inner_mean_factory=inner,
        sign_sum_factory=tff.aggregators.SecureSumFactory(1.0, -1.0))),
    # Reveals no maximum either; 'mean' runs the inner mean on the raw updates too.
    ('centered_clipping', lambda inner, report: tff_robust.SecureCenteredClippingFactory(
        inner_mean_factory=inner)),
    ('weight_capped_gm', lambda inner, report: weight_cap.WeightCappingFactory(
        tff_robust.GeometricMedianFactory(inner_mean_factory=inner,
                                          report_max_effective_weight=report))),
    ('weight_capped_mean', lambda inner, report: weight_cap.WeightCappingFactory(
        inner if inner is not None else tff_robust.iterative.iterative_mean.
        Float64MeanFactory())),
    ('centered_clipping_from_mean', lambda inner, report: (
        tff_robust.SecureCenteredClippingFactory(initial_point='mean',
                                                 inner_mean_factory=inner))),
)


_PROCESSES = {}


def created(build, secure_inner, report):
  """`build(inner, report)`'s process, `inner` a `secure_mean()` or None (the plain
  mean), created once per arguments: the walks below and the secure-sum runs share
  them."""
  key = (build, secure_inner, report)
  if key not in _PROCESSES:
    inner = secure_mean() if secure_inner else None
    _PROCESSES[key] = aggregator_cases.built_in_the_test_context(
        lambda: build(inner, report).create(VALUE_TYPE, WEIGHT_TYPE))
  return _PROCESSES[key]


class CompiledComputationPrivacyTest(parameterized.TestCase):

  def test_the_walk_sees_a_gathering_aggregate_and_secure_sums(self):
    # The walk must be able to fail: a gathering baseline's federated_aggregate of
    # whole updates, and a secure inner mean's secure sums, are both found.
    gathering = coordinatewise.CoordinateWiseMedianFactory().create(
        VALUE_TYPE, WEIGHT_TYPE)
    self.assertIn('federated_aggregate',
                  {uri for uri, _ in client_to_server_intrinsics(gathering.next)})
    secure = secure_mean().create(VALUE_TYPE, WEIGHT_TYPE)
    uris = [uri for uri, member in client_to_server_intrinsics(secure.next)
            if not only_scalars(member)]
    self.assertNotEmpty(uris)
    self.assertContainsSubset(uris, SECURE_SUMS)

  @parameterized.named_parameters(*SECURE_COMPATIBLE)
  def test_only_sums_and_a_scalar_max_reach_the_server(self, build):
    process = created(build, False, True)
    intrinsics = client_to_server_intrinsics(process.next)
    self.assertNotEmpty(intrinsics)
    for uri, member in intrinsics:
      if uri == 'federated_max':
        self.assertTrue(only_scalars(member), f'federated_max of {member}')
      else:
        self.assertIn(uri, SUMS)

  @parameterized.named_parameters(*SECURE_COMPATIBLE)
  def test_without_max_weight_only_sums_reach_the_server(self, build):
    process = created(build, False, False)
    uris = {uri for uri, _ in client_to_server_intrinsics(process.next)}
    self.assertContainsSubset(uris, SUMS)

  @parameterized.named_parameters(*SECURE_COMPATIBLE)
  def test_with_secure_inner_mean_values_only_leave_through_secure_sums(self, build):
    process = created(build, True, False)
    model_sized = [(uri, member)
                   for uri, member in client_to_server_intrinsics(process.next)
                   if not only_scalars(member)]
    self.assertNotEmpty(model_sized)  # Else the loop below checks nothing.
    for uri, member in model_sized:
      self.assertIn(uri, SECURE_SUMS, f'{uri} moves {member} to the server')


class SecureSumCompositionTest(aggregator_cases.SecureSumContextMixin,
                               parameterized.TestCase):


  @parameterized.named_parameters(*SECURE_COMPATIBLE)
  def test_secure_inner_mean_matches_plain_mean_up_to_quantisation(self, build):
    rng = np.random.default_rng(0)
    values = [collections.OrderedDict(
        kernel=rng.normal(size=(4, 3)).astype(np.float32),
        bias=rng.normal(size=3).astype(np.float32)) for _ in range(6)]
    weights = [np.float32(w) for w in rng.uniform(1, 3, size=6)]

    def run(secure_inner):
      process = created(build, secure_inner, True)
      return process.next(process.initialize(), values, weights).result

    plain, secure = run(False), run(True)
    # SecureSumFactory quantises each summand to 32 bits over [-bound, bound].
    for name in plain:
      np.testing.assert_allclose(secure[name], plain[name], atol=1e-3)


class DifferentiallyPrivateInnerMeanTest(parameterized.TestCase):

  def test_no_noise_and_large_clip_is_the_exact_aggregate(self):
    rng = np.random.default_rng(1)
    values = [collections.OrderedDict(
        kernel=rng.normal(size=(4, 3)).astype(np.float32),
        bias=rng.normal(size=3).astype(np.float32)) for _ in range(5)]
    weights = [np.float32(w) for w in rng.uniform(1, 3, size=5)]

    def run(inner):
      process = tff_robust.GeometricMedianFactory(
          inner_mean_factory=inner).create(VALUE_TYPE, WEIGHT_TYPE)
      return process.next(process.initialize(), values, weights).result

    exact = run(None)
    private = run(tff_robust.DifferentiallyPrivateWeightedMeanFactory(
        noise_multiplier=0.0, clip=1e6, weight_bound=3.0))
    for name in exact:
      np.testing.assert_allclose(private[name], exact[name], rtol=1e-5, atol=1e-6)

  def test_noise_spread_matches_configured_scale(self):
    # All clients at 0 with ν = 1: every β_i = 1, records (0, 1), and the result is C
    # times the numerator's noise N(0, 2z²) divided by the noisy Σβ = m + n.
    num_clients, noise_multiplier, clip = 20, 0.5, 1.0
    factory = tff_robust.GeometricMedianFactory(
        num_communication_passes=2, nu=1.0,
        inner_mean_factory=tff_robust.DifferentiallyPrivateWeightedMeanFactory(
            noise_multiplier=noise_multiplier, clip=clip))
    process = factory.create(VALUE_TYPE, WEIGHT_TYPE)
    zeros = collections.OrderedDict(
        kernel=np.zeros((4, 3), np.float32), bias=np.zeros(3, np.float32))
    state, draws = process.initialize(), []
    next_fn = aggregator_cases.fast_next(process)  # 40 calls of 20 clients.
    for _ in range(40):
      output = next_fn(state, [zeros] * num_clients, [np.float32(1)] * num_clients)
      state = output.state
      draws.append(np.concatenate([np.ravel(output.result[k]) for k in zeros]))
    observed = np.std(np.stack(draws))
    expected = privacy.RECORD_SENSITIVITY * noise_multiplier * clip / num_clients
    self.assertBetween(observed / expected, 0.85, 1.15)

  @parameterized.named_parameters(
      ('float32', np.float32, np.float32), ('float64', np.float64, np.float64),
      ('mixed', np.float32, np.float64))
  def test_float64_and_mixed_precision_models(self, kernel_dtype, bias_dtype):
    # tensorflow-privacy clips float32 records only: float64 and mixed models failed
    # to build. Without noise and clipping the result is the weighted mean, in the
    # value's own dtypes.
    value_type = tff.types.to_type(collections.OrderedDict(
        kernel=tff.TensorType(kernel_dtype, [4, 3]),
        bias=tff.TensorType(bias_dtype, [3])))
    rng = np.random.default_rng(2)
    values = [collections.OrderedDict(
        kernel=rng.normal(size=(4, 3)).astype(kernel_dtype),
        bias=rng.normal(size=3).astype(bias_dtype)) for _ in range(5)]
    weights = rng.uniform(1, 3, size=5).astype(np.float32)
    process = tff_robust.DifferentiallyPrivateWeightedMeanFactory(
        noise_multiplier=0.0, clip=1e6, weight_bound=3.0).create(value_type, WEIGHT_TYPE)
    result = process.next(process.initialize(), values, list(weights)).result
    for name, dtype in (('kernel', kernel_dtype), ('bias', bias_dtype)):
      expected = np.average([v[name].astype(np.float64) for v in values], axis=0,
                            weights=weights.astype(np.float64))
      self.assertEqual(np.asarray(result[name]).dtype, dtype)
      np.testing.assert_allclose(result[name], expected, rtol=1e-5, atol=1e-6)

  @parameterized.named_parameters(
      ('negative_noise', dict(noise_multiplier=-1.0, clip=1.0), 'noise_multiplier'),
      ('zero_clip', dict(noise_multiplier=1.0, clip=0.0), 'clip'),
      ('zero_weight_bound', dict(noise_multiplier=1.0, clip=1.0, weight_bound=0.0),
       'weight_bound'),
  )
  def test_bad_argument_is_named(self, kwargs, name):
    with self.assertRaisesRegex(ValueError, name):
      tff_robust.DifferentiallyPrivateWeightedMeanFactory(**kwargs)

  @parameterized.named_parameters(
      ('string_noise', dict(noise_multiplier='1', clip=1.0), 'noise_multiplier'),
      ('bool_clip', dict(noise_multiplier=1.0, clip=True), 'clip'),
  )
  def test_argument_of_the_wrong_type_is_named(self, kwargs, name):
    with self.assertRaisesRegex(TypeError, name):
      tff_robust.DifferentiallyPrivateWeightedMeanFactory(**kwargs)

  def test_numpy_scalars_are_accepted(self):
    tff_robust.DifferentiallyPrivateWeightedMeanFactory(
        noise_multiplier=np.float32(0.5), clip=np.float64(1.0))


def numpy_record(value, weight, clip, weight_bound):
  """The record β̃·(x̃/C, 1) by hand: x̃ = x·min(1, C/‖x‖), β̃ = min(β, B)/B."""
  flat = np.concatenate([np.ravel(v).astype(np.float64) for v in value.values()])
  norm = np.linalg.norm(flat)
  beta = min(max(float(weight), 0.0), weight_bound) / weight_bound
  if not np.isfinite(norm):
    beta = 0.0
  if beta == 0:  # A zero record (no NaN from 0 · NaN).
    return collections.OrderedDict(
        (k, np.zeros(np.shape(v))) for k, v in value.items()), beta
  scale = beta * min(1.0, clip / norm) / clip
  return collections.OrderedDict(
      (k, np.asarray(v, np.float64) * scale) for k, v in value.items()), beta


def numpy_mean(values, weights, clip, weight_bound):
  """The DP mean without noise by hand: Σ β̃_i x̃_i / Σ β̃_i."""
  records = [numpy_record(v, w, clip, weight_bound) for v, w in zip(values, weights)]
  total = sum(beta for _, beta in records)
  return collections.OrderedDict(
      (k, clip * sum(r[k] for r, _ in records) / total) for k in values[0])


def _values(rng, num, scale=1.0):
  return [collections.OrderedDict(
      kernel=(scale * rng.normal(size=(4, 3))).astype(np.float32),
      bias=(scale * rng.normal(size=3)).astype(np.float32)) for _ in range(num)]


class RecordTest(parameterized.TestCase):
  """The record and its clip against an independent numpy computation."""

  def test_record_matches_numpy_and_is_within_the_sensitivity(self):
    rng = np.random.default_rng(3)
    values = _values(rng, 6, scale=3.0)
    values[1]['bias'][0] = np.nan
    weights = [0.5, 2.0, 7.0, 0.0, 1.5, 3.9]
    clip, weight_bound = 2.0, 4.0
    for value, weight in zip(values, weights):
      record = privacy.client_record(value, tf.constant(weight, tf.float32),
                                     tf.constant(clip, tf.float32), weight_bound)
      expected, beta = numpy_record(value, weight, clip, weight_bound)
      np.testing.assert_allclose(record['weight'], beta, rtol=1e-6)
      for name in value:
        np.testing.assert_allclose(record['weighted_value'][name], expected[name],
                                   rtol=1e-5, atol=1e-7)
      squared = float(record['weight']) ** 2 + sum(
          float(np.sum(np.square(t))) for t in record['weighted_value'].values())
      self.assertLessEqual(np.sqrt(squared), privacy.RECORD_SENSITIVITY * (1 + 1e-6))

  def test_mean_is_the_weighted_mean_of_clipped_updates(self):
    # Without noise: Σ β̃ x̃ / Σ β̃, the clip binding for most clients and B cutting
    # the largest weights.
    rng = np.random.default_rng(4)
    values = _values(rng, 7, scale=2.0)
    weights = [float(w) for w in rng.uniform(0.2, 3.0, size=7)]
    clip, weight_bound = 3.0, 2.0
    process = tff_robust.DifferentiallyPrivateWeightedMeanFactory(
        0.0, clip, weight_bound=weight_bound).create(VALUE_TYPE, WEIGHT_TYPE)
    output = process.next(process.initialize(), values,
                          [np.float32(w) for w in weights])
    expected = numpy_mean(values, weights, clip, weight_bound)
    for name in expected:
      np.testing.assert_allclose(output.result[name], expected[name], rtol=1e-5,
                                 atol=1e-6)
    self.assertAlmostEqual(float(output.measurements['clip']), clip, places=6)

  def test_adaptive_clip_follows_the_quantile_update(self):
    # Without noise the clip moves geometrically: C ← C·exp(−η·(fraction of
    # ‖x_i‖ ≤ C − q)) after every call, and each call clips with the C before it.
    rng = np.random.default_rng(5)
    num, initial, quantile, rate = 8, 0.5, 0.5, 0.3
    factory = tff_robust.DifferentiallyPrivateWeightedMeanFactory.adaptive(
        0.0, clients_per_round=num, initial_clip=initial, target_quantile=quantile,
        learning_rate=rate)
    self.assertIsNone(factory.clip)
    process = factory.create(VALUE_TYPE, WEIGHT_TYPE)
    state, clip = process.initialize(), initial
    for call in range(5):
      values = _values(rng, num, scale=1.0 + call)
      output = process.next(state, values, [np.float32(1)] * num)
      state = output.state
      np.testing.assert_allclose(output.measurements['clip'], clip, rtol=1e-5)
      expected = numpy_mean(values, [1.0] * num, clip, 1.0)
      for name in expected:
        np.testing.assert_allclose(output.result[name], expected[name], rtol=1e-4,
                                   atol=1e-6)
      norms = [np.linalg.norm(np.concatenate([np.ravel(t) for t in v.values()]))
               for v in values]
      below = np.mean([n <= clip for n in norms])
      clip *= np.exp(-rate * (below - quantile))

  def test_adaptive_noise_split_is_tff_s(self):
    factory = tff_robust.DifferentiallyPrivateWeightedMeanFactory.adaptive(
        1.2, clients_per_round=10, clipped_count_stddev=1.0)
    self.assertEqual(factory.count_noise_multiplier, 2.0)
    self.assertAlmostEqual(factory.value_noise_multiplier,
                           (1.2 ** -2 - 2.0 ** -2) ** -0.5, places=12)
    # The default σ_c: TFF's 0.05·n, raised to z.
    self.assertEqual(tff_robust.DifferentiallyPrivateWeightedMeanFactory.adaptive(
        0.5, clients_per_round=100).count_noise_multiplier, 10.0)
    self.assertEqual(tff_robust.DifferentiallyPrivateWeightedMeanFactory.adaptive(
        1.5, clients_per_round=10).count_noise_multiplier, 3.0)
    self.assertEqual(tff_robust.DifferentiallyPrivateWeightedMeanFactory.adaptive(
        0.0, clients_per_round=10).value_noise_multiplier, 0.0)

  @parameterized.named_parameters(
      ('count_too_noiseless', dict(noise_multiplier=1.0, clipped_count_stddev=0.5),
       ValueError, 'clipped_count_stddev'),
      ('zero_clients', dict(clients_per_round=0), ValueError, 'clients_per_round'),
      ('quantile_above_one', dict(target_quantile=1.5), ValueError, 'target_quantile'),
      ('zero_rate', dict(learning_rate=0.0), ValueError, 'learning_rate'),
      ('zero_initial_clip', dict(initial_clip=0.0), ValueError, 'initial_clip'),
      ('string_noise', dict(noise_multiplier='1'), TypeError, 'noise_multiplier'),
      ('negative_bound', dict(weight_bound=-1.0), ValueError, 'weight_bound'),
  )
  def test_bad_adaptive_argument_is_named(self, change, error, name):
    kwargs = dict(noise_multiplier=1.0, clients_per_round=10)
    kwargs.update(change)
    with self.assertRaisesRegex(error, name):
      tff_robust.DifferentiallyPrivateWeightedMeanFactory.adaptive(**kwargs)



def secure_record_dp_mean(noise_multiplier=0.0, clip=10.0):
  return tff_robust.DifferentiallyPrivateWeightedMeanFactory(
      noise_multiplier, clip,
      record_aggregation_factory=tff.aggregators.SecureSumFactory(1.0, -1.0))


class SecureRecordSumTest(aggregator_cases.SecureSumContextMixin,
                          parameterized.TestCase):
  """Secure aggregation of the DP mean's records (TFF's distributed DP is refused)."""

  def test_secure_record_sum_matches_the_plain_one(self):
    # A record's coordinates are in [-1, 1]: SecureSumFactory(1.0, -1.0) clips
    # nothing and only quantises.
    rng = np.random.default_rng(6)
    values = _values(rng, 6, scale=2.0)
    weights = [np.float32(1)] * 6

    def run(inner):
      process = tff_robust.GeometricMedianFactory(inner_mean_factory=inner).create(
          VALUE_TYPE, WEIGHT_TYPE)
      return process.next(process.initialize(), values, weights).result

    plain = run(tff_robust.DifferentiallyPrivateWeightedMeanFactory(0.0, 10.0))
    secure = run(secure_record_dp_mean())
    for name in plain:
      np.testing.assert_allclose(secure[name], plain[name], atol=1e-4)

  def test_model_sized_values_leave_only_through_secure_sums(self):
    process = tff_robust.GeometricMedianFactory(
        inner_mean_factory=secure_record_dp_mean(0.5, 1.0)).create(VALUE_TYPE,
                                                                   WEIGHT_TYPE)
    model_sized = [(uri, member)
                   for uri, member in client_to_server_intrinsics(process.next)
                   if not only_scalars(member)]
    self.assertNotEmpty(model_sized)
    for uri, member in model_sized:
      self.assertIn(uri, SECURE_SUMS, f'{uri} moves {member} to the server')

  @parameterized.named_parameters(
      ('fixed', lambda ddp: tff_robust.DifferentiallyPrivateWeightedMeanFactory(
          1.0, 1.0, record_aggregation_factory=ddp)),
      ('adaptive', lambda ddp: tff_robust.DifferentiallyPrivateWeightedMeanFactory.
       adaptive(1.0, 10, record_aggregation_factory=ddp)),
  )
  def test_distributed_dp_sum_is_refused_with_why_and_what_to_use(self, build):
    ddp = distributed_dp.DistributedDpSumFactory(
        noise_multiplier=1.0, expected_clients_per_round=10, bits=20, l2_clip=1.5)
    with self.assertRaisesRegex(ValueError, 'DistributedDpSumFactory') as raised:
      build(ddp)
    for part in ('DecodeError', 'UnsupportedDpEvent',
                 'record_aggregation_factory=tff.aggregators.SecureSumFactory(1.0, '
                 '-1.0)'):
      self.assertIn(part, str(raised.exception))

  def test_ddp_secure_aggregator_as_the_inner_mean_is_refused(self):
    # TFF's distributed-DP mean is unweighted (and divides by a count).
    with self.assertRaises(TypeError):
      tff_robust.GeometricMedianFactory(
          inner_mean_factory=tff.learning.ddp_secure_aggregator(0.5, 10))


# The DP configurations of the iterative aggregates. Each: the factory built around a
# DP inner mean, the value type, the inner mean's value types (whose records make the
# noised sum) and how many times each side channel crosses per round ('dp_sum': the
# noised sums, one per inner-mean call).
DP_NOISE_MULTIPLIER = 0.5


def dp_inner():
  return tff_robust.DifferentiallyPrivateWeightedMeanFactory(
      noise_multiplier=DP_NOISE_MULTIPLIER, clip=1.0)


def dp_adaptive_inner():
  return tff_robust.DifferentiallyPrivateWeightedMeanFactory.adaptive(
      noise_multiplier=DP_NOISE_MULTIPLIER, clients_per_round=10)


FLOAT64_VALUE_TYPE = tff.types.to_type(collections.OrderedDict(
    kernel=tff.TensorType(np.float64, [4, 3]), bias=tff.TensorType(np.float64, [3])))
_PAIR_TYPE = tff.types.to_type(collections.OrderedDict(value=VALUE_TYPE,
                                                       square=VALUE_TYPE))
# The default GM (trimmed start, R = 3, relative ν, both reports).
_GM_CHANNELS = dict(dp_sum=3, first_beta_sum=2, max_weight=3, weight_sum=1,
                    distance_sum=1, radius_histogram=2, nu_histogram=1,
                    beta_sum_and_objective=1, objective=1)
DP_CONFIGURATIONS = (
    ('gm', lambda: tff_robust.GeometricMedianFactory(inner_mean_factory=dp_inner()),
     VALUE_TYPE, [VALUE_TYPE], _GM_CHANNELS),
    ('gm_float64', lambda: tff_robust.GeometricMedianFactory(
        inner_mean_factory=dp_inner()),
     FLOAT64_VALUE_TYPE, [FLOAT64_VALUE_TYPE], _GM_CHANNELS),
    ('gm_without_reports', lambda: tff_robust.GeometricMedianFactory(
        inner_mean_factory=dp_inner(), report_max_effective_weight=False,
        report_objective=False),
     VALUE_TYPE, [VALUE_TYPE],
     dict(dp_sum=3, weight_sum=1, distance_sum=1, radius_histogram=2, nu_histogram=1,
          beta_sum_and_objective=1)),
    # The fewest: an absolute ν, the mean start, no early stop, no reports.
    ('gm_fewest_side_channels', lambda: tff_robust.GeometricMedianFactory(
        inner_mean_factory=dp_inner(), nu=1e-6, tolerance=0, initial_point='mean',
        report_max_effective_weight=False, report_objective=False),
     VALUE_TYPE, [VALUE_TYPE], dict(dp_sum=3, weight_sum=1, beta_sum_and_objective=2)),
    ('one_step_gm', lambda: tff_robust.one_step_geometric_median_factory(
        inner_mean_factory=dp_inner()),
     VALUE_TYPE, [VALUE_TYPE],
     dict(dp_sum=1, nu_histogram=1, first_beta_sum=1, max_weight=1, objective=1)),
    ('gamma_mean', lambda: tff_robust.GammaMeanFactory(inner_mean_factory=dp_inner()),
     VALUE_TYPE, [VALUE_TYPE], dict(dp_sum=4, gamma_start_sums=1,
                                    gamma_iteration_sums=3)),
    ('gamma_mean_diagonal_from_gm', lambda: tff_robust.GammaMeanFactory(
        covariance='diagonal', initial_point='geometric_median',
        inner_mean_factory=dp_inner()),
     VALUE_TYPE, [VALUE_TYPE, _PAIR_TYPE],
     dict(_GM_CHANNELS, dp_sum=6, gamma_start_sums=1, gamma_iteration_sums=3)),
    # The adaptive clip: one more noised sum a call, its count (a float32 scalar).
    ('gm_adaptive_clip', lambda: tff_robust.GeometricMedianFactory(
        inner_mean_factory=dp_adaptive_inner()),
     VALUE_TYPE, [VALUE_TYPE], dict(_GM_CHANNELS, dp_clip_count=3)),
    ('one_step_gm_adaptive_clip', lambda: tff_robust.one_step_geometric_median_factory(
        inner_mean_factory=dp_adaptive_inner()),
     VALUE_TYPE, [VALUE_TYPE],
     dict(dp_sum=1, dp_clip_count=1, nu_histogram=1, first_beta_sum=1, max_weight=1,
          objective=1)),
    # The configuration docs/aggregators.md recommends under DP, reports off: the
    # ν histogram and the filter's count are all it sends un-noised.
    ('recommended_one_step_gm', lambda: tff_robust.NonfiniteFilteringFactory(
        tff_robust.one_step_geometric_median_factory(
            relative_nu=1.0, inner_mean_factory=dp_adaptive_inner(),
            report_max_effective_weight=False, report_objective=False)),
     VALUE_TYPE, [VALUE_TYPE],
     dict(dp_sum=1, dp_clip_count=1, nu_histogram=1, num_nonfinite=1)),
    ('filtered_capped_gm', lambda: tff_robust.NonfiniteFilteringFactory(
        weight_cap.WeightCappingFactory(tff_robust.GeometricMedianFactory(
            inner_mean_factory=dp_inner()))),
     VALUE_TYPE, [VALUE_TYPE],
     dict(_GM_CHANNELS, num_nonfinite=1, weight_cap_histogram=1, num_capped=1)),
)
_CHANNELS = {channel.name: channel for channel in privacy.SIDE_CHANNELS}


def unnoised_aggregations(process, inner_value_types):
  """(number of noised DP sums, Counter of (uri, member) of every other CLIENTS →
  SERVER aggregation of `process.next`). A noised sum is a `federated_sum` of the DP
  mean's records (`DifferentiallyPrivateWeightedMeanFactory.record_type`)."""
  records = [privacy.DifferentiallyPrivateWeightedMeanFactory.record_type(t)
             for t in inner_value_types]
  noised, others = 0, collections.Counter()
  for uri, member in client_to_server_intrinsics(process.next):
    if uri == 'federated_sum' and any(str(member) == str(r) for r in records):
      noised += 1
    else:
      others[(uri, str(member))] += 1
  return noised, others


def declared_keys():
  """(uri, member) → the side channels that such an aggregation may be."""
  keys = collections.defaultdict(list)
  for channel in privacy.SIDE_CHANNELS:
    for member in channel.members:
      keys[(channel.intrinsic, str(member))].append(channel.name)
  return keys


def expected_aggregations(channels, observed):
  """The Counter of (uri, member) that the channel counts `channels` make, each
  channel at its member of this model's float width (the one observed)."""
  expected = collections.Counter()
  for name, count in channels.items():
    if name == 'dp_sum':
      continue
    if name == 'dp_clip_count':
      # The adaptive clip's noised count of clients below the clip, one a call
      # (tensorflow-privacy's QuantileEstimatorQuery: records ±1/2, Gaussian noise,
      # accounted in the call's DP event).
      expected[('federated_sum', str(tff.TensorType(np.float32)))] += count
      continue
    channel = _CHANNELS[name]
    members = [str(m) for m in channel.members]
    member = next((m for m in members if (channel.intrinsic, m) in observed), members[0])
    expected[(channel.intrinsic, member)] += count
  return expected


class DifferentiallyPrivateSideChannelTest(parameterized.TestCase):
  """In a DP configuration every client statistic that reaches the server is the DP
  mean's noised sum or a declared side channel, as many times as declared: a new
  un-noised sum (or one more of a declared kind) fails here."""

  @parameterized.named_parameters(*DP_CONFIGURATIONS)
  def test_only_the_noised_sum_and_declared_side_channels_reach_the_server(
      self, build, value_type, inner_value_types, channels):
    process = build().create(value_type, WEIGHT_TYPE)
    noised, others = unnoised_aggregations(process, inner_value_types)
    declared = declared_keys()
    undeclared = sorted(key for key in others if key not in declared)
    self.assertEmpty(undeclared, 'un-noised client-to-server aggregations that are '
                     'not in tff_robust.aggregators.privacy.SIDE_CHANNELS (declare '
                     'them there and in docs/aggregators.md, with their sensitivity)')
    self.assertEqual(noised, channels['dp_sum'])
    expected = expected_aggregations(channels, others)
    self.assertEqual(dict(others), dict(expected), 'un-noised aggregations per round, '
                     'by (intrinsic, member): observed != declared for this '
                     'configuration')

  @parameterized.named_parameters(*DP_CONFIGURATIONS)
  def test_the_accountant_composes_one_gaussian_per_noised_sum(
      self, build, value_type, inner_value_types, channels):
    del value_type, inner_value_types
    # The accountant's count of Gaussian mechanisms a round (`round_event_of`) is the
    # number of noised sums in the compiled computation (the test above).
    z = accounting.effective_noise_multiplier(accounting.round_event_of(build()))
    self.assertAlmostEqual(z, DP_NOISE_MULTIPLIER / np.sqrt(channels['dp_sum']),
                           places=12)

  @parameterized.named_parameters(
      ('plain_inner_mean', lambda: tff_robust.GeometricMedianFactory()),
      # GMA's sign votes are model-sized un-noised sums beside the DP mean.
      ('gma_sign_sums', lambda: tff_robust.GradientMaskedAveragingFactory(
          inner_mean_factory=dp_inner())),
  )
  def test_the_walk_fails_on_an_unnoised_model_sized_sum(self, build):
    process = build().create(VALUE_TYPE, WEIGHT_TYPE)
    _, others = unnoised_aggregations(process, [VALUE_TYPE])
    self.assertNotEmpty([key for key in others if key not in declared_keys()])

  def test_every_side_channel_is_in_the_docs(self):
    docs = (pathlib.Path(__file__).resolve().parents[3] / 'docs' /
            'aggregators.md').read_text(encoding='utf-8')
    missing = [c.name for c in privacy.SIDE_CHANNELS if f'`{c.name}`' not in docs]
    self.assertEmpty(missing)

  def test_every_side_channel_is_sent_by_a_configuration(self):
    # No stale entry: each declared channel is seen in some configuration above.
    used = {name for *_, channels in DP_CONFIGURATIONS for name in channels}
    self.assertEqual(sorted(set(_CHANNELS) - used), [])

  def test_the_adaptive_clip_adds_one_noised_count_a_call(self):
    # Without the walk's count of float32 sums: the adaptive configuration sends
    # exactly one more per inner-mean call than the fixed one.
    def float32_sums(inner):
      process = tff_robust.GeometricMedianFactory(inner_mean_factory=inner).create(
          VALUE_TYPE, WEIGHT_TYPE)
      _, others = unnoised_aggregations(process, [VALUE_TYPE])
      return others[('federated_sum', str(tff.TensorType(np.float32)))]

    self.assertEqual(float32_sums(dp_adaptive_inner()) - float32_sums(dp_inner()), 3)


def _gaussian_fixed():
  return tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      noise_multiplier=0.5, clients_per_round=10, clip=1.0)


COUNT_NORMALISING_MEANS = (
    ('gaussian_fixed', lambda: tff.aggregators.MeanFactory(
        value_sum_factory=_gaussian_fixed()), 'NormalizedQuery'),
    ('gaussian_adaptive', lambda: tff.aggregators.MeanFactory(
        value_sum_factory=tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(
            noise_multiplier=0.5, clients_per_round=10)), 'NormalizedQuery'),
    ('as_weight_sum', lambda: tff.aggregators.MeanFactory(
        weight_sum_factory=_gaussian_fixed()), 'NormalizedQuery'),
    ('no_privacy_average', lambda: tff.aggregators.MeanFactory(
        value_sum_factory=tff.aggregators.DifferentiallyPrivateFactory(
            tfp.NoPrivacyAverageQuery())), 'NoPrivacyAverageQuery'),
    ('unweighted_mean', lambda: tff.aggregators.MeanFactory(
        value_sum_factory=tff.aggregators.UnweightedMeanFactory()),
     'UnweightedMeanFactory'),
    # Found inside another factory too.
    ('inside_clipping', lambda: tff.aggregators.clipping_factory(
        1.0, tff.aggregators.MeanFactory(value_sum_factory=_gaussian_fixed())),
     'NormalizedQuery'),
)
OUTER_FACTORIES = (
    ('gm', lambda inner: tff_robust.GeometricMedianFactory(inner_mean_factory=inner)),
    ('gamma_mean', lambda inner: tff_robust.GammaMeanFactory(inner_mean_factory=inner)),
    ('centered_clipping', lambda inner: tff_robust.SecureCenteredClippingFactory(
        inner_mean_factory=inner)),
    ('gma', lambda inner: tff_robust.GradientMaskedAveragingFactory(
        inner_mean_factory=inner)),
)


class CountNormalisingInnerMeanTest(parameterized.TestCase):
  """An inner "mean" around TFF's DP factories divided Σ β_i x_i by a fixed count
  as well as by Σ β_i: accepted, it returned a 1/n-th of the geometric median."""

  @parameterized.product(inner=COUNT_NORMALISING_MEANS, outer=OUTER_FACTORIES)
  def test_is_refused_with_the_fix(self, inner, outer):
    _, build_inner, part = inner
    _, build_outer = outer
    with self.assertRaisesRegex(TypeError, part) as raised:
      build_outer(build_inner())
    self.assertIn('divides its sum by a count', str(raised.exception))
    self.assertIn('tff_robust.DifferentiallyPrivateWeightedMeanFactory('
                  'noise_multiplier, clip)', str(raised.exception))

  @parameterized.named_parameters(
      ('dp_weighted_mean', dp_inner),
      ('secure_mean', secure_mean),
      ('default', lambda: None),
      # A DP *sum* as MeanFactory's value sum is a mean (its weight sum un-noised).
      ('dp_sum_in_mean_factory', lambda: tff.aggregators.MeanFactory(
          value_sum_factory=tff.aggregators.DifferentiallyPrivateFactory(
              tfp.GaussianSumQuery(l2_norm_clip=1.0, stddev=0.5)))),
      ('float64_mean', iterative_mean.Float64MeanFactory),
  )
  def test_a_sum_based_mean_is_accepted(self, build_inner):
    self.assertEmpty(iterative_mean.count_normalising_parts(build_inner()))
    for _, build_outer in OUTER_FACTORIES:
      build_outer(build_inner())


if __name__ == '__main__':
  tf.test.main()
