"""The gathering baselines and norm clipping against plain-numpy implementations of
their papers' definitions (Yin et al. 2018; Blanchard et al. 2017; Karimireddy et al.
2021; Sun et al. 2019)."""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from baselines import centered_clipping
from baselines import coordinatewise
from baselines import krum
from baselines import wrappers
from tasks import references
from tests.helpers import aggregator_cases as cases
from tff_robust.aggregators.nonfinite import NonfiniteFilteringFactory

TOLERANCE = 1e-5


# ---- numpy references, written from the papers' definitions -------------------------
# The median, trimmed mean and Krum are the plain-numpy references the attacks share
# (`tasks.references`, numpy only); named here as the tests of the wrappers use them.


def np_median(x, w):
  return references.coordinate_median(x, w)


def np_trimmed_mean(x, w, beta):
  return references.trimmed_mean(x, w, beta)


def np_krum(x, w, f, m):
  return references.krum(x, w, f, m)


def np_clip(z, tau):
  norm = np.linalg.norm(z)
  return z if norm <= tau else z * tau / norm


def np_centered_clipping(x, w, tau, iterations, v0):
  v = v0.copy()
  for _ in range(iterations):
    v = v + sum(wi * np_clip(xi - v, tau) for xi, wi in zip(x, w)) / np.sum(w)
  return v


def np_norm_clipping(x, w, c):
  return sum(wi * np_clip(xi, c) for xi, wi in zip(x, w)) / np.sum(w)


# ---- factories under test -------------------------------------------------------------

BASELINES = dict(
    median=(coordinatewise.CoordinateWiseMedianFactory, np_median),
    trimmed_mean=(lambda: coordinatewise.TrimmedMeanFactory(trim_fraction=0.2),
                  lambda x, w: np_trimmed_mean(x, w, 0.2)),
    trimmed_mean_small=(lambda: coordinatewise.TrimmedMeanFactory(trim_fraction=0.15),
                        lambda x, w: np_trimmed_mean(x, w, 0.15)),
    krum=(lambda: krum.KrumFactory(num_byzantine=2),
          lambda x, w: np_krum(x, w, 2, 1)),
    multi_krum=(lambda: krum.KrumFactory(num_byzantine=1, num_selected=None),
                lambda x, w: np_krum(x, w, 1, None)),
    multi_krum_fraction=(
        lambda: krum.KrumFactory(byzantine_fraction=0.2, num_selected=4),
        lambda x, w: np_krum(x, w, 2, 4)),
    centered_clipping=(
        lambda: centered_clipping.CenteredClippingFactory(
            clip_radius=1.0, num_iterations=3, initial_point='mean'),
        lambda x, w: np_centered_clipping(
            x, w, 1.0, 3, np.average(x, axis=0, weights=w))),
    centered_clipping_zero=(
        lambda: centered_clipping.CenteredClippingFactory(
            clip_radius=2.0, num_iterations=2, initial_point='zero'),
        lambda x, w: np_centered_clipping(x, w, 2.0, 2, np.zeros(x.shape[1]))),
    norm_clipping=(lambda: wrappers.norm_clipping_factory(clip_norm=1.5),
                   lambda x, w: np_norm_clipping(x, w, 1.5)),
)


def _cases():
  return [dict(c, name=name, testcase_name=f'{name}_{c["testcase_name"]}')
          for name in BASELINES for c in cases.input_cases()]


class MatchesNumpyReferenceTest(parameterized.TestCase):

  @parameterized.named_parameters(*_cases())
  def test_matches_reference(self, name, inputs, weights):
    build, reference = BASELINES[name]
    x, w = cases.INPUTS[inputs](), cases.WEIGHTS[weights]()
    result, _ = cases.run(cases.process(name, build), x, w)
    self.assertLessEqual(cases.relative_error(result, reference(x, w)), TOLERANCE)


class NonfiniteClientsTest(parameterized.TestCase):

  @parameterized.named_parameters(*[(name, name) for name in BASELINES])
  def test_nonfinite_clients_are_dropped_and_counted(self, name):
    build, reference = BASELINES[name]
    x, w = cases.random_inputs(7), cases.random_weights()
    poisoned = x.copy()
    poisoned[2, 0], poisoned[5, 3] = np.nan, np.inf
    result, output = cases.run(cases.process(
        ('filtered', name), lambda: NonfiniteFilteringFactory(build())), poisoned, w)
    keep = np.array([i not in (2, 5) for i in range(cases.NUM_CLIENTS)])
    self.assertEqual(output.measurements['num_nonfinite_clients'], 2)
    self.assertTrue(np.all(np.isfinite(result)))
    self.assertLessEqual(
        cases.relative_error(result, reference(x[keep], w[keep])), TOLERANCE)


