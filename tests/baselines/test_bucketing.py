"""Bucketing (Karimireddy et al. 2022) around the gathering baselines, against plain
numpy: shuffle, weighted bucket means, then the inner rule on the buckets; bucketing(gm)
inside TFF's FedAvg builder."""

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

from baselines import bucketing
from baselines import coordinatewise
from baselines import krum
from tasks import registry
from tests.baselines import test_baselines as references
from tests.baselines import test_geometric_median as gm_references
from tests.helpers import aggregator_cases as cases
from tests.helpers import least_squares as ls
from tff_robust.aggregators import geometric_median

SEED = 7


def np_bucket_means(x, w, order, s):
  """Weighted means of x[order] in consecutive groups of s, and their total weights."""
  x, w = x[order], w[order]
  groups = [slice(i, i + s) for i in range(0, len(x), s)]
  totals = np.array([w[g].sum() for g in groups])
  means = np.stack([w[g] @ x[g] / w[g].sum() for g in groups])
  return means, totals


def _order(num_clients, round_num, seed=SEED):
  return bucketing.bucket_order(num_clients, seed, round_num).numpy()


class BucketingTest(parameterized.TestCase):

  @parameterized.named_parameters(
      *[dict(c, testcase_name=f'median_s{s}_{c["testcase_name"]}', bucket_size=s)
        for s in (1, 2, 3, 10) for c in cases.input_cases()])
  def test_median_of_bucket_means(self, bucket_size, inputs, weights):
    x, w = cases.INPUTS[inputs](), cases.WEIGHTS[weights]()
    process = cases.process(('bucketing_median', bucket_size), lambda: (
        bucketing.BucketingFactory(coordinatewise.CoordinateWiseMedianFactory(),
                                   bucket_size, seed=SEED)))
    state = process.initialize()
    for round_num in range(2):  # The second round shuffles differently.
      result, output = cases.run(process, x, w, state)
      means, _ = np_bucket_means(x, np.asarray(w, np.float64),
                                 _order(len(x), round_num), bucket_size)
      np.testing.assert_allclose(result, np.median(means, axis=0), rtol=1e-5,
                                 atol=1e-5)
      self.assertEqual(output.measurements['num_buckets'], len(means))
      state = output.state

  def test_multi_krum_on_buckets_weights_them_by_their_totals(self):
    x, w = cases.clustered_attack_inputs(), cases.random_weights()
    process = bucketing.BucketingFactory(
        krum.KrumFactory(num_byzantine=1, num_selected=None), 2,
        seed=SEED).create(cases.VALUE_TYPE, cases.WEIGHT_TYPE)
    result, _ = cases.run(process, x, w)
    means, totals = np_bucket_means(x, np.asarray(w, np.float64), _order(len(x), 0), 2)
    np.testing.assert_allclose(result, references.np_krum(means, totals, 1, None),
                               rtol=1e-5, atol=1e-5)

  def test_bucket_means_near_the_float32_maximum_do_not_overflow(self):
    # w·x would overflow float32 for x = 3e38 and w = 3; the mean itself is finite.
    x = cases.random_inputs()
    x[:3] = 3e38
    w = np.full(len(x), 3.0, np.float32)
    process = bucketing.BucketingFactory(coordinatewise.CoordinateWiseMedianFactory(),
                                         3, seed=SEED).create(cases.VALUE_TYPE,
                                                               cases.WEIGHT_TYPE)
    result, _ = cases.run(process, x, list(w))
    means, _ = np_bucket_means(x, w.astype(np.float64), _order(len(x), 0), 3)
    self.assertTrue(np.all(np.isfinite(result)))
    np.testing.assert_allclose(result, np.median(means, axis=0), rtol=1e-5, atol=1e-5)

  def test_order_is_a_permutation_that_depends_on_the_round_and_seed(self):
    self.assertCountEqual(_order(10, 0), range(10))
    self.assertNotEqual(list(_order(10, 0)), list(_order(10, 1)))
    self.assertNotEqual(list(_order(10, 0)), list(_order(10, 0, seed=SEED + 1)))
    self.assertEqual(list(_order(10, 3)), list(_order(10, 3)))

  def test_rejects_what_it_cannot_wrap_and_bad_sizes(self):
    with self.assertRaisesRegex(TypeError, 'gathering baselines'):
      bucketing.BucketingFactory(geometric_median.GeometricMedianFactory())
    with self.assertRaisesRegex(ValueError, 'bucket_size'):
      bucketing.BucketingFactory(coordinatewise.CoordinateWiseMedianFactory(), 0)
    with self.assertRaisesRegex(TypeError, 'bucket_size must be an integer'):
      bucketing.BucketingFactory(coordinatewise.CoordinateWiseMedianFactory(), 2.0)
    for seed in ('a', 1.5, True):
      with self.assertRaisesRegex(TypeError, f'seed must be an integer, got {seed!r}'):
        bucketing.BucketingFactory(coordinatewise.CoordinateWiseMedianFactory(),
                                   seed=seed)


@pytest.mark.slow  # Trains end to end: a round of TFF's FedAvg builder.
class FedAvgBuilderTest(tf.test.TestCase):

  def test_one_round_of_bucketing_gm_in_build_weighted_fed_avg(self):
    # Five clients, one with labels ×100 (a huge update); buckets of 2 (the last holds
    # one client), then 5 passes of the gathered geometric median on the 3 bucket
    # means weighted by their totals. Client deltas from plain numpy gradient descent.
    trained, deltas, start, metrics = ls.one_round_with_a_huge_client(
        registry.aggregator_from_name(
            'bucketing+gm', wrapper_args={'bucketing': {'bucket_size': 2, 'seed': SEED}},
            num_communication_passes=5, tolerance=0.0), seed=5)
    means, totals = np_bucket_means(deltas, np.ones(5), _order(5, 0), 2)
    expected, _ = gm_references.np_weiszfeld(means, totals, passes=5)
    ls.assert_moved_by(self, trained, start, expected)
    self.assertEqual(metrics['num_buckets'], 3)
    self.assertEqual(metrics['num_passes_applied'], 5)
