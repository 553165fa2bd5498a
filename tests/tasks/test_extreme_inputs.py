"""Every aggregator of the registry at the edges of the float32 range, against float64
numpy implementations of its formula; the GM's stopping rule at every scale; and the
default RFA on real EMNIST-linear updates under the paper's corruptions.

What "correct" means here: the aggregator receives float32 client values, so the
reference is its formula evaluated in float64 on exactly those values, and the result
must agree to a relative error of 1e-5 in norm, and be finite. TensorFlow's CPU
kernels flush float32 subnormals (below 2^-126 ≈ 1.18e-38) to zero, on input and on
output: clients all at 1e-40 are read as zeros, and any result below 2^-126 becomes 0.
So the comparison allows 2^-126 per coordinate on top (which only matters for the
clients at 1e-40: there the result must be finite and ~0, never NaN from 0/0). The
weights are example counts (10 to 200), so the plain weighted sum Σ α_i x_i of a client
at 3e38 exceeds the float32 range although the mean does not: aggregators accumulate
means in float64 (`tff_robust.iterative.iterative_mean.Float64MeanFactory`).
"""

import collections
import functools

from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from benchmarks import gm_start_point
from tasks import references
from tasks import registry
from tests.helpers import aggregator_cases as cases
import tff_robust

NUM_CLIENTS = 20
GM_PASSES = 20  # From zero, 11 passes reach the median to 1e-6 on these inputs.
SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)  # TensorFlow flushes below it.
# One far client whose largest coordinate is the scale, or every client at the scale.
FAR_CLIENT = collections.OrderedDict(
    one_at_1e10=1e10, one_at_1e20=1e20, one_at_1e30=1e30, one_at_3e38=3e38)
ALL_TINY = collections.OrderedDict(all_at_1e_30=1e-30, all_at_1e_40=1e-40)
SCALES = collections.OrderedDict(**FAR_CLIENT, **ALL_TINY)


def extreme_inputs(case, seed=0):
  """(float32-exact float64 [20, 9] values, example-count weights)."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(NUM_CLIENTS, cases.DIMENSION))
  weights = rng.integers(10, 201, size=NUM_CLIENTS).astype(np.float64)
  if case in ALL_TINY:
    x *= ALL_TINY[case]
  else:
    # One client whose largest coordinate is the scale (3e38 < float32 max 3.4e38).
    u = rng.normal(size=cases.DIMENSION)
    x[7] = FAR_CLIENT[case] * u / np.abs(u).max()
  return x.astype(np.float32).astype(np.float64), weights


# ---- float64 references of every registry formula (`tasks.references`) ------------

def np_centered_clipping(x, a):
  """At the registry's defaults; the 'previous' start is zero in the first round."""
  return references.centered_clipping(x, a, 1.0, 3, np.zeros(x.shape[1]))


REFERENCES = dict(
    mean=({}, references.weighted_mean),
    gm=(dict(num_communication_passes=GM_PASSES, tolerance=0.0),
        functools.partial(references.geometric_median, passes=GM_PASSES)),
    gathered_gm=(dict(num_communication_passes=GM_PASSES, tolerance=0.0),
                 functools.partial(references.geometric_median, passes=GM_PASSES)),
    one_step_gm=({}, functools.partial(references.geometric_median, passes=1,
                                       start='zero')),
    gamma_mean=({}, references.gamma_mean),
    gamma_mean_diagonal=({}, functools.partial(references.gamma_mean,
                                               covariance='diagonal')),
    # At the registry's default arguments.
    gma=({}, functools.partial(references.gradient_masked_mean, tau=0.4)),
    median=({}, references.coordinate_median),
    trimmed_mean=({}, functools.partial(references.trimmed_mean, trim_fraction=0.1)),
    krum=(dict(num_byzantine=1),
          functools.partial(references.krum, num_byzantine=1, num_selected=1)),
    multi_krum=(dict(num_byzantine=1), functools.partial(
        references.krum, num_byzantine=1, num_selected=NUM_CLIENTS - 1)),
    norm_clipping=({}, functools.partial(references.norm_clipping, clip_norm=1.0)),
    centered_clipping=({}, np_centered_clipping),
    secure_centered_clipping=({}, np_centered_clipping),
)


def _process(name):
  kwargs = REFERENCES[name][0]
  return cases.process(('extreme', name), lambda: registry.aggregator_from_name(
      name, **kwargs))


class EveryAggregatorAtExtremeScalesTest(parameterized.TestCase):

  def test_every_registered_aggregator_has_a_reference(self):
    self.assertCountEqual(registry.known_aggregators(), REFERENCES)

  @parameterized.product(name=list(registry.known_aggregators()), case=list(SCALES))
  def test_matches_float64_formula(self, name, case):
    x, weights = extreme_inputs(case)
    expected = REFERENCES[name][1](x, weights)
    actual, output = cases.run(_process(name), x, weights)
    self.assertTrue(np.all(np.isfinite(expected)))
    self.assertTrue(np.all(np.isfinite(actual)))
    error = np.linalg.norm(actual - expected)
    allowed = 1e-5 * np.linalg.norm(expected) + SMALLEST_NORMAL * np.sqrt(x.shape[1])
    self.assertLessEqual(error, allowed, f'{name} {case}: {actual} vs {expected}')
    self.assertEqual(output.measurements['num_nonfinite_clients'], 0)


