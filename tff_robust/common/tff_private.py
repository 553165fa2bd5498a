"""The one door to TensorFlow Federated's and TensorFlow's private modules.

Every private module the project uses (`tensorflow_federated.python...`,
`tensorflow.python...`) is imported here and nowhere else (`tests/test_packaging.py`
enforces it), after checking that the installed TFF is the release they were read
against. What needs them: the in-process evaluation of TFF computations
(`tasks.simulation.in_process`), the multi-worker runtime
(`tff_robust.distributed.distributed_context` and its `worker_connection`,
`resident_values`, `local_workers`), the client update of TFF's model-delta client
work (`tff_robust.learning.processes`), the original TFF RFA baseline
(`baselines.wrappers`), seeding the eager context (`tasks.simulation.loop`),
AutoGraph's conversion rules while tracing TFF's client work
(`tasks.simulation.client_work`, `tasks.simulation.on_workers`), TFF's distributed DP
sum (`tff_robust.aggregators.privacy`, not exported by 0.87), telling the contexts
that cannot run secure sums (`tff_robust.common.secure_sums`), remembering deserialized
types (the binaries' `tasks.binaries.exit_status`, and the tests), and a few tests.

The private fields and functions of their objects (the eager context's seed, a
dataset's shuffle seeds, TFF's mergeable-context steps and remote executors) are
read or set only by the functions at the end of this module; the one exception is
the `_process` field of TFF's local `ServiceManager`, which
`tff_robust.common.teardown` and `tff_robust.distributed.runtime` read to stop
worker_binaries: they import without TensorFlow (the workers' side uses them), so
they cannot come through here.

Porting to another TFF release: change `SUPPORTED_TFF` and, for every module below
that moved or changed, the import here and its users; where a name became public
(`tff.framework`, `tff.types`, `tff.structure`), prefer it and drop the import.
"""

import functools
import random

import tensorflow as tf
import tensorflow_federated as tff

from tff_robust.common import teardown

SUPPORTED_TFF = '0.87.'
if not tff.__version__.startswith(SUPPORTED_TFF):
  raise ImportError(
      f'tff_robust reaches into TensorFlow Federated {SUPPORTED_TFF}x internals, and '
      f'TFF {tff.__version__} is installed. Install tensorflow-federated==0.87.0 '
      '(requirements.txt), or port tff_robust/common/tff_private.py to this release.')

# pylint: disable=g-direct-tensorflow-import,g-bad-import-order,unused-import
from tensorflow.python.autograph.core import config as autograph_config
from tensorflow.python.autograph.impl import conversion as autograph_conversion
from tensorflow.python.eager import context as eager_context
from tensorflow.python.eager import wrap_function
from tensorflow.python.eager.polymorphic_function import attributes as function_attributes
from tensorflow_federated.python.aggregators import differential_privacy
from tensorflow_federated.python.aggregators import distributed_dp
from tensorflow_federated.python.aggregators import robust
from tensorflow_federated.python.common_libs import async_utils
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.backends.native import compiler as native_compiler
from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler
from tensorflow_federated.python.core.environments.tensorflow_backend import (
    compiled_computation_transformations)
from tensorflow_federated.python.core.environments.tensorflow_backend import (
    tensorflow_tree_transformations)
from tensorflow_federated.python.core.environments.tensorflow_frontend import (
    tensorflow_computation)
from tensorflow_federated.python.core.impl.compiler import building_blocks
from tensorflow_federated.python.core.impl.compiler import transformations
from tensorflow_federated.python.core.impl.compiler import tree_analysis
from tensorflow_federated.python.core.impl.computation import computation_impl
from tensorflow_federated.python.core.impl.computation import function_utils
from tensorflow_federated.python.core.impl.execution_contexts import compiler_pipeline
from tensorflow_federated.python.core.impl.execution_contexts import (
    mergeable_comp_execution_context)
