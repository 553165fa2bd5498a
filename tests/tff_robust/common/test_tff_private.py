"""tff_private.traced_with_little_autograph: TFF's functions are traced unconverted
unless they must be, and nothing of it outlives the call. That TFF's client work so
traced computes what TFF's own does, to the bit, is
tests/tasks/simulation/test_client_work.py's. tff_private.memoize_type_deserialization
returns TFF's own types."""

import importlib.util
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_robust.common import tff_private

# A module of TFF's name (AutoGraph's rules go by a function's module), in a file
# (AutoGraph converts a function from its source).
_FAKE_TFF_MODULE = 'tensorflow_federated.fake_for_tests'

_FUNCTIONS = '''
def sign(x):  # Branches on a tensor.
  if x > 0:
    return 1.0
  return -1.0


def choose(x, condition):  # Branches on a tensor or on a Python value.
  if condition:
    return x
  return -x
'''
_SCALAR = tf.TensorSpec([], tf.float32)


@pytest.fixture
def fake_tff(tmp_path):
  path = tmp_path / 'fake_for_tests.py'
  path.write_text(_FUNCTIONS)
  spec = importlib.util.spec_from_file_location(_FAKE_TFF_MODULE, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[_FAKE_TFF_MODULE] = module
  spec.loader.exec_module(module)
  yield module
  del sys.modules[_FAKE_TFF_MODULE]


def _counted(trace):
  calls = []

  def counted():
    calls.append(True)
    return trace()

  return counted, calls


def test_a_tff_function_that_branches_on_a_tensor_is_traced_converted(fake_tff):
  trace, calls = _counted(
      lambda: tf.function(lambda x: fake_tff.sign(x)).get_concrete_function(_SCALAR))
  graph = tff_private.traced_with_little_autograph(trace)
  assert len(calls) == 2  # Unconverted, then again converted.
  assert float(graph(tf.constant(2.0))) == 1.0
  assert float(graph(tf.constant(-2.0))) == -1.0


def test_nothing_outlives_the_call(fake_tff):
  # A Python condition: traced unconverted, which AutoGraph caches.
  tff_private.traced_with_little_autograph(lambda: tf.function(
      lambda x: fake_tff.choose(x, True)).get_concrete_function(_SCALAR))
  # A tensor condition afterwards: converted, as AutoGraph's own rules say.
  absolute = tf.function(lambda x: fake_tff.choose(x, x > 0)).get_concrete_function(
      _SCALAR)
  assert float(absolute(tf.constant(-3.0))) == 3.0


def test_a_nested_call_runs_under_the_outer_calls_rules_and_fallback(fake_tff):
  inner, calls = _counted(
      lambda: tf.function(lambda x: fake_tff.sign(x)).get_concrete_function(_SCALAR))
  graph = tff_private.traced_with_little_autograph(
      lambda: tff_private.traced_with_little_autograph(inner))
  assert len(calls) == 2  # Failed under the outer rules, then converted.
  assert float(graph(tf.constant(-2.0))) == -1.0


_TYPES = (
    tff.TensorType(np.float32, [3, 2]),
    tff.TensorType(np.int32, [None]),
    tff.StructType([('kernel', tff.TensorType(np.float32, [3, 2])),
                    ('bias', tff.TensorType(np.float32, [2]))]),
    tff.StructType([tff.TensorType(np.float32, [2]), tff.TensorType(np.float32, [])]),
    tff.FederatedType(np.float32, tff.CLIENTS),
    tff.FederatedType(np.float32, tff.SERVER),
    tff.SequenceType(tff.TensorType(np.float32, [2])),
    tff.FunctionType(tff.FederatedType(np.float32, tff.CLIENTS),
                     tff.FederatedType(np.float32, tff.SERVER)),
    tff.FunctionType(None, tff.StructType([('a', np.int64)])),
)


def test_memoized_type_deserialization_returns_tffs_own_types():
  tff_private.memoize_type_deserialization()  # Again: the suite's conftest did too.
  deserialize = tff_private.type_serialization.deserialize_type
  protos = [tff_private.type_serialization.serialize_type(t) for t in _TYPES]
  tffs_own = [deserialize.__wrapped__(proto) for proto in protos]
  assert tffs_own == list(_TYPES)
  remembered = [deserialize(proto) for proto in protos]
  assert remembered == tffs_own
  assert all(a is b for a, b in zip(remembered, map(deserialize, protos)))
  tff_private.memoize_type_deserialization()
  assert tff_private.type_serialization.deserialize_type is deserialize
