"""The factories' type checks name what is wrong with a value type."""

from absl.testing import absltest
from absl.testing import parameterized
import ml_dtypes
import numpy as np
import tensorflow_federated as tff

from tasks import registry
from tff_robust.common import type_checks


class ValueTypeTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('tensor', tff.TensorType(ml_dtypes.bfloat16, [3])),
      ('structure', tff.types.to_type([tff.TensorType(np.float32, [2]),
                                       tff.TensorType(ml_dtypes.bfloat16, [3])])))
  def test_bfloat16_is_named_not_called_an_integer(self, value_type):
    with self.assertRaisesRegex(TypeError, 'bfloat16') as raised:
      type_checks.check_float_structure(value_type)
    self.assertNotIn('integer', str(raised.exception))

  @parameterized.parameters('gm', 'median', 'secure_centered_clipping')
  def test_every_factory_gives_the_bfloat16_message(self, name):
    with self.assertRaisesRegex(TypeError, 'Cast the update to float32'):
      registry.aggregator_from_name(name).create(
          tff.TensorType(ml_dtypes.bfloat16, [3]), tff.TensorType(np.float32))

  def test_integers_still_get_the_integer_message(self):
    with self.assertRaisesRegex(TypeError, 'Cast integer tensors'):
      type_checks.check_float_structure(tff.TensorType(np.int32, [3]))


if __name__ == '__main__':
  absltest.main()
