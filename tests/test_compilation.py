"""tests/helpers/compilation.py: the suite compiles without grappler, `deployed()` with
it (the configuration test_in_process holds the simulation to), and the suite's
compilation is back after the block."""

from unittest import mock

import numpy as np
import tensorflow_federated as tff
# pylint: disable=g-direct-tensorflow-import
from tff_robust.common.tff_private import compiled_computation_transformations
# pylint: enable=g-direct-tensorflow-import

from tests.helpers import compilation


def _grappler_runs_of_a_new_computation():
  """How often grappler ran while a new mean process was compiled and called."""
  optimize = compiled_computation_transformations.optimize_tensorflow_graphs
  with mock.patch.object(compiled_computation_transformations,
                         'optimize_tensorflow_graphs', side_effect=optimize) as spy:
    process = tff.aggregators.MeanFactory().create(
        tff.TensorType(np.float32, [3]), tff.TensorType(np.float32))
    output = process.next(process.initialize(), [np.arange(3, dtype=np.float32)], [2.0])
  np.testing.assert_array_equal(output.result, [0.0, 1.0, 2.0])
  return spy.call_count


def test_the_suite_skips_grappler_and_deployed_runs_it():
  assert _grappler_runs_of_a_new_computation() == 0
  with compilation.deployed():
    assert _grappler_runs_of_a_new_computation() > 0
  assert _grappler_runs_of_a_new_computation() == 0