from tensorflow_federated.python.core.impl.executors import cardinalities_utils
from tensorflow_federated.python.core.impl.executors import cardinality_carrying_base
from tensorflow_federated.python.core.impl.types import type_analysis
from tensorflow_federated.python.core.impl.types import type_conversions
from tensorflow_federated.python.core.impl.types import type_serialization
from tensorflow_federated.python.core.impl.utils import tensorflow_utils
from tensorflow_federated.python.learning.templates import model_delta_client_work
from tensorflow_federated.python.tensorflow_libs import graph_utils
from tensorflow_federated.python.tensorflow_libs import serialization_utils
from tensorflow_federated.proto.v0 import executor_pb2
# pylint: enable=g-direct-tensorflow-import,g-bad-import-order,unused-import

# TFF 0.87's finalizer of its idle local worker manager fails when it runs in the
# interpreter's teardown ("Exception ignored ... ServiceManager.__del__ ...
# 'NoneType' object has no attribute 'Popen'"), and importing this module or others
# (the geometric median's, tasks.builders.task) can move it there, as a plain TFF
# script's imports can: disarmed at exit, before the teardown. Every factory of
# tff_robust imports this module (`tff_robust.common.secure_sums`).
teardown.disarm_idle_managers_at_exit()


def memoize_type_deserialization() -> None:
  """Makes TFF's `deserialize_type` remember the type of each serialized type proto,
  for the rest of the process. Why: TFF's compiler deserializes the type of every node
  of a computation again, each holding its children's types. TFF's types are
  immutable, and a remembered one equals what TFF returns (the same object for most:
  TFF interns them). Idempotent; the binaries and the tests call it, the library never
  does (it changes nothing in a user's process)."""
  deserialize = type_serialization.deserialize_type
  if hasattr(deserialize, '__wrapped__'):
    return
  remembered = {}

  @functools.wraps(deserialize)
  def memoized_deserialize_type(type_proto):
    key = type_proto.SerializeToString(deterministic=True)
    found = remembered.get(key)
    if found is None:
      found = remembered[key] = deserialize(type_proto)
    return found

  type_serialization.deserialize_type = memoized_deserialize_type


# Private fields and functions of TensorFlow's and TFF's objects: read or set here
# only, each behind a function that says what it stands for.
# pylint: disable=protected-access


def set_eager_global_seed(seed) -> None:
  """What `tf.random.set_seed(seed)` does to the eager context in TF 2.14
  (`Context._set_global_seed`), without clearing its kernel caches."""
  eager = eager_context.context()
  eager._seed = seed
  eager._rng = random.Random(seed)


def eager_seed_state() -> tuple:
  """The eager context's global seed and the state of its op-seed generator."""
  eager = eager_context.context()
  return eager._seed, eager._rng.getstate()


def set_eager_seed_state(state: tuple) -> None:
  """Restores an `eager_seed_state()`."""
  seed, rng_state = state
  set_eager_global_seed(seed)
  eager_context.context()._rng.setstate(rng_state)


def shuffle_seeds(dataset) -> list[tuple[int, int]]:
  """(seed, seed2) of every `Dataset.shuffle` in `dataset`'s pipeline, outermost
  first: the seeds TF drew from the global seed when the dataset was built (TF has
  no public accessor)."""
  found = []
  while dataset is not None:
    if type(dataset).__name__ == '_ShuffleDataset':
      found.append((int(dataset._seed), int(dataset._seed2)))
    dataset = getattr(dataset, '_input_dataset', None)
  return found


def never_inlined(wrapped, signature):
  """The `tf.compat.v1.wrap_function` result `wrapped` as a function its callers call
  rather than inline (the `_noinline` attribute)."""
  return wrap_function.WrappedFunction(wrapped.graph, wrapped._variable_holder,
                                       attrs={function_attributes.NO_INLINE: True},
                                       signature=signature)


# The TFF modules whose functions in the model-delta client update of a
# `from_keras_model` model branch or loop on tensors, so AutoGraph must convert them.
_TFF_MODULES_WITH_TENSOR_CONTROL_FLOW = (
    'tensorflow_federated.python.learning.loop_builder',
    'tensorflow_federated.python.learning.tensor_utils',
    'tensorflow_federated.python.learning.templates.model_delta_client_work',
)


