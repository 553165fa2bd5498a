"""The by-name registry, robustness sanity across aggregators, and plugging into TFF's
FedAvg builder."""

import collections

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from baselines import arc
from baselines import bucketing
from baselines import coordinatewise
from baselines import fedavg
from baselines import gather
from baselines import geometric_median as gathered_geometric_median
from baselines import krum
from baselines import nnm
from tasks import references
from tasks import registry
from tests.helpers import aggregator_cases as cases
from tests.helpers import least_squares as ls
from tests.tasks import test_extreme_inputs as extreme
import tff_robust


class RegistryTest(parameterized.TestCase):

  def test_known_aggregators(self):
    self.assertContainsSubset(
        ['mean', 'gm', 'one_step_gm', 'gamma_mean', 'gamma_mean_diagonal', 'gma',
         'median', 'trimmed_mean', 'krum', 'multi_krum', 'norm_clipping',
         'centered_clipping'], registry.known_aggregators())

  def test_unknown_name_lists_the_known_ones(self):
    with self.assertRaisesRegex(ValueError, "'geomedian'.*gamma_mean.*multi_krum"):
      registry.aggregator_from_name('geomedian')

  @parameterized.named_parameters(*[(n, n) for n in registry.known_aggregators()])
  def test_every_name_builds_a_weighted_factory(self, name):
    kwargs = dict(num_byzantine=1) if 'krum' in name else {}
    factory = registry.aggregator_from_name(name, **kwargs)
    self.assertIsInstance(factory, tff.aggregators.WeightedAggregationFactory)

  @parameterized.named_parameters(*[(n, n) for n in registry.known_aggregators()])
  def test_secure_compatible_exactly_when_not_gathering(self, name):
    # Every aggregator of the registry is one of the two kinds, each declared by its
    # class: a secure-compatible factory, whose values reach the server through sums
    # only, or a gathering baseline, which sees every update.
    secure = registry.is_secure_compatible(registry.aggregator_from_name(name))
    self.assertNotEqual(secure, registry.gathers(name))

  def test_the_library_factories_are_secure_compatible(self):
    secure = {name for name in registry.known_aggregators()
              if registry.is_secure_compatible(registry.aggregator_from_name(name))}
    self.assertContainsSubset({'mean', 'gm', 'one_step_gm', 'gamma_mean', 'gma',
                               'norm_clipping', 'secure_centered_clipping'}, secure)
    self.assertNoCommonElements({'median', 'trimmed_mean', 'krum', 'gathered_gm',
                                 'centered_clipping'}, secure)

  def test_kwargs_reach_the_factory(self):
    with self.assertRaisesRegex(ValueError, 'trim_fraction'):
      registry.aggregator_from_name('trimmed_mean', trim_fraction=0.5)
    with self.assertRaisesRegex(ValueError, 'tau'):
      registry.aggregator_from_name('gma', tau=2.0)


ROBUST = collections.OrderedDict(
    # From the mean, Weiszfeld needs more than the default 3 passes to leave a 100×
    # far cluster holding up to ~35% of the weight.
    gm=dict(num_communication_passes=10),
    gamma_mean=dict(),
    gamma_mean_diagonal=dict(),
    median=dict(),
    trimmed_mean=dict(trim_fraction=0.2),
    multi_krum=dict(num_byzantine=2),
)


class RobustnessSanityTest(parameterized.TestCase):
  """20% of the clients send the same far-away vector (clean centre: all ones)."""

  def _distance_to_centre(self, name, kwargs, weights):
    proc = cases.process(('registry', name, *sorted(kwargs.items())),
                         lambda: registry.aggregator_from_name(name, **kwargs))
    result, _ = cases.run(proc, cases.clustered_attack_inputs(), weights)
    return np.linalg.norm(result - 1.0)

  @parameterized.named_parameters(*[
      (f'{name}_{w}', name, w) for name in ROBUST for w in cases.WEIGHTS])
  def test_stays_near_the_clean_centre(self, name, weights):
    distance = self._distance_to_centre(name, ROBUST[name], cases.WEIGHTS[weights]())
    # The mean is 60 away (20 per coordinate); the inliers' spread is 0.1 per
    # coordinate, and these end 0.09–0.18 away.
    self.assertLess(distance, 0.5)

  @parameterized.named_parameters(
      ('mean', 'mean', {}, 50.0),
      # The far cluster holds the mean start: 17.7 away after 2 passes, 4.6 after 3.
      ('gm_three_passes_from_the_mean', 'gm',
       dict(num_communication_passes=3, initial_point='mean'), 2.0))
  def test_weaker_rules_do_not(self, name, kwargs, distance):
    self.assertGreater(self._distance_to_centre(name, kwargs, cases.equal_weights()),
                       distance)


