"""The simulation's in-process evaluation of TFF computations returns what TFF's runtime
returns: every aggregator of the registry (results, states, measurements, round after
round), and one round of each bundled task both ways."""

from unittest import mock
import weakref

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from baselines import gather
from tasks import builders
from tasks import registry
from tasks.simulation import client_work as client_work_lib
from tasks.simulation import in_process
from tasks.simulation import rounds
from tests.helpers import aggregator_cases as cases
from tests.helpers import compilation
from tff_robust import passwise

# The simulation's value type: the model's trainable variables as a list.
_VALUE_TYPE = tff.types.to_type([tff.TensorType(np.float32, [3, 2]),
                                 tff.TensorType(np.float32, [4])])
_WEIGHT_TYPE = tff.TensorType(np.float32)
# Every aggregator of the registry, and each wrapper around an iterative one.
_NAMES = list(registry.AGGREGATORS) + ['arc+gm', 'arc+mean', 'bucketing+gm', 'nnm+gm',
                                       'arc+gamma_mean', 'bucketing+median']



def _assert_equal(testcase, expected, actual, exact: bool, path: str):
  testcase.assertEqual(tf.nest.map_structure(lambda _: 0, expected),
                       tf.nest.map_structure(lambda _: 0, actual), path)
  for e, a in zip(tf.nest.flatten(expected), tf.nest.flatten(actual)):
    if exact:
      np.testing.assert_array_equal(np.asarray(a), np.asarray(e), err_msg=path)
    else:
      np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(e, np.float64),
                                 rtol=1e-6, atol=1e-6, err_msg=path)


_BUILT = {}


def _process_and_aggregation(name):
  """The federated process of `name` and its in-process aggregation, built once."""
  if name not in _BUILT:
    factory = registry.aggregator_from_name(name, assumed_byzantine_fraction=0.2)
    process = factory.create(_VALUE_TYPE, _WEIGHT_TYPE)
    _BUILT[name] = (factory, process, in_process.aggregation(process))
  return _BUILT[name]


