"""ε(δ) of a run with the DP inner mean (`tff_robust.aggregators.accounting`), against
closed forms: the Rényi-DP curve α/(2z²) of the Gaussian mechanism with the
accountant's RDP-to-(ε, δ) conversion, the exact (ε, δ) curve of the Gaussian mechanism
(Balle and Wang 2018), and the composition of R Gaussians as one with z/√R."""

import math
from unittest import mock

from absl.testing import parameterized
import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tff_robust.common.tff_private import differential_privacy

import tff_robust
from tff_robust.aggregators import accounting
from tff_robust.aggregators import weight_cap


def rdp_epsilon(noise_multiplier, compositions, delta):
  """ε of `compositions` Gaussian mechanisms (no sampling) by hand: RDP
  ε_α = compositions·α/(2z²) at each of the accountant's orders, converted with
  ε = ε_α + log(1 − 1/α) − log(δα)/(α − 1) (Canonne, Kamath, Steinke 2020, Prop. 12;
  the conversion dp_accounting uses), minimised over the orders."""
  orders = np.array(rdp_privacy_accountant.DEFAULT_RDP_ORDERS, dtype=np.float64)
  orders = orders[orders > 1.01]
  rdp = compositions * orders / (2.0 * noise_multiplier ** 2)
  return float(np.min(rdp + np.log1p(-1.0 / orders) -
                      np.log(delta * orders) / (orders - 1.0)))


def _phi(x):
  return 0.5 * math.erfc(-x / math.sqrt(2.0))


def exact_gaussian_epsilon(sigma, delta):
  """The exact ε(δ) of one Gaussian mechanism of noise σ at sensitivity 1 (add or
  remove): δ(ε) = Φ(1/(2σ) − εσ) − e^ε·Φ(−1/(2σ) − εσ), decreasing in ε, solved by
  bisection."""
  def delta_at(eps):
    return (_phi(0.5 / sigma - eps * sigma) -
            math.exp(eps) * _phi(-0.5 / sigma - eps * sigma))

  low, high = 0.0, 1.0
  while delta_at(high) > delta:
    high *= 2.0
  for _ in range(200):
    middle = 0.5 * (low + high)
    low, high = (middle, high) if delta_at(middle) > delta else (low, middle)
  return high


CLOSED_FORM_CASES = (
    # (z, R passes, T rounds, δ); q = 1: compositions = R·T.
    ('one_gaussian_z1', 1.0, 1, 1, 1e-5),
    ('one_gaussian_z0.5', 0.5, 1, 1, 1e-5),
    ('one_gaussian_z5_delta1e-3', 5.0, 1, 1, 1e-3),
    ('three_passes_z2', 2.0, 3, 1, 1e-5),
    ('three_passes_thirty_rounds', 10.0, 3, 30, 1e-5),
)


def _coarse_pld():
  """The PLD accountant at a 10× coarser loss grid, for the sampled runs' relations
  (equal events, monotonicity, inversion), which hold on any grid: a sampled run's
  PLD at the default grid costs seconds per call."""
  return mock.patch.object(accounting, 'PLD_DISCRETIZATION',
                           10 * accounting.PLD_DISCRETIZATION)