# Builds and trains learning processes end to end (~40 CPU-s).
@pytest.mark.slow
class FedAvgPluginTest(parameterized.TestCase):
  """Aggregators by name as `model_aggregator` of TFF's and the baselines' builders:
  the model moves by the numpy reference of the aggregator (`test_extreme_inputs`)
  applied to the clients' plain-numpy updates, one of them huge (labels ×100)."""

  @parameterized.named_parameters(
      ('median_fedavg', 'median', fedavg.build_fedavg),
      ('gma_fedavg', 'gma', fedavg.build_fedavg),
      # Every name's `create(value_type)` is checked in `test_registry_contract.py`; a
      # learning process is built for a few: iterative secure, gathering, stateful.
      ('gm_unweighted', 'gm', tff.learning.algorithms.build_unweighted_fed_avg),
      ('krum_unweighted', 'krum', tff.learning.algorithms.build_unweighted_fed_avg),
      ('gamma_mean_unweighted', 'gamma_mean',
       tff.learning.algorithms.build_unweighted_fed_avg),
      ('centered_clipping_unweighted', 'centered_clipping',
       tff.learning.algorithms.build_unweighted_fed_avg),
  )
  def test_one_round(self, name, build):
    kwargs, reference = extreme.REFERENCES[name]
    trained, deltas, start, _ = ls.one_round_with_a_huge_client(
        registry.aggregator_from_name(name, **kwargs), seed=7, build=build)
    # Five clients of 6 examples: weighted by examples or not, the weights are equal.
    ls.assert_moved_by(self, trained, start, reference(deltas, np.ones(len(deltas))))

  def test_one_round_of_minibatch_sgd(self):
    # Each client sends its gradient at the model; the server steps by −0.1 × their
    # diagonal γ-mean (TFF's default server SGD).
    clients = ls.least_squares_clients(seed=8)
    task = ls.least_squares_task(clients)
    kwargs, reference = extreme.REFERENCES['gamma_mean_diagonal']
    process = fedavg.build_minibatch_sgd(
        task.model_fn,
        model_aggregator=registry.aggregator_from_name('gamma_mean_diagonal', **kwargs))
    start = ls.random_params(np.random.default_rng(8))
    state = process.set_model_weights(
        process.initialize(),
        tff.learning.models.ModelWeights(trainable=start, non_trainable=[]))
    datasets = [ls.full_batch(x, y, steps=1) for x, y in clients.values()]
    trained = process.get_model_weights(process.next(state, datasets).state).trainable
    gradients = np.stack([np.concatenate([np.ravel(g) for g in ls.gradient(start, x, y)])
                          for x, y in clients.values()])
    sizes = np.array([len(x) for x, _ in clients.values()], np.float64)
    ls.assert_moved_by(self, trained, start, -0.1 * reference(gradients, sizes))


