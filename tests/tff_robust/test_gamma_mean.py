"""γ-mean (Entropy 2022, Algorithms 1 and 2) against numpy implementations of the
paper's fixed-point iterations."""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests.helpers import aggregator_cases as cases
from tff_robust.gamma_mean import GammaMeanFactory
from tff_robust.nonfinite import NonfiniteFilteringFactory

TOLERANCE = 1e-5
ITERATIONS = 3
VARIANCE_FLOOR = 1e-12
# γ·D/2 must stay below ~87 for the inliers (float32 weights, see the factory's
# docstring): with 20% attackers 100 away per coordinate, an α-weighted initial mean
# can sit ~100 from the inliers in norm.
GAMMA = dict(identity=0.005, diagonal=0.5)


def np_simple_gamma_mean(x, alpha, gamma, iterations, mu):
  """Algorithm 2: d_i = exp(−γ/2 ‖x_i − μ‖²), μ ← Σ w_i x_i (weights × α_i)."""
  for _ in range(iterations):
    d = alpha * np.exp(-gamma / 2 * np.sum((x - mu) ** 2, axis=1))
    mu = (d / d.sum()) @ x
  return mu


def np_diagonal_gamma_mean(x, alpha, gamma, iterations, mu):
  """Algorithm 1 with diag(Σ): Σ̂ ← (1+γ) Σ w_i (x_i − μ̂)(x_i − μ̂)ᵀ, diagonal kept;
  σ₀² the α-weighted second moment about μ₀."""
  var = np.maximum(np.average((x - mu) ** 2, axis=0, weights=alpha), VARIANCE_FLOOR)
  for _ in range(iterations):
    d = alpha * np.exp(-gamma / 2 * np.sum((x - mu) ** 2 / var, axis=1))
    w = d / d.sum()
    mu = w @ x
    var = np.maximum((1 + gamma) * (w @ (x - mu) ** 2), VARIANCE_FLOOR)
  return mu


def np_weiszfeld(x, alpha, passes=3, nu=1e-6):
  """RFA Algorithm 2 from zero (GeometricMedianFactory's default start):
  β_i = α_i / max(ν, ‖v − x_i‖)."""
  v = np.zeros(x.shape[1])
  for _ in range(passes):
    beta = alpha / np.maximum(nu, np.linalg.norm(x - v, axis=1))
    v = beta @ x / beta.sum()
  return v


def reference(covariance, start, x, w):
  mu = np.average(x, axis=0, weights=w) if start == 'mean' else np_weiszfeld(x, w)
  fn = np_simple_gamma_mean if covariance == 'identity' else np_diagonal_gamma_mean
  return fn(x, w, GAMMA[covariance], ITERATIONS, mu)


def gamma_process(covariance, start='mean'):
  return cases.process(('gamma', covariance, start), lambda: GammaMeanFactory(
      gamma=GAMMA[covariance], num_iterations=ITERATIONS, covariance=covariance,
      initial_point=start))


def moderate_outlier_inputs():
  # Huge next to the N(0, 1) clients, yet no γ-weight underflows in float32 (the
  # all-underflow case, magnitude 1e6, has its own test).
  return cases.huge_outlier_inputs(magnitude=50.0)


INPUTS = dict(cases.INPUTS, huge_outlier=moderate_outlier_inputs)


def _cases():
  return [dict(c, covariance=cov, start=start,
               testcase_name=f'{cov}_{start}_{c["testcase_name"]}')
          for cov in ('identity', 'diagonal')
          for start in ('mean', 'geometric_median')
          for c in cases.input_cases()]


