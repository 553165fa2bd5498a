"""Secure-aggregation compatibility and differential privacy of the iterative aggregates.

The compiled-computation check walks the `next` computation's building blocks and lists
every intrinsic that moves data from CLIENTS to SERVER: a secure-compatible aggregator
may only use sums there (and, for the one measurement that needs it, the maximum of a
scalar client weight), never an intrinsic that hands a client's value to the server.
"""

import collections

from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.compiler import building_blocks
from tensorflow_federated.python.core.impl.compiler import tree_analysis

from baselines import coordinatewise
from tests.helpers import aggregator_cases
import tff_robust
from tff_robust.aggregators import robust_scale
from tff_robust.aggregators import weight_cap

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
    _PROCESSES[key] = build(inner, report).create(VALUE_TYPE, WEIGHT_TYPE)
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
        noise_multiplier=0.0, clip=1e6))
    for name in exact:
      np.testing.assert_allclose(private[name], exact[name], rtol=1e-5, atol=1e-6)

  def test_noise_spread_matches_configured_scale(self):
    # All clients at 0 with ν = 1: every β_i = 1, records (0, 1) are never clipped,
    # and the result is the noise on the numerator divided by the noisy Σβ = m + n.
    num_clients, noise_multiplier, clip = 20, 0.5, 1.0
    factory = tff_robust.GeometricMedianFactory(
        num_communication_passes=2, nu=1.0,
        inner_mean_factory=tff_robust.DifferentiallyPrivateWeightedMeanFactory(
            noise_multiplier=noise_multiplier, clip=clip))
    process = factory.create(VALUE_TYPE, WEIGHT_TYPE)
    zeros = collections.OrderedDict(
        kernel=np.zeros((4, 3), np.float32), bias=np.zeros(3, np.float32))
    state, draws = process.initialize(), []
    for _ in range(40):
      output = process.next(state, [zeros] * num_clients, [np.float32(1)] * num_clients)
      state = output.state
      draws.append(np.concatenate([np.ravel(output.result[k]) for k in zeros]))
    observed = np.std(np.stack(draws))
    expected = noise_multiplier * clip / num_clients
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
        noise_multiplier=0.0, clip=1e6).create(value_type, WEIGHT_TYPE)
    result = process.next(process.initialize(), values, list(weights)).result
    for name, dtype in (('kernel', kernel_dtype), ('bias', bias_dtype)):
      expected = np.average([v[name].astype(np.float64) for v in values], axis=0,
                            weights=weights.astype(np.float64))
      self.assertEqual(np.asarray(result[name]).dtype, dtype)
      np.testing.assert_allclose(result[name], expected, rtol=1e-5, atol=1e-6)

  @parameterized.named_parameters(
      ('negative_noise', dict(noise_multiplier=-1.0, clip=1.0), 'noise_multiplier'),
      ('zero_clip', dict(noise_multiplier=1.0, clip=0.0), 'clip'),
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


if __name__ == '__main__':
  tf.test.main()
