"""Gradient Masked Averaging against a numpy implementation of the GMA paper's eq. 3."""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tests.helpers import aggregator_cases as cases
from tff_robust.aggregators.gradient_masking import GradientMaskedAveragingFactory
from tff_robust.aggregators.nonfinite import NonfiniteFilteringFactory

TOLERANCE = 1e-5


def np_gma(x, w, tau):
  """A_j = |(1/N) Σ_n sign(Δ_n)_j|, m_j = 1 if A_j ≥ τ else A_j, m ⊙ weighted mean."""
  agreement = np.abs(np.mean(np.sign(x), axis=0))
  mask = np.where(agreement >= tau, 1.0, agreement)
  return mask * np.average(x, axis=0, weights=w), agreement


def gma_process(tau):
  return cases.process(('gma', tau), lambda: GradientMaskedAveragingFactory(tau=tau))


class MatchesNumpyReferenceTest(parameterized.TestCase):

  @parameterized.named_parameters(*[
      dict(c, tau=tau, testcase_name=f'{c["testcase_name"]}_tau{tau}')
      for c in cases.input_cases() for tau in (0.4, 0.75)])
  def test_matches_reference(self, inputs, weights, tau):
    x, w = cases.INPUTS[inputs](), cases.WEIGHTS[weights]()
    result, output = cases.run(gma_process(tau), x, w)
    expected, agreement = np_gma(x, w, tau)
    self.assertLessEqual(cases.relative_error(result, expected), TOLERANCE)
    self.assertAlmostEqual(
        output.measurements['fraction_masked'], np.mean(agreement < tau), places=6)
    self.assertAlmostEqual(
        output.measurements['mean_agreement'], np.mean(agreement), places=6)

  @parameterized.product(fraction=(0.2, 0.3, 0.4), tau=(0.4, 0.75),
                         weights=('equal', 'weighted'))
  def test_sign_flipping_cluster_is_masked(self, fraction, tau, weights):
    # The shared clustered input is all positive, so GMA's mask is 1 there. Here the
    # attackers sit at the negated far point: agreement is 1 − 2·fraction in every
    # coordinate (0.6, 0.4, 0.2), masked exactly where it is below τ (0.4 = τ is not).
    x = cases.clustered_attack_inputs(fraction=fraction)
    x[:int(round(fraction * cases.NUM_CLIENTS))] *= -1
    w = cases.WEIGHTS[weights]()
    result, output = cases.run(gma_process(tau), x, w)
    expected, agreement = np_gma(x, w, tau)
    np.testing.assert_allclose(agreement, 1 - 2 * fraction)
    self.assertLessEqual(cases.relative_error(result, expected), TOLERANCE)
    self.assertAlmostEqual(
        output.measurements['fraction_masked'], float(1 - 2 * fraction < tau), places=6)

  @parameterized.named_parameters(('equal', 'equal'), ('weighted', 'weighted'))
  def test_tau_zero_is_the_weighted_mean(self, weights):
    x, w = cases.random_inputs(21), cases.WEIGHTS[weights]()
    result, output = cases.run(gma_process(0.0), x, w)
    self.assertLessEqual(
        cases.relative_error(result, np.average(x, axis=0, weights=w)), TOLERANCE)
    self.assertEqual(output.measurements['fraction_masked'], 0.0)

  def test_agreeing_signs_give_the_weighted_mean_even_for_tau_one(self):
    x = np.abs(cases.random_inputs(22)) + 0.1
    x[:, 3] *= -1  # All negative: still full agreement.
    w = cases.random_weights()
    result, output = cases.run(gma_process(1.0), x, w)
    self.assertLessEqual(
        cases.relative_error(result, np.average(x, axis=0, weights=w)), TOLERANCE)
    self.assertEqual(output.measurements['mean_agreement'], 1.0)

  def test_disagreeing_coordinate_is_scaled_by_its_agreement(self):
    x = np.abs(cases.random_inputs(23)) + 0.1
    x[:5, 0] *= -1  # Half disagree: A_0 = 0.
    x[:3, 1] *= -1  # 7 against 3: A_1 = 0.4.
    w = cases.random_weights()
    result, _ = cases.run(gma_process(0.75), x, w)
    mean = np.average(x, axis=0, weights=w)
    np.testing.assert_allclose(result[0], 0.0, atol=1e-7)
    np.testing.assert_allclose(result[1], 0.4 * mean[1], rtol=1e-5)
    np.testing.assert_allclose(result[2:], mean[2:], rtol=1e-5)

  def test_nonfinite_clients_are_dropped_and_not_counted_in_agreement(self):
    x, w = cases.random_inputs(24), cases.random_weights()
    poisoned = x.copy()
    poisoned[0, 2] = np.nan
    poisoned[7, 8] = -np.inf
    result, output = cases.run(cases.process(('filtered_gma', 0.4), lambda: (
        NonfiniteFilteringFactory(GradientMaskedAveragingFactory(tau=0.4)))), poisoned, w)
    keep = np.array([i not in (0, 7) for i in range(cases.NUM_CLIENTS)])
    expected, _ = np_gma(x[keep], w[keep], 0.4)
    self.assertEqual(output.measurements['num_nonfinite_clients'], 2)
    self.assertLessEqual(cases.relative_error(result, expected), TOLERANCE)


class InvalidArgumentsTest(parameterized.TestCase):

  @parameterized.named_parameters(('negative', -0.1), ('above_one', 1.1))
  def test_tau_outside_unit_interval(self, tau):
    with self.assertRaisesRegex(ValueError, 'tau'):
      GradientMaskedAveragingFactory(tau=tau)

  def test_sign_sum_factory_must_be_unweighted(self):
    with self.assertRaisesRegex(TypeError, 'sign_sum_factory'):
      GradientMaskedAveragingFactory(sign_sum_factory=tff.aggregators.MeanFactory())


class SecureSumCompositionTest(cases.SecureSumContextMixin, tf.test.TestCase):


  def test_secure_sums_match_the_plain_result_up_to_quantisation(self):
    x, w = cases.random_inputs(25), cases.random_weights()
    secure = cases.process('gma_secure', lambda: GradientMaskedAveragingFactory(
        tau=0.4,
        sign_sum_factory=tff.aggregators.SecureSumFactory(1.0, -1.0),
        inner_mean_factory=tff.aggregators.MeanFactory(
            value_sum_factory=tff.aggregators.SecureSumFactory(100.0))))
    result, _ = cases.run(secure, x, w)
    expected, _ = np_gma(x, w, 0.4)
    np.testing.assert_allclose(result, expected, atol=1e-3)


if __name__ == '__main__':
  tf.test.main()
