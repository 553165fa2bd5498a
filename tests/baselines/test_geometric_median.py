"""The gathering geometric median (RFA's smoothed Weiszfeld at the server) against the
numpy Weiszfeld of `tasks.references` and against the secure `tff_robust.GeometricMedianFactory`
on the same inputs; by name inside bucketing and NNM."""

from absl.testing import parameterized
import numpy as np

from baselines import bucketing
from baselines import geometric_median
from baselines import nnm
from tasks import references
from tasks import registry
from tests.helpers import aggregator_cases as cases
import tff_robust

NU = 1e-6
PASSES = 5


def np_weiszfeld(x, a, passes=PASSES, nu=NU, tolerance=0.0, start='zero', v0=None):
  """RFA Algorithm 2 in float64 with the package's starts and freezing rule
  (`tasks.references.geometric_median`, absolute ν): (estimate, its trace). The
  'previous' start is a Weiszfeld step from `v0` (from 0 when None)."""
  if start == 'previous':
    start = 'zero' if v0 is None else v0
  trace = {}
  estimate = references.geometric_median(x, a, passes, nu=nu, tolerance=tolerance,
                                         start=start, trace=trace)
  return estimate, trace


def _gathered(passes=PASSES, tolerance=0.0, initial_point='zero'):
  return cases.process(
      ('gathered_gm', passes, tolerance, initial_point),
      lambda: geometric_median.GatheredGeometricMedianFactory(
          passes, nu=NU, tolerance=tolerance, initial_point=initial_point))


def _secure(passes=PASSES, tolerance=0.0, initial_point='zero'):
  return cases.process(
      ('secure_gm', passes, tolerance, initial_point),
      lambda: tff_robust.GeometricMedianFactory(
          passes, nu=NU, tolerance=tolerance, initial_point=initial_point))


def far_outlier_inputs(seed=8):
  x = cases.random_inputs(seed)
  x[5] = 1e30
  return x


def zero_weights(seed=9):
  w = cases.random_weights(seed)
  w[[1, 4]] = 0.0
  return w


INPUTS = dict(cases.INPUTS, far_outlier_1e30=far_outlier_inputs)
WEIGHTS = dict(cases.WEIGHTS, some_zero=zero_weights)
CASES = [dict(testcase_name=f'{i}_{w}', inputs=i, weights=w)
         for i in INPUTS for w in WEIGHTS]


class GatheredGeometricMedianTest(parameterized.TestCase):

  @parameterized.named_parameters(
      *[dict(c, testcase_name=f'{start}_{c["testcase_name"]}', start=start)
        for start in ('zero', 'mean') for c in CASES])
  def test_matches_numpy_weiszfeld_and_the_secure_factory(self, start, inputs,
                                                          weights):
    x, w = INPUTS[inputs](), WEIGHTS[weights]()
    expected, expected_measurements = np_weiszfeld(x, w, start=start)
    actual, output = cases.run(_gathered(initial_point=start), x, w)
    secure, _ = cases.run(_secure(initial_point=start), x, w)
    scale = max(np.linalg.norm(expected), 1.0)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(actual, secure, rtol=1e-5, atol=1e-5 * scale)
    measurements = output.measurements
    self.assertEqual(measurements['num_clients'], np.count_nonzero(w))
    self.assertEqual(measurements['num_passes_applied'], PASSES)
    self.assertEqual(measurements['frozen_at_pass'], 0)
    np.testing.assert_allclose(measurements['objective'],
                               expected_measurements['objective'], rtol=1e-5)
    np.testing.assert_allclose(measurements['relative_gradient'],
                               expected_measurements['relative_gradient'], rtol=1e-4,
                               atol=1e-7)

  def test_far_outlier_does_not_move_the_median(self):
    # The median of the honest clients' region, not anywhere near 1e30.
    x = far_outlier_inputs()
    actual, _ = cases.run(_gathered(passes=20), x, cases.equal_weights())
    self.assertLess(np.abs(actual).max(), 10.0)

  def test_tolerance_freezes_as_the_secure_factory_does(self):
    # Two clients on the same point: the relative gradient falls below 1e-3 within a
    # few passes and the estimate freezes. (With half the clients on one point, as in
    # `ties`, the ν-smoothed steps approach it slowly and 10 passes never freeze.)
    x, w = cases.random_inputs(), cases.equal_weights()
    x[1] = x[0]
    expected, expected_measurements = np_weiszfeld(x, w, passes=10, tolerance=1e-3)
    actual, output = cases.run(_gathered(passes=10, tolerance=1e-3), x, w)
    secure, secure_output = cases.run(_secure(passes=10, tolerance=1e-3), x, w)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(actual, secure, rtol=1e-5, atol=1e-5)
    frozen_at = expected_measurements['frozen_at_pass']
    self.assertBetween(frozen_at, 2, 9)
    for name in ('frozen_at_pass', 'num_passes_applied'):
      self.assertEqual(output.measurements[name], expected_measurements[name])
      self.assertEqual(output.measurements[name], secure_output.measurements[name])

  def test_warm_start_carries_the_previous_result(self):
    process, secure = _gathered(initial_point='previous'), _secure(
        initial_point='previous')
    state, secure_state, previous = process.initialize(), secure.initialize(), None
    for seed in (10, 11):
      x, w = cases.random_inputs(seed), cases.random_weights(seed)
      expected, _ = np_weiszfeld(x, w, start='previous', v0=previous)
      actual, output = cases.run(process, x, w, state)
      secure_result, secure_output = cases.run(secure, x, w, secure_state)
      np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
      np.testing.assert_allclose(actual, secure_result, rtol=1e-5, atol=1e-5)
      state, secure_state, previous = output.state, secure_output.state, expected

  def test_all_zero_weights_give_zero(self):
    actual, output = cases.run(_gathered(), cases.random_inputs(),
                               np.zeros(cases.NUM_CLIENTS))
    np.testing.assert_array_equal(actual, np.zeros(cases.DIMENSION))
    self.assertEqual(output.measurements['num_clients'], 0)

  @parameterized.named_parameters(
      ('passes', dict(num_communication_passes=0), 'num_communication_passes'),
      ('nu', dict(nu=0.0), 'nu'),
      ('tolerance', dict(nu=1e-6, tolerance=1.0), 'tolerance'),
      ('original_rfa_tolerance', dict(tolerance=1e-4), 'without nu'),
      ('start', dict(initial_point='median'), 'initial_point'))
  def test_bad_arguments_are_named(self, kwargs, message):
    with self.assertRaisesRegex(ValueError, message):
      geometric_median.GatheredGeometricMedianFactory(**kwargs)

  @parameterized.named_parameters(
      ('bool_tolerance', dict(nu=1e-6, tolerance=False)),
      # A type error first, not the "without nu" reading of a positive tolerance.
      ('string_tolerance_without_nu', dict(tolerance='1e-6')))
  def test_tolerance_of_the_wrong_type(self, kwargs):
    with self.assertRaisesRegex(TypeError, 'tolerance must be a number'):
      geometric_median.GatheredGeometricMedianFactory(**kwargs)

  def test_numpy_tolerance_is_accepted(self):
    geometric_median.GatheredGeometricMedianFactory(nu=1e-6, tolerance=np.float32(1e-5))


