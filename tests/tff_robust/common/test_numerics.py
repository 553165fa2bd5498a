"""Norms and finiteness over model structures, against numpy."""

import collections

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tff_robust.common import numerics


def structure(scale, seed=0):
  rng = np.random.default_rng(seed)
  return collections.OrderedDict(
      kernel=(scale * rng.normal(size=(30, 20))).astype(np.float32),
      bias=(scale * rng.normal(size=20)).astype(np.float32))


def numpy_norm(s):
  return np.linalg.norm(np.concatenate([np.ravel(v).astype(np.float64) for v in s.values()]))


class GlobalNormTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(1e-36, 1e-30, 1e-20, 1e-3, 1.0, 1e3, 1e19, 1e30)
  def test_matches_numpy_at_every_scale(self, scale):
    # From 1e19 on, float32 squares overflow: the rescaled path must take over.
    s = structure(scale)
    self.assertAllClose(numerics.global_l2_norm(s), numpy_norm(s), rtol=1e-5)

  def test_nan_stays_nan(self):
    s = structure(1.0)
    s['bias'][3] = np.nan
    self.assertTrue(np.isnan(numerics.global_l2_norm(s)))

  @parameterized.parameters(1e-30, 1e-3, 1.0, 1e30)
  def test_distance_matches_numpy(self, scale):
    a, b = structure(scale, seed=1), structure(scale, seed=2)
    expected = numpy_norm(collections.OrderedDict(
        (k, a[k].astype(np.float64) - b[k]) for k in a))
    self.assertAllClose(numerics.global_l2_distance(a, b), expected, rtol=1e-5)

  def test_nonfinite_client_is_dropped_and_zeroed(self):
    s = structure(1.0)
    weight, dropped = numerics.weight_if_usable(s, 2.0)
    self.assertEqual((float(weight), int(dropped)), (2.0, 0))
    self.assertAllEqual(numerics.zeros_if_dropped(s, dropped)['kernel'], s['kernel'])
    s['kernel'][0, 0] = np.inf
    weight, dropped = numerics.weight_if_usable(s, 2.0)
    self.assertEqual((float(weight), int(dropped)), (0.0, 1))
    self.assertAllEqual(numerics.zeros_if_dropped(s, dropped)['kernel'],
                        np.zeros_like(s['kernel']))


if __name__ == '__main__':
  tf.test.main()