class AggregationTest(parameterized.TestCase):
  # Compiled as deployed (grappler on, tests/helpers/compilation.py): the simulation's
  # in-process path is held to TFF's runtime in the configuration users run.

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.enterClassContext(compilation.deployed())

  @parameterized.parameters(*_NAMES)
  def test_equals_the_federated_process(self, name):
    factory, process, aggregate = _process_and_aggregation(name)
    self.assertIsNotNone(aggregate)
    # The gathering ones' server matrix products may sum in another order here
    # (NNM's mixing, 1 ulp); the simulation takes `tasks.simulation.gathered` for them.
    exact = not isinstance(getattr(factory, 'inner', None),
                           gather.GatheringAggregationFactory)
    federated_state = in_process_state = process.initialize()
    # One round of each kind of input, the state carried from round to round (the
    # stateful ones, clipping and bucketing, move); the faulty round last, so that
    # its NaNs cannot reach the state the other rounds start from.
    for round_num, kind in enumerate(('random', 'attacked', 'faulty')):
      updates, weights = cases.simulation_round(kind, seed=round_num)
      expected = process.next(federated_state, updates, list(weights))
      # Both ways a call runs in process: one traced function (small arguments),
      # and each TensorFlow computation on its own (large ones).
      for fuse_at_most_bytes in (in_process.FUSE_AT_MOST_BYTES, 0):
        with mock.patch.object(in_process, 'FUSE_AT_MOST_BYTES', fuse_at_most_bytes), \
             mock.patch.object(in_process, 'FUSE_AFTER_CALLS', 0):
          actual = aggregate(in_process_state, list(updates), list(weights))
        where = (f'{name}, round {round_num} ({kind}), '
                 f'{"fused" if fuse_at_most_bytes else "call by call"}')
        _assert_equal(self, expected.result, actual.result, exact, f'{where}: result')
        _assert_equal(self, expected.measurements, actual.measurements, exact,
                      f'{where}: measurements')
        _assert_equal(self, expected.state, actual.state, exact, f'{where}: state')
      federated_state, in_process_state = expected.state, actual.state

  def test_a_call_is_traced_once_it_repeats(self):
    process = registry.aggregator_from_name('gm').create(_VALUE_TYPE, _WEIGHT_TYPE)
    updates, weights = cases.simulation_round('random', 0)
    with mock.patch.dict(in_process._COMPILED, clear=True):
      aggregate = in_process.aggregation(process)
      [compiled] = in_process._COMPILED.values()
      results = []
      for call in range(in_process.FUSE_AFTER_CALLS + 1):
        self.assertEmpty(compiled.fused, f'traced before call {call}')
        results.append(aggregate(process.initialize(), list(updates), list(weights)))
      self.assertLen(compiled.fused, 1)
      for result in results[1:]:
        _assert_equal(self, results[0].result, result.result, True, 'result')

  def test_the_updates_are_dropped_once_taken(self):
    _, process, aggregate = _process_and_aggregation('gm')
    updates, weights = cases.simulation_round('random', 0)
    aggregate(process.initialize(), updates, list(weights))
    self.assertEqual(updates, [])

  def test_leaves_a_python_driven_process_to_its_driver(self):
    # Pass by pass (e.g. on workers, `tasks.simulation.on_workers`): not one TFF
    # computation, so it runs as its driver says.
    process = passwise.PasswiseFactory(registry.aggregator_from_name('gm')).create(
        _VALUE_TYPE, _WEIGHT_TYPE)
    self.assertIsNone(in_process.process_next(process))
    self.assertIsNone(in_process.aggregation(process))

  def test_refuses_a_numpy_value_of_another_dtype_as_the_runtime_does(self):
    _, process, aggregate = _process_and_aggregation('mean')
    updates, weights = cases.simulation_round('random', 0)
    as_float64 = [[np.asarray(leaf, np.float64) for leaf in update]
                  for update in updates]
    with self.assertRaises(TypeError):  # TFF's runtime: "Failed to serialize".
      process.next(process.initialize(), as_float64, list(weights))
    with self.assertRaisesRegex(TypeError, 'dtype float64 .* convert it to float32'):
      aggregate(process.initialize(), as_float64, list(weights))

  def test_refuses_an_intrinsic_it_does_not_know(self):
    # A secure sum: the in-process path says so and the caller keeps TFF's runtime.
    secure = tff.aggregators.SecureSumFactory(upper_bound_threshold=100.0)
    process = secure.create(tff.TensorType(np.float32, [2]))
    with self.assertRaisesRegex(in_process.UnsupportedComputationError,
                                'federated_secure'):
      in_process.InProcessComputation(process.next)
    self.assertIsNone(in_process.process_next(process))

  def test_refuses_a_missing_or_extra_argument_as_the_computation_does(self):
    # Before: the weights given to an unweighted mean were dropped (the mean came
    # back unweighted), and a missing server argument became NaN.
    mean = tff.aggregators.UnweightedMeanFactory().create(
        tff.TensorType(np.float32, [2]))
    updates = [np.array([1.0, 2.0], np.float32), np.array([3.0, 4.0], np.float32)]
    local = in_process.InProcessComputation(mean.next)
    for call in (mean.next, local):
      with self.assertRaisesRegex(TypeError, 'not used'):
        call(mean.initialize(), updates, [1.0, 3.0])
    with self.assertRaises(TypeError):
      in_process.aggregation(mean)(mean.initialize(), list(updates), [1.0, 3.0])
    server = tff.FederatedType(np.float32, tff.SERVER)

    @tff.federated_computation(server, server, server)
    def add(a, b, c):
      return tff.federated_map(tff.tensorflow.computation(lambda x, y, z: x + y + z),
                               tff.federated_zip((a, b, c)))

    for call in (add, in_process.InProcessComputation(add)):
      with self.assertRaisesRegex(TypeError, 'Missing argument `c`'):
        call(1.0, 2.0)
    self.assertEqual(in_process.InProcessComputation(add)(1.0, 2.0, c=4.0), 7.0)


_CLIENT_VALUE = tff.TensorType(np.float32, [1000])


@tff.tensorflow.computation(_CLIENT_VALUE)
def _plus_one(x):
  return x + 1.0


@tff.tensorflow.computation(_CLIENT_VALUE)
def _doubled(x):
  return x * 2.0


