"""The original TFF RFA's test cases through this package's API.

google-research/federated, `robust_aggregation/robust_federated_aggregation_test.py`:
10 clients, each holding one example x_i ~ U[0, 1)^500 (numpy RandomState(0)), whose
model update is x_i itself and whose weight is its example count; a linear model
starting at zero and a server step of 1, so after one round the model is the
aggregate. For R ∈ {3, 5} passes and the original's `tolerance` (its ν) ∈ {1e-4, 1e-6}
the aggregate must equal the original's numpy smoothed Weiszfeld (`original_numpy`,
the original test's `aggregation_fn_np`) to the original's `assertAllClose`
tolerance, 1e-6. Configured as documented: `original_rfa.RobustWeiszfeldFactory(R,
tolerance)`, or `GeometricMedianFactory(R, nu=tolerance, tolerance=0,
initial_point='mean')`.
"""

import collections

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tff_robust
from tff_robust.aggregators import original_rfa

DIM = 500
NUM_DATA_POINTS = 10
CASES = [(f'passes{r}_tolerance{t:g}', r, t) for r in (3, 5) for t in (1e-4, 1e-6)]
MODEL_TYPE = [tff.TensorType(np.float32, [DIM, 1])]  # The model's trainable weights.


def toy_data():
  """The original's data: one example per client (labels drawn, as there, unused)."""
  rng = np.random.RandomState(0)
  data = rng.rand(NUM_DATA_POINTS, DIM).astype(np.float32)
  labels = rng.rand(NUM_DATA_POINTS, 1).astype(np.float32)
  return data, labels


def original_numpy(value, weight, num_communication_passes=5, tolerance=1e-6):
  """The original test's `aggregation_fn_np`: the weighted mean, then R − 1 smoothed
  Weiszfeld steps with weights α_i / max(ν, ‖v − x_i‖), ν = `tolerance`."""
  tolerance = np.float32(tolerance)
  aggr = np.average(value, axis=0, weights=weight)
  for _ in range(num_communication_passes - 1):
    aggr = np.average(
        value, axis=0,
        weights=[weight[i] / np.maximum(tolerance, np.linalg.norm(aggr - value[i, :]))
                 for i in range(value.shape[0])])
  return aggr


def expected_median(num_passes, tolerance):
  data, _ = toy_data()
  weights = np.ones(NUM_DATA_POINTS, np.float32) / NUM_DATA_POINTS
  return original_numpy(data, weights, num_passes, tolerance)


def documented_factory(num_passes, tolerance):
  return tff_robust.GeometricMedianFactory(
      num_communication_passes=num_passes, nu=tolerance, tolerance=0.0,
      initial_point='mean')


ENTRY_POINTS = collections.OrderedDict(
    original_rfa_factory=lambda r, t: original_rfa.RobustWeiszfeldFactory(r, t).create(
        tff.types.to_type(MODEL_TYPE), tff.TensorType(np.float32)),
    original_rfa_stateless=lambda r, t: original_rfa.build_stateless_robust_aggregation(
        MODEL_TYPE, num_communication_passes=r, tolerance=t),
    documented_configuration=lambda r, t: documented_factory(r, t).create(
        tff.types.to_type(MODEL_TYPE), tff.TensorType(np.float32)),
)


class OriginalAggregationCasesTest(parameterized.TestCase):

  @parameterized.named_parameters(*[
      (f'{entry}_{name}', entry, r, t) for entry in ENTRY_POINTS for name, r, t in CASES])
  def test_matches_the_original(self, entry, num_passes, tolerance):
    data, _ = toy_data()
    proc = ENTRY_POINTS[entry](num_passes, tolerance)
    # The original's client weight is the example count, 1.
    output = proc.next(proc.initialize(), [[x.reshape(DIM, 1)] for x in data],
                       [np.float32(1.0)] * NUM_DATA_POINTS)
    np.testing.assert_allclose(np.reshape(output.result[0], -1),
                               expected_median(num_passes, tolerance),
                               rtol=1e-6, atol=1e-6)
    self.assertEqual(output.measurements['num_passes_applied'], num_passes)

  @parameterized.named_parameters(*[(entry, entry) for entry in ENTRY_POINTS])
  def test_tolerance_is_nu_where_it_binds(self, entry):
    # Beyond the original's cases, whose distances (~9) never reach ν: here the
    # clients are 1e-3 × the original's, at 0.0059-0.0064 from the estimate, so
    # ν = 0.0062 floors about half of the distances.
    data = toy_data()[0] * np.float32(1e-3)
    proc = ENTRY_POINTS[entry](5, 0.0062)
    output = proc.next(proc.initialize(), [[x.reshape(DIM, 1)] for x in data],
                       [np.float32(1.0)] * NUM_DATA_POINTS)
    weights = np.ones(NUM_DATA_POINTS, np.float32) / NUM_DATA_POINTS
    expected = original_numpy(data, weights, 5, 0.0062)
    np.testing.assert_allclose(np.reshape(output.result[0], -1), expected,
                               rtol=1e-6, atol=1e-9)
    # With ν = 1e-6 instead the result moves (ν is what `tolerance` sets).
    self.assertGreater(np.abs(original_numpy(data, weights, 5, 1e-6) - expected).max(),
                       1e-7)