class ClosedFormTest(parameterized.TestCase):

  @parameterized.named_parameters(*CLOSED_FORM_CASES)
  def test_rdp_is_the_gaussian_rdp_curve_converted(self, z, passes, rounds, delta):
    got = accounting.epsilon(z, passes, rounds, sampling_probability=1.0, delta=delta)
    self.assertAlmostEqual(got, rdp_epsilon(z, passes * rounds, delta), delta=1e-9 * got)
    # The classic zCDP conversion ρ + 2√(ρ log 1/δ), ρ = RT/(2z²), bounds it from
    # above; the exact curve from below.
    rho = passes * rounds / (2.0 * z * z)
    self.assertLessEqual(got, rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta)))
    self.assertGreaterEqual(got, exact_gaussian_epsilon(z / math.sqrt(passes * rounds),
                                                        delta))

  @parameterized.named_parameters(*CLOSED_FORM_CASES)
  def test_pld_is_the_exact_gaussian_curve(self, z, passes, rounds, delta):
    got = accounting.epsilon(z, passes, rounds, sampling_probability=1.0, delta=delta,
                             accountant='pld')
    exact = exact_gaussian_epsilon(z / math.sqrt(passes * rounds), delta)
    # The PLD accountant's discretization rounds the privacy loss up: an upper bound,
    # within 1e-3 of the exact ε.
    self.assertBetween(got, exact - 1e-9, exact + 1e-3 + 1e-3 * exact)

  @parameterized.product(passes=(2, 3, 10), rounds=(1, 7), accountant=('rdp', 'pld'))
  def test_passes_and_rounds_compose_as_one_gaussian_with_z_over_root(
      self, passes, rounds, accountant):
    z, delta = 1.3, 1e-5
    with _coarse_pld():
      composed = accounting.epsilon(z, passes, rounds, 1.0, delta, accountant)
      single = accounting.epsilon(z / math.sqrt(passes * rounds), 1, 1, 1.0, delta,
                                  accountant)
    self.assertAlmostEqual(composed, single, delta=1e-6 * single)

  @parameterized.product(passes=(2, 3), accountant=('rdp', 'pld'))
  def test_the_passes_of_a_round_share_its_sample(self, passes, accountant):
    with _coarse_pld():
      # A round samples its clients once and runs R passes on them: the R Gaussians of
      # the round are one of z/√R inside the sampling.
      z, rounds, q, delta = 0.8, 30, 0.1, 1e-5
      run = accounting.epsilon(z, passes, rounds, q, delta, accountant)
      equivalent = accounting.epsilon_of_event(
          dp_accounting.GaussianDpEvent(z / math.sqrt(passes)), rounds, q, delta,
          accountant)
      self.assertAlmostEqual(run, equivalent, delta=1e-6 * equivalent)
      # Sampling only lowers ε, and more rounds raise it.
      self.assertLess(run,
                      accounting.epsilon(z, passes, rounds, 1.0, delta, accountant))
      self.assertLess(accounting.epsilon(z, passes, rounds - 10, q, delta, accountant),
                      run)

  @parameterized.parameters('rdp', 'pld')
  def test_delta_inverts_epsilon(self, accountant):
    with _coarse_pld():
      eps = accounting.epsilon(1.0, 3, 30, 0.1, 1e-5, accountant)
      self.assertAlmostEqual(accounting.delta(1.0, 3, 30, 0.1, eps, accountant), 1e-5,
                             delta=1e-7)

  @parameterized.parameters('rdp', 'pld')
  def test_noise_multiplier_for_a_target_epsilon(self, accountant):
    with _coarse_pld():
      z = accounting.noise_multiplier_for(4.0, passes=3, rounds=30,
                                          sampling_probability=0.1, delta=1e-5,
                                          accountant=accountant)
      self.assertLessEqual(accounting.epsilon(z, 3, 30, 0.1, 1e-5, accountant), 4.0)
      self.assertGreater(accounting.epsilon(0.99 * z, 3, 30, 0.1, 1e-5, accountant),
                         4.0)

  @parameterized.parameters('rdp', 'pld')
  def test_no_noise_has_no_epsilon(self, accountant):
    self.assertEqual(accounting.epsilon(0.0, 3, 30, 0.1, 1e-5, accountant), math.inf)
    self.assertEqual(accounting.delta(0.0, 3, 30, 0.1, 10.0, accountant), 1.0)

  @parameterized.named_parameters(
      ('negative_noise', dict(noise_multiplier=-1.0), ValueError, 'noise_multiplier'),
      ('zero_passes', dict(passes=0), ValueError, 'passes'),
      ('float_rounds', dict(rounds=3.0), TypeError, 'rounds'),
      ('zero_sampling', dict(sampling_probability=0.0), ValueError, 'sampling'),
      ('sampling_above_one', dict(sampling_probability=1.5), ValueError, 'sampling'),
      ('zero_delta', dict(delta=0.0), ValueError, 'delta'),
      ('delta_one', dict(delta=1.0), ValueError, 'delta'),
      ('unknown_accountant', dict(accountant='moments'), ValueError, 'accountant'),
  )
  def test_bad_argument_is_named(self, change, error, name):
    kwargs = dict(noise_multiplier=1.0, passes=3, rounds=30, sampling_probability=0.1,
                  delta=1e-5)
    kwargs.update(change)
    with self.assertRaisesRegex(error, name):
      accounting.epsilon(**kwargs)


