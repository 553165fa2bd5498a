"""The argument checks of the factories' constructors. As in TFF's own factories, an
argument of the wrong type raises TypeError and one of the right type but out of range
raises ValueError; both name the argument and the value given."""

import math
from typing import Optional

import numpy as np


def _is_integer(value) -> bool:
  return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def _is_real_number(value) -> bool:
  return (not isinstance(value, bool) and
          isinstance(value, (int, float, np.integer, np.floating)))


def check_positive_int(name: str, value) -> int:
  """`value` as an int, if it is an integer ≥ 1."""
  if not _is_integer(value):
    raise TypeError(f'{name} must be an integer >= 1, got {value!r}.')
  if value < 1:
    raise ValueError(f'{name} must be an integer >= 1, got {value!r}.')
  return int(value)


def check_optional_nonnegative_int(name: str, value) -> Optional[int]:
  """None, or `value` as an int if it is an integer ≥ 0."""
  if value is None:
    return None
  if not _is_integer(value):
    raise TypeError(f'{name} must be an integer >= 0 or None, got {value!r}.')
  if value < 0:
    raise ValueError(f'{name} must be an integer >= 0 or None, got {value!r}.')
  return int(value)


def check_int(name: str, value) -> int:
  """`value` as an int, if it is an integer (of any sign)."""
  if not _is_integer(value):
    raise TypeError(f'{name} must be an integer, got {value!r}.')
  return int(value)


def _as_float(name: str, value, requirement: str) -> float:
  """`value` as a float (TypeError if it is not a real number); an integer beyond the
  float range is out of range, as is infinity."""
  if not _is_real_number(value):
    raise TypeError(f'{name} must be a number, got {value!r}.')
  try:
    return float(value)
  except OverflowError:  # e.g. 10**400
    raise ValueError(f'{name} must be {requirement}, got {value!r}.') from None


def _checked_float(name: str, value, requirement: str, holds) -> float:
  """`value` as a float, if it is a number for which `holds` is true (never for NaN);
  `requirement` says which numbers those are."""
  number = _as_float(name, value, requirement)
  if not holds(number):
    raise ValueError(f'{name} must be {requirement}, got {value!r}.')
  return number


def check_finite_float(name: str, value) -> float:
  """`value` as a float, if it is a finite number."""
  return _checked_float(name, value, 'a finite number', math.isfinite)


def check_positive_float(name: str, value) -> float:
  """`value` as a float, if it is a finite number > 0."""
  return _checked_float(name, value, 'a finite number > 0',
                        lambda x: math.isfinite(x) and x > 0)


def check_nonnegative_float(name: str, value) -> float:
  """`value` as a float, if it is a finite number >= 0."""
  return _checked_float(name, value, 'a finite number >= 0',
                        lambda x: math.isfinite(x) and x >= 0)


def check_number_in(name: str, value, low: float, high: float,
                    high_inclusive: bool) -> float:
  """`value` as a float, if it is a number in [low, high) (or [low, high])."""
  bracket = ']' if high_inclusive else ')'
  return _checked_float(
      name, value, f'in [{low}, {high}{bracket}',
      lambda x: low <= x <= high if high_inclusive else low <= x < high)