class StoppingRuleTest(parameterized.TestCase):

  @parameterized.parameters(*SCALES)
  def test_tolerance_zero_applies_every_pass(self, case):
    x, weights = extreme_inputs(case, seed=1)
    # The registry's GM of `REFERENCES`: GM_PASSES passes at tolerance 0.
    _, output = cases.run(_process('gm'), x, weights)
    self.assertEqual(output.measurements['num_passes_applied'], GM_PASSES)
    self.assertEqual(output.measurements['frozen_at_pass'], 0)

  def test_criterion_is_scale_and_shift_free_and_dominated_by_no_client(self):
    # Same relative gradients for the clients, the clients scaled by 1e20 and shifted:
    # nothing like g_ν's relative improvement, which one far client makes vanish.
    x, weights = extreme_inputs('one_at_1e10', seed=2)
    x[7] /= 1e9  # The far client at 10.
    proc = cases.process(('extreme', 'gm_mean_6'), lambda: tff_robust.GeometricMedianFactory(
        num_communication_passes=6, tolerance=0.0, initial_point='mean'))
    criteria = []
    for scale, shift in ((1.0, 0.0), (1e20, 0.0), (1.0, 3.0)):
      _, output = cases.run(proc, scale * x + shift, weights)
      criteria.append(output.measurements['relative_gradient'])
    # To float32 rounding of the steps (relative to ‖v‖, hence atol).
    np.testing.assert_allclose(criteria[1], criteria[0], rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(criteria[2], criteria[0], rtol=1e-3, atol=1e-6)
    self.assertTrue(np.all((criteria[0] > 0) & (criteria[0] <= 1)))

  def test_default_tolerance_freezes_only_at_the_median(self):
    # With one client at 1e30, the paper's relative-objective rule froze after 2
    # passes 3e-3 off even at tolerance 0; the relative gradient keeps going.
    x, weights = extreme_inputs('one_at_1e30', seed=3)
    proc = cases.process(('extreme', 'gm_default_20'), lambda: (
        tff_robust.GeometricMedianFactory(num_communication_passes=GM_PASSES)))
    actual, output = cases.run(proc, x, weights)
    expected = references.geometric_median(x, weights, GM_PASSES)
    self.assertLessEqual(np.linalg.norm(actual - expected), 1e-5 * np.linalg.norm(expected))
    frozen_at = int(output.measurements['frozen_at_pass'])
    # The trimmed start's Weiszfeld steps (and relative gradients) begin at pass 3.
    gradients = output.measurements['relative_gradient']
    self.assertBetween(frozen_at, 4, GM_PASSES)
    self.assertEqual(output.measurements['num_passes_applied'], frozen_at)
    self.assertLessEqual(gradients[frozen_at - 3], 1e-6)
    self.assertTrue(np.all(gradients[:frozen_at - 3] > 1e-6))


REAL_VALUE_TYPE = tff.types.to_type(collections.OrderedDict(
    kernel=tff.TensorType(np.float32, [gm_start_point.PIXELS, gm_start_point.NUM_CLASSES]),
    bias=tff.TensorType(np.float32, [gm_start_point.NUM_CLASSES])))


_REAL_PROCESSES = {}


class RealUpdatesTest(parameterized.TestCase):
  """Real EMNIST-linear updates (bundled digits, 5 local SGD steps per client; see
  `benchmarks/gm_start_point.py`), 5 of 20 clients corrupted."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.updates, cls.alphas = gm_start_point.real_updates(seed=0)

  def _result(self, attack, factory_key, build_factory):
    """(the factory's result, the exact median) on the attacked round (float64)."""
    points = gm_start_point.corrupt(self.updates, self.alphas, attack, seed=0)
    points = points.astype(np.float32).astype(np.float64)
    v_star = gm_start_point.geometric_median(points, self.alphas)
    process = _REAL_PROCESSES.get(factory_key)
    if process is None:  # Created once per factory, for every attack.
      process = _REAL_PROCESSES[factory_key] = build_factory().create(
          REAL_VALUE_TYPE, tff.TensorType(np.float32))
    values = [collections.OrderedDict(
        kernel=p[:-10].reshape(784, 10).astype(np.float32),
        bias=p[-10:].astype(np.float32)) for p in points]
    output = process.next(process.initialize(), values,
                          [np.float32(a) for a in self.alphas])
    result = np.concatenate([np.ravel(output.result['kernel']),
                             np.ravel(output.result['bias'])])
    return result, v_star

  def _relative_distance(self, attack, factory_key, build_factory):
    result, v_star = self._result(attack, factory_key, build_factory)
    return np.linalg.norm(result - v_star) / np.linalg.norm(v_star)

  @parameterized.parameters('omniscient', 'x1000')
  def test_default_rfa_is_nearer_the_honest_mean_than_the_median(self, attack):
    # The median itself is pulled by the corrupted clients; the trimmed start is not.
    honest = ~gm_start_point.corrupted_clients(len(self.alphas), seed=0)
    honest_mean = np.average(self.updates[honest], axis=0, weights=self.alphas[honest])
    result, v_star = self._result(attack, 'default', tff_robust.GeometricMedianFactory)
    self.assertLess(np.linalg.norm(result - honest_mean),
                    0.5 * np.linalg.norm(v_star - honest_mean))

  @parameterized.parameters('omniscient', 'x1000')
  def test_three_passes_from_zero_are_within_2_percent_of_the_median(self, attack):
    self.assertLess(self._relative_distance(
        attack, 'zero_start',
        lambda: tff_robust.GeometricMedianFactory(initial_point='zero')), 0.02)

  def test_the_papers_mean_start_is_not(self):
    # What the default start buys: 3 passes from the weighted mean stay far away.
    self.assertGreater(self._relative_distance(
        'x1000', 'mean_start',
        lambda: tff_robust.GeometricMedianFactory(initial_point='mean')), 1.0)


if __name__ == '__main__':
  tf.test.main()
