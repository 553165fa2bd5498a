"""traced.once: a builder's computations are reused for equal arguments only, and the
library's iterative secure aggregates, created again from another factory instance,
are the same computations (what lets TFF's compiler cache them)."""

import collections

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from baselines import arc
import tff_robust
from tff_robust.common import traced
from tff_robust.iterative import iterative_mean
from tests.helpers import aggregator_cases as cases

_FIELDS = [tff.TensorType(np.float32, [2]), tff.TensorType(np.float32)]
_FACTORIES = collections.OrderedDict(
    gm=tff_robust.GeometricMedianFactory,
    gm_zero_start_absolute_nu=lambda: tff_robust.GeometricMedianFactory(
        initial_point='zero', nu=1e-6, relative_nu=None),
    gm_warm_start=lambda: tff_robust.GeometricMedianFactory(initial_point='previous'),
    gm_mean_start_tolerance=lambda: tff_robust.GeometricMedianFactory(
        initial_point='mean', relative_nu=0.2, tolerance=1e-3),
    one_step_gm=tff_robust.one_step_geometric_median_factory,
    gamma_mean=tff_robust.GammaMeanFactory,
    gamma_mean_diagonal=lambda: tff_robust.GammaMeanFactory(covariance='diagonal'),
    centered_clipping=tff_robust.SecureCenteredClippingFactory,
    float32_mean=iterative_mean.Float32MeanFactory,
    float64_mean=iterative_mean.Float64MeanFactory,
    nonfinite_filtered_gm=lambda: tff_robust.NonfiniteFilteringFactory(
        tff_robust.GeometricMedianFactory()),
    arc_of_gm=lambda: arc.AdaptiveRobustClippingFactory(
        tff_robust.GeometricMedianFactory(), byzantine_fraction=0.1),
)


def _created(build, value_type=cases.VALUE_TYPE):
  return cases.built_in_the_test_context(
      lambda: build().create(value_type, cases.WEIGHT_TYPE))


class OnceTest(absltest.TestCase):

  def test_equal_arguments_return_the_first_result_and_others_build_anew(self):
    calls = []

    @traced.once
    def build(value_type, scale):
      calls.append((value_type, scale))

      @tff.tensorflow.computation(value_type)
      def scaled(value):
        return tf.nest.map_structure(lambda t: t * scale, value)

      return scaled

    as_tuple = tff.StructWithPythonType(_FIELDS, tuple)
    first = build(as_tuple, 2.0)
    self.assertIs(build(tff.StructWithPythonType(_FIELDS, tuple), 2.0), first)
    # The same fields in another container, or another constant: traced again.
    as_list = build(tff.StructWithPythonType(_FIELDS, list), 2.0)
    self.assertIsNot(as_list, first)
    self.assertNotEqual(as_list.type_signature, first.type_signature)
    self.assertIsNot(build(as_tuple, 3.0), first)
    self.assertLen(calls, 3)

  def test_arguments_of_other_python_types_are_other_keys(self):
    build = traced.once(lambda passes: tf.constant(passes).dtype)
    self.assertEqual(build(True), tf.bool)
    self.assertEqual(build(1), tf.int32)

  def test_the_cache_is_bounded(self):
    build = traced.once(lambda key: object())
    first = build(0)
    for key in range(1, traced.MAX_ENTRIES + 1):
      build(key)
    self.assertIsNot(build(0), first)


class CreatedAgainTest(parameterized.TestCase):

  @parameterized.named_parameters(*_FACTORIES.items())
  def test_is_the_same_computation(self, build):
    first, again = _created(build), _created(build)
    self.assertEqual(again.initialize, first.initialize)
    self.assertEqual(again.next, first.next)

  @parameterized.named_parameters(*_FACTORIES.items())
  def test_another_value_type_is_another_computation(self, build):
    other = tff.types.to_type(collections.OrderedDict(
        kernel=tff.TensorType(np.float32, [2, 2]), bias=tff.TensorType(np.float32, [2])))
    self.assertNotEqual(_created(build, other).next, _created(build).next)

  @parameterized.named_parameters(
      ('gm_tolerance', tff_robust.GeometricMedianFactory,
       lambda: tff_robust.GeometricMedianFactory(relative_nu=0.2, tolerance=1e-3)),
      ('gm_relative_nu', tff_robust.GeometricMedianFactory,
       lambda: tff_robust.GeometricMedianFactory(relative_nu=0.5)),
      ('gamma', tff_robust.GammaMeanFactory,
       lambda: tff_robust.GammaMeanFactory(gamma=0.5)),
      ('clip_radius', tff_robust.SecureCenteredClippingFactory,
       lambda: tff_robust.SecureCenteredClippingFactory(clip_radius=2.0)),
      ('gamma_scale', lambda: tff_robust.GammaMeanFactory(gamma_scale='spread'),
       lambda: tff_robust.GammaMeanFactory(gamma_scale='absolute')),
      ('covariance', tff_robust.GammaMeanFactory,
       lambda: tff_robust.GammaMeanFactory(covariance='diagonal')),
      ('arc_fraction', _FACTORIES['arc_of_gm'],
       lambda: arc.AdaptiveRobustClippingFactory(
           tff_robust.GeometricMedianFactory(), byzantine_fraction=0.3)),
  )
  def test_another_constant_is_another_computation(self, build, build_other):
    self.assertNotEqual(_created(build_other).next, _created(build).next)

if __name__ == '__main__':
  absltest.main()
