"""The trust region against its numpy reference (`tasks.references.trust_region`) over
runs of rounds, easy and adversarial; its bound as a property, around the geometric
median in rounds with a corrupted majority; its arguments, types and drivers."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow_federated as tff

from tasks import references
import tff_robust
from tff_robust.aggregators import trust_region
from tff_robust.distributed import passwise
from tff_robust.iterative import iterative_mean

DIMENSION = 4
WEIGHT_TYPE = tff.TensorType(np.float32)
VALUE_TYPE = tff.TensorType(np.float64, [DIMENSION])


def _round_means(case):
  """[rounds, DIMENSION]: the inner mean of each round of a run."""
  rng = np.random.default_rng(1)
  directions = rng.normal(size=(12, DIMENSION))
  unit = directions / np.linalg.norm(directions, axis=1, keepdims=True)
  if case == 'steady':
    return unit * rng.uniform(0.8, 1.2, size=(12, 1))
  if case == 'growing':  # Each round twice the last: the bound binds from round 2.
    return unit * np.exp2(np.arange(12))[:, None]
  if case == 'shrinking':
    return unit * np.exp2(-np.arange(12.0))[:, None]
  if case == 'one_spike':
    return unit * np.where(np.arange(12) == 6, 1e6, 1.0)[:, None]
  if case == 'spike_every_round':  # An attacker owning every round after the first.
    return unit * np.where(np.arange(12) == 0, 1.0, 1e30)[:, None]
  if case == 'zeros_first':  # Zero results are not recorded: unbounded until then.
    return unit * np.where(np.arange(12) < 3, 0.0, 5.0)[:, None]
  if case == 'huge_norms':
    return unit * 1e200 * rng.uniform(1, 100, size=(12, 1))
  raise ValueError(case)


CASES = ('steady', 'growing', 'shrinking', 'one_spike', 'spike_every_round',
         'zeros_first', 'huge_norms')
ARGUMENTS = ({}, {'multiple': 1.0, 'window': 1}, {'multiple': 3.5, 'window': 4})

_PROCESSES = {}
# One GM factory for every test: `_process` keys its inner factory by repr.
_GM = tff_robust.GeometricMedianFactory()


def _process(arguments, inner=None, driver='fused'):
  key = (tuple(sorted(arguments.items())), repr(inner), driver)
  if key not in _PROCESSES:
    factory = trust_region.TrustRegionFactory(
        inner or iterative_mean.Float64MeanFactory(), **arguments)
    if driver == 'passwise':
      factory = passwise.PasswiseFactory(factory)
    _PROCESSES[key] = factory.create(VALUE_TYPE, WEIGHT_TYPE)
  return _PROCESSES[key]


def _plain_gm():
  """`_GM`'s own process, created once."""
  if 'plain_gm' not in _PROCESSES:
    _PROCESSES['plain_gm'] = _GM.create(VALUE_TYPE, WEIGHT_TYPE)
  return _PROCESSES['plain_gm']


def _run(process, rounds_of_clients, weights=None):
  """The outputs of consecutive calls, one per round of `[clients, DIMENSION]` rows."""
  state, outputs = process.initialize(), []
  for rows in rounds_of_clients:
    round_weights = [np.float32(1.0)] * len(rows) if weights is None else weights
    output = process.next(state, list(rows), round_weights)
    state = output.state
    outputs.append(output)
  return outputs


def _clients_with_mean(means):
  """Three clients a round whose mean is the round's row of `means`."""
  offsets = np.array([[1.0, -1.0, 0.0, 0.5], [-1.0, 0.0, 1.0, 0.0],
                      [0.0, 1.0, -1.0, -0.5]])
  return [mean + offsets * 1e-3 * np.max(np.abs(mean)) for mean in means]


