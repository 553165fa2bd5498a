"""The factories' argument checks: TypeError for a value of the wrong type, ValueError
for one of the right type out of range, as TFF's factories raise them."""

import math
import re

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from tff_robust import arguments

_NOT_NUMBERS = (('string', '1'), ('bool', True), ('none', None), ('complex', 1j),
                ('list', [1]))


def _in_unit_interval(value):
  return arguments.check_number_in('x', value, 0, 1, high_inclusive=False)


def _in_closed_unit_interval(value):
  return arguments.check_number_in('x', value, 0, 1, high_inclusive=True)


class ArgumentsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('positive_int', arguments.check_positive_int, [1, 7, np.int64(3)]),
      ('nonnegative_int', lambda n, v: arguments.check_optional_nonnegative_int(n, v),
       [0, 5, np.int32(2)]),
      ('positive_float', arguments.check_positive_float,
       [1e-30, 2, np.float32(0.5), np.int64(4)]),
      ('nonnegative_float', arguments.check_nonnegative_float, [0, 0.0, 3.5, np.int8(1)]),
  )
  def test_valid_values_are_returned_as_python_numbers(self, check, values):
    for value in values:
      result = check('x', value)
      self.assertEqual(result, value)
      self.assertIn(type(result), (int, float))

  @parameterized.named_parameters(
      ('half_open', _in_unit_interval, [0, 0.5, np.float64(0.999)]),
      ('closed', _in_closed_unit_interval, [0, 1, np.float32(1.0)]),
  )
  def test_numbers_inside_the_interval_pass(self, check, values):
    for value in values:
      self.assertEqual(check(value), float(value))
      self.assertIs(type(check(value)), float)

  def test_none_is_the_optional_ints_absence(self):
    self.assertIsNone(arguments.check_optional_nonnegative_int('x', None))

  @parameterized.named_parameters(
      ('positive_int', arguments.check_positive_int, _NOT_NUMBERS + (('float', 2.0),)),
      ('nonnegative_int', arguments.check_optional_nonnegative_int,
       (('string', '1'), ('bool', False), ('float', 0.0), ('numpy_float', np.float32(1)))),
      ('positive_float', arguments.check_positive_float, _NOT_NUMBERS),
      ('nonnegative_float', arguments.check_nonnegative_float, _NOT_NUMBERS),
      ('interval', lambda n, v: _in_unit_interval(v), _NOT_NUMBERS),
  )
  def test_wrong_types_raise_type_error_naming_the_argument(self, check, cases):
    for label, value in cases:
      with self.subTest(label):
        with self.assertRaisesRegex(TypeError, f'^x must be .*got {re.escape(repr(value))}'):
          check('x', value)

  @parameterized.named_parameters(
      ('positive_int', arguments.check_positive_int, [0, -3, np.int8(0)]),
      ('nonnegative_int', arguments.check_optional_nonnegative_int, [-1, np.int64(-2)]),
      ('positive_float', arguments.check_positive_float,
       [0.0, -1.0, math.nan, math.inf, -math.inf]),
      ('nonnegative_float', arguments.check_nonnegative_float,
       [-1e-12, math.nan, math.inf]),
      ('half_open', lambda n, v: _in_unit_interval(v), [1, -0.1, math.nan, math.inf]),
      ('closed', lambda n, v: _in_closed_unit_interval(v), [1.0001, -1e-9, math.nan]),
  )
  def test_out_of_range_values_raise_value_error_naming_the_argument(self, check, values):
    for value in values:
      with self.subTest(repr(value)):
        with self.assertRaisesRegex(ValueError, '^x must be'):
          check('x', value)

  def test_the_message_shows_the_interval(self):
    with self.assertRaisesRegex(ValueError, r'in \[0, 1\), got 1'):
      _in_unit_interval(1)
    with self.assertRaisesRegex(ValueError, r'in \[0, 1\], got 2'):
      _in_closed_unit_interval(2)


if __name__ == '__main__':
  absltest.main()
