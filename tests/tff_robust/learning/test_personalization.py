"""tff_robust.PersonalizationClient (Ditto, personalized RFA) against numpy references
on least squares (see tests.helpers.least_squares)."""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tests.helpers import least_squares as ls
from tff_robust.learning import personalization


# ---- the client algorithm (tff_robust.learning.personalization) -----------------------------


class PersonalizationClientTest(tf.test.TestCase, parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.clients = ls.least_squares_clients()
    cls.client = personalization.PersonalizationClient(
        ls.linear_model, tf.keras.losses.MeanSquaredError)

  def test_personalized_rfa_matches_algorithm4(self):
    rng = np.random.default_rng(1)
    w, u = ls.random_params(rng), ls.random_params(rng, 0.5)
    x, y = self.clients['client_1']
    update = self.client.personalized_rfa_update(
        u, w, ls.full_batch(x, y), ls.full_batch(x, y), ls.LEARNING_RATE)
    expected_delta, expected_u = ls.reference_algorithm4(w, u, ls.batches(x, y),
                                                       ls.LEARNING_RATE)
    ls.assert_weights_close(self, update.shared_delta, expected_delta)
    ls.assert_weights_close(self, update.personal_offset, expected_u)
    self.assertEqual(update.personal_stats.num_steps, ls.STEPS)
    self.assertEqual(update.shared_stats.num_examples, ls.STEPS * len(x))

  def test_personalized_rfa_separate_personal_learning_rate(self):
    rng = np.random.default_rng(2)
    w, u = ls.random_params(rng), ls.random_params(rng)
    x, y = self.clients['client_0']
    update = self.client.personalized_rfa_update(
        u, w, ls.full_batch(x, y, 2), ls.full_batch(x, y, 3), learning_rate=0.02,
        personal_learning_rate=0.07)
    expected_u = [a - b for a, b in zip(ls.gradient_descent(
        [p + q for p, q in zip(w, u)], ls.batches(x, y, 2), 0.07), w)]
    expected_w = ls.gradient_descent([p + q for p, q in zip(w, expected_u)],
                                   ls.batches(x, y, 3), 0.02)
    ls.assert_weights_close(self, update.personal_offset, expected_u)
    ls.assert_weights_close(self, update.shared_delta,
                          [a - b - c for a, b, c in zip(expected_w, expected_u, w)])

  @parameterized.named_parameters(('lambda_0', 0.0), ('lambda_1', 1.0),
                                  ('lambda_5', 5.0))
  def test_ditto_personal_update_matches_reference(self, lam):
    rng = np.random.default_rng(3)
    w, v = ls.random_params(rng), ls.random_params(rng)
    x, y = self.clients['client_2']
    update = self.client.ditto_personal_update(v, w, ls.full_batch(x, y), ls.LEARNING_RATE,
                                               lam)
    ls.assert_weights_close(self, update.personal_weights,
                          ls.gradient_descent(v, ls.batches(x, y), ls.LEARNING_RATE, lam, w))

  def test_local_sgd_matches_gradient_descent(self):
    rng = np.random.default_rng(4)
    w = ls.random_params(rng)
    x, y = self.clients['client_0']
    update = self.client.local_sgd(w, ls.full_batch(x, y), ls.LEARNING_RATE)
    expected = ls.gradient_descent(w, ls.batches(x, y), ls.LEARNING_RATE)
    ls.assert_weights_close(self, update.shared_delta,
                          [a - b for a, b in zip(expected, w)])

  def test_ditto_lambda_zero_is_local_training_only(self):
    rng = np.random.default_rng(5)
    v, w_one, w_two = (ls.random_params(rng) for _ in range(3))
    x, y = self.clients['client_1']
    with_one = self.client.ditto_personal_update(v, w_one, ls.full_batch(x, y),
                                                 ls.LEARNING_RATE, 0.0).personal_weights
    with_two = self.client.ditto_personal_update(v, w_two, ls.full_batch(x, y),
                                                 ls.LEARNING_RATE, 0.0).personal_weights
    local = self.client.local_sgd(v, ls.full_batch(x, y), ls.LEARNING_RATE).shared_delta
    ls.assert_weights_close(self, with_one, with_two, atol=0)
    ls.assert_weights_close(self, with_one, [a + b for a, b in zip(v, local)])

  def test_ditto_large_lambda_pins_personal_model_to_global(self):
    rng = np.random.default_rng(6)
    v, w = ls.random_params(rng, 3.0), ls.random_params(rng)
    x, y = self.clients['client_2']
    # The personal model starts far from w, so ending at w is a move all the way.
    self.assertGreater(np.abs(v[0] - w[0]).max(), 0.5)
    # ηλ = 0.5 keeps the iteration stable; the fixed point is w − ∇F(v)/λ ≈ w.
    lam = 1e6
    update = self.client.ditto_personal_update(v, w, ls.full_batch(x, y, 40),
                                               0.5 / lam, lam)
    ls.assert_weights_close(self, update.personal_weights, w, atol=1e-4)

  @parameterized.parameters((-1.0, ValueError), (np.nan, ValueError),
                            (np.inf, ValueError), (True, TypeError), ('1', TypeError))
  def test_rejects_impossible_lambda(self, lam, error):
    w = ls.random_params(np.random.default_rng(7))
    x, y = self.clients['client_0']
    with self.assertRaisesRegex(error, 'lambda must be a'):
      self.client.ditto_personal_update(w, w, ls.full_batch(x, y), 0.1, lam)

  @parameterized.product(rate=[0.0, -0.1, np.nan, np.inf],
                         method=['local_sgd', 'ditto', 'personalized_rfa',
                                 'personalized_rfa_personal'])
  def test_rejects_impossible_learning_rates(self, rate, method):
    w = ls.random_params(np.random.default_rng(7))
    data = ls.full_batch(*self.clients['client_0'])
    call, name = {
        'local_sgd': (lambda: self.client.local_sgd(w, data, rate), 'learning_rate'),
        'ditto': (lambda: self.client.ditto_personal_update(w, w, data, rate, 1.0),
                  'learning_rate'),
        'personalized_rfa': (lambda: self.client.personalized_rfa_update(
            w, w, data, data, rate), 'learning_rate'),
        'personalized_rfa_personal': (lambda: self.client.personalized_rfa_update(
            w, w, data, data, 0.1, rate), 'personal_learning_rate'),
    }[method]
    with self.assertRaisesRegex(ValueError, f'^{name} must be a finite number > 0'):
      call()

  def test_rejects_wrong_shapes(self):
    w = ls.random_params(np.random.default_rng(7))
    x, y = self.clients['client_0']
    with self.assertRaisesRegex(ValueError, 'do not match'):
      self.client.local_sgd([w[0]], ls.full_batch(x, y), 0.1)


if __name__ == '__main__':
  tf.test.main()