class WrappedByNameTest(parameterized.TestCase):

  def test_bucketing_gm_is_bucketing_around_the_gathered_median(self):
    factory = registry.aggregator_from_name(
        'bucketing+gm', wrapper_args={'bucketing': {'bucket_size': 2, 'seed': 3}},
        num_communication_passes=PASSES, nu=NU, tolerance=0.0)
    self.assertIsInstance(factory.inner, bucketing.BucketingFactory)
    self.assertIsInstance(factory.inner.inner,
                          geometric_median.GatheredGeometricMedianFactory)
    self.assertFalse(registry.is_secure_compatible(factory.inner))
    x, w = cases.clustered_attack_inputs(), cases.random_weights()
    actual, output = cases.run(factory.create(cases.VALUE_TYPE, cases.WEIGHT_TYPE), x,
                               w)
    order = bucketing.bucket_order(len(x), 3, 0).numpy()
    x, w = x[order], np.asarray(w, np.float64)[order]
    means = np.stack([w[i:i + 2] @ x[i:i + 2] / w[i:i + 2].sum()
                      for i in range(0, len(x), 2)])
    totals = np.array([w[i:i + 2].sum() for i in range(0, len(x), 2)])
    np.testing.assert_allclose(actual, np_weiszfeld(means, totals, start='trimmed')[0],
                               rtol=1e-5,
                               atol=1e-5)
    self.assertEqual(output.measurements['num_buckets'], 5)

  def test_nnm_gm_mixes_then_takes_the_gathered_median(self):
    factory = registry.aggregator_from_name(
        'nnm+gm', wrapper_args={'nnm': {'num_byzantine': 2}}, tolerance=0.0)
    self.assertIsInstance(factory.inner, nnm.NearestNeighborMixingFactory)
    self.assertIsInstance(factory.inner.inner,
                          geometric_median.GatheredGeometricMedianFactory)
    x, w = cases.clustered_attack_inputs(), cases.random_weights()
    actual, _ = cases.run(factory.create(cases.VALUE_TYPE, cases.WEIGHT_TYPE), x, w)
    n = len(x)
    mixed = np.stack([
        x[np.argsort(((x - x[i]) ** 2).sum(axis=1), kind='stable')[:n - 2]].mean(axis=0)
        for i in range(n)])
    np.testing.assert_allclose(actual,
                               np_weiszfeld(mixed, w, passes=3, start='trimmed')[0],
                               rtol=1e-5,
                               atol=1e-5)

  def test_gm_stays_secure_outside_gathering_wrappers(self):
    self.assertIsInstance(registry.aggregator_from_name('gm').inner,
                          tff_robust.GeometricMedianFactory)
    # ARC wraps any aggregator: its inner GM stays the secure one.
    arc_inner = registry.aggregator_from_name('arc+gm').inner._inner  # pylint: disable=protected-access
    self.assertIsInstance(arc_inner, tff_robust.GeometricMedianFactory)
