"""The drop-in RFA learning processes, used exactly like build_weighted_fed_avg."""

import collections

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tff_robust

# Trains end to end (TFF learning processes around the geometric median): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

INPUT_SPEC = (tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([None], tf.int32))


def model_fn():
  keras_model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(4,)),
      tf.keras.layers.Dense(3, kernel_initializer='zeros'),
  ])
  return tff.learning.models.from_keras_model(
      keras_model,
      input_spec=INPUT_SPEC,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])


def client_datasets(num_clients, seed=0, sizes=None):
  rng = np.random.default_rng(seed)
  datasets = []
  for size in sizes or [12] * num_clients:
    x = rng.normal(size=(size, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 1).astype(np.int32)
    datasets.append(tf.data.Dataset.from_tensor_slices((x, y)).batch(4))
  return datasets


def flat(model_weights):
  return np.concatenate([np.ravel(w) for w in model_weights.trainable])


BUILDERS = (
    ('rfa', tff_robust.build_robust_federated_aggregation_process),
    ('one_step_rfa', tff_robust.build_one_step_robust_federated_aggregation_process),
)


class RobustProcessTest(parameterized.TestCase):

  @parameterized.named_parameters(*BUILDERS)
  def test_one_round_moves_the_model(self, build):
    process = build(model_fn, tff.learning.optimizers.build_sgdm(learning_rate=0.5))
    state = process.initialize()
    before = process.get_model_weights(state)

    output = process.next(state, client_datasets(4))

    after = process.get_model_weights(output.state)
    self.assertGreater(np.linalg.norm(flat(after) - flat(before)), 1e-3)
    self.assertTrue(np.all(np.isfinite(flat(after))))
    aggregator = output.metrics['aggregator']
    self.assertIn('objective', aggregator)
    self.assertEqual(aggregator['num_nonfinite_clients'], 0)
    self.assertIn('loss', output.metrics['client_work']['train'])

  @parameterized.named_parameters(*BUILDERS)
  def test_caps_client_weights_by_default(self, build):
    # A client's weight is the example count it reports: one with 100 times the
    # others' examples weighs 2 × the median (to a bucket), not 100 ×.
    optimizer = tff.learning.optimizers.build_sgdm(learning_rate=0.5)
    sizes = [8] * 5 + [800]
    capped = build(model_fn, optimizer)
    output = capped.next(capped.initialize(), client_datasets(6, sizes=sizes))
    aggregator = output.metrics['aggregator']
    self.assertEqual(aggregator['num_capped_clients'], 1)
    self.assertBetween(aggregator['weight_cap'], 2 * 8, 2 * 8 * 2**(1 / 8) * (1 + 1e-6))
    uncapped = build(model_fn, optimizer, cap_weights=False)
    output = uncapped.next(uncapped.initialize(), client_datasets(6, sizes=sizes))
    self.assertNotIn('weight_cap', output.metrics['aggregator'])

  @parameterized.named_parameters(
      ('rfa', tff_robust.build_robust_federated_aggregation_process, {},
       {'bound_by_recent_steps': False}),
      ('one_step_rfa', tff_robust.build_one_step_robust_federated_aggregation_process,
       {'bound_by_recent_steps': True}, {}))
  def test_bounds_the_step_by_the_recent_ones(self, build, switch, off):
    # Round 1 is unbounded; round 2's bound is 2 × round 1's step (the server's SGD
    # at rate 1: the step is the aggregate). On by default in RFA only.
    optimizer = tff.learning.optimizers.build_sgdm(learning_rate=0.5)
    process = build(model_fn, optimizer, **switch)
    state = process.initialize()
    first = process.next(state, client_datasets(4))
    step = np.linalg.norm(flat(process.get_model_weights(first.state)) -
                          flat(process.get_model_weights(state)))
    self.assertEqual(first.metrics['aggregator']['trust_radius'], np.inf)
    second = process.next(first.state, client_datasets(4))
    np.testing.assert_allclose(second.metrics['aggregator']['trust_radius'],
                               2 * step, rtol=1e-5)
    unbounded = build(model_fn, optimizer, **off)
    output = unbounded.next(unbounded.initialize(), client_datasets(4))
    self.assertNotIn('trust_radius', output.metrics['aggregator'])

  @parameterized.parameters('cap_weights', 'bound_by_recent_steps')
  def test_switches_must_be_bools(self, name):
    with self.assertRaisesRegex(TypeError, name):
      tff_robust.build_robust_federated_aggregation_process(
          model_fn, tff.learning.optimizers.build_sgdm(learning_rate=0.5),
          **{name: 'yes'})

  def test_same_result_as_fed_avg_for_one_client(self):
    # The geometric median of one point is that point.
    optimizer = tff.learning.optimizers.build_sgdm(learning_rate=0.5)
    data = client_datasets(1)
    robust = tff_robust.build_robust_federated_aggregation_process(model_fn, optimizer)
    fed_avg = tff.learning.algorithms.build_weighted_fed_avg(model_fn, optimizer)
    robust_weights = robust.get_model_weights(robust.next(robust.initialize(), data).state)
    fed_avg_weights = fed_avg.get_model_weights(
        fed_avg.next(fed_avg.initialize(), data).state)
    np.testing.assert_allclose(flat(robust_weights), flat(fed_avg_weights), atol=1e-6)

  def test_options_are_passed_through(self):
    # Clients of 4, 8 and 24 examples (uniform and by-example weights differ) and two
    # rounds (server momentum shows in the second): the drop-in equals TFF's builder
    # with the same options and the non-finite-filtered geometric median, and dropping
    # the weighting, the server optimizer, the passes, the start or ν changes the model
    # (ν = 100 exceeds every distance, so every pass is the plain mean).
    datasets = client_datasets(3, sizes=(4, 8, 24))
    options = dict(
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=0.5),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0,
                                                               momentum=0.9),
        client_weighting=tff.learning.ClientWeighting.UNIFORM)

    def after_two_rounds(process):
      state = process.initialize()
      for _ in range(2):
        state = process.next(state, datasets).state
      return flat(process.get_model_weights(state))

    def robust(**changes):
      return after_two_rounds(tff_robust.build_robust_federated_aggregation_process(
          model_fn, **{**options, 'num_communication_passes': 5, 'nu': 1e-3,
                       'initial_point': 'mean', **changes}))

    reference = after_two_rounds(tff.learning.algorithms.build_weighted_fed_avg(
        model_fn, **options, model_aggregator=tff_robust.NonfiniteFilteringFactory(
            tff_robust.GeometricMedianFactory(num_communication_passes=5, nu=1e-3,
                                              initial_point='mean'))))
    actual = robust()
    np.testing.assert_allclose(actual, reference, atol=1e-6)
    for dropped in (dict(client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES),
                    dict(server_optimizer_fn=None), dict(num_communication_passes=2),
                    dict(initial_point='trimmed'), dict(initial_point='zero'),
                    dict(nu=100.0)):
      self.assertGreater(np.abs(robust(**dropped) - actual).max(), 1e-4, dropped)

  def test_keras_optimizer_function_gets_a_clear_error(self):
    with self.assertRaisesRegex(TypeError, 'tff.learning.optimizers'):
      tff_robust.build_robust_federated_aggregation_process(
          model_fn, lambda: tf.keras.optimizers.SGD(0.1))


