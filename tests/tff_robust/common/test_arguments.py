"""The factories' argument checks: TypeError for a value of the wrong type, ValueError
for one of the right type out of range, as TFF's factories raise them."""

import math
import re

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from tff_robust.common import arguments

_NOT_NUMBERS = (('string', '1'), ('bool', True), ('numpy_bool', np.bool_(True)),
                ('none', None), ('complex', 1j), ('numpy_complex', np.complex64(1)),
                ('list', [1]))
_NOT_INTEGERS = _NOT_NUMBERS + (('float', 2.0), ('numpy_float', np.float32(1)))
_HUGE = 10**400  # An int beyond the float range: float(_HUGE) overflows.


def _in_unit_interval(name, value):
  return arguments.check_number_in(name, value, 0, 1, high_inclusive=False)


def _in_closed_unit_interval(name, value):
  return arguments.check_number_in(name, value, 0, 1, high_inclusive=True)


_INT_CHECKS = dict(int=arguments.check_int, positive_int=arguments.check_positive_int,
                   nonnegative_int=arguments.check_optional_nonnegative_int)
_FLOAT_CHECKS = dict(finite_float=arguments.check_finite_float,
                     positive_float=arguments.check_positive_float,
                     nonnegative_float=arguments.check_nonnegative_float,
                     half_open=_in_unit_interval, closed=_in_closed_unit_interval)


class ArgumentsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('int', 'int', [-4, 0, np.int64(-3), _HUGE]),
      ('positive_int', 'positive_int', [1, 7, np.int64(3), _HUGE]),
      ('nonnegative_int', 'nonnegative_int', [0, 5, np.int32(2)]),
  )
  def test_valid_integers_are_returned_as_python_ints(self, check, values):
    for value in values:
      result = _INT_CHECKS[check]('x', value)
      self.assertEqual(result, value)
      self.assertIs(type(result), int)

  @parameterized.named_parameters(
      ('finite_float', 'finite_float', [-1e30, 0, np.float16(-2)]),
      ('positive_float', 'positive_float', [1e-30, 2, np.float32(0.5), np.int64(4)]),
      ('nonnegative_float', 'nonnegative_float', [0, 0.0, 3.5, np.int8(1)]),
      ('half_open', 'half_open', [0, 0.5, np.float64(0.999)]),
      ('closed', 'closed', [0, 1, np.float32(1.0)]),
  )
  def test_valid_numbers_are_returned_as_python_floats(self, check, values):
    for value in values:
      result = _FLOAT_CHECKS[check]('x', value)
      self.assertEqual(result, float(value))
      self.assertIs(type(result), float)

  def test_none_is_the_optional_ints_absence(self):
    self.assertIsNone(arguments.check_optional_nonnegative_int('x', None))

  @parameterized.named_parameters(
      [(name, check, _NOT_INTEGERS) for name, check in _INT_CHECKS.items()
       if name != 'nonnegative_int'] +
      [('nonnegative_int', arguments.check_optional_nonnegative_int,
        tuple(case for case in _NOT_INTEGERS if case[0] != 'none'))] +
      [(name, check, _NOT_NUMBERS) for name, check in _FLOAT_CHECKS.items()])
  def test_wrong_types_raise_type_error_naming_the_argument(self, check, cases):
    for label, value in cases:
      with self.subTest(label):
        with self.assertRaisesRegex(TypeError,
                                    f'^x must be .*got {re.escape(repr(value))}'):
          check('x', value)

  @parameterized.named_parameters(
      ('positive_int', arguments.check_positive_int, [0, -3, np.int8(0)]),
      ('nonnegative_int', arguments.check_optional_nonnegative_int, [-1, np.int64(-2)]),
      ('finite_float', arguments.check_finite_float,
       [math.nan, math.inf, -math.inf, _HUGE, -_HUGE]),
      ('positive_float', arguments.check_positive_float,
       [0.0, -1.0, math.nan, math.inf, -math.inf, _HUGE]),
      ('nonnegative_float', arguments.check_nonnegative_float,
       [-1e-12, math.nan, math.inf, _HUGE]),
      ('half_open', _in_unit_interval, [1, -0.1, math.nan, math.inf, _HUGE]),
      ('closed', _in_closed_unit_interval, [1.0001, -1e-9, math.nan, -_HUGE]),
  )
  def test_out_of_range_values_raise_value_error_naming_the_argument(self, check, values):
    for value in values:
      with self.subTest(repr(value)[:20]):
        with self.assertRaisesRegex(ValueError, '^x must be'):
          check('x', value)

  def test_the_message_shows_the_interval(self):
    with self.assertRaisesRegex(ValueError, r'in \[0, 1\), got 1'):
      _in_unit_interval('x', 1)
    with self.assertRaisesRegex(ValueError, r'in \[0, 1\], got 2'):
      _in_closed_unit_interval('x', 2)


if __name__ == '__main__':
  absltest.main()
