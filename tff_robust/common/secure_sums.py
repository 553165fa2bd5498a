"""Which of TFF 0.87's contexts can run secure-sum intrinsics, checked when a factory
of this package creates a process that holds them.

`tff.federated_secure_sum` and `tff.federated_secure_sum_bitwidth` (what
`tff.aggregators.SecureSumFactory` traces) are left as they are by TFF's native
compiler, which TFF's default context and `tff.backends.native`'s local contexts run;
their C++ executor then fails at the first call with a gRPC error ("Cannot embed a
federated value") and thousands of characters of locals. TFF's test context
(`tff.backends.test.set_sync_test_cpp_execution_context()`) replaces them with plain
sums first. Every other context (the test one, `tff_robust.distributed`'s, a
deployment's own) is left to decide for itself.
"""

import tensorflow_federated as tff

from tff_robust.common.tff_private import computation_impl
from tff_robust.common.tff_private import native_compiler
from tff_robust.common.tff_private import tree_analysis

NEEDS_THE_TEST_CONTEXT = (
    'TFF 0.87 runs secure sums (tff.aggregators.SecureSumFactory) only in its test '
    'context, as plain sums: call tff.backends.test.set_sync_test_cpp_execution_context()'
    ' before building the aggregator or process.')


def runs_on_tffs_native_compiler(context) -> bool:
  """Whether `context` is one of TFF's execution contexts that compile with its
  native compiler (TFF's default context among them): secure sums fail there."""
  if isinstance(context, tff.framework.SyncExecutionContext):
    context = getattr(context, '_async_context', None)
  if not isinstance(context, tff.framework.AsyncExecutionContext):
    return False
  pipeline = getattr(context, '_compiler_pipeline', None)
  return (getattr(pipeline, '_compiler_fn', None) is
          native_compiler.desugar_and_transform_to_native)


def check_runnable(process: tff.templates.AggregationProcess) -> None:
  """Raises a one-line ValueError naming TFF's test context if `process.next` holds a
  secure-sum intrinsic and the current context cannot run it."""
  if not runs_on_tffs_native_compiler(tff.framework.get_context_stack().current):
    return
  # The intrinsics' URIs are strings of the computation's proto: their absence there
  # (a millisecond) spares the walk of the building blocks (a quarter of a second for
  # RFA's `next`), which confirms a match.
  proto = computation_impl.ConcreteComputation.get_proto(process.next)
  if b'federated_secure_' not in proto.SerializeToString():
    return
  if tree_analysis.find_secure_aggregation_in_tree(process.next.to_building_block()):
    raise ValueError(NEEDS_THE_TEST_CONTEXT)
