"""Nearest-neighbour mixing (Allouah et al. 2023) around the gathering baselines,
against plain numpy: each update replaced by the mean of its n − f nearest updates,
then the inner rule; by name through the registry; inside TFF's FedAvg builder."""

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

from baselines import centered_clipping
from baselines import coordinatewise
from baselines import krum
from baselines import nnm
from tasks import registry
from tests.baselines import test_baselines as references
from tests.helpers import aggregator_cases as cases
from tests.helpers import least_squares as ls
from tff_robust.aggregators import geometric_median


def np_nnm(x, f):
  """Row i → the mean of the n − f rows nearest to it (itself included; ties to the
  lower index), distances as plain sums of squared differences."""
  n = len(x)
  mixed = []
  for i in range(n):
    distances = np.array([np.sum((x[i] - x[j]) ** 2) for j in range(n)])
    nearest = np.argsort(distances, kind='stable')[:n - f]
    mixed.append(x[nearest].mean(axis=0))
  return np.stack(mixed)


class NearestNeighborMixingTest(parameterized.TestCase):

  @parameterized.named_parameters(
      *[dict(c, testcase_name=f'median_f{f}_{c["testcase_name"]}', f=f)
        for f in (0, 2, 4) for c in cases.input_cases()])
  def test_median_of_mixed_updates(self, f, inputs, weights):
    x, w = cases.INPUTS[inputs](), cases.WEIGHTS[weights]()
    process = cases.process(('nnm_median', f), lambda: nnm.NearestNeighborMixingFactory(
        coordinatewise.CoordinateWiseMedianFactory(), num_byzantine=f))
    result, output = cases.run(process, x, w)
    np.testing.assert_allclose(result, np.median(np_nnm(x, f), axis=0), rtol=1e-5,
                               atol=1e-5)
    self.assertEqual(output.measurements['num_neighbors'], len(x) - f)

  @parameterized.named_parameters(*cases.input_cases(weights=('weighted',)))
  def test_multi_krum_sees_mixed_updates_with_the_clients_weights(self, inputs, weights):
    x, w = cases.INPUTS[inputs](), cases.WEIGHTS[weights]()
    process = cases.process('nnm_multi_krum', lambda: nnm.NearestNeighborMixingFactory(
        krum.KrumFactory(num_byzantine=2, num_selected=None), byzantine_fraction=0.2))
    result, _ = cases.run(process, x, w)
    np.testing.assert_allclose(
        result, references.np_krum(np_nnm(x, 2), np.asarray(w, np.float64), 2, None),
        rtol=1e-5, atol=1e-5)

  def test_exact_distances_beside_a_huge_update(self):
    # One update 1e10 away: through a Gram matrix the honest distances would cancel
    # and the neighbours be arbitrary; from differences they are exact.
    x = cases.random_inputs(4)
    x[0] = 1e10
    process = cases.process(('nnm_median', 1), lambda: nnm.NearestNeighborMixingFactory(
        coordinatewise.CoordinateWiseMedianFactory(), num_byzantine=1))
    result, _ = cases.run(process, x, cases.equal_weights())
    np.testing.assert_allclose(result, np.median(np_nnm(x, 1), axis=0), rtol=1e-5,
                               atol=1e-5)

  def test_centered_clipping_state_passes_through(self):
    # 'previous' keeps the last aggregate in the inner state: round 2 starts there.
    process = cases.process('nnm_cc', lambda: nnm.NearestNeighborMixingFactory(
        centered_clipping.CenteredClippingFactory(clip_radius=1.0, num_iterations=3,
                                                  initial_point='previous'),
        num_byzantine=3))
    state, start = process.initialize(), np.zeros(cases.DIMENSION)
    for seed in (6, 7):
      x, w = cases.random_inputs(seed), cases.random_weights()
      result, output = cases.run(process, x, w, state)
      start = references.np_centered_clipping(np_nnm(x, 3), w, 1.0, 3, start)
      np.testing.assert_allclose(result, start, rtol=1e-5, atol=1e-5)
      state = output.state

  def test_composes_by_name_through_the_registry(self):
    factory = registry.aggregator_from_name(
        'nnm+median', wrapper_args={'nnm': {'num_byzantine': 3}})
    x, w = cases.clustered_attack_inputs(), cases.random_weights()
    process = factory.create(cases.VALUE_TYPE, cases.WEIGHT_TYPE)
    result, output = cases.run(process, x, w)
    np.testing.assert_allclose(result, np.median(np_nnm(x, 3), axis=0), rtol=1e-5,
                               atol=1e-5)
    self.assertEqual(output.measurements['num_neighbors'], 7)
    self.assertIn('nnm', registry.known_wrappers())
    self.assertFalse(registry.is_secure_compatible(
        nnm.NearestNeighborMixingFactory(coordinatewise.CoordinateWiseMedianFactory(),
                                         num_byzantine=1)))

  def test_too_many_byzantine_clients_fail_at_run_time(self):
    process = cases.process(('nnm_median', 10), lambda: nnm.NearestNeighborMixingFactory(
        coordinatewise.CoordinateWiseMedianFactory(), num_byzantine=10))
    with self.assertRaisesRegex(Exception, 'num_byzantine'):
      cases.run(process, cases.random_inputs(), cases.equal_weights())

  @parameterized.named_parameters(
      ('gm_inner', lambda: nnm.NearestNeighborMixingFactory(
          geometric_median.GeometricMedianFactory(), num_byzantine=1), TypeError,
       'gathering baselines'),
      ('neither', lambda: nnm.NearestNeighborMixingFactory(
          coordinatewise.CoordinateWiseMedianFactory()), ValueError,
       'exactly one of num_byzantine'),
      ('negative', lambda: nnm.NearestNeighborMixingFactory(
          coordinatewise.CoordinateWiseMedianFactory(), num_byzantine=-1), ValueError,
       'num_byzantine must be'),
      ('fraction', lambda: nnm.NearestNeighborMixingFactory(
          coordinatewise.CoordinateWiseMedianFactory(), byzantine_fraction=0.5),
       ValueError, 'byzantine_fraction'))
  def test_bad_arguments_are_named(self, build, error, message):
    with self.assertRaisesRegex(error, message):
      build()


@pytest.mark.slow  # Trains end to end: a round of TFF's FedAvg builder.
class FedAvgBuilderTest(tf.test.TestCase):

  def test_one_round_of_build_weighted_fed_avg(self):
    # Five clients, one with labels ×100 (a huge update). NNM (f = 1) replaces each
    # update by the mean of its 4 nearest, the median takes the coordinatewise median
    # of those; the model moves by it. Client deltas from plain numpy gradient descent.
    trained, deltas, start, metrics = ls.one_round_with_a_huge_client(
        registry.aggregator_from_name(
            'nnm+median', wrapper_args={'nnm': {'num_byzantine': 1}}), seed=5)
    expected = references.np_median(np_nnm(deltas, 1), np.ones(5))
    self.assertGreater(  # Mixing matters here: the plain median differs.
        np.max(np.abs(expected - references.np_median(deltas, np.ones(5)))), 1e-3)
    ls.assert_moved_by(self, trained, start, expected)
    self.assertEqual(metrics['num_neighbors'], 4)


if __name__ == '__main__':
  tf.test.main()