class MatchesNumpyReferenceTest(parameterized.TestCase):

  @parameterized.named_parameters(*_cases())
  def test_matches_reference(self, covariance, start, inputs, weights):
    x, w = INPUTS[inputs](), cases.WEIGHTS[weights]()
    result, output = cases.run(gamma_process(covariance, start), x, w)
    expected = reference(covariance, start, x, w)
    self.assertLessEqual(cases.relative_error(result, expected), TOLERANCE)
    self.assertEqual(output.measurements['num_underflow_passes'], 0)
    calls = ITERATIONS + (1 if start == 'mean' else 3 + (covariance == 'diagonal'))
    self.assertEqual(output.measurements['num_secure_average_calls'], calls)

  @parameterized.named_parameters(('identity', 'identity'), ('diagonal', 'diagonal'))
  def test_nonfinite_clients_are_dropped_and_counted(self, covariance):
    x, w = cases.random_inputs(31), cases.random_weights()
    poisoned = x.copy()
    poisoned[1, 1], poisoned[6, 7] = np.nan, np.inf
    result, output = cases.run(cases.process(
        ('filtered_gamma', covariance), lambda: NonfiniteFilteringFactory(GammaMeanFactory(
            gamma=GAMMA[covariance], num_iterations=ITERATIONS,
            covariance=covariance))), poisoned, w)
    keep = np.array([i not in (1, 6) for i in range(cases.NUM_CLIENTS)])
    self.assertEqual(output.measurements['num_nonfinite_clients'], 2)
    self.assertLessEqual(
        cases.relative_error(result, reference(covariance, 'mean', x[keep], w[keep])),
        TOLERANCE)


class UnderflowTest(parameterized.TestCase):

  @parameterized.named_parameters(('identity', 'identity'), ('diagonal', 'diagonal'))
  def test_all_weights_underflow_keeps_the_initial_point(self, covariance):
    # γ = 1e4: exp(−γ/2·D) is 0 in float32 for every client, from the first iteration.
    proc = cases.process(('gamma_huge', covariance), lambda: GammaMeanFactory(
        gamma=1e4, num_iterations=ITERATIONS, covariance=covariance))
    x, w = cases.random_inputs(32), cases.random_weights()
    result, output = cases.run(proc, x, w)
    self.assertTrue(np.all(np.isfinite(result)))
    self.assertLessEqual(
        cases.relative_error(result, np.average(x, axis=0, weights=w)), TOLERANCE)
    self.assertEqual(output.measurements['num_underflow_passes'], ITERATIONS)
    np.testing.assert_array_equal(output.measurements['underflow'], [1.0] * ITERATIONS)

  def test_huge_outlier_from_the_mean_underflows_but_stays_defined(self):
    x, w = cases.huge_outlier_inputs(magnitude=1e6), cases.equal_weights()
    result, output = cases.run(gamma_process('identity'), x, w)
    self.assertTrue(np.all(np.isfinite(result)))
    self.assertEqual(output.measurements['num_underflow_passes'], ITERATIONS)


class GammaPerDimensionTest(tf.test.TestCase):

  def test_gamma_is_c_over_p(self):
    factory = GammaMeanFactory(gamma_per_dimension=2.0)
    self.assertAlmostEqual(factory.gamma_for(cases.VALUE_TYPE), 2.0 / cases.DIMENSION)
    proc = cases.process('gamma_c', lambda: GammaMeanFactory(
        gamma_per_dimension=0.18, num_iterations=ITERATIONS))
    x, w = cases.random_inputs(33), cases.random_weights()
    result, _ = cases.run(proc, x, w)
    expected = np_simple_gamma_mean(
        x, w, 0.18 / cases.DIMENSION, ITERATIONS, np.average(x, axis=0, weights=w))
    self.assertLessEqual(cases.relative_error(result, expected), TOLERANCE)


class InvalidArgumentsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('gamma_zero', dict(gamma=0.0), 'gamma'),
      ('gamma_negative', dict(gamma=-1.0), 'gamma'),
      ('c_zero', dict(gamma_per_dimension=0.0), 'gamma_per_dimension'),
      ('both', dict(gamma=1.0, gamma_per_dimension=1.0), 'gamma_per_dimension'),
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


  @parameterized.named_parameters(('identity', 'identity'), ('diagonal', 'diagonal'))
  def test_secure_inner_mean_matches_reference_up_to_quantisation(self, covariance):
    # The bound applies to weight × value (and × squared deviation for 'diagonal').
    secure_mean = tff.aggregators.MeanFactory(
        value_sum_factory=tff.aggregators.SecureSumFactory(200.0), no_nan_division=True)
    proc = cases.process(('gamma_secure', covariance), lambda: GammaMeanFactory(
        gamma=GAMMA[covariance], num_iterations=ITERATIONS, covariance=covariance,
        inner_mean_factory=secure_mean))
    x, w = cases.random_inputs(34), cases.random_weights()
    result, _ = cases.run(proc, x, w)
    np.testing.assert_allclose(result, reference(covariance, 'mean', x, w), atol=1e-3)


if __name__ == '__main__':
  tf.test.main()
