"""How the test processes compile TFF computations: as TFF's runtime does, but without
grappler, unless a test asks for the deployed compilation.

TFF's native compiler (`desugar_and_transform_to_native`, which its local and test
contexts, our workers' contexts and `tasks.simulation.in_process` all call)
runs grappler, at its most aggressive, on every TensorFlow graph of a computation.
That was about a third of the time of the aggregator and baseline tests (8:08 → 5:35
for tests/tff_robust/aggregators and tests/baselines in one process), and it changed
no bit where compared on this CPU-only TensorFlow (docs/decisions.md). The deployed
compilation still runs where the simulation's path is held to TFF's runtime
(`deployed()`: tests/tasks/simulation/test_in_process.py) and in every program the
tests start (binaries, benchmarks, workers' drivers, `command_lines.run_each`), which
never load tests/conftest.py.

The switch is the one argument TFF's compiler has for it: `transform_to_native_form`,
which `desugar_and_transform_to_native` looks up on each call, is given no
`grappler_config`; every context (TFF's local and test ones, our workers', those made
at import) then compiles without grappler, with nothing else of TFF's compiler copied.
"""

import contextlib
from unittest import mock

import tensorflow_federated as tff
from tff_robust.common.tff_private import native_compiler as compiler

from tasks.simulation import in_process

_TRANSFORM_TO_NATIVE_FORM = compiler.transform_to_native_form


def _without_grappler(computation, transform_math_to_tf=False, grappler_config=None):
  del grappler_config
  return _TRANSFORM_TO_NATIVE_FORM(computation, transform_math_to_tf)


def use_without_grappler():
  """Every computation compiled from now on in this process skips grappler."""
  compiler.transform_to_native_form = _without_grappler


@contextlib.contextmanager
def deployed():
  """Within the block, TFF's own compilation (grappler on). It starts a fresh default
  context and empties `in_process`'s cache of compiled forms: both caches are keyed by
  the computation, not by how it was compiled."""
  with mock.patch.object(compiler, 'transform_to_native_form', _TRANSFORM_TO_NATIVE_FORM), \
      mock.patch.dict(in_process._COMPILED, clear=True):  # pylint: disable=protected-access
    tff.backends.native.set_sync_local_cpp_execution_context()
    yield