class ReferenceTest(parameterized.TestCase):

  @parameterized.product(case=CASES, arguments=ARGUMENTS)
  def test_matches_the_numpy_reference(self, case, arguments):
    means = _round_means(case)
    trace = {}
    expected = references.trust_region(means, trace=trace, **arguments)
    outputs = _run(_process(arguments), _clients_with_mean(means))
    for t, output in enumerate(outputs):
      np.testing.assert_allclose(output.result, expected[t], rtol=1e-9, atol=0)
      np.testing.assert_allclose(output.measurements['trust_radius'],
                                 trace['trust_radius'][t], rtol=1e-9)
      np.testing.assert_allclose(output.measurements['trust_scale'],
                                 trace['trust_scale'][t], rtol=1e-9)

  @parameterized.parameters(*ARGUMENTS)
  def test_no_result_is_longer_than_the_multiple_of_the_recent_median(self, **arguments):
    multiple = arguments.get('multiple', trust_region.DEFAULT_MULTIPLE)
    window = arguments.get('window', trust_region.DEFAULT_WINDOW)
    rng = np.random.default_rng(2)
    means = rng.normal(size=(15, DIMENSION)) * np.exp(rng.normal(0, 3, size=(15, 1)))
    norms = [np.linalg.norm(o.result) for o in
             _run(_process(arguments), _clients_with_mean(means))]
    for t in range(1, len(norms)):
      recent = sorted(norms[max(0, t - window):t])
      self.assertLessEqual(norms[t],
                           multiple * recent[(len(recent) - 1) // 2] * (1 + 1e-12))

  def test_pass_by_pass_equals_the_fused_process(self):
    clients = _clients_with_mean(_round_means('one_spike'))
    fused = _run(_process({}, _GM), clients)
    by_pass = _run(_process({}, _GM, 'passwise'), clients)
    for one, other in zip(fused, by_pass):
      np.testing.assert_allclose(other.result, one.result, rtol=1e-12)
      self.assertEqual(other.measurements['trust_scale'],
                       one.measurements['trust_scale'])


class CorruptedMajorityTest(parameterized.TestCase):
  """Around the GM (breakdown point 1/2), a round whose weight is mostly corrupted
  moves the model by a step of the recent rounds' length; honest rounds pass."""

  @parameterized.product(shift=(0.0, 10.0, 1e3), num_corrupted=(6, 8))
  def test_a_corrupted_majority_round_is_bounded(self, shift, num_corrupted):
    rng = np.random.default_rng(3)
    center = np.full(DIMENSION, shift) + rng.normal(size=DIMENSION)

    def honest_round(count=10):
      return center + rng.normal(size=(count, DIMENSION)) * 0.1

    corrupted = np.concatenate([honest_round(10 - num_corrupted),
                                np.full((num_corrupted, DIMENSION), -1e6)])
    rounds = [honest_round() for _ in range(5)] + [corrupted, honest_round()]
    outputs = _run(_process({}, _GM), rounds)
    plain = _run(_plain_gm(), rounds)
    honest_norms = [np.linalg.norm(o.result) for o in outputs[:5]]
    self.assertGreater(np.linalg.norm(plain[5].result), 1e5)  # The GM is theirs.
    self.assertLessEqual(np.linalg.norm(outputs[5].result),
                         2.0 * np.median(honest_norms) * (1 + 1e-9))
    for t in (0, 1, 2, 3, 4, 6):
      np.testing.assert_allclose(outputs[t].result, plain[t].result, rtol=1e-6)
      self.assertEqual(outputs[t].measurements['trust_scale'], 1.0)


class FactoryTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('multiple_below_one', {'multiple': 0.5}, ValueError),
      ('multiple_infinite', {'multiple': float('inf')}, ValueError),
      ('multiple_nan', {'multiple': float('nan')}, ValueError),
      ('multiple_string', {'multiple': 'two'}, TypeError),
      ('window_zero', {'window': 0}, ValueError),
      ('window_float', {'window': 2.5}, TypeError))
  def test_rejects_bad_arguments(self, arguments, error):
    with self.assertRaises(error):
      trust_region.TrustRegionFactory(iterative_mean.Float64MeanFactory(), **arguments)

  def test_rejects_what_is_not_a_weighted_factory(self):
    with self.assertRaisesRegex(TypeError, 'WeightedAggregationFactory'):
      trust_region.TrustRegionFactory(tff.aggregators.SumFactory())

  def test_state_and_measurement_types(self):
    process = _process({}, _GM)
    inner = _plain_gm()
    signature = process.next.type_signature
    self.assertEqual(signature.result.result, inner.next.type_signature.result.result)
    state = signature.result.state.member
    self.assertEqual([n for n, _ in tff.structure.iter_elements(state)],
                     ['inner', 'norms', 'count'])
    self.assertEqual(state.norms, tff.TensorType(np.float64, [5]))
    names = [n for n, _ in tff.structure.iter_elements(
        signature.result.measurements.member)]
    inner_names = [n for n, _ in tff.structure.iter_elements(
        inner.next.type_signature.result.measurements.member)]
    self.assertEqual(names, inner_names + ['trust_radius', 'trust_scale'])

  def test_is_secure_compatible_as_its_inner_factory(self):
    self.assertTrue(trust_region.TrustRegionFactory(
        tff_robust.GeometricMedianFactory()).secure_compatible)
    self.assertFalse(trust_region.TrustRegionFactory(
        tff.aggregators.MeanFactory()).secure_compatible)


if __name__ == '__main__':
  absltest.main()
