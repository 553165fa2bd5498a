"""tff_robust.aggregators.robust_scale against its definition, on hand-made histograms."""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tff_robust.aggregators import robust_scale


def scale_of(distances, weights, float64=False):
  statistics = tf.add_n([robust_scale.client_statistics(np.float64(d), w, float64)
                         for d, w in zip(distances, weights)])
  return float(robust_scale.scale_from_statistics(statistics))


class RobustScaleTest(parameterized.TestCase):

  def test_geometric_mean_of_the_distances_near_the_median(self):
    # Median bucket ⌊log2 3⌋ = 1; 1e6 (bucket 19) and 1e-6 (bucket −20) are outside.
    distances = [1e-6, 2.0, 3.0, 5.0, 1e6]
    expected = np.exp(np.mean(np.log([2.0, 3.0, 5.0])))
    self.assertAlmostEqual(scale_of(distances, [1.0] * 5), expected, places=10)

  def test_weights_count_as_multiplicities(self):
    self.assertAlmostEqual(scale_of([2.0, 6.0], [3.0, 1.0]),
                           np.exp((3 * np.log(2.0) + np.log(6.0)) / 4), places=10)

  def test_the_window_is_around_the_weighted_lower_tercile(self):
    # Exactly a third of the weight at 1 (bucket 0), the rest at 1e9 (bucket 29): the
    # tercile is the near third, and the far two thirds are outside its window.
    self.assertAlmostEqual(scale_of([1.0, 1e9], [1.0, 2.0]), 1.0, places=10)
    # A little more than two thirds far away is needed to move it there.
    self.assertAlmostEqual(scale_of([1.0, 1e9], [1.0, 2.01]), 1e9, delta=1.0)

  @parameterized.parameters((1e-3, 0.33), (1e6, 0.66))
  def test_a_group_on_one_side_does_not_move_it(self, factor, fraction):
    # Weight `fraction` at `factor` × the honest distances 2 and 3.
    honest = [2.0, 3.0] * 50
    group = int(round(fraction / (1.0 - fraction) * len(honest)))
    distances = honest + [factor * 2.5] * group
    self.assertAlmostEqual(scale_of(distances, [1.0] * len(distances)),
                           np.sqrt(6.0), places=8)

  @parameterized.parameters(([0.0, 0.0], 0.0), ([0.0, np.inf, np.nan, 4.0], 4.0))
  def test_zero_and_nonfinite_distances_are_not_counted(self, distances, expected):
    self.assertAlmostEqual(scale_of(distances, [1.0] * len(distances)), expected)

  def test_no_positive_distance_gives_the_floor_one(self):
    statistics = robust_scale.client_statistics(0.0, 1.0)
    self.assertEqual(float(robust_scale.relative_floor(statistics, 0.2)), 1.0)

  @parameterized.parameters((False, 1e-60, 1e60), (True, 1e-300, 1e300))
  def test_distances_beyond_the_range_share_the_edge_buckets(self, float64, low, high):
    # float32-model buckets end at 2^±160: 1e-60 and 1e-50 share the lowest one.
    lowest, size = robust_scale.buckets(float64)
    statistics = robust_scale.client_statistics(np.float64(low), 1.0, float64)
    self.assertEqual(int(np.argmax(statistics[0].numpy())),
                     0 if np.log2(low) < lowest else int(np.floor(np.log2(low))) - lowest)
    self.assertEqual(statistics.shape, (2, size))
    self.assertAlmostEqual(scale_of([high], [1.0], float64), high, delta=high * 1e-9)


if __name__ == '__main__':
  import absl.testing.absltest  # pylint: disable=g-import-not-at-top
  absl.testing.absltest.main()