def dp_mean(z=0.7):
  return tff_robust.DifferentiallyPrivateWeightedMeanFactory(noise_multiplier=z,
                                                             clip=1.0)


class FactoryEventTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('dp_mean', lambda: dp_mean(), 1),
      ('gm', lambda: tff_robust.GeometricMedianFactory(inner_mean_factory=dp_mean()), 3),
      ('gm_five_passes', lambda: tff_robust.GeometricMedianFactory(
          num_communication_passes=5, inner_mean_factory=dp_mean()), 5),
      ('one_step_gm', lambda: tff_robust.one_step_geometric_median_factory(
          inner_mean_factory=dp_mean()), 1),
      # The mean start is one more call.
      ('gamma_mean', lambda: tff_robust.GammaMeanFactory(inner_mean_factory=dp_mean()),
       4),
      # The median start's 3 passes, 3 iterations (its round of scalar sums calls
      # no mean).
      ('gamma_mean_from_gm', lambda: tff_robust.GammaMeanFactory(
          inner_mean_factory=dp_mean(), initial_point='geometric_median'), 6),
      ('filtered_capped_gm', lambda: tff_robust.NonfiniteFilteringFactory(
          weight_cap.WeightCappingFactory(tff_robust.GeometricMedianFactory(
              inner_mean_factory=dp_mean()))), 3),
  )
  def test_round_is_one_gaussian_per_inner_mean_call(self, build, calls):
    event = accounting.round_event_of(build())
    self.assertAlmostEqual(accounting.effective_noise_multiplier(event),
                           0.7 / math.sqrt(calls), places=12)
    self.assertAlmostEqual(
        accounting.epsilon_of(build(), rounds=30, sampling_probability=0.1,
                              delta=1e-5),
        accounting.epsilon(0.7, calls, 30, 0.1, 1e-5), places=9)

  def test_gm_start_with_its_own_noise_composes_both(self):
    factory = tff_robust.GammaMeanFactory(
        inner_mean_factory=dp_mean(1.0), initial_point='geometric_median',
        geometric_median_factory=tff_robust.GeometricMedianFactory(
            num_communication_passes=2, inner_mean_factory=dp_mean(2.0)))
    self.assertAlmostEqual(
        accounting.effective_noise_multiplier(accounting.round_event_of(factory)),
        (3 / 1.0 ** 2 + 2 / 2.0 ** 2) ** -0.5, places=12)

  def test_a_plain_inner_mean_has_no_epsilon(self):
    with self.assertRaisesRegex(ValueError, 'DifferentiallyPrivateWeightedMeanFactory'):
      accounting.round_event_of(tff_robust.GeometricMedianFactory())

  def test_an_unknown_factory_is_named(self):
    with self.assertRaisesRegex(TypeError, 'GradientMaskedAveragingFactory'):
      accounting.round_event_of(tff_robust.GradientMaskedAveragingFactory(
          inner_mean_factory=dp_mean()))

  def test_the_accounted_event_is_the_mechanism_s_own(self):
    # TFF's DifferentiallyPrivateFactory reports the DP event of every call in its
    # state: the DP mean's is the Gaussian the accountant composes.
    process = dp_mean(0.7).create(tff.TensorType(np.float32, [3]),
                                  tff.TensorType(np.float32))
    output = process.next(process.initialize(), [np.ones(3, np.float32)] * 3,
                          [np.float32(1)] * 3)
    reported = differential_privacy.extract_dp_event_from_state(output.state['dp_sum'])
    accounted = accounting.round_event_of(dp_mean(0.7))
    self.assertIsInstance(reported, dp_accounting.GaussianDpEvent)
    self.assertIsInstance(accounted, dp_accounting.GaussianDpEvent)
    # The state holds it in float32.
    self.assertAlmostEqual(reported.noise_multiplier, accounted.noise_multiplier,
                           places=6)


