"""The one door to TensorFlow Federated's and TensorFlow's private modules.

Every private module the project uses (`tensorflow_federated.python...`,
`tensorflow.python...`) is imported here and nowhere else (`tests/test_packaging.py`
enforces it), after checking that the installed TFF is the release they were read
against. What needs them: the in-process evaluation of TFF computations
(`tasks.simulation.in_process`), the multi-worker runtime
(`tff_robust.distributed.distributed_context` and its `worker_connection`,
`resident_values`, `local_workers`), the client update of TFF's model-delta client
work (`tff_robust.learning.processes`), the original TFF RFA baseline
(`baselines.wrappers`), seeding the eager context (`tasks.simulation.loop`), TFF's
distributed DP sum (`tff_robust.aggregators.privacy`, not exported by 0.87), telling the
contexts that cannot run secure sums (`tff_robust.common.secure_sums`), and a few
tests.

Porting to another TFF release: change `SUPPORTED_TFF` and, for every module below
that moved or changed, the import here and its users; where a name became public
(`tff.framework`, `tff.types`, `tff.structure`), prefer it and drop the import.
"""

import atexit

import tensorflow_federated as tff

from tff_robust.common import teardown

SUPPORTED_TFF = '0.87.'
if not tff.__version__.startswith(SUPPORTED_TFF):
  raise ImportError(
      f'tff_robust reaches into TensorFlow Federated {SUPPORTED_TFF}x internals, and '
      f'TFF {tff.__version__} is installed. Install tensorflow-federated==0.87.0 '
      '(requirements.txt), or port tff_robust/common/tff_private.py to this release.')

# pylint: disable=g-direct-tensorflow-import,g-bad-import-order,unused-import
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
from tensorflow_federated.python.core.impl.utils import tensorflow_utils
from tensorflow_federated.python.learning.templates import model_delta_client_work
from tensorflow_federated.python.tensorflow_libs import graph_utils
from tensorflow_federated.python.tensorflow_libs import serialization_utils
# pylint: enable=g-direct-tensorflow-import,g-bad-import-order,unused-import

# TFF 0.87's finalizer of its idle local worker manager fails when it runs in the
# interpreter's teardown ("Exception ignored ... ServiceManager.__del__ ...
# 'NoneType' object has no attribute 'Popen'"), and importing this module or others
# (the geometric median's, tasks.builders.task) can move it there, as a plain TFF
# script's imports can: disarmed at exit, before the teardown. Every factory of
# tff_robust imports this module (`tff_robust.common.secure_sums`).
atexit.register(teardown.disarm_idle_managers)
