"""A factory built with a secure inner sum where TFF cannot run it says so in one line
naming TFF's test context, instead of TFF's gRPC error at the first call."""

from absl.testing import absltest
from absl.testing import parameterized
import tensorflow_federated as tff

from tests.helpers import aggregator_cases as cases
import tff_robust
from tff_robust.common import secure_sums


def _secure_mean():
  return tff.aggregators.MeanFactory(
      value_sum_factory=tff.aggregators.SecureSumFactory(1e4))


def _installed(context):
  return tff.framework.get_context_stack().install(context)


def _native():
  return tff.backends.native.create_sync_local_cpp_execution_context()


class SecureSumContextTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('weighted', lambda: tff_robust.GeometricMedianFactory(
          inner_mean_factory=_secure_mean()).create(cases.VALUE_TYPE, cases.WEIGHT_TYPE)),
      ('unweighted', lambda: tff_robust.GammaMeanFactory(
          inner_mean_factory=_secure_mean()).create(cases.VALUE_TYPE)))
  def test_tffs_default_context_gets_one_line_naming_the_test_context(self, build):
    with _installed(_native()):
      with self.assertRaises(ValueError) as raised:
        build()
    message = str(raised.exception)
    self.assertIn('tff.backends.test.set_sync_test_cpp_execution_context()', message)
    self.assertNotIn('\n', message)

  def test_the_test_context_builds_it(self):
    process = cases.built_in_the_test_context(
        lambda: tff_robust.GeometricMedianFactory(
            inner_mean_factory=_secure_mean()).create(cases.VALUE_TYPE,
                                                      cases.WEIGHT_TYPE))
    self.assertIsInstance(process, tff.templates.AggregationProcess)

  def test_without_secure_sums_the_default_context_builds_it(self):
    with _installed(_native()):
      process = tff_robust.iterative.iterative_mean.Float64MeanFactory().create(
          cases.VALUE_TYPE, cases.WEIGHT_TYPE)
    self.assertIsInstance(process, tff.templates.AggregationProcess)

  def test_only_tffs_native_contexts_are_refused(self):
    self.assertTrue(secure_sums.runs_on_tffs_native_compiler(_native()))
    self.assertTrue(secure_sums.runs_on_tffs_native_compiler(
        tff.backends.native.create_async_local_cpp_execution_context()))
    self.assertFalse(secure_sums.runs_on_tffs_native_compiler(
        tff.backends.test.create_sync_test_cpp_execution_context()))
    self.assertFalse(secure_sums.runs_on_tffs_native_compiler(object()))


if __name__ == '__main__':
  absltest.main()
