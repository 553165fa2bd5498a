"""tff_private.traced_with_little_autograph: TFF's functions are traced unconverted
unless they must be, and nothing of it outlives the call. That TFF's client work so
traced computes what TFF's own does, to the bit, is
tests/tasks/simulation/test_client_work.py's."""

import importlib.util
import sys

import tensorflow as tf

from tff_robust.common import tff_private

# A module of TFF's name (AutoGraph's rules go by a function's module), in a file
# (AutoGraph converts a function from its source).
_FAKE_TFF_MODULE = 'tensorflow_federated.fake_for_tests'


def _in_fake_tff_module(directory, source: str, name: str):
  path = directory / 'fake_for_tests.py'
  path.write_text(source)
  spec = importlib.util.spec_from_file_location(_FAKE_TFF_MODULE, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[_FAKE_TFF_MODULE] = module
  spec.loader.exec_module(module)
  return getattr(module, name)


_BRANCHES_ON_A_TENSOR = '''
def sign(x):
  if x > 0:
    return 1.0
  return -1.0
'''


def _sign_graph(sign):
  return tf.function(lambda x: sign(x)).get_concrete_function(
      tf.TensorSpec([], tf.float32))


def test_a_tff_function_that_branches_on_a_tensor_is_traced_converted(tmp_path):
  sign = _in_fake_tff_module(tmp_path, _BRANCHES_ON_A_TENSOR, 'sign')
  traced = []

  def trace():
    traced.append(True)
    return _sign_graph(sign)

  try:
    graph = tff_private.traced_with_little_autograph(trace)
  finally:
    del sys.modules[_FAKE_TFF_MODULE]
  assert len(traced) == 2  # Unconverted, then again converted.
  assert float(graph(tf.constant(2.0))) == 1.0
  assert float(graph(tf.constant(-2.0))) == -1.0


_CHOOSES = '''
def choose(x, condition):
  if condition:
    return x
  return -x
'''


def test_nothing_outlives_the_call(tmp_path):
  choose = _in_fake_tff_module(tmp_path, _CHOOSES, 'choose')
  spec = tf.TensorSpec([], tf.float32)
  try:
    # A Python condition: traced unconverted, which AutoGraph caches.
    tff_private.traced_with_little_autograph(
        lambda: tf.function(lambda x: choose(x, True)).get_concrete_function(spec))
    # A tensor condition afterwards: converted, as AutoGraph's own rules say.
    absolute = tf.function(lambda x: choose(x, x > 0)).get_concrete_function(spec)
  finally:
    del sys.modules[_FAKE_TFF_MODULE]
  assert float(absolute(tf.constant(-3.0))) == 3.0


def test_a_nested_call_runs_under_the_outer_calls_rules_and_fallback(tmp_path):
  sign = _in_fake_tff_module(tmp_path, _BRANCHES_ON_A_TENSOR, 'sign')
  inner_traces = []

  def inner():
    inner_traces.append(True)
    return _sign_graph(sign)

  try:
    graph = tff_private.traced_with_little_autograph(
        lambda: tff_private.traced_with_little_autograph(inner))
  finally:
    del sys.modules[_FAKE_TFF_MODULE]
  assert len(inner_traces) == 2  # Failed under the outer rules, then converted.
  assert float(graph(tf.constant(-2.0))) == -1.0
