"""The original TFF RFA's entry points with the original's meaning of every argument.

google-research/federated's `robust_aggregation/robust_federated_aggregation.py` (the
RFA authors' TFF code) offers `RobustWeiszfeldFactory(num_communication_passes=5,
tolerance=1e-6)` and, in older versions, `build_stateless_robust_aggregation(
model_type, num_communication_passes=5, tolerance=1e-6)`. There, `tolerance` is the
smoothing ν of the smoothed Weiszfeld algorithm, the first pass is the weighted mean
and every pass is applied. `tff_robust.GeometricMedianFactory` calls ν `nu`, uses
`tolerance` for an early stop and starts from a trimmed mean by default, so the same
call means something else; it refuses a positive `tolerance` without `nu` for that
reason. The entry points here take the original's arguments and build
`GeometricMedianFactory(num_communication_passes, nu=tolerance, tolerance=0,
initial_point='mean')`: the original's computation, with this package's measurements
and its float64 distances (results agree with the original's numpy reference to 1e-6,
`tests/tff_robust/aggregators/test_original_rfa_cases.py`).
"""

import numpy as np
import tensorflow_federated as tff

from tff_robust.aggregators import geometric_median

ORIGINAL_NUM_PASSES = 5
ORIGINAL_TOLERANCE = 1e-6


class RobustWeiszfeldFactory(geometric_median.GeometricMedianFactory):
  """The original's `RobustWeiszfeldFactory`: R passes from the weighted mean, every
  pass applied, ν = `tolerance`.

  A `GeometricMedianFactory` (weighted and unweighted) with
  `nu=tolerance, tolerance=0, initial_point='mean'`; its `nu` property is the
  original's `tolerance` and its `tolerance` property (the early stop) is 0. The
  created process's type signature and measurements are `GeometricMedianFactory`'s
  (the original reported none).
  """

  def __init__(self, num_communication_passes: int = ORIGINAL_NUM_PASSES,
               tolerance: float = ORIGINAL_TOLERANCE):
    """Initializes the factory.

    Args:
      num_communication_passes: R >= 1, weighted means per aggregation, the first
        one (the plain weighted mean) included. The original's default 5.
      tolerance: the smoothing ν > 0 (the original's meaning), default 1e-6.

    Raises:
      TypeError: if `num_communication_passes` is not a Python int (as the
        original; numpy integers too) or `tolerance` not a number.
      ValueError: if `num_communication_passes` < 1 or `tolerance` is not a finite
        number > 0.
    """
    if isinstance(num_communication_passes, bool) or not isinstance(
        num_communication_passes, int):
      raise TypeError('num_communication_passes must be a Python int (as in the '
                      f'original), found {type(num_communication_passes)}.')
    super().__init__(num_communication_passes=num_communication_passes,
                     nu=tolerance, tolerance=0.0, initial_point='mean')


def build_stateless_robust_aggregation(
    model_type, num_communication_passes: int = ORIGINAL_NUM_PASSES,
    tolerance: float = ORIGINAL_TOLERANCE) -> tff.templates.AggregationProcess:
  """The older original entry point: the aggregation process of
  `RobustWeiszfeldFactory(num_communication_passes, tolerance)` for model updates of
  type `model_type` (a `tff.Type` or anything `tff.types.to_type` accepts) with float32
  client weights, `(<state, {model_type}@CLIENTS, {float32}@CLIENTS> -> <state,
  model_type@SERVER, measurements@SERVER>)`."""
  return RobustWeiszfeldFactory(num_communication_passes, tolerance).create(
      tff.types.to_type(model_type), tff.TensorType(np.float32))
