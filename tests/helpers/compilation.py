"""How the test processes compile TFF computations: as TFF's runtime does, but without
grappler, unless a test asks for the deployed compilation.

TFF's native compiler (`desugar_and_transform_to_native`, which its local and test
contexts, our workers' contexts and `tasks.simulation.in_process` all call)
runs grappler, at its most aggressive, on every TensorFlow graph of a computation.
That was about a third of the time of the aggregator and baseline tests (8:08 → 5:35
for tests/tff_robust/aggregators and tests/baselines in one process), and it changed
no bit where compared on this CPU-only TensorFlow (docs/development.md). The deployed
compilation still runs where the simulation's path is held to TFF's runtime
(`deployed()`: tests/tasks/simulation/test_in_process.py) and in every program the
tests start (binaries, benchmarks, workers' drivers, `command_lines.run_each`), which
never load tests/conftest.py.
"""

import contextlib
from unittest import mock

import tensorflow_federated as tff
# pylint: disable=g-direct-tensorflow-import
from tensorflow_federated.python.core.backends.native import compiler
from tensorflow_federated.python.core.environments.tensorflow_backend import (
    tensorflow_tree_transformations)
from tensorflow_federated.python.core.impl.computation import computation_impl
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
# pylint: enable=g-direct-tensorflow-import

from tasks.simulation import in_process

DEPLOYED = compiler.desugar_and_transform_to_native


def without_grappler(computation):
  """`desugar_and_transform_to_native` with its `grappler_config` left out: the same
  intrinsics lowered, the same call-dominant form, the graphs as traced."""
  desugared, _ = tensorflow_tree_transformations.replace_intrinsics_with_bodies(
      computation.to_building_block())
  return compiler.transform_to_native_form(computation_impl.ConcreteComputation(
      computation_proto=desugared.proto, context_stack=context_stack_impl.context_stack))


def _compile_with(compile_fn):
  # The contexts look the function up when they are created (TFF's local context, our
  # workers') or on each call (TFF's test context, `in_process`), so the default
  # context is made again.
  compiler.desugar_and_transform_to_native = compile_fn
  tff.backends.native.set_sync_local_cpp_execution_context()


def use_without_grappler():
  """Every computation compiled from now on in this process skips grappler."""
  _compile_with(without_grappler)


@contextlib.contextmanager
def deployed():
  """Within the block, TFF's own compilation (grappler on), in a fresh default
  context and with `in_process`'s cache of compiled forms empty (its key is the
  computation, not the compiler); the suite's are restored after it."""
  previous = compiler.desugar_and_transform_to_native
  _compile_with(DEPLOYED)
  try:
    with mock.patch.dict(in_process._COMPILED, clear=True):  # pylint: disable=protected-access
      yield
  finally:
    _compile_with(previous)
