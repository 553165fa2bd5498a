"""Secure centered clipping (Karimireddy et al. 2021) against plain numpy and against
the gathering baseline: L iterations of v ← v + Σ α_i clip_τ(x_i − v) / Σ α_i, each a
broadcast and one inner mean; round-to-round state; far-away clients; inside TFF's
FedAvg builder. (Its compiled-computation privacy walk and secure-sum run are in
tests/tff_robust/aggregators/test_privacy.py, with the other secure-compatible factories.)"""

import collections

from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from baselines import centered_clipping as gathering
from tasks import registry
from tests.helpers import aggregator_cases as cases
from tests.helpers import least_squares as ls
import tff_robust
from tff_robust.aggregators import centered_clipping

TOLERANCE = 1e-5


def np_centered_clipping(x, a, tau, iterations, v0):
  """The paper's eq. (CC) with weights, in float64; and the last iteration's fraction
  of clients with ‖x_i − v‖ > τ."""
  v = np.array(v0, np.float64)
  for _ in range(iterations):
    distances = np.linalg.norm(x - v, axis=1)
    scale = np.minimum(1.0, tau / np.maximum(distances, 1e-300))
    v = v + (a * scale) @ (x - v) / a.sum()
  return v, float(np.mean(distances > tau))


def start(initial_point, x, a):
  if initial_point == 'mean':
    return a @ x / a.sum()
  return np.zeros(x.shape[1])


def secure_process(tau, iterations, initial_point, inner=None):
  return cases.process(
      ('secure_cc', tau, iterations, initial_point, type(inner).__name__),
      lambda: centered_clipping.SecureCenteredClippingFactory(
          clip_radius=tau, num_iterations=iterations, initial_point=initial_point,
          inner_mean_factory=inner))


def gathering_process(tau, iterations, initial_point):
  return cases.process(
      ('gathering_cc', tau, iterations, initial_point),
      lambda: gathering.CenteredClippingFactory(
          clip_radius=tau, num_iterations=iterations, initial_point=initial_point))