class ProcessWithAggregatorTest(parameterized.TestCase):
  """`build_process_with_aggregator` takes `build_weighted_fed_avg`'s spelling."""

  def _after_one_round(self, process):
    state = process.next(process.initialize(), client_datasets(3, sizes=(4, 8, 24))).state
    return flat(process.get_model_weights(state))

  @parameterized.named_parameters(
      ('defaults', {}, {}),
      ('model_aggregator', dict(model_aggregator=tff_robust.GammaMeanFactory()),
       dict(model_aggregator=tff_robust.GammaMeanFactory())))
  def test_equals_tffs_builder_called_the_same_way(self, ours, theirs):
    optimizer = tff.learning.optimizers.build_sgdm(learning_rate=0.5)
    actual = self._after_one_round(
        tff_robust.build_process_with_aggregator(model_fn, optimizer, **ours))
    expected = self._after_one_round(
        tff.learning.algorithms.build_weighted_fed_avg(model_fn, optimizer, **theirs))
    np.testing.assert_allclose(actual, expected, atol=1e-6)

  def test_both_spellings_at_once_are_refused(self):
    with self.assertRaisesRegex(TypeError, 'same argument'):
      tff_robust.build_process_with_aggregator(
          model_fn, tff.learning.optimizers.build_sgdm(learning_rate=0.5), None,
          tff_robust.GammaMeanFactory(), model_aggregator=tff_robust.GammaMeanFactory())


if __name__ == '__main__':
  tf.test.main()
