"""Adaptive robust clipping (Allouah et al. 2024, ByzFL's ARC) around any aggregator,
against plain numpy: every update clipped to the (k+1)-th largest norm,
k = ⌊2f(n − f)/n⌋, then the inner rule; what the server learns (one norm per client,
by the compiled-computation walk); by name; inside TFF's FedAvg builder."""

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from baselines import arc
from baselines import coordinatewise
from baselines import krum
from tasks import references
from tasks import registry
from tests.helpers import aggregator_cases as cases
from tests.helpers import least_squares as ls
from tests.tff_robust.aggregators import test_privacy as privacy
import tff_robust
from tff_robust.distributed import passwise
from tff_robust.iterative import iterative_mean


def np_arc(x, f):
  """`tasks.references.arc_clipped_rows`: the clipped rows (float64), the threshold
  and the number of rows clipped."""
  trace = {}
  clipped = references.arc_clipped_rows(np.asarray(x, np.float64), f, trace)
  return clipped, trace['threshold'], trace['num_clipped']


def byzfl_num_clipped(n, f):
  """ByzFL's expression (byzfl/aggregators/preaggregators.py, ARC.__call__)."""
  return int((2 * f / n) * (n - f))


def arc_process(key, inner, **kwargs):
  return cases.process(('arc', key, tuple(sorted(kwargs.items()))),
                       lambda: arc.AdaptiveRobustClippingFactory(inner(), **kwargs))


def huge_norm_attackers(magnitude):
  """Three clients far away (float32-exact), the rest N(0, 1)."""
  x = cases.random_inputs(8)
  x[[1, 4, 8]] = magnitude * np.sign(x[[1, 4, 8]])
  return x.astype(np.float32).astype(np.float64)