class ClientByClientTest(absltest.TestCase):
  """A CLIENTS value computed by maps and zips is computed one client at a time as
  its one reader takes it, and once when several read it."""

  def setUp(self):
    super().setUp()
    self.clients = [np.full(1000, i, np.float32) for i in range(20)]
    # Fresh compiled forms and embedded functions: `_embedded` below sees them all.
    self.enter_context(mock.patch.dict(in_process._COMPILED, clear=True))
    self.enter_context(mock.patch.dict(in_process._EMBEDDED_FUNCTIONS, clear=True))
    # Call by call, as arguments above `FUSE_AT_MOST_BYTES` are (traced into one
    # function, TensorFlow's executor decides what is alive when).
    self.enter_context(mock.patch.object(in_process, 'FUSE_AT_MOST_BYTES', 0))

  def _most_client_values_alive(self, computation):
    """Calls `computation` on the clients; returns its result and the most outputs
    of shape [1000] of its TensorFlow functions alive at once."""
    outputs, most = [], [0]  # Weak references: tensors are not hashable.
    embedded = in_process._embedded

    def spying(block):
      function = embedded(block)

      def call(*args):
        output = function(*args)
        for leaf in tf.nest.flatten(output):
          if isinstance(leaf, tf.Tensor) and leaf.shape == (1000,):
            outputs.append(weakref.ref(leaf))
        most[0] = max(most[0], sum(output() is not None for output in outputs))
        return output

      return call

    with mock.patch.object(in_process, '_embedded', spying):
      result = in_process.InProcessComputation(computation)(list(self.clients))
    return result, most[0]

  def test_a_chain_of_maps_into_a_sum_holds_one_clients_values_at_a_time(self):

    @tff.federated_computation(tff.FederatedType(_CLIENT_VALUE, tff.CLIENTS))
    def chain(x):
      return tff.federated_sum(
          tff.federated_map(_doubled, tff.federated_map(_plus_one, x)))

    result, most_alive = self._most_client_values_alive(chain)
    np.testing.assert_array_equal(result, sum((x + 1) * 2 for x in self.clients))
    # A few (one client's intermediates, the running sums), not one per client: as
    # lists, the 20 clients' first map would all be alive while the second runs.
    self.assertLessEqual(most_alive, 6)

  def test_a_value_two_readers_take_is_computed_once(self):
    iterations = []
    original_iter = in_process._ClientByClient.__iter__

    def counted_iter(value):
      iterations.append(id(value))
      return original_iter(value)

    @tff.federated_computation(tff.FederatedType(_CLIENT_VALUE, tff.CLIENTS))
    def read_twice(x):
      y = tff.federated_map(_plus_one, x)
      return tff.federated_sum(y), tff.federated_sum(tff.federated_map(_doubled, y))

    with mock.patch.object(in_process._ClientByClient, '__iter__', counted_iter):
      result = in_process.InProcessComputation(read_twice)(list(self.clients))
    np.testing.assert_array_equal(result[0], sum(x + 1 for x in self.clients))
    np.testing.assert_array_equal(result[1], sum((x + 1) * 2 for x in self.clients))
    self.assertTrue(iterations)
    self.assertEqual(len(iterations), len(set(iterations)))  # None read twice.


# One round both ways for each bundled task, tiny: the client work (local training of
# the task's model) through TFF's runtime, the aggregator and the server update in
# process or not.
_TASKS = {
    'emnist': dict(task='emnist', model='linear'),
    'shakespeare': dict(task='shakespeare', model='lstm', num_clients=4),
    'sent140': dict(task='sent140', model='linear', num_clients=4),
}


@pytest.mark.slow  # Trains each task's model (an LSTM among them) end to end.
class RoundTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.enterClassContext(compilation.deployed())

  # Each task's model, and an aggregator of each kind of state (the GM's, the
  # γ-mean's): the aggregation of every registry name is held to TFF's runtime above.
  @parameterized.parameters(('emnist', 'gm'), ('shakespeare', 'gm'),
                            ('sent140', 'gamma_mean'))
  def test_a_round_equals_the_federated_round(self, task, aggregator):
    spec = _TASKS[task]
    task = builders.build_task(
        spec['task'], spec['model'], source='synthetic',
        client_spec=builders.ClientSpec(1, 4, max_elements=8, shuffle_buffer_size=1),
        num_clients=spec.get('num_clients'))
    work = client_work_lib.fedavg_client_work(task)
    with tf.Graph().as_default():
      weights_type = tff.learning.models.weights_type_from_model(task.model_fn())
    factory = registry.aggregator_from_name(aggregator)
    keras_model = task.keras_model_fn()
    initial = tff.learning.models.ModelWeights(
        trainable=[v.numpy() for v in keras_model.trainable_variables],
        non_trainable=[v.numpy() for v in keras_model.non_trainable_variables])
    client_ids = list(task.train_data.client_ids)[:3]
    outputs = []
    for in_process_path in (False, True):
      round_ = rounds.Round(work, factory, model_weights_type=weights_type,
                            in_process=in_process_path)
      self.assertEqual(round_.aggregate == round_.aggregation.next,
                       not in_process_path)
      state = round_.initialize(initial)
      for round_num in range(2):
        output = round_.next(state, task.client_dataset, client_ids=client_ids,
                             learning_rate=0.1)
        state = output.state
      outputs.append(output)
    federated, local = outputs
    _assert_equal(self, federated.state, local.state, True, 'state')
    _assert_equal(self, federated.measurements['aggregator'],
                  local.measurements['aggregator'], True, 'measurements')


if __name__ == '__main__':
  absltest.main()