class MatchesNumpyAndTheGatheringBaselineTest(parameterized.TestCase):

  @parameterized.named_parameters(
      *[dict(c, testcase_name=f'{p}_tau{tau}_L{l}_{c["testcase_name"]}',
             initial_point=p, tau=tau, iterations=l)
        for p, tau, l in (('previous', 1.0, 3), ('mean', 1.0, 3), ('zero', 2.0, 2),
                          ('previous', 0.5, 1))
        for c in cases.input_cases()])
  def test_one_round(self, initial_point, tau, iterations, inputs, weights):
    x, a = cases.INPUTS[inputs](), cases.WEIGHTS[weights]()
    result, output = cases.run(secure_process(tau, iterations, initial_point), x, a)
    expected, fraction = np_centered_clipping(x, a, tau, iterations,
                                              start(initial_point, x, a))
    self.assertLessEqual(cases.relative_error(result, expected), TOLERANCE)
    baseline, baseline_output = cases.run(
        gathering_process(tau, iterations, initial_point), x, a)
    self.assertLessEqual(cases.relative_error(result, baseline), TOLERANCE)
    self.assertAlmostEqual(output.measurements['fraction_clipped'], fraction, places=6)
    self.assertAlmostEqual(output.measurements['fraction_clipped'],
                           baseline_output.measurements['fraction_clipped'], places=6)
    self.assertEqual(output.measurements['num_secure_average_calls'],
                     iterations + (initial_point == 'mean'))

  def test_previous_aggregate_is_the_next_centre(self):
    process = secure_process(0.5, 2, 'previous')
    baseline = gathering_process(0.5, 2, 'previous')
    state, baseline_state, v = process.initialize(), baseline.initialize(), None
    v = np.zeros(cases.DIMENSION)
    for seed in (11, 12, 13):
      x, a = cases.random_inputs(seed), cases.random_weights()
      result, output = cases.run(process, x, a, state)
      expected, _ = np_centered_clipping(x, a, 0.5, 2, v)
      baseline_result, baseline_output = cases.run(baseline, x, a, baseline_state)
      self.assertLessEqual(cases.relative_error(result, expected), TOLERANCE)
      self.assertLessEqual(cases.relative_error(result, baseline_result), TOLERANCE)
      state, baseline_state, v = output.state, baseline_output.state, expected
    np.testing.assert_allclose(cases.to_vector(state['previous']), v, rtol=1e-5)

  @parameterized.product(magnitude=(1e10, 1e30, 3e38), initial_point=('previous', 'zero'))
  def test_far_clients_move_the_centre_by_at_most_tau(self, magnitude, initial_point):
    # Three clients far out on opposite signs: x − v overflows float32 at 3e38 and the
    # scale τ/‖x − v‖ ~ 1e-39 is below float32's normal range (float64 path).
    x = cases.random_inputs(8)
    x[[1, 4]] = magnitude
    x[8] = -magnitude
    x = x.astype(np.float32).astype(np.float64)
    a = cases.random_weights()
    result, output = cases.run(secure_process(1.0, 3, initial_point), x, a)
    expected, fraction = np_centered_clipping(x, a, 1.0, 3, np.zeros(cases.DIMENSION))
    self.assertTrue(np.all(np.isfinite(result)))
    self.assertLessEqual(cases.relative_error(result, expected), TOLERANCE)
    self.assertAlmostEqual(output.measurements['fraction_clipped'], fraction, places=6)

  def test_clients_of_weight_zero_are_ignored(self):
    x, a = cases.random_inputs(9), cases.random_weights()
    x[[0, 6]] = 1e6
    a[[0, 6]] = 0.0
    result, output = cases.run(secure_process(1.0, 3, 'zero'), x, a)
    kept = a > 0
    expected, fraction = np_centered_clipping(x[kept], a[kept], 1.0, 3,
                                              np.zeros(cases.DIMENSION))
    self.assertLessEqual(cases.relative_error(result, expected), TOLERANCE)
    self.assertAlmostEqual(output.measurements['fraction_clipped'], fraction, places=6)

  def test_float32_inner_mean_gives_the_same_result(self):
    # The clipped differences are bounded by τ·α: TFF's float32 products suffice.
    x, a = cases.clustered_attack_inputs(), cases.random_weights()
    result, _ = cases.run(secure_process(
        1.0, 3, 'previous', tff_robust.iterative.iterative_mean.Float32MeanFactory()), x, a)
    expected, _ = np_centered_clipping(x, a, 1.0, 3, np.zeros(cases.DIMENSION))
    self.assertLessEqual(cases.relative_error(result, expected), TOLERANCE)

  @parameterized.named_parameters(
      ('radius', dict(clip_radius=0.0), ValueError, 'clip_radius'),
      ('iterations', dict(num_iterations=0), ValueError, 'num_iterations'),
      ('start', dict(initial_point='median'), ValueError, 'initial_point'),
      ('inner', dict(inner_mean_factory='mean'), TypeError, 'inner_mean_factory'))
  def test_bad_arguments_are_named(self, kwargs, error, message):
    with self.assertRaisesRegex(error, message):
      centered_clipping.SecureCenteredClippingFactory(**kwargs)

  def test_registered_and_declared_secure(self):
    factory = registry.aggregator_from_name('secure_centered_clipping')
    self.assertTrue(registry.is_secure_compatible(factory))
    self.assertFalse(registry.is_secure_compatible(
        registry.aggregator_from_name('centered_clipping')))


class FedAvgBuilderTest(tf.test.TestCase):

  def test_two_rounds_equal_the_gathering_baseline(self):
    rng = np.random.default_rng(5)
    clients = collections.OrderedDict()
    for i in range(4):
      x = rng.normal(size=(6, ls.DIM)).astype(np.float32)
      y = x @ rng.normal(size=(ls.DIM, 1)) + i
      clients[f'c{i}'] = (x, (y * (50.0 if i == 1 else 1.0)).astype(np.float32))
    task = ls.least_squares_task(clients)
    datasets = [ls.full_batch(x, y) for x, y in clients.values()]
    start_weights = tff.learning.models.ModelWeights(
        trainable=ls.random_params(rng), non_trainable=[])

    def two_rounds(name):
      process = tff.learning.algorithms.build_weighted_fed_avg(
          task.model_fn, tff.learning.optimizers.build_sgdm(ls.LEARNING_RATE),
          model_aggregator=registry.aggregator_from_name(
              name, clip_radius=0.3, num_iterations=2))
      state = process.set_model_weights(process.initialize(), start_weights)
      for _ in range(2):
        output = process.next(state, datasets)
        state = output.state
      return process.get_model_weights(state).trainable, output.metrics

    secure, metrics = two_rounds('secure_centered_clipping')
    baseline, _ = two_rounds('centered_clipping')
    ls.assert_weights_close(self, secure, baseline)
    self.assertEqual(metrics['aggregator']['num_secure_average_calls'], 2)


if __name__ == '__main__':
  tf.test.main()