class NegativePrediction(tf.keras.losses.Loss):
  """Loss −prediction per example."""

  def call(self, y_true, y_pred):
    del y_true
    return -y_pred[:, 0]


def model_fn():
  """The original's model: a zero-initialised linear map without bias. Its loss,
  −prediction, has gradient −x on the example x, so one local SGD step of rate 1
  from zero makes the client's update x itself (the original's dummy client
  computation, which returned the mean of the client's examples)."""
  data, labels = toy_data()
  keras_model = tf.keras.Sequential([
      tf.keras.layers.Input(shape=(DIM,)),
      tf.keras.layers.Dense(1, kernel_initializer='zeros', use_bias=False)])
  sample = tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=data[:1], y=labels[:1])).batch(1)
  return tff.learning.models.from_keras_model(
      keras_model, input_spec=sample.element_spec,
      loss=NegativePrediction())


def client_datasets():
  data, labels = toy_data()
  return [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=data[i:i + 1], y=labels[i:i + 1])).batch(1) for i in range(NUM_DATA_POINTS)]


# Trains end to end: a round of the RFA learning process per case (the numbers of the
# aggregation cases above).
@pytest.mark.slow
class OriginalLearningProcessCasesTest(parameterized.TestCase):
  """The original test's shape: one round of the learning process, then the model."""

  @parameterized.named_parameters(*CASES)
  def test_one_round_matches_the_original(self, num_passes, tolerance):
    process = tff_robust.build_robust_federated_aggregation_process(
        model_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
        num_communication_passes=num_passes, nu=tolerance, tolerance=0.0,
        initial_point='mean')
    output = process.next(process.initialize(), client_datasets())
    model = process.get_model_weights(output.state)
    np.testing.assert_allclose(np.reshape(model.trainable[0], -1),
                               expected_median(num_passes, tolerance),
                               rtol=1e-6, atol=1e-6)


class ToleranceMeaningTest(parameterized.TestCase):
  """The original's call style cannot silently mean something else here."""

  @parameterized.named_parameters(
      ('factory', lambda: tff_robust.GeometricMedianFactory(
          num_communication_passes=5, tolerance=1e-4)),
      ('builder', lambda: tff_robust.build_robust_federated_aggregation_process(
          model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
          num_communication_passes=5, tolerance=1e-4)),
  )
  def test_original_keyword_alone_raises(self, build):
    with self.assertRaisesRegex(ValueError, r'tolerance.*\bnu\b.*original_rfa'):
      build()

  def test_registry_name_raises_too(self):
    from tasks import registry  # pylint: disable=g-import-not-at-top
    with self.assertRaisesRegex(ValueError, 'robust_aggregation'):
      registry.aggregator_from_name('gm', tolerance=1e-4)

  def test_explicit_meaning_is_accepted(self):
    factory = tff_robust.GeometricMedianFactory(nu=1e-4, tolerance=1e-3)
    self.assertEqual((factory.nu, factory.tolerance), (1e-4, 1e-3))
    # tolerance 0 (every pass) has no ν reading; the default ν is relative.
    factory = tff_robust.GeometricMedianFactory(tolerance=0.0)
    self.assertEqual((factory.nu, factory.relative_nu, factory.tolerance),
                     (None, 0.2, 0.0))
    factory = tff_robust.GeometricMedianFactory()
    self.assertEqual((factory.nu, factory.relative_nu, factory.tolerance),
                     (None, 0.2, 1e-6))
    factory = tff_robust.GeometricMedianFactory(relative_nu=0.5, tolerance=1e-3)
    self.assertEqual((factory.nu, factory.relative_nu), (None, 0.5))

  def test_original_positional_call_means_nu(self):
    # RobustWeiszfeldFactory(R, tolerance) positionally is (R, ν) here as well.
    factory = tff_robust.GeometricMedianFactory(5, 1e-4)
    self.assertEqual((factory.num_communication_passes, factory.nu), (5, 1e-4))

  def test_compatibility_factory_maps_the_arguments(self):
    factory = original_rfa.RobustWeiszfeldFactory(num_communication_passes=3,
                                                  tolerance=1e-4)
    self.assertEqual((factory.num_communication_passes, factory.nu, factory.tolerance,
                      factory.initial_point), (3, 1e-4, 0.0, 'mean'))
    with self.assertRaisesRegex(TypeError, 'num_communication_passes must be a Python int'):
      original_rfa.RobustWeiszfeldFactory(num_communication_passes=3.0)
    with self.assertRaises(ValueError):
      original_rfa.RobustWeiszfeldFactory(num_communication_passes=0)
