"""The type checks of every factory's `create`, raising TypeError as TFF's `MeanFactory`
does for a value or weight type it cannot aggregate."""

from typing import Optional

import numpy as np
import tensorflow_federated as tff


def check_float_structure(value_type) -> None:
  """Raises a TypeError unless `value_type` is a non-federated structure of float
  tensors (as TFF's `MeanFactory`; complex, integer, string and federated types fail)."""
  if not isinstance(value_type, (tff.TensorType, tff.StructType)):
    raise TypeError(
        f'Expected a tff.TensorType or tff.StructType value type, got {value_type!r}.'
    )
  unsupported = sorted({str(np.dtype(leaf.dtype)) for leaf in _tensor_types(value_type)
                        if np.dtype(leaf.dtype).name in _UNSUPPORTED_FLOATS})
  if unsupported:
    raise TypeError(
        f'Robust aggregators take float16, float32 and float64 values; got '
        f'{", ".join(unsupported)} in the value type {value_type}. Cast the update to '
        'float32 before aggregating (its norms and weighted sums need more than '
        "bfloat16's 8 bits of precision).")
  if not tff.types.is_structure_of_floats(value_type):
    raise TypeError(
        'Robust aggregators need float values (model updates); got the value type '
        f'{value_type}. Cast integer tensors to float before aggregating.'
    )


# Float dtypes that are not numpy floats (TFF's `is_structure_of_floats` rejects them as
# if they were integers).
_UNSUPPORTED_FLOATS = ('bfloat16',)


def _tensor_types(value_type) -> list:
  if isinstance(value_type, tff.TensorType):
    return [value_type]
  if isinstance(value_type, tff.StructType):
    return [leaf for _, element in tff.structure.iter_elements(value_type)
            for leaf in _tensor_types(element)]
  return []


def check_weight_type(weight_type: Optional[tff.Type]) -> None:
  """Raises a TypeError unless `weight_type` is a scalar float or integer
  `tff.TensorType` (client weights such as example counts).

  TFF's `MeanFactory` raises a TypeError at once for a weight type that is not a
  `tff.Type` and fails later, while tracing, for a string, boolean, vector or
  structure weight; here all of them raise the TypeError at once. Float and integer
  weights of any width are accepted, as TFF does.
  """
  if not isinstance(weight_type, tff.TensorType):
    raise TypeError(
        'The weight type must be a scalar tff.TensorType (e.g. tff.TensorType('
        f'np.float32)), got {weight_type!r}.')
  dtype = np.dtype(weight_type.dtype)
  is_real_number = (np.issubdtype(dtype, np.floating) or
                    np.issubdtype(dtype, np.integer))
  if weight_type.shape != () or not is_real_number:
    raise TypeError(
        'The weight type must be a scalar of a float or integer dtype (client weights '
        f'such as example counts), got {weight_type}.')


def has_float64(value_type) -> bool:
  """Whether a structure of float tensors holds a float64 tensor."""
  if isinstance(value_type, tff.TensorType):
    return np.dtype(value_type.dtype) == np.float64
  return any(has_float64(element)
             for _, element in tff.structure.iter_elements(value_type))