def adaptive_mean(z=1.2, stddev=1.0):
  return tff_robust.DifferentiallyPrivateWeightedMeanFactory.adaptive(
      z, clients_per_round=10, clipped_count_stddev=stddev)


class AdaptiveClipAccountingTest(parameterized.TestCase):
  """The adaptive clip's noised count is a Gaussian mechanism on the same clients,
  composed with the records' in every call."""

  def test_hand_composed_with_dp_accounting(self):
    # The GM's 3 calls a round, each the records' Gaussian of z_v and the count's of
    # z_c = 2σ_c, 30 rounds sampled at q = 0.1, composed by hand with dp_accounting's
    # RDP accountant.
    z, stddev, rounds, q, delta = 1.2, 1.0, 30, 0.1, 1e-5
    z_v = (z ** -2 - (2 * stddev) ** -2) ** -0.5
    call = dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(z_v),
                                          dp_accounting.GaussianDpEvent(2 * stddev)])
    run = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        q, dp_accounting.SelfComposedDpEvent(call, 3)), rounds)
    by_hand = dp_accounting.rdp.RdpAccountant().compose(run).get_epsilon(delta)
    factory = tff_robust.GeometricMedianFactory(
        inner_mean_factory=adaptive_mean(z, stddev))
    got = accounting.epsilon_of(factory, rounds, q, delta)
    self.assertAlmostEqual(got, by_hand, delta=1e-9 * by_hand)
    # z is the call's total, as in TFF: the same ε as a fixed clip at z, and more
    # than the records' Gaussian alone (the count is accounted, not free).
    self.assertAlmostEqual(got, accounting.epsilon(z, 3, rounds, q, delta),
                           delta=1e-6 * got)
    self.assertGreater(got, accounting.epsilon(z_v, 3, rounds, q, delta) * 1.05)
    # And the PLD accountant agrees through the equivalent single Gaussian.
    self.assertAlmostEqual(
        accounting.epsilon_of(factory, rounds, q, delta, accountant='pld'),
        accounting.epsilon(z, 3, rounds, q, delta, accountant='pld'), delta=1e-3)

  def test_the_count_event_is_the_quantile_query_s_own(self):
    # tensorflow-privacy's QuantileEstimatorQuery reports its count's DP event: the
    # Gaussian the accountant composes.
    import tensorflow_privacy as tfp  # pylint: disable=g-import-not-at-top
    query = tfp.QuantileEstimatorQuery(
        initial_estimate=0.1, target_quantile=0.5, learning_rate=0.2,
        below_estimate_stddev=1.0, expected_num_records=10, geometric_update=True)
    global_state = query.initial_global_state()
    _, _, reported = query.get_noised_result(query.initial_sample_state(),
                                             global_state)
    accounted = adaptive_mean(1.2, 1.0).dp_event().events[1]
    self.assertIsInstance(reported, dp_accounting.GaussianDpEvent)
    self.assertAlmostEqual(float(reported.noise_multiplier),
                           accounted.noise_multiplier, places=6)


if __name__ == '__main__':
  tf.test.main()