class ClippedUpdatesTest(parameterized.TestCase):

  @parameterized.named_parameters(
      *[dict(c, testcase_name=f'median_f{f}_{c["testcase_name"]}', f=f)
        for f in (0, 2, 4) for c in cases.input_cases()])
  def test_median_of_clipped_updates(self, f, inputs, weights):
    x, w = cases.INPUTS[inputs](), cases.WEIGHTS[weights]()
    process = arc_process('median', coordinatewise.CoordinateWiseMedianFactory,
                          num_byzantine=f)
    result, output = cases.run(process, x, w)
    clipped, threshold, num_clipped = np_arc(x, f)
    np.testing.assert_allclose(result, np.median(clipped, axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(output.measurements['clipping_threshold'], threshold,
                               rtol=1e-6)
    self.assertEqual(output.measurements['num_clipped'], num_clipped)
    self.assertEqual(output.measurements['num_clients'], len(x))

  @parameterized.named_parameters(*cases.input_cases())
  def test_weighted_mean_of_clipped_updates(self, inputs, weights):
    # Around a secure-compatible aggregator: the clients' weights reach the inner mean.
    x, w = cases.INPUTS[inputs](), cases.WEIGHTS[weights]()
    process = arc_process('mean', iterative_mean.Float64MeanFactory, num_byzantine=3)
    result, _ = cases.run(process, x, w)
    clipped, _, _ = np_arc(x, 3)
    np.testing.assert_allclose(result, np.average(clipped, axis=0, weights=w),
                               rtol=1e-5, atol=1e-6)

  @parameterized.named_parameters(*cases.input_cases(weights=('weighted',)))
  def test_multi_krum_of_clipped_updates(self, inputs, weights):
    x, w = cases.INPUTS[inputs](), cases.WEIGHTS[weights]()
    process = arc_process('multi_krum', lambda: krum.KrumFactory(
        num_byzantine=2, num_selected=None), byzantine_fraction=0.2)
    result, _ = cases.run(process, x, w)
    np.testing.assert_allclose(
        result, references.krum(np_arc(x, 2)[0], np.asarray(w, np.float64), 2, None),
        rtol=1e-5, atol=1e-5)

  @parameterized.parameters(1e10, 1e30, 3e38)
  def test_huge_norm_attackers_are_clipped_to_the_honest_scale(self, magnitude):
    # k = ⌊2·3·7/10⌋ = 4: the three attackers and the largest honest update are
    # clipped to the fifth largest norm. A scale of ~1e-38 multiplies in float64.
    x, w = huge_norm_attackers(magnitude), cases.random_weights()
    process = arc_process('mean', iterative_mean.Float64MeanFactory, num_byzantine=3)
    result, output = cases.run(process, x, w)
    clipped, threshold, _ = np_arc(x, 3)
    self.assertLess(threshold, 10.0)
    self.assertTrue(np.all(np.isfinite(result)))
    np.testing.assert_allclose(result, np.average(clipped, axis=0, weights=w),
                               rtol=1e-5, atol=1e-6)
    self.assertEqual(output.measurements['num_clipped'], 4)

  def test_zero_weight_clients_take_no_part_in_the_order_statistic(self):
    # A client of weight 0 (as NonfiniteFilteringFactory leaves a dropped one) is not
    # counted in n: f = ⌊0.25·8⌋ = 2 over the 8 others, k = ⌊2·2·6/8⌋ = 3.
    x, w = cases.random_inputs(9), cases.random_weights()
    x[[0, 6]] *= 1e3
    w[[0, 6]] = 0.0
    process = arc_process('median', coordinatewise.CoordinateWiseMedianFactory,
                          byzantine_fraction=0.25)
    result, output = cases.run(process, x, w)
    kept = w > 0
    clipped, threshold, num_clipped = np_arc(x[kept], 2)
    self.assertEqual(num_clipped, 3)
    np.testing.assert_allclose(result, np.median(clipped, axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(output.measurements['clipping_threshold'], threshold,
                               rtol=1e-6)
    self.assertEqual(output.measurements['num_clipped'], num_clipped)

  def test_too_many_byzantine_clients_fail_at_run_time(self):
    process = arc_process('median', coordinatewise.CoordinateWiseMedianFactory,
                          num_byzantine=10)
    with self.assertRaisesRegex(Exception, 'num_byzantine'):
      cases.run(process, cases.random_inputs(), cases.equal_weights())


class NumClippedTest(tf.test.TestCase):

  def test_matches_byzfl_formula_up_to_its_float_rounding(self):
    pairs = [(n, f) for n in range(1, 260) for f in range(0, (n + 1) // 2)]
    ours = arc.num_clipped_updates([n for n, _ in pairs], [f for _, f in pairs]).numpy()
    exact = [2 * f * (n - f) // n for n, f in pairs]
    self.assertAllEqual(ours, exact)
    differ = [(n, f) for (n, f), k in zip(pairs, exact) if byzfl_num_clipped(n, f) != k]
    # ByzFL's float expression lands just below the integer in a few cases only.
    self.assertIn((242, 33), differ)
    self.assertLess(len(differ), len(pairs) // 100)
    self.assertEqual(ours[pairs.index((25, 5))], 8)


class CompositionTest(parameterized.TestCase):

  def test_composes_by_name_through_the_registry(self):
    factory = registry.aggregator_from_name(
        'arc+krum', wrapper_args={'arc': {'num_byzantine': 2}}, num_byzantine=2)
    x, w = cases.clustered_attack_inputs(), cases.random_weights()
    x[5, 0] = np.nan  # Dropped by the outermost filter: n = 9 for ARC and Krum.
    process = factory.create(cases.VALUE_TYPE, cases.WEIGHT_TYPE)
    result, output = cases.run(process, x, w)
    kept = np.arange(len(x)) != 5
    np.testing.assert_allclose(
        result, references.krum(np_arc(x[kept], 2)[0], w[kept], 2, 1), rtol=1e-5,
        atol=1e-5)
    self.assertEqual(output.measurements['num_nonfinite_clients'], 1)
    self.assertIn('arc', registry.known_wrappers())
    self.assertFalse(registry.is_secure_compatible(factory))

  def test_wraps_the_geometric_median(self):
    x, w = huge_norm_attackers(1e6), cases.random_weights()
    process = arc_process('one_step_gm', tff_robust.one_step_geometric_median_factory,
                          num_byzantine=3)
    result, output = cases.run(process, x, w)
    clipped, _, _ = np_arc(x, 3)
    beta = w / np.maximum(1e-6, np.linalg.norm(clipped, axis=1))
    np.testing.assert_allclose(result, beta @ clipped / beta.sum(), rtol=1e-5)
    self.assertIn('num_secure_average_calls', output.measurements)

  def test_arc_of_the_gm_runs_pass_by_pass_as_its_fused_process(self):
    # ARC is a transformer of its inner aggregate's steps: on workers (one
    # computation per pass) it is the same aggregate, with nothing to unwrap.
    factory = registry.aggregator_from_name(
        'arc+gm', wrapper_args={'arc': {'num_byzantine': 2}})
    x, w = huge_norm_attackers(1e6), cases.random_weights()
    fused, fused_output = cases.run(
        factory.create(cases.VALUE_TYPE, cases.WEIGHT_TYPE), x, w)
    process = passwise.PasswiseFactory(factory).create(cases.VALUE_TYPE,
                                                        cases.WEIGHT_TYPE)
    self.assertGreater(process.computations_per_call, 3)
    result, output = cases.run(process, x, w)
    np.testing.assert_allclose(result, fused, rtol=1e-6)
    self.assertEqual(list(output.measurements), list(fused_output.measurements))

  @parameterized.named_parameters(
      ('not_a_factory', lambda: arc.AdaptiveRobustClippingFactory(
          'median', num_byzantine=1), TypeError, 'WeightedAggregationFactory'),
      ('neither', lambda: arc.AdaptiveRobustClippingFactory(
          coordinatewise.CoordinateWiseMedianFactory()), ValueError,
       'exactly one of num_byzantine'),
      ('both', lambda: arc.AdaptiveRobustClippingFactory(
          coordinatewise.CoordinateWiseMedianFactory(), num_byzantine=1,
          byzantine_fraction=0.1), ValueError, 'exactly one of num_byzantine'),
      ('negative', lambda: arc.AdaptiveRobustClippingFactory(
          coordinatewise.CoordinateWiseMedianFactory(), num_byzantine=-1), ValueError,
       'num_byzantine must be'),
      ('fraction', lambda: arc.AdaptiveRobustClippingFactory(
          coordinatewise.CoordinateWiseMedianFactory(), byzantine_fraction=0.5),
       ValueError, 'byzantine_fraction'))
  def test_bad_arguments_are_named(self, build, error, message):
    with self.assertRaisesRegex(error, message):
      build()


class WhatTheServerLearnsTest(tf.test.TestCase):
  """The compiled `next` of ARC around the geometric median with a secure inner mean:
  every model-sized value leaves the clients through secure sums only; the one other
  CLIENTS → SERVER intrinsic is the aggregate of one norm (and weight) per client."""

  def test_one_norm_per_client_and_secure_sums_only(self):
    factory = arc.AdaptiveRobustClippingFactory(
        tff_robust.GeometricMedianFactory(inner_mean_factory=privacy.secure_mean(),
                                          report_max_effective_weight=False),
        num_byzantine=1)
    intrinsics = privacy.client_to_server_intrinsics(cases.built_in_the_test_context(
        lambda: factory.create(privacy.VALUE_TYPE, privacy.WEIGHT_TYPE)).next)
    not_sums = [(uri, member) for uri, member in intrinsics if uri not in privacy.SUMS]
    self.assertEqual([uri for uri, _ in not_sums], ['federated_aggregate'])
    self.assertEqual(not_sums[0][1], tff.StructType([np.float64, np.float32]))
    for uri, member in intrinsics:
      if not privacy.only_scalars(member):
        self.assertIn(uri, privacy.SECURE_SUMS, f'{uri} moves {member}')


class SecureInnerMeanTest(cases.SecureSumContextMixin, tf.test.TestCase):

  def test_runs_around_a_secure_geometric_median(self):
    # In TFF's test context (secure sums run as plain sums): the result is the plain
    # one up to SecureSumFactory's 32-bit quantisation over [-1e4, 1e4].
    x, w = huge_norm_attackers(1e6), cases.random_weights()

    def run(inner):
      process = arc.AdaptiveRobustClippingFactory(
          tff_robust.GeometricMedianFactory(inner_mean_factory=inner),
          num_byzantine=3).create(cases.VALUE_TYPE, cases.WEIGHT_TYPE)
      return cases.run(process, x, w)[0]

    np.testing.assert_allclose(run(privacy.secure_mean()), run(None), atol=1e-3)


@pytest.mark.slow  # Trains end to end: a round of TFF's FedAvg builder.
class FedAvgBuilderTest(tf.test.TestCase):

  def test_one_round_of_arc_krum_in_build_weighted_fed_avg(self):
    # Five clients, one with labels ×100 (a huge update). ARC (f = 1, k = 1) clips it
    # to the second largest norm, Krum (f = 1) picks one clipped update; the model
    # moves by it. Client deltas from plain numpy gradient descent.
    trained, deltas, start, metrics = ls.one_round_with_a_huge_client(
        registry.aggregator_from_name(
            'arc+krum', wrapper_args={'arc': {'num_byzantine': 1}}, num_byzantine=1),
        seed=4)
    clipped, _, num_clipped = np_arc(deltas, 1)
    self.assertEqual(num_clipped, 1)
    ls.assert_moved_by(self, trained, start,
                       references.krum(clipped, np.ones(5), 1, 1))
    self.assertEqual(metrics['num_clipped'], 1)


if __name__ == '__main__':
  tf.test.main()
