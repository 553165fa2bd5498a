"""tff_robust.iterative.iterative_steps: a toy iterative aggregate, defined once, run by both drivers
(the fused process and pass by pass) equals a plain numpy loop."""

import collections

from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_robust.iterative import iterative_steps
from tff_robust.iterative import iterative_mean
from tff_robust.aggregators import nonfinite
from tff_robust.common import numerics
from tff_robust.distributed import passwise

VALUE_TYPE = tff.types.to_type(collections.OrderedDict(
    kernel=tff.TensorType(np.float32, [2, 2]), bias=tff.TensorType(np.float32, [3])))
WEIGHT_TYPE = tff.TensorType(np.float32)


class ReweightedMeanSteps(iterative_steps.IterativeSteps):
  """A toy M-estimator: v₀ the weighted mean, then `num_iterations` passes of
  v ← Σ w_i x_i / Σ w_i with w_i = α_i / (1 + ‖x_i − v‖²). The state counts the
  calls; the measurements are the per-pass Σw (`record_sums`) and the call count."""

  def __init__(self, value_type, num_iterations, record_sums):
    self.value_type = value_type
    self._num_iterations = num_iterations
    self._record_sums = record_sums
    self._inner = iterative_mean.Float64MeanFactory().create(
        value_type, iterative_mean.WEIGHT_TYPE)

    @tff.tensorflow.computation(value_type, value_type, tf.float32)
    def client_weight(center, value, alpha):
      distance = numerics.global_l2_distance(value, center)
      return alpha / tf.cast(1.0 + tf.square(distance), tf.float32)

    @tff.tensorflow.computation(tf.int32)
    def increment(count):
      return count + 1

    self._client_weight, self._increment = client_weight, increment

  def initialize(self):
    return tff.federated_zip(collections.OrderedDict(
        inner=self._inner.initialize(), calls=tff.federated_value(0, tff.SERVER)))

  def start(self, state):
    return {'inner': state.inner,
            'calls': tff.federated_map(self._increment, state.calls), 'sums': []}

  def passes(self):
    return [iterative_steps.Pass('mean', self._mean)] + [
        iterative_steps.Pass('reweight', self._reweight)] * self._num_iterations

  def _mean(self, carry, value, alpha):
    output = self._inner.next(carry['inner'], value, alpha)
    return dict(carry, inner=output.state, center=output.result)

  def _reweight(self, carry, value, alpha):
    weight = tff.federated_map(
        self._client_weight, (tff.federated_broadcast(carry['center']), value, alpha))
    output = self._inner.next(carry['inner'], value, weight)
    carry = dict(carry, inner=output.state, center=output.result)
    if self._record_sums:
      carry['sums'] = carry['sums'] + [tff.federated_sum(weight)]
    return carry

  def finish(self, carry):
    measurements = collections.OrderedDict(
        weight_sums=iterative_mean.stack_at_server(carry['sums']), calls=carry['calls'])
    state = collections.OrderedDict(inner=carry['inner'], calls=carry['calls'])
    return tff.templates.MeasuredProcessOutput(
        tff.federated_zip(state), carry['center'], tff.federated_zip(measurements))


class ReweightedMeanFactory(iterative_steps.IterativeAggregationFactory):

  def __init__(self, num_iterations=3, record_sums=True):
    self._num_iterations = num_iterations
    self._record_sums = record_sums

  def steps(self, value_type):
    return ReweightedMeanSteps(value_type, self._num_iterations, self._record_sums)


def numpy_reweighted_mean(points, alphas, num_iterations):
  center = np.average(points, axis=0, weights=alphas)
  sums = []
  for _ in range(num_iterations):
    weights = alphas / (1.0 + np.sum((points - center) ** 2, axis=1))
    center = np.average(points, axis=0, weights=weights)
    sums.append(np.sum(weights))
  return center, np.array(sums)


def _clients(seed):
  rng = np.random.default_rng(seed)
  points = rng.normal(size=(6, 7))
  points[0] += 10.0
  alphas = rng.integers(1, 5, 6).astype(np.float64)
  values = [collections.OrderedDict(kernel=p[:4].reshape(2, 2).astype(np.float32),
                                    bias=p[4:].astype(np.float32)) for p in points]
  return points.astype(np.float32).astype(np.float64), alphas, values


def _vector(value):
  return np.concatenate([np.ravel(value['kernel']), np.ravel(value['bias'])])


_PROCESSES = {}


def _process(driver, num_iterations=3, record_sums=True):
  key = (driver, num_iterations, record_sums)
  if key not in _PROCESSES:
    factory = ReweightedMeanFactory(num_iterations, record_sums)
    if driver == 'fused':
      _PROCESSES[key] = factory.create(VALUE_TYPE, WEIGHT_TYPE)
    else:
      _PROCESSES[key] = passwise.PasswiseFactory(factory).create(VALUE_TYPE,
                                                                 WEIGHT_TYPE)
  return _PROCESSES[key]


