"""The declared bounds of the clients' contributions (`tff_robust.iterative.contributions`):
what an honest client sends is admitted, what it cannot send is refused, checked
against plain numpy statements of each rule."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tff_robust.aggregators import robust_scale
from tff_robust.iterative import contributions

ALPHA = np.float32(37.0)


def _admits(bound, contribution, alpha=ALPHA, *context):
  contribution = tf.nest.map_structure(tf.constant, contribution)
  return bool(bound.admits(contribution, tf.constant(alpha), *context))


class ScalarBoundsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('unbounded', contributions.UNBOUNDED, lambda x: True),
      ('nonnegative', contributions.NONNEGATIVE, lambda x: x >= 0),
      ('equal', contributions.EQUAL_TO_ALPHA, lambda x: x == ALPHA),
      ('at_most', contributions.AT_MOST_ALPHA, lambda x: 0 <= x <= ALPHA),
      ('zero_or_alpha', contributions.ZERO_OR_ALPHA, lambda x: x in (0, ALPHA)),
      ('flag', contributions.FLAG, lambda x: x in (0, 1)),
      ('sign_vote', contributions.SIGN_VOTE, lambda x: -1 <= x <= 1),
  )
  def test_against_the_rule(self, bound, rule):
    for x in (-1e30, -37.0, -1.0, -0.5, 0.0, 0.5, 1.0, 36.999, 37.0, 37.001, 1e30):
      self.assertEqual(_admits(bound, np.float64(x)), rule(x), x)

  @parameterized.parameters(np.nan, np.inf, -np.inf)
  def test_nonfinite_is_refused_by_every_bound(self, value):
    for bound in (contributions.UNBOUNDED, contributions.NONNEGATIVE,
                  contributions.AT_MOST_ALPHA, contributions.FLAG):
      self.assertFalse(_admits(bound, np.array([1.0, value])))

  def test_fields_bound_each_element(self):
    bound = contributions.fields(contributions.AT_MOST_ALPHA, contributions.NONNEGATIVE)
    self.assertTrue(_admits(bound, (np.float64(3.0), np.float64(1e9))))
    self.assertFalse(_admits(bound, (np.float64(38.0), np.float64(1e9))))
    self.assertFalse(_admits(bound, (np.float64(3.0), np.float64(-1.0))))

  @parameterized.parameters(0.5, 1.0, 2.0)
  def test_norm_at_most_a_radius(self, radius):
    rng = np.random.default_rng(0)
    for _ in range(20):
      x = [rng.normal(size=3).astype(np.float32), rng.normal(size=[2, 2]).astype(
          np.float32)]
      norm = np.sqrt(sum(np.sum(np.square(p.astype(np.float64))) for p in x))
      self.assertEqual(_admits(contributions.norm_at_most(radius), x),
                       norm <= radius * (1 + 1e-5))
      self.assertEqual(_admits(contributions.norm_at_most(), x, ALPHA,
                               tf.constant(radius, tf.float64)),
                       norm <= radius * (1 + 1e-5))


class HistogramBoundsTest(parameterized.TestCase):

  @parameterized.parameters('alpha', 'one')
  def test_one_hot(self, mass):
    value = ALPHA if mass == 'alpha' else 1.0
    bound = contributions.one_hot(mass)
    row = np.zeros(16)
    self.assertTrue(_admits(bound, row))
    row[5] = value
    self.assertTrue(_admits(bound, row))
    for tampered in (row * 2, row + np.eye(16)[7] * value, -row):
      self.assertFalse(_admits(bound, tampered))

  @parameterized.product(float64=(False, True),
                         distance=(0.0, 1e-300, 1e-45, 3e-3, 0.7, 1.0, 2.0, 5e4,
                                   3e38, 1e300, np.inf, np.nan))
  def test_honest_scale_statistics_are_admitted(self, float64, distance):
    bound = robust_scale.statistics_bound(float64)
    for count_zero in (False, True):
      statistics = robust_scale.client_statistics(
          tf.constant(distance, tf.float64), tf.constant(ALPHA), float64, count_zero)
      self.assertTrue(bool(bound.admits(statistics, tf.constant(ALPHA))))

  @parameterized.parameters(False, True)
  def test_tampered_scale_statistics_are_refused(self, float64):
    bound = robust_scale.statistics_bound(float64)
    honest = robust_scale.client_statistics(tf.constant(2.5, tf.float64),
                                            tf.constant(ALPHA), float64).numpy()
    bucket = int(np.flatnonzero(honest[0])[0])
    inflated = honest * 1e3
    moved_log = honest.copy()
    moved_log[1, bucket] += 5 * ALPHA  # a log-distance outside its bucket
    moved_mass = honest.copy()
    moved_mass[:, bucket] = 0
    moved_mass[0, 0] = ALPHA           # the mass moved, the log left behind
    for tampered in (inflated, moved_log, moved_mass):
      self.assertFalse(bool(bound.admits(tf.constant(tampered), tf.constant(ALPHA))))


if __name__ == '__main__':
  absltest.main()
