"""γ-mean (Entropy 2022, Algorithms 1 and 2) against the float64 log-domain numpy
γ-mean of `tasks.references`, at the default spread-scaled γ and at the paper's
absolute one."""

import collections
import itertools

from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import references
from tests.helpers import aggregator_cases as cases
from tff_robust.aggregators.gamma_mean import GammaMeanFactory
from tff_robust.aggregators.geometric_median import GeometricMedianFactory
from tff_robust.aggregators.nonfinite import NonfiniteFilteringFactory

TOLERANCE = 1e-5
FLOAT64_TOLERANCE = 1e-12
ITERATIONS = 3
COVARIANCES = ('identity', 'diagonal')
# The far clients: one client times 1e4, or at a value in every coordinate.
FAR_CLIENTS = collections.OrderedDict(
    times_1e4=None, at_1e10=1e10, at_1e20=1e20, at_3e38=3e38)
SIGMAS = collections.OrderedDict(sigma_1e_3=1e-3, sigma_1=1.0, sigma_1e3=1e3)
DIMENSIONS = (10, 1000, 100000)
NUM_HONEST = 19
_VECTOR_PROCESSES = {}


def gamma_process(covariance, start='mean', **kwargs):
  return cases.process(
      ('gamma', covariance, start, tuple(sorted(kwargs.items()))),
      lambda: GammaMeanFactory(covariance=covariance, initial_point=start, **kwargs))


def vector_process(dimension, dtype=np.float32, **kwargs):
  """The process of `GammaMeanFactory(**kwargs)` for a flat [dimension] vector."""
  key = (dimension, np.dtype(dtype).name, tuple(sorted(kwargs.items())))
  if key not in _VECTOR_PROCESSES:
    _VECTOR_PROCESSES[key] = GammaMeanFactory(**kwargs).create(
        tff.TensorType(dtype, [dimension]), tff.TensorType(np.float32))
  return _VECTOR_PROCESSES[key]


def run_vectors(proc, x, dtype=np.float32, weights=None):
  weights = np.ones(len(x)) if weights is None else weights
  output = proc.next(proc.initialize(), [row.astype(dtype) for row in x],
                     [np.float32(w) for w in weights])
  return np.asarray(output.result), output


def honest_clients(sigma, dimension, seed=0):
  """19 clients from N(μ, σ²I), μ itself drawn from N(0, I) (so that at σ = 1e-3 the
  common part dwarfs the spread), as float32-exact float64."""
  rng = np.random.default_rng(seed)
  mu = rng.normal(size=dimension)
  honest = mu + sigma * rng.normal(size=(NUM_HONEST, dimension))
  return honest.astype(np.float32).astype(np.float64)


def with_far_client(honest, far):
  far_client = 1e4 * honest[0] if far is None else np.full(honest.shape[1], far)
  x = np.vstack([far_client[None], honest])
  return x.astype(np.float32).astype(np.float64)


def honest_mean_and_spread(honest):
  """m, the honest clients' mean, and s, their root-mean-square distance to it."""
  m = honest.mean(axis=0)
  return m, np.sqrt(np.mean(np.sum((honest - m) ** 2, axis=1)))


def far_client_cases():
  return [dict(testcase_name=f'{cov}_{far}_{sigma}_d{d}', covariance=cov,
               far=FAR_CLIENTS[far], sigma=SIGMAS[sigma], dimension=d)
          for cov, far, sigma, d in itertools.product(
              COVARIANCES, FAR_CLIENTS, SIGMAS, DIMENSIONS)]


class FarClientTest(parameterized.TestCase):
  """The issue's cases: one far client never moves the default γ-mean off the honest
  clients, at any scale, in any dimension, and the iterations are the reference's."""

  @parameterized.named_parameters(*far_client_cases())
  def test_ends_within_a_tenth_of_the_spread(self, covariance, far, sigma, dimension):
    honest = honest_clients(sigma, dimension)
    x = with_far_client(honest, far)
    result, output = run_vectors(vector_process(dimension, covariance=covariance), x)
    m, s = honest_mean_and_spread(honest)
    self.assertLessEqual(np.linalg.norm(result - m), 0.1 * s)
    expected = references.gamma_mean(x, np.ones(len(x)), covariance=covariance)
    self.assertLessEqual(cases.relative_error(result, expected), TOLERANCE)
    self.assertEqual(output.measurements['num_underflow_passes'], 0)