class DriversTest(parameterized.TestCase):

  @parameterized.parameters('fused', 'passwise')
  def test_equals_the_numpy_loop_over_two_calls(self, driver):
    process = _process(driver)
    state = process.initialize()
    for call, seed in enumerate((0, 1), start=1):
      points, alphas, values = _clients(seed)
      output = process.next(state, values, [np.float32(a) for a in alphas])
      center, sums = numpy_reweighted_mean(points, alphas, 3)
      np.testing.assert_allclose(_vector(output.result), center, rtol=1e-5)
      np.testing.assert_allclose(output.measurements['weight_sums'], sums, rtol=1e-5)
      self.assertEqual(output.measurements['calls'], call)
      self.assertEqual(output.state['calls'], call)
      state = output.state

  def test_both_drivers_return_the_same_values(self):
    _, alphas, values = _clients(2)
    weights = [np.float32(a) for a in alphas]
    outputs = []
    for driver in ('fused', 'passwise'):
      process = _process(driver)
      outputs.append(process.next(process.initialize(), values, weights))
    fused, passes = outputs
    for name in ('kernel', 'bias'):
      np.testing.assert_array_equal(passes.result[name], fused.result[name])
    np.testing.assert_array_equal(passes.measurements['weight_sums'],
                                  fused.measurements['weight_sums'])
    self.assertEqual(list(passes.measurements), list(fused.measurements))
    self.assertEqual(list(passes.state), list(fused.state))

  def test_one_computation_per_pass_each_a_single_aggregation(self):
    driver = iterative_steps.PassByPass(ReweightedMeanSteps(VALUE_TYPE, 2, True), WEIGHT_TYPE)
    self.assertLen(driver.computations, 3)
    for computation in driver.computations:
      tff.backends.native.compile_to_mergeable_comp_form(computation)
    fused = ReweightedMeanFactory(2).create(VALUE_TYPE, WEIGHT_TYPE)
    with self.assertRaisesRegex(ValueError, 'dependent'):
      tff.backends.native.compile_to_mergeable_comp_form(fused.next)

  def test_passes_with_the_same_carry_share_a_computation(self):
    driver = iterative_steps.PassByPass(ReweightedMeanSteps(VALUE_TYPE, 4, False),
                                  WEIGHT_TYPE)
    # 'mean' (from the state), three middle 'reweight's (carry to carry, all with
    # the same carry), the last 'reweight' (to the output).
    first, *middle, last = driver.computations
    self.assertLen(middle, 3)
    self.assertLen({id(c) for c in middle}, 1)
    self.assertLen({id(first), id(middle[0]), id(last)}, 3)

  def test_the_nonfinite_filter_is_run_and_counted_pass_by_pass(self):
    points, alphas, values = _clients(3)
    values[1]['bias'][0] = np.nan
    process = passwise.PasswiseFactory(nonfinite.NonfiniteFilteringFactory(
        ReweightedMeanFactory())).create(VALUE_TYPE, WEIGHT_TYPE)
    output = process.next(process.initialize(), values,
                          [np.float32(a) for a in alphas])
    self.assertEqual(output.measurements[nonfinite.MEASUREMENT], 1)
    keep = np.arange(len(points)) != 1
    center, _ = numpy_reweighted_mean(points[keep], alphas[keep], 3)
    np.testing.assert_allclose(_vector(output.result), center, rtol=1e-5)

  def test_a_carry_of_python_values_is_refused(self):

    class Broken(ReweightedMeanSteps):

      def _mean(self, carry, value, alpha):
        return dict(super()._mean(carry, value, alpha), pass_number=1)

    with self.assertRaisesRegex(TypeError, 'federated values at SERVER'):
      iterative_steps.PassByPass(Broken(VALUE_TYPE, 1, True), WEIGHT_TYPE)


class NestedTest(parameterized.TestCase):

  def test_a_nested_aggregate_runs_its_passes_under_its_key(self):
    inner_steps = ReweightedMeanSteps(VALUE_TYPE, 2, True)

    class Outer(iterative_steps.IterativeSteps):
      """The toy's passes under 'toy', then a pass that ends it and sums α."""
      value_type = VALUE_TYPE

      def initialize(self):
        return inner_steps.initialize()

      def start(self, state):
        return {'toy': inner_steps.start(state)}

      def passes(self):
        return iterative_steps.nested(inner_steps, 'toy') + [
            iterative_steps.Pass('after', self._after)]

      def _after(self, carry, value, alpha):
        output = inner_steps.finish(carry['toy'])
        return {'output': output, 'alpha_sum': tff.federated_sum(alpha)}

      def finish(self, carry):
        output = carry['output']
        return tff.templates.MeasuredProcessOutput(
            output.state, output.result, tff.federated_zip(collections.OrderedDict(
                toy=output.measurements, alpha_sum=carry['alpha_sum'])))

    points, alphas, values = _clients(4)
    weights = [np.float32(a) for a in alphas]
    center, sums = numpy_reweighted_mean(points, alphas, 2)
    fused = iterative_steps.fused_process(Outer(), WEIGHT_TYPE)
    passes = iterative_steps.PassByPass(Outer(), WEIGHT_TYPE)
    self.assertLen(passes.computations, 4)
    for output in (fused.next(fused.initialize(), values, weights),
                   passes.next(passes.initialize(), values, weights)):
      np.testing.assert_allclose(_vector(output.result), center, rtol=1e-5)
      np.testing.assert_allclose(output.measurements['toy']['weight_sums'], sums,
                                 rtol=1e-5)
      self.assertEqual(output.measurements['alpha_sum'], np.sum(alphas))


if __name__ == '__main__':
  tf.test.main()
