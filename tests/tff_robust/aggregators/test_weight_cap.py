"""The robust weight cap against its numpy reference (`tasks.references.capped_weights`),
on easy and adversarial weights; its arguments, measurements and drivers."""

import collections

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow_federated as tff

from tasks import references
import tff_robust
from tff_robust.aggregators import weight_cap
from tff_robust.distributed import passwise
from tff_robust.iterative import iterative_mean

NUM_CLIENTS = 12
WEIGHT_TYPE = tff.TensorType(np.float32)
# Client i sends the i-th unit vector: the weighted mean is the normalised capped
# weights, which the test reads back.
VALUE_TYPE = tff.TensorType(np.float64, [NUM_CLIENTS])


def _weights(case):
  rng = np.random.default_rng(0)
  counts = rng.integers(10, 201, size=NUM_CLIENTS).astype(np.float64)
  if case == 'example_counts':
    return counts
  if case == 'equal':
    return np.ones(NUM_CLIENTS)
  if case == 'powers_of_two':  # On the bucket edges.
    return np.exp2(rng.integers(0, 10, size=NUM_CLIENTS)).astype(np.float64)
  if case == 'one_huge':
    return np.concatenate([counts[:-1], [3e38]])
  if case == 'attackers_below_half':  # 5 of 12 claim 1e6: the median stays honest.
    return np.concatenate([counts[:7], np.full(5, 1e6)])
  if case == 'attackers_at_zero_and_tiny':
    return np.concatenate([counts[:8], [0.0, 0.0, 1e-30, 1e-30]])
  if case == 'tiny':
    return counts * 1e-30
  if case == 'all_zero':
    return np.zeros(NUM_CLIENTS)
  raise ValueError(case)


CASES = ('example_counts', 'equal', 'powers_of_two', 'one_huge', 'attackers_below_half',
         'attackers_at_zero_and_tiny', 'tiny', 'all_zero')
ARGUMENTS = ({}, {'quantile': 0.25, 'multiple': 1.0}, {'quantile': 0.9, 'multiple': 4.5})

_PROCESSES = {}


def _process(arguments, driver='fused'):
  key = (tuple(sorted(arguments.items())), driver)
  if key not in _PROCESSES:
    factory = weight_cap.WeightCappingFactory(iterative_mean.Float64MeanFactory(),
                                              **arguments)
    if driver == 'passwise':
      factory = passwise.PasswiseFactory(factory)
    _PROCESSES[key] = factory.create(VALUE_TYPE, WEIGHT_TYPE)
  return _PROCESSES[key]


def _run(process, weights):
  values = list(np.eye(NUM_CLIENTS))
  return process.next(process.initialize(), values,
                      [np.float32(w) for w in weights])


class ReferenceTest(parameterized.TestCase):

  @parameterized.product(case=CASES, arguments=ARGUMENTS)
  def test_matches_the_numpy_reference(self, case, arguments):
    weights = _weights(case).astype(np.float32).astype(np.float64)
    trace = {}
    expected = references.capped_weights(weights, trace=trace, **arguments)
    output = _run(_process(arguments), weights)
    total = expected.sum()
    np.testing.assert_allclose(output.result,
                               expected / total if total > 0 else 0 * expected,
                               rtol=1e-6, atol=1e-300)
    np.testing.assert_allclose(output.measurements['weight_cap'],
                               np.float32(trace['weight_cap']), rtol=1e-6)
    self.assertEqual(output.measurements['num_capped_clients'],
                     trace['num_capped_clients'])

  @parameterized.parameters(*CASES)
  def test_the_cap_is_the_multiple_of_the_quantile_within_a_bucket(self, case):
    weights = _weights(case).astype(np.float32).astype(np.float64)
    positive = np.sort(weights[weights > 0])
    if not len(positive):
      self.skipTest('no client')
    cap = float(_run(_process({}), weights).measurements['weight_cap'])
    median = positive[int(np.ceil(0.5 * len(positive))) - 1]
    multiple = weight_cap.DEFAULT_MULTIPLE
    self.assertGreater(cap, multiple * median * (1 - 1e-6))
    self.assertLessEqual(cap, multiple * median * 2**(1 / 8) * (1 + 1e-6))

  def test_pass_by_pass_equals_the_fused_process(self):
    weights = _weights('attackers_below_half')
    fused = _run(_process({}), weights)
    by_pass = _run(_process({}, 'passwise'), weights)
    np.testing.assert_allclose(by_pass.result, fused.result, rtol=1e-12)
    self.assertEqual(by_pass.measurements, fused.measurements)


class FactoryTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('quantile_zero', {'quantile': 0.0}, ValueError),
      ('quantile_one', {'quantile': 1.0}, ValueError),
      ('quantile_negative', {'quantile': -0.5}, ValueError),
      ('quantile_string', {'quantile': 'median'}, TypeError),
      ('multiple_below_one', {'multiple': 0.5}, ValueError),
      ('multiple_infinite', {'multiple': float('inf')}, ValueError),
      ('multiple_nan', {'multiple': float('nan')}, ValueError),
      ('multiple_bool', {'multiple': True}, TypeError))
  def test_rejects_bad_arguments(self, arguments, error):
    with self.assertRaises(error):
      weight_cap.WeightCappingFactory(iterative_mean.Float64MeanFactory(), **arguments)

  def test_rejects_what_is_not_a_weighted_factory(self):
    with self.assertRaisesRegex(TypeError, 'WeightedAggregationFactory'):
      weight_cap.WeightCappingFactory(tff.aggregators.SumFactory())

  def test_type_signature_and_measurements(self):
    process = weight_cap.WeightCappingFactory(
        tff_robust.GeometricMedianFactory()).create(VALUE_TYPE, WEIGHT_TYPE)
    inner = tff_robust.GeometricMedianFactory().create(VALUE_TYPE, WEIGHT_TYPE)
    signature = process.next.type_signature
    self.assertEqual(signature.result.result, inner.next.type_signature.result.result)
    names = [n for n, _ in tff.structure.iter_elements(
        signature.result.measurements.member)]
    inner_names = [n for n, _ in tff.structure.iter_elements(
        inner.next.type_signature.result.measurements.member)]
    self.assertEqual(names, inner_names + ['weight_cap', 'num_capped_clients'])

  def test_is_secure_compatible_as_its_inner_factory(self):
    self.assertTrue(weight_cap.WeightCappingFactory(
        tff_robust.GeometricMedianFactory()).secure_compatible)
    self.assertFalse(weight_cap.WeightCappingFactory(
        tff_robust.NonfiniteFilteringFactory(_Gathering())).secure_compatible)


class _Gathering(tff.aggregators.MeanFactory):
  secure_compatible = False


if __name__ == '__main__':
  absltest.main()