_LITTLE_AUTOGRAPH_RULES = (
    *(autograph_config.Convert(m) for m in _TFF_MODULES_WITH_TENSOR_CONTROL_FLOW),
    autograph_config.DoNotConvert('tensorflow_federated'),
    autograph_config.DoNotConvert('attr'))


def traced_with_little_autograph(trace):
  """`trace()` with AutoGraph converting no TFF function but those of
  `_TFF_MODULES_WITH_TENSOR_CONTROL_FLOW` (and none of `attrs`), as it already skips
  TensorFlow's and Keras's own: TFF's optimizers, metrics and Keras wrapper branch
  only on Python values, so they trace to the same graph unconverted, and sooner
  (docs/development.md).

  A TFF function that branches on a tensor fails the trace with
  `tf.errors.OperatorNotAllowedInGraphError`; then `trace()` runs again under
  AutoGraph's own rules. What the rules cannot catch is a Python loop over a dataset
  in a TFF module left unconverted, which would unroll; the three modules above hold
  the client update's. AutoGraph's cache of functions found not to need converting is
  emptied afterwards, so later traces follow AutoGraph's own rules (what `trace()`
  built keeps its graphs). The rules are process-wide while `trace()` runs: not for
  traces in other threads at the same time. A nested call runs under the outer one's
  rules and fallback."""
  global _tracing
  if _tracing:
    return trace()
  saved = autograph_config.CONVERSION_RULES
  autograph_config.CONVERSION_RULES = _LITTLE_AUTOGRAPH_RULES + saved
  _tracing = True
  try:
    try:
      return trace()
    except tf.errors.OperatorNotAllowedInGraphError:
      _restore_autograph_rules(saved)
      return trace()
  finally:
    _restore_autograph_rules(saved)
    _tracing = False


# Whether a `traced_with_little_autograph` call is running (a nested one runs under
# its rules and fallback).
_tracing = False


def _restore_autograph_rules(rules) -> None:
  autograph_config.CONVERSION_RULES = rules
  autograph_conversion._ALLOWLIST_CACHE = type(autograph_conversion._ALLOWLIST_CACHE)()


def as_lambda(building_block):
  """TFF's mergeable compiler's `_ensure_lambda`: a building block as a Lambda."""
  return mergeable_comp_compiler._ensure_lambda(building_block)


def calls_with_fn_consuming_arg(tree, fn_predicate, arg_predicate) -> list:
  """TFF's `tree_analysis._extract_calls_with_fn_consuming_arg`: the calls in `tree`
  of a function matching `fn_predicate` on an argument that depends on a call
  matching `arg_predicate` (what keeps the mergeable compiler from splitting it)."""
  return tree_analysis._extract_calls_with_fn_consuming_arg(
      tree, fn_predicate=fn_predicate, arg_predicate=arg_predicate)


async def compute_after_merged(form, shard, merged, context):
  """TFF's mergeable context's after-merge step of `form` on one shard."""
  return await mergeable_comp_execution_context._compute_after_merged(
      form, shard, merged, context)


def repackage_partitioned_values(results: list, result_type):
  """TFF's mergeable context's assembly of the shards' after-merge results."""
  return mergeable_comp_execution_context._repackage_partitioned_values(
      results, result_type)


def executor_of(remote_value):
  """The `tff.framework.RemoteExecutor` a remote value lives on."""
  return remote_value._executor


def flush_disposals(executor) -> None:
  """Sends a `tff.framework.RemoteExecutor`'s batch of values to dispose now rather
  than once it holds 20 (TFF's batch size). TFF 0.87 has no public call for it."""
  pending = executor._dispose_request
  if pending is None or not pending.value_ref:
    return
  executor._dispose_request = executor_pb2.DisposeRequest(
      executor=executor._executor_id)
  executor._stub.dispose(pending)


def executor_cardinalities(factory) -> list:
  """The cardinalities a TFF remote executor factory holds an executor for."""
  return list(factory._executors.keys())
# pylint: enable=protected-access
