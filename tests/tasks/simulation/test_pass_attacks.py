"""Corrupted clients that send different inputs in different passes of an iterative
secure aggregate, or replace their contributions inside a pass, run pass by pass in
the simulation (`tasks.simulation.pass_attacks`), with and without the declared
bounds."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow_federated as tff

from tasks import registry
from tasks.simulation import attacks
from tasks.simulation import pass_attacks

NUM_CLIENTS = 20
DIMENSION = 9
VALUE_TYPE = tff.TensorType(np.float32, [DIMENSION])
WEIGHT_TYPE = tff.TensorType(np.float32)
ITERATIVE = ('gm', 'one_step_gm', 'gamma_mean', 'secure_centered_clipping')
CORRUPTED = np.zeros(NUM_CLIENTS, bool)
CORRUPTED[[3, 11]] = True

_BUILT = {}


def _built(name, capped):
  key = (name, capped)
  if key not in _BUILT:
    factory = registry.aggregator_from_name(name,
                                            weight_cap={} if capped else None)
    _BUILT[key] = (factory.create(VALUE_TYPE, WEIGHT_TYPE),
                   pass_attacks.pass_by_pass(factory, VALUE_TYPE))
  return _BUILT[key]


def _bounded(name, capped, attack, bounds=True, **params):
  key = (name, capped, attack, bounds, tuple(sorted(params.items())))
  if key not in _BUILT:
    factory = registry.aggregator_from_name(name, weight_cap={} if capped else None)
    contribution_attack = (pass_attacks.PASS_ATTACKS[attack](**params)
                           if attack else None)
    _BUILT[key] = pass_attacks.pass_by_pass(factory, VALUE_TYPE,
                                            contribution_attack=contribution_attack,
                                            bounds=bounds)
  return _BUILT[key]


def _inputs():
  rng = np.random.default_rng(0)
  x = (1.0 + 0.5 * rng.normal(size=(NUM_CLIENTS, DIMENSION))).astype(np.float32)
  weights = rng.integers(10, 201, size=NUM_CLIENTS).astype(np.float32)
  return x.astype(np.float64), weights.astype(np.float64)


def _fused(process, x, weights):
  output = process.next(process.initialize(), [r.astype(np.float32) for r in x],
                        [np.float32(w) for w in weights])
  return np.asarray(output.result, np.float64), output


def _by_pass(built, x, weights, attack):
  initialize, aggregate, _ = built
  output = aggregate(initialize(), x, weights, CORRUPTED, attack,
                     np.random.default_rng(0))
  return np.asarray(output.result, np.float64), output


class PassByPassTest(parameterized.TestCase):

  @parameterized.product(name=ITERATIVE, capped=(False, True))
  def test_honest_passes_are_the_process_itself(self, name, capped):
    process, built = _built(name, capped)
    x, weights = _inputs()
    expected, fused = _fused(process, x, weights)
    actual, output = _by_pass(built, x, weights, None)
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-7)
    self.assertEqual(output.measurements['num_nonfinite_clients'],
                     fused.measurements['num_nonfinite_clients'])

  @parameterized.parameters(*ITERATIVE)
  def test_attacking_from_the_first_pass_is_the_update_attack(self, name):
    process, built = _built(name, False)
    x, weights = _inputs()
    update_attack = attacks.build_update_attack('ipm', epsilon=10.0)
    attacked = update_attack.malicious_rows(x, weights, CORRUPTED, None)
    consistent = x.copy()
    consistent[CORRUPTED] = attacked
    expected, _ = _fused(process, consistent, weights)
    actual, _ = _by_pass(built, x, weights, pass_attacks.LateSwitch(from_pass=0))
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)

  @parameterized.parameters(*ITERATIVE)
  def test_the_cap_bounds_a_weight_claimed_in_a_later_pass(self, name):
    # The histogram pass sees the true weights; a later pass's claim is capped there.
    _, built = _built(name, True)
    x, weights = _inputs()
    results = [_by_pass(built, x, weights, pass_attacks.LateSwitch(
        from_pass=1, weight_factor=factor))[0] for factor in (1e2, 1e4)]
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6)

  def test_without_the_cap_a_late_weight_owns_the_median(self):
    _, built = _built('gm', False)
    x, weights = _inputs()
    # Honest in the first Weiszfeld pass, then −10 × the honest mean at 1e4 × α.
    result, _ = _by_pass(built, x, weights, pass_attacks.LateSwitch(
        from_pass=1, weight_factor=1e4))
    honest_mean = x[~CORRUPTED].mean(axis=0)
    self.assertGreater(np.linalg.norm(result - honest_mean),
                       5 * np.linalg.norm(honest_mean))

  @parameterized.product(name=ITERATIVE + ('gma',), capped=(False, True))
  def test_bounded_nan_contributions_are_a_client_that_sent_nothing(self, name,
                                                                    capped):
    process, _ = _built(name, capped)
    x, weights = _inputs()
    dropped = weights.copy()
    dropped[CORRUPTED] = 0.0
    expected, _ = _fused(process, x, dropped)
    actual, output = _by_pass(_bounded(name, capped, 'nan_contributions'), x, weights,
                              None)
    self.assertGreater(output.measurements[pass_attacks.REFUSED_MEASUREMENT], 0)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)

  @parameterized.parameters(*ITERATIVE)
  def test_without_the_bounds_one_nan_contribution_poisons_the_aggregate(self, name):
    x, weights = _inputs()
    actual, _ = _by_pass(_bounded(name, False, 'nan_contributions', bounds=False), x,
                         weights, None)
    self.assertFalse(np.all(np.isfinite(actual)))

  @parameterized.parameters(*ITERATIVE)
  def test_the_bounds_refuse_claims_beyond_an_honest_clients(self, name):
    x, weights = _inputs()
    honest_mean = x[~CORRUPTED].mean(axis=0)
    distances = {}
    for bounds in (False, True):
      result, output = _by_pass(_bounded(name, False, 'claim_near', bounds=bounds,
                                         factor=1e3), x, weights, None)
      distances[bounds] = np.linalg.norm(result - honest_mean)
    self.assertGreater(output.measurements[pass_attacks.REFUSED_MEASUREMENT], 0)
    self.assertLess(distances[True], 0.2 * distances[False])

  def test_without_the_bounds_a_claim_moves_the_gm(self):
    x, weights = _inputs()
    honest_mean = x[~CORRUPTED].mean(axis=0)
    update_only, _ = _by_pass(_built('gm', False)[1], x, weights,
                              pass_attacks.LateSwitch(from_pass=0))
    claimed, _ = _by_pass(_bounded('gm', False, 'claim_near', bounds=False), x,
                          weights, None)
    self.assertGreater(np.linalg.norm(claimed - honest_mean),
                       5 * np.linalg.norm(update_only - honest_mean))

  def test_gma_sign_votes_are_a_channel_the_bounds_close(self):
    # Votes of −1e6 (PoisonedSums) outvote every honest client's ±1, which turns
    # the masking off; a vote in [−1, 1] is all an honest client can send.
    x, weights = _inputs()
    process, update_only = _built('gma', False)
    expected, _ = _fused(process, x, weights)
    honest, output = _by_pass(_bounded('gma', False, None), x, weights, None)
    np.testing.assert_allclose(honest, expected, rtol=1e-6, atol=1e-7)
    self.assertEqual(output.measurements[pass_attacks.REFUSED_MEASUREMENT], 0)
    fair, _ = _by_pass(update_only, x, weights, pass_attacks.LateSwitch(from_pass=0))
    poisoned, _ = _by_pass(_bounded('gma', False, 'poisoned_sums', bounds=False), x,
                           weights, None)
    self.assertGreater(np.linalg.norm(poisoned - fair), 0.1 * np.linalg.norm(fair))
    _, output = _by_pass(_bounded('gma', False, 'poisoned_sums'), x, weights, None)
    self.assertGreater(output.measurements[pass_attacks.REFUSED_MEASUREMENT], 0)

  def test_rejects_what_is_not_an_iterative_aggregate(self):
    with self.assertRaisesRegex(TypeError, 'iterative'):
      pass_attacks.pass_by_pass(tff.aggregators.MeanFactory(), VALUE_TYPE)


# Each case traces one computation per pass of a bounded aggregate (~3 CPU-min).
@pytest.mark.slow
class ProtocolBoundsGridTest(parameterized.TestCase):
  """The bounds across aggregators, caps and geometries."""

  @parameterized.product(name=ITERATIVE, capped=(False, True), shift=(0.0, 1e3))
  def test_the_bounds_admit_every_honest_contribution(self, name, capped, shift):
    process, _ = _built(name, capped)
    x, weights = _inputs()
    x = x + shift
    weights[0] *= 50.0  # a client far above the cap
    expected, _ = _fused(process, x, weights)
    actual, output = _by_pass(_bounded(name, capped, None), x, weights, None)
    self.assertEqual(output.measurements[pass_attacks.REFUSED_MEASUREMENT], 0)
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6 * (1 + shift))

  @parameterized.product(name=('gm', 'one_step_gm', 'gamma_mean'),
                         attack=('claim_near', 'numerator_only', 'poisoned_sums',
                                 'nan_contributions'))
  def test_under_the_bounds_no_protocol_attack_beats_the_update_attack(self, name,
                                                                       attack):
    # A Weiszfeld step's (w, β) is admitted only with β·‖w − v‖ ≤ α·ν, what an honest
    # client's β = α·ν/max(ν, d) gives (the γ-mean's weight bounds its ‖x − μ‖ alike):
    # whatever a corrupted client sends, it moves the step no more than a client at
    # any distance with the honest weight.
    update_only = _built(name, False)[1]
    bounded = _bounded(name, False, attack)
    for num_corrupted, shift, scale in ((1, 0.0, 1.0), (5, 100.0, 1.0),
                                        (5, -3.0, 1e-3), (8, 1e3, 10.0)):
      x, weights = _inputs()
      x = shift + scale * x
      corrupted = np.zeros(NUM_CLIENTS, bool)
      corrupted[:num_corrupted] = True
      honest = x[~corrupted]
      median = np.median(honest, axis=0)
      spread = np.sqrt(np.mean(np.sum((honest - honest.mean(axis=0))**2, axis=1)))
      distances = []
      for (initialize, aggregate, _), attack_ in ((update_only, pass_attacks.LateSwitch(
          from_pass=0)), (bounded, None)):
        output = aggregate(initialize(), x, weights, corrupted, attack_,
                           np.random.default_rng(0))
        distances.append(np.linalg.norm(np.asarray(output.result, np.float64) - median))
      self.assertLessEqual(distances[1], distances[0] + 0.05 * spread,
                           (num_corrupted, shift, scale))


if __name__ == '__main__':
  absltest.main()
