"""The simulation's in-process server step of the gathering baselines returns what
their federated process returns: result, state and measurements, round after round."""

import collections
import gc
import weakref

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import builders
from tasks import registry
from tasks.simulation import gathered
from tasks.simulation import loop
from tests.helpers import aggregator_cases as cases

# The simulation's value type: the model's trainable variables as a list.
_VALUE_TYPE = tff.types.to_type([tff.TensorType(np.float32, [3, 2]),
                                 tff.TensorType(np.float32, [4])])
_WEIGHT_TYPE = tff.TensorType(np.float32)
_NUM_CLIENTS = 9



def _assert_same(testcase, expected, actual, path=''):
  flat_expected, flat_actual = tf.nest.flatten(expected), tf.nest.flatten(actual)
  testcase.assertLen(flat_actual, len(flat_expected), path)
  for e, a in zip(flat_expected, flat_actual):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(e, np.float64),
                               rtol=1e-6, atol=1e-6, err_msg=path)


_BUILT = {}


def _process_and_aggregation(name):
  """The federated process of the registry's `name` and its in-process aggregation,
  built once (tracing the process costs about a second) and shared by the inputs."""
  if name not in _BUILT:
    factory = registry.aggregator_from_name(name, assumed_byzantine_fraction=0.2)
    _BUILT[name] = (factory.create(_VALUE_TYPE, _WEIGHT_TYPE),
                    gathered.in_process_aggregation(factory, _VALUE_TYPE))
  return _BUILT[name]


class InProcessAggregationTest(parameterized.TestCase):

  @parameterized.product(
      name=['median', 'trimmed_mean', 'krum', 'multi_krum', 'centered_clipping',
            'gathered_gm', 'bucketing+median', 'bucketing+krum', 'nnm+gm',
            'nnm+trimmed_mean'],
      kind=['random', 'faulty', 'attacked'])
  def test_equals_the_federated_process(self, name, kind):
    process, aggregate = _process_and_aggregation(name)
    self.assertIsNotNone(aggregate)
    federated_state = in_process_state = process.initialize()
    for round_num in range(3):  # Stateful ones (bucketing, centered clipping) move.
      updates, weights = cases.simulation_round(kind, seed=round_num)
      expected = process.next(federated_state, updates, list(weights))
      actual = aggregate(in_process_state, updates, list(weights))
      _assert_same(self, expected.result, actual.result, f'{name} result')
      self.assertEqual(list(expected.measurements), list(actual.measurements))
      _assert_same(self, expected.measurements, actual.measurements, f'{name} meas.')
      _assert_same(self, expected.state, actual.state, f'{name} state')
      self.assertEqual(tf.nest.map_structure(lambda _: 0, expected.state),
                       tf.nest.map_structure(lambda _: 0, actual.state))
      federated_state, in_process_state = expected.state, actual.state

  @parameterized.parameters('mean', 'gm', 'one_step_gm', 'gma', 'norm_clipping',
                            'secure_centered_clipping', 'arc+median')
  def test_only_gathering_baselines_take_the_shortcut(self, name):
    factory = registry.aggregator_from_name(name)
    self.assertIsNone(gathered.in_process_aggregation(factory, _VALUE_TYPE))

  def test_float64_updates(self):
    value_type = tff.types.to_type([tff.TensorType(np.float64, [5])])
    factory = registry.aggregator_from_name('trimmed_mean')
    process = factory.create(value_type, _WEIGHT_TYPE)
    aggregate = gathered.in_process_aggregation(factory, value_type)
    rng = np.random.default_rng(3)
    updates = [[rng.normal(size=5) * 1e200] for _ in range(6)]  # Beyond float32.
    weights = [np.float32(w) for w in rng.integers(1, 9, size=6)]
    expected = process.next(process.initialize(), updates, weights)
    actual = aggregate(process.initialize(), updates, weights)
    self.assertEqual(actual.result[0].dtype, np.float64)
    np.testing.assert_allclose(actual.result[0], expected.result[0], rtol=1e-12)

  def test_an_update_of_another_shape_is_refused(self):
    process, aggregate = _process_and_aggregation('median')
    updates, weights = cases.simulation_round('random', 0)
    updates[3] = [updates[3][0], updates[3][1][:2]]
    with self.assertRaisesRegex(TypeError, r'shapes .*\(2,\).* created for'):
      aggregate(process.initialize(), updates, list(weights))

  def test_the_updates_are_released_as_they_are_copied(self):
    process, aggregate = _process_and_aggregation('median')
    updates, weights = cases.simulation_round('faulty', 0)
    expected = process.next(process.initialize(), updates, list(weights))
    leaves = [weakref.ref(leaf) for update in updates for leaf in update]
    actual = aggregate(process.initialize(), updates, list(weights))
    self.assertEmpty(updates)
    gc.collect()
    self.assertEqual([ref() for ref in leaves], [None] * len(leaves))
    _assert_same(self, expected.result, actual.result)

  @parameterized.parameters(('median', True), ('bucketing+krum', True), ('gm', True))
  def test_the_simulation_takes_the_shortcut(self, name, expected):
    task = builders.build_task('emnist', 'linear', source='synthetic',
                               client_spec=builders.ClientSpec(1, 10))
    simulation = loop.Simulation(
        task, registry.aggregator_from_name(name, assumed_byzantine_fraction=0.1))
    # pylint: disable=protected-access
    self.assertEqual(simulation._aggregate != simulation._aggregation.next, expected)

  def test_every_client_non_finite_leaves_an_empty_matrix(self):
    process, aggregate = _process_and_aggregation('median')
    updates, weights = cases.simulation_round('random', 0)
    updates = [[np.full_like(leaf, np.nan) for leaf in update] for update in updates]
    expected = process.next(process.initialize(), updates, list(weights))
    actual = aggregate(process.initialize(), updates, list(weights))
    _assert_same(self, expected.result, actual.result)
    self.assertEqual(actual.measurements['num_nonfinite_clients'], _NUM_CLIENTS)
    self.assertEqual(actual.measurements['num_clients'], 0)


if __name__ == '__main__':
  absltest.main()