class WrappedNamesTest(parameterized.TestCase):

  def test_wrapper_and_its_arguments(self):
    factory = registry.aggregator_from_name(
        'bucketing+trimmed_mean', wrapper_args={'bucketing': {'bucket_size': 3}},
        trim_fraction=0.2)
    self.assertEqual(type(factory).__name__, 'NonfiniteFilteringFactory')
    self.assertEqual(type(factory.inner).__name__, 'BucketingFactory')
    self.assertEqual(factory.inner._bucket_size, 3)  # pylint: disable=protected-access
    self.assertFalse(registry.is_secure_compatible(factory))

  def test_what_each_wrapper_takes(self):
    gathering = ('median', 'trimmed_mean', 'krum', 'multi_krum', 'centered_clipping',
                 'gm')  # 'gm' as its gathering twin, 'gathered_gm'.
    self.assertEqual(registry.wrappable('bucketing'), gathering)
    self.assertEqual(registry.wrappable('nnm'), gathering)
    self.assertEqual(registry.wrappable('arc'), registry.known_aggregators())
    self.assertEqual([w for w in registry.known_wrappers()
                      if registry.wraps_gathering_only(w)], ['bucketing', 'nnm'])

  @parameterized.named_parameters(*[(w, w) for w in registry.known_wrappers()])
  def test_a_wrapper_builds_in_front_of_what_it_takes_only(self, wrapper):
    takes = registry.wrappable(wrapper)
    for name in registry.known_aggregators():
      if name in takes or name == 'gathered_gm':  # Listed as 'gm' where it is a twin.
        registry.aggregator_from_name(f'{wrapper}+{name}')
      else:
        with self.assertRaisesRegex(TypeError, f'{wrapper} wraps'):
          registry.aggregator_from_name(f'{wrapper}+{name}')

  def test_names_are_sugar_for_the_composed_objects(self):
    # The same classes, arguments and nesting as composed by hand in Python.
    def chain(factory):
      links = []
      while factory is not None:
        links.append((type(factory), {k: v for k, v in vars(factory).items()
                                      if not isinstance(v, _FACTORY_TYPES)}))
        factory = getattr(factory, 'inner', None)
      return links

    nonfinite = tff_robust.NonfiniteFilteringFactory
    for name, by_hand in (
        ('bucketing+median', nonfinite(bucketing.BucketingFactory(
            coordinatewise.CoordinateWiseMedianFactory()))),
        ('bucketing+gm', nonfinite(bucketing.BucketingFactory(
            gathered_geometric_median.GatheredGeometricMedianFactory()))),
        ('arc+gm', nonfinite(arc.AdaptiveRobustClippingFactory(
            tff_robust.GeometricMedianFactory(), byzantine_fraction=0.25))),
        ('nnm+krum', nonfinite(nnm.NearestNeighborMixingFactory(
            krum.KrumFactory(byzantine_fraction=0.25), byzantine_fraction=0.25)))):
      self.assertEqual(chain(registry.aggregator_from_name(name)), chain(by_hand), name)
    self.assertTrue(issubclass(bucketing.BucketingFactory.wraps,
                               gather.GatheringAggregationFactory))

  def test_bucketing_median_by_name_is_the_composed_object(self):
    x = cases.random_inputs(seed=9)
    by_name = cases.process(('sugar', 'bucketing+median'),
                            lambda: registry.aggregator_from_name('bucketing+median'))
    by_hand = cases.process(('sugar', 'composed'), lambda: bucketing.BucketingFactory(
        coordinatewise.CoordinateWiseMedianFactory()))
    np.testing.assert_array_equal(cases.run(by_name, x, np.ones(10))[0],
                                  cases.run(by_hand, x, np.ones(10))[0])

  def test_unknown_parts_are_named(self):
    with self.assertRaisesRegex(ValueError, r"wrapper\(s\) \['shuffle'\].*bucketing"):
      registry.aggregator_from_name('shuffle+median')
    with self.assertRaisesRegex(
        ValueError, r"Unknown aggregator 'medain'.*gm.*wrapper\+name.*bucketing, nnm"):
      registry.aggregator_from_name('bucketing+medain')


class KrumByNameTest(parameterized.TestCase):

  @parameterized.named_parameters(
      # f = floor(0.25 * 10) = 2: the documented default.
      ('default', {}, 2),
      # The run's rho, as the binaries pass it: f = floor(0.1 * 10) = 1.
      ('run_rho', dict(assumed_byzantine_fraction=0.1), 1),
      # Explicit arguments win over the run's rho.
      ('explicit', dict(num_byzantine=3, assumed_byzantine_fraction=0.1), 3),
  )
  def test_krum_without_arguments(self, kwargs, expected_f):
    x = np.random.default_rng(11).normal(size=(10, cases.DIMENSION))
    x[:2] += 50.0  # Two far clients: Krum never picks them.
    proc = cases.process(('krum_by_name', expected_f),
                         lambda: registry.aggregator_from_name('krum', **kwargs))
    result, output = cases.run(proc, x, np.ones(10))
    self.assertEqual(output.measurements['num_byzantine'], expected_f)
    np.testing.assert_allclose(result, references.krum(x, np.ones(10), expected_f),
                               rtol=1e-6)

  def test_multi_krum_without_arguments(self):
    factory = registry.aggregator_from_name('multi_krum')
    self.assertEqual(factory.inner.num_byzantine_for(8), 2)

  @parameterized.named_parameters(
      ('krum', 'krum', dict(num_byzantine=1), 4, 5),
      ('krum_default_fraction', 'krum', {}, 4, 5),  # n = 4: f = 1; n = 5: f = 1.
      ('multi_krum_selected', 'multi_krum', dict(num_byzantine=0, num_selected=6), 5, 6),
      # 8 clients are 4 buckets of 2: too few for f = 1; 10 clients are 5 buckets.
      ('bucketing_krum', 'bucketing+krum', dict(num_byzantine=1), 8, 9),
      ('arc_krum', 'arc+krum', dict(num_byzantine=1), 4, 5),  # Through ARC.
      ('nnm', 'nnm+median', dict(wrapper_args={'nnm': dict(num_byzantine=3)}), 3, 4,
       'NearestNeighborMixingFactory: .*n > f'),
      ('arc', 'arc+gm', dict(wrapper_args={'arc': dict(num_byzantine=3)}), 3, 4,
       'AdaptiveRobustClippingFactory: .*n > f'),
  )
  def test_too_few_clients_fail_early_and_clearly(
      self, name, kwargs, too_few, enough,
      message=r'KrumFactory: .*(n > 2f \+ 2|num_selected)'):
    factory = registry.aggregator_from_name(name, **kwargs)
    with self.assertRaisesRegex(ValueError, message):
      registry.check_num_clients(factory, too_few)
    registry.check_num_clients(factory, enough)

  def test_aggregators_without_a_condition_pass(self):
    for name in ('gm', 'median', 'mean'):
      registry.check_num_clients(registry.aggregator_from_name(name), 1)