class CenteredClippingStateTest(tf.test.TestCase):

  def test_previous_aggregate_is_the_next_starting_point(self):
    proc = cases.process('cc_previous', lambda: centered_clipping.CenteredClippingFactory(
        clip_radius=0.5, num_iterations=2, initial_point='previous'))
    x1, x2, w = cases.random_inputs(11), cases.random_inputs(12), cases.random_weights()
    first, output = cases.run(proc, x1, w)
    second, _ = cases.run(proc, x2, w, state=output.state)
    expected_first = np_centered_clipping(x1, w, 0.5, 2, np.zeros(cases.DIMENSION))
    expected_second = np_centered_clipping(x2, w, 0.5, 2, expected_first)
    self.assertLessEqual(cases.relative_error(first, expected_first), TOLERANCE)
    self.assertLessEqual(cases.relative_error(second, expected_second), TOLERANCE)


class InvalidArgumentsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('trim_half', lambda: coordinatewise.TrimmedMeanFactory(0.5), 'trim_fraction'),
      ('trim_negative', lambda: coordinatewise.TrimmedMeanFactory(-0.1),
       'trim_fraction'),
      ('krum_no_f', krum.KrumFactory, 'num_byzantine'),
      ('krum_negative_f', lambda: krum.KrumFactory(num_byzantine=-1), 'num_byzantine'),
      ('krum_zero_selected', lambda: krum.KrumFactory(num_byzantine=1, num_selected=0),
       'num_selected'),
      ('cc_radius', lambda: centered_clipping.CenteredClippingFactory(0.0),
       'clip_radius'),
      ('cc_start', lambda: centered_clipping.CenteredClippingFactory(
          initial_point='origin'), 'initial_point'),
      ('clip_norm', lambda: wrappers.norm_clipping_factory(-1.0), 'clip_norm'),
  )
  def test_bad_argument_is_named(self, build, name):
    with self.assertRaisesRegex(ValueError, name):
      build()

  @parameterized.named_parameters(
      ('trim_string', lambda: coordinatewise.TrimmedMeanFactory('0.1'), 'trim_fraction'),
      ('krum_float_f', lambda: krum.KrumFactory(num_byzantine=1.0), 'num_byzantine'),
      ('krum_float_selected', lambda: krum.KrumFactory(num_byzantine=1, num_selected=2.0),
       'num_selected'),
  )
  def test_argument_of_the_wrong_type_is_named(self, build, name):
    with self.assertRaisesRegex(TypeError, name):
      build()

  def test_too_many_byzantine_clients_fail_at_run_time(self):
    # n = 10 <= 2f + 2 = 10.
    proc = cases.process('krum_f4', lambda: krum.KrumFactory(num_byzantine=4))
    with self.assertRaisesRegex(Exception, 'num_byzantine'):
      cases.run(proc, cases.random_inputs(), cases.equal_weights())


def np_pairwise_squared_distances(x):
  x = np.asarray(x, np.float64)
  return np.array([[0.0 if i == j else np.sum((xi - xj) ** 2)
                    for j, xj in enumerate(x)] for i, xi in enumerate(x)])


class PairwiseSquaredDistancesTest(parameterized.TestCase):
  """Krum's and NNM's distances (Gram matrix, cancelling pairs recomputed from their
  differences) against the plain double loop."""

  @parameterized.product(
      # Blocks of 1 column, of a few columns not dividing p, and wider than p.
      block_values=[1, 100, 1 << 18],
      inputs=['random', 'huge_outlier', 'far_1e10', 'two_far_1e10', 'far_3e38',
              'close_pair_far_away', 'duplicated', 'all_equal', 'infinite_row',
              'infinite_centre'])
  def test_matches_the_double_loop(self, block_values, inputs):
    rng = np.random.default_rng(11)
    x = rng.normal(size=(7, 23)).astype(np.float32)
    if inputs == 'huge_outlier':
      x[3, 4] = 1e6
    elif inputs == 'far_1e10':
      # Honest distances ~1 beside one client 1e10 away.
      x[0] = 1e10
    elif inputs == 'two_far_1e10':
      x[0], x[5] = 1e10, -1e10
    elif inputs == 'far_3e38':
      x[2] = 3e38
    elif inputs == 'close_pair_far_away':
      # Two clients ‖y‖² ~ 2e13 from the centre and 0.6 apart: the Gram distance's
      # rounding (~1e-2) is a percent of it; the pair is recomputed from differences.
      x[0] = 1e6 + x[0] * 1e-3
      x[1] = x[0] + np.float32(0.125) * np.sign(x[1])
    elif inputs == 'duplicated':
      x[1] = x[4] = x[0]
    elif inputs == 'all_equal':
      x[:] = x[0]
    elif inputs == 'infinite_row':
      # E.g. a bucket mean that overflowed: inf − inf in the Gram distances is NaN;
      # from the differences its distances are +inf, as Krum's ranking needs.
      x[3, 5] = np.inf
    elif inputs == 'infinite_centre':
      x[:4, 0] = np.inf  # The median-norm row is infinite: every pair recomputed.
    actual = krum.pairwise_squared_distances(tf.constant(x), block_values).numpy()
    np.testing.assert_allclose(actual, np_pairwise_squared_distances(x), rtol=1e-9,
                               atol=0.0)

  @parameterized.parameters(0, 1)
  def test_no_pairs(self, num_rows):
    actual = krum.pairwise_squared_distances(tf.zeros([num_rows, 5])).numpy()
    np.testing.assert_array_equal(actual, np.zeros([num_rows, num_rows]))


if __name__ == '__main__':
  tf.test.main()