class TinySpreadTest(parameterized.TestCase):
  """Updates late in training can spread by 1e-8 a coordinate: the weights must still
  tell a client 10 spreads away from the others (an absolute σ² floor did not)."""

  @parameterized.product(covariance=COVARIANCES, dimension=(10, 1000))
  def test_one_client_ten_spreads_away_is_down_weighted(self, covariance, dimension):
    rng = np.random.default_rng(3)
    honest = (1e-8 * rng.normal(size=(NUM_HONEST, dimension))).astype(np.float32)
    honest = honest.astype(np.float64)
    m, s = honest_mean_and_spread(honest)
    direction = rng.normal(size=dimension)
    x = np.vstack([m + 10 * s * direction / np.linalg.norm(direction), honest])
    x = x.astype(np.float32).astype(np.float64)
    result, _ = run_vectors(vector_process(dimension, covariance=covariance), x)
    self.assertLessEqual(np.linalg.norm(result - m), 0.1 * s)
    expected = references.gamma_mean(x, np.ones(len(x)), covariance=covariance)
    self.assertLessEqual(cases.relative_error(result, expected), TOLERANCE)


class OrdinaryInputsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      (f'{cov}_d{d}', cov, d) for cov, d in itertools.product(COVARIANCES, DIMENSIONS))
  def test_equals_the_log_domain_reference(self, covariance, dimension):
    # d = 1000 and 100000: exp(−‖x − μ‖²/4) underflows even float64 here.
    x = honest_clients(1.0, dimension, seed=1)
    weights = np.random.default_rng(2).uniform(0.5, 3.0, size=len(x))
    result, output = run_vectors(vector_process(dimension, covariance=covariance), x,
                                 weights=weights)
    expected = references.gamma_mean(x, weights, covariance=covariance)
    self.assertLessEqual(cases.relative_error(result, expected), TOLERANCE)
    self.assertEqual(output.measurements['num_underflow_passes'], 0)
    self.assertEqual(result.dtype, np.float32)

  @parameterized.named_parameters(*[(cov, cov) for cov in COVARIANCES])
  def test_float64_values_are_aggregated_in_float64(self, covariance):
    # Not float32-exact values: float32 anywhere inside would show.
    honest = honest_clients(1.0, 1000, seed=3)
    honest += 1e-9 * np.random.default_rng(4).normal(size=honest.shape)
    x = np.vstack([1e4 * honest[:1], honest])
    result, _ = run_vectors(vector_process(1000, np.float64, covariance=covariance), x,
                            dtype=np.float64)
    self.assertEqual(result.dtype, np.float64)
    expected = references.gamma_mean(x, np.ones(len(x)), covariance=covariance)
    self.assertLessEqual(cases.relative_error(result, expected), FLOAT64_TOLERANCE)

  def test_a_mixed_structure_with_an_agreed_coordinate_stays_finite(self):
    # The floor of a structure holding float64 is float64's; its root is 0 in a
    # float32 leaf, where a coordinate every client agrees on would give 0/0.
    value_type = tff.types.to_type(collections.OrderedDict(
        a=tff.TensorType(np.float32, [3]), b=tff.TensorType(np.float64, [2])))
    proc = GammaMeanFactory(covariance='diagonal').create(
        value_type, tff.TensorType(np.float32))
    x = honest_clients(1.0, 5, seed=7)
    x[:, 0] = 0.5  # Every client agrees on a[0].
    values = [collections.OrderedDict(a=row[:3].astype(np.float32), b=row[3:])
              for row in x]
    result = proc.next(proc.initialize(), values, [np.float32(1)] * len(x)).result
    result = np.concatenate([result['a'], result['b']]).astype(np.float64)
    self.assertTrue(np.all(np.isfinite(result)), result)
    expected = references.gamma_mean(x, np.ones(len(x)), covariance='diagonal')
    self.assertLessEqual(cases.relative_error(result, expected), TOLERANCE)


def _start_cases():
  return [dict(c, covariance=cov, start=start,
               testcase_name=f'{cov}_{start}_{c["testcase_name"]}')
          for cov in COVARIANCES for start in ('mean', 'geometric_median')
          for c in cases.input_cases()]


def geometric_median_start(x, w):
  """The default GeometricMedianFactory's own result: the γ-mean's start, whatever
  that factory computes."""
  proc = cases.process('gamma_start_gm', GeometricMedianFactory)
  return cases.run(proc, x, w)[0]