def _configuration(value):
  """A factory's constructor configuration, nested factories included."""
  if hasattr(value, '__dict__') and not isinstance(value, type):
    return (type(value).__name__,
            {k: _configuration(v) for k, v in sorted(vars(value).items())})
  if isinstance(value, (list, tuple)):
    return [_configuration(v) for v in value]
  return repr(value)


class AssumedFractionTest(parameterized.TestCase):

  @parameterized.parameters(
      *registry.known_aggregators(),
      *(f'{w}{registry.SEPARATOR}median' for w in registry.known_wrappers()))
  def test_names_it_reaches(self, name):
    # A sweep builds one factory for every ρ of a name that does not take it.
    takes = registry.takes_assumed_byzantine_fraction(name)
    # Every factory that reads ρ refuses NaN, however it holds it.
    try:
      registry.aggregator_from_name(name, assumed_byzantine_fraction=float('nan'))
      refused = False
    except ValueError:
      refused = True
    self.assertEqual(refused, takes)
    if not takes:
      self.assertEqual(*(_configuration(registry.aggregator_from_name(
          name, assumed_byzantine_fraction=rho)) for rho in (0.1, 0.3)))


class WrappersByNameTest(parameterized.TestCase):

  @parameterized.named_parameters(
      # f = floor(0.25 * 10) = 2 → ARC clips k = floor(2f(n - f)/n) = 3 updates.
      ('default', {}, 3),
      # f = floor(0.1 * 10) = 1 → k = floor(1.8) = 1.
      ('run_rho', dict(assumed_byzantine_fraction=0.1), 1),
      # The wrapper's own argument wins: f = 0 clips nothing.
      ('explicit', dict(wrapper_args={'arc': dict(num_byzantine=0)},
                        assumed_byzantine_fraction=0.1), 0),
  )
  def test_arc_takes_the_assumed_fraction(self, kwargs, expected_clipped):
    # Distinct norms, so exactly the k largest are clipped.
    x = np.random.default_rng(5).normal(size=(10, cases.DIMENSION))
    x *= np.arange(1.0, 11.0)[:, None]
    proc = cases.process(('arc_by_name', expected_clipped),
                         lambda: registry.aggregator_from_name('arc+mean', **kwargs))
    _, output = cases.run(proc, x, np.ones(10))
    self.assertEqual(_find(output.measurements, 'num_clipped'), expected_clipped)

  def test_nnm_without_arguments_assumes_a_quarter(self):
    x = np.random.default_rng(6).normal(size=(8, cases.DIMENSION))
    x[:2] += 30.0
    by_default = cases.process(('nnm_by_name',),
                               lambda: registry.aggregator_from_name('nnm+median'))
    explicit = cases.process(('nnm_by_name', 0.25), lambda: registry.aggregator_from_name(
        'nnm+median', wrapper_args={'nnm': dict(byzantine_fraction=0.25)}))
    other = cases.process(('nnm_by_name', 0), lambda: registry.aggregator_from_name(
        'nnm+median', wrapper_args={'nnm': dict(num_byzantine=0)}))
    result, _ = cases.run(by_default, x, np.ones(8))
    np.testing.assert_allclose(result, cases.run(explicit, x, np.ones(8))[0], rtol=1e-6)
    # f matters here, so the match above is not vacuous.
    self.assertGreater(np.abs(result - cases.run(other, x, np.ones(8))[0]).max(), 1e-3)


_FACTORY_TYPES = (tff.aggregators.WeightedAggregationFactory,
                  tff.aggregators.UnweightedAggregationFactory)


def _find(measurements, key):
  """The value of `key` anywhere in nested measurements."""
  if key in measurements:
    return measurements[key]
  for value in measurements.values():
    if hasattr(value, 'keys'):
      found = _find(value, key)
      if found is not None:
        return found
  return None


if __name__ == '__main__':
  tf.test.main()