class MatchesNumpyReferenceTest(parameterized.TestCase):

  @parameterized.named_parameters(*_start_cases())
  def test_matches_reference(self, covariance, start, inputs, weights):
    x, w = cases.INPUTS[inputs](), cases.WEIGHTS[weights]()
    x = x.astype(np.float32).astype(np.float64)
    result, output = cases.run(gamma_process(covariance, start), x, w)
    origin = None if start == 'mean' else geometric_median_start(x, w)
    expected = references.gamma_mean(x, w, covariance=covariance, start=origin)
    self.assertLessEqual(cases.relative_error(result, expected), TOLERANCE)
    self.assertEqual(output.measurements['num_underflow_passes'], 0)
    calls = ITERATIONS + (1 if start == 'mean' else 3 + 1)
    self.assertEqual(output.measurements['num_secure_average_calls'], calls)

  @parameterized.named_parameters(*[(cov, cov) for cov in COVARIANCES])
  def test_nonfinite_clients_are_dropped_and_counted(self, covariance):
    x, w = cases.random_inputs(31), cases.random_weights()
    poisoned = x.copy()
    poisoned[1, 1], poisoned[6, 7] = np.nan, np.inf
    result, output = cases.run(cases.process(
        ('filtered_gamma', covariance), lambda: NonfiniteFilteringFactory(
            GammaMeanFactory(covariance=covariance))), poisoned, w)
    keep = np.array([i not in (1, 6) for i in range(cases.NUM_CLIENTS)])
    self.assertEqual(output.measurements['num_nonfinite_clients'], 2)
    expected = references.gamma_mean(x[keep], w[keep], covariance=covariance)
    self.assertLessEqual(cases.relative_error(result, expected), TOLERANCE)

  @parameterized.named_parameters(*[(cov, cov) for cov in COVARIANCES])
  def test_scale_equivariant(self, covariance):
    # The inliers' σ is 0.1: at 1e-12 their σ² (1e-26) is far below any absolute
    # floor of the kind the default once had (1e-12), above float32's smallest normal.
    x, w = cases.clustered_attack_inputs(), cases.random_weights()
    proc = gamma_process(covariance)
    base, _ = cases.run(proc, x, w)
    for scale in (1e-12, 1e-4, 1e6, 1e20):
      scaled, _ = cases.run(proc, scale * x, w)
      self.assertLessEqual(cases.relative_error(scaled, scale * base), TOLERANCE)


class PaperSettingTest(parameterized.TestCase):
  """gamma_scale='absolute': the paper's γ = 0.5 on Σ = I (Algorithm 2) or diag(Σ)."""

  @parameterized.named_parameters(
      ('identity_d10', 'identity', 10, 0.5), ('diagonal_d10', 'diagonal', 10, 0.5),
      # exp(−γ/2·‖x − μ‖²) ≈ e^−240 underflowed float32 for every client, and the
      # factory used to return the plain mean: the log-domain shift keeps them.
      ('identity_d1000_gamma_0.05', 'identity', 1000, 0.05))
  def test_representable_weights_give_the_paper_gamma_mean(self, covariance, dimension,
                                                           gamma):
    x = honest_clients(1.0, dimension, seed=5)
    proc = vector_process(dimension, covariance=covariance, gamma=gamma,
                          gamma_scale='absolute')
    result, output = run_vectors(proc, x)
    expected = references.gamma_mean(x, np.ones(len(x)), gamma=gamma, covariance=covariance,
                              scale='absolute')
    self.assertLessEqual(cases.relative_error(result, expected), TOLERANCE)
    self.assertEqual(output.measurements['num_underflow_passes'], 0)

  @parameterized.named_parameters(*[(cov, cov) for cov in COVARIANCES])
  def test_unrepresentable_weights_are_flagged_and_robust(self, covariance):
    # d = 100000: the clients' γ/2·‖x − μ‖² differ by hundreds of nats, beyond float32.
    honest = honest_clients(1.0, 100000, seed=6)
    x = with_far_client(honest, 1e20)
    proc = vector_process(100000, covariance=covariance, gamma_scale='absolute')
    result, output = run_vectors(proc, x)
    m, s = honest_mean_and_spread(honest)
    self.assertGreater(output.measurements['num_underflow_passes'], 0)
    self.assertGreater(np.sum(output.measurements['capped_clients']), 0)
    self.assertLessEqual(np.linalg.norm(result - m), s)

  def test_one_client_at_1e20_is_down_weighted_by_the_diagonal(self):
    # Was: every σ_j² overflowed to inf, every distance was 0, and the plain mean
    # (‖r‖ = 1.6e20) was returned with num_underflow_passes = 0.
    honest = honest_clients(1.0, 1000, seed=7)
    x = with_far_client(honest, 1e20)
    proc = vector_process(1000, covariance='diagonal', gamma_scale='absolute')
    result, _ = run_vectors(proc, x)
    m, s = honest_mean_and_spread(honest)
    self.assertLessEqual(np.linalg.norm(result - m), 0.1 * s)

  def test_huge_gamma_keeps_the_nearest_clients_and_flags_them(self):
    # γ = 1e4: every exp(−γ/2·D) is 0 in float32; the shift keeps the nearest.
    x, w = cases.random_inputs(32), cases.random_weights()
    proc = gamma_process('identity', gamma=1e4, gamma_scale='absolute')
    result, output = cases.run(proc, x, w)
    self.assertTrue(np.all(np.isfinite(result)))
    self.assertGreater(output.measurements['num_underflow_passes'], 0)
    self.assertGreater(cases.relative_error(result, np.average(x, axis=0, weights=w)),
                       1e-3)  # Not the plain mean.

  def test_gamma_per_dimension_is_absolute_c_over_p(self):
    factory = GammaMeanFactory(gamma_per_dimension=2.0)
    self.assertEqual(factory.gamma_scale, 'absolute')
    self.assertAlmostEqual(factory.gamma_for(cases.VALUE_TYPE), 2.0 / cases.DIMENSION)
    proc = gamma_process('identity', gamma_per_dimension=0.18)
    x, w = cases.random_inputs(33), cases.random_weights()
    result, _ = cases.run(proc, x, w)
    expected = references.gamma_mean(x.astype(np.float32).astype(np.float64), w,
                              gamma=0.18 / cases.DIMENSION, scale='absolute')
    self.assertLessEqual(cases.relative_error(result, expected), TOLERANCE)


class InvalidArgumentsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('gamma_zero', dict(gamma=0.0), 'gamma'),
      ('gamma_negative', dict(gamma=-1.0), 'gamma'),
      ('c_zero', dict(gamma_per_dimension=0.0), 'gamma_per_dimension'),
      ('both', dict(gamma=1.0, gamma_per_dimension=1.0), 'gamma_per_dimension'),
      ('c_with_spread', dict(gamma_per_dimension=1.0, gamma_scale='spread'),
       'gamma_per_dimension'),
      ('scale', dict(gamma_scale='relative'), 'gamma_scale'),
      ('iterations', dict(num_iterations=0), 'num_iterations'),
      ('covariance', dict(covariance='full'), 'covariance'),
      ('initial_point', dict(initial_point='zero'), 'initial_point'),
      ('variance_floor', dict(variance_floor=0.0), 'variance_floor'),
  )
  def test_bad_argument_is_named(self, kwargs, name):
    with self.assertRaisesRegex(ValueError, name):
      GammaMeanFactory(**kwargs)

  @parameterized.named_parameters(
      ('float_iterations', dict(num_iterations=2.0), 'num_iterations'),
      ('string_gamma', dict(gamma='0.1'), 'gamma'),
  )
  def test_argument_of_the_wrong_type_is_named(self, kwargs, name):
    with self.assertRaisesRegex(TypeError, name):
      GammaMeanFactory(**kwargs)


class SecureSumCompositionTest(cases.SecureSumContextMixin, parameterized.TestCase):

  @parameterized.named_parameters(*[(cov, cov) for cov in COVARIANCES])
  def test_secure_inner_mean_matches_reference_up_to_quantisation(self, covariance):
    # The bound applies to weight × value (and × squared standardised deviation for
    # 'diagonal', which is below p·(1+γ') ≈ 11 for every client of weight > e^−11).
    secure_mean = tff.aggregators.MeanFactory(
        value_sum_factory=tff.aggregators.SecureSumFactory(200.0), no_nan_division=True)
    proc = cases.process(('gamma_secure', covariance), lambda: GammaMeanFactory(
        covariance=covariance, inner_mean_factory=secure_mean))
    x, w = cases.random_inputs(34), cases.random_weights()
    result, _ = cases.run(proc, x, w)
    expected = references.gamma_mean(x, w, covariance=covariance)
    np.testing.assert_allclose(result, expected, atol=1e-3)


if __name__ == '__main__':
  tf.test.main()
