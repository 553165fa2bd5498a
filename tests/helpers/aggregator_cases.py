"""Shared inputs and helpers of the aggregator tests: a nested model structure, client
matrices (random and adversarial), and a cache of created processes (tracing a TFF
computation costs ~0.5 s, so every process is built once per test session)."""

import collections
import contextlib
import functools

import numpy as np
import tensorflow_federated as tff

from tasks.simulation import in_process

# An OrderedDict of tensors of different shapes holding a list, as TFF learning's
# model weights do: p = 6 + 2 + 1 = 9 scalars.
VALUE_TYPE = tff.types.to_type(collections.OrderedDict(
    kernel=tff.TensorType(np.float32, [3, 2]),
    bias=[tff.TensorType(np.float32, [2]), tff.TensorType(np.float32, [])]))
WEIGHT_TYPE = tff.TensorType(np.float32)
DIMENSION = 9
NUM_CLIENTS = 10

_PROCESSES = {}
_FAST_NEXT = {}


def process(key, build_factory):
  """The process of `build_factory()` for VALUE_TYPE, created once per `key`."""
  if key not in _PROCESSES:
    _PROCESSES[key] = build_factory().create(VALUE_TYPE, WEIGHT_TYPE)
  return _PROCESSES[key]


def fast_next(proc):
  """`proc.next`, evaluated in this process (`tasks.simulation.in_process`) where it
  can be: the same results as TFF's runtime, bit for bit, on every registry row
  (tests/tasks/simulation/test_in_process.py), and 10–20× faster from the third call
  on with tens of clients (slower for fewer calls or clients: the first calls
  compile). For tests of an aggregate's properties over many calls of many clients;
  tests of the runtime itself, of contexts and of secure sums (which this evaluation
  refuses: TFF's runtime then runs them) call `proc.next`."""
  if id(proc) not in _FAST_NEXT:
    _FAST_NEXT[id(proc)] = (proc, in_process.process_next(proc) or proc.next)
  return _FAST_NEXT[id(proc)][1]


def built_in_the_test_context(build):
  """`build()` with TFF's test context installed: a factory of tff_robust refuses to
  create a process holding secure sums in TFF's default context, which cannot run them
  (`tff_robust.common.secure_sums`). What is traced does not depend on the context, so
  the walks of the compiled computations see the same process."""
  with tff.framework.get_context_stack().install(
      tff.backends.test.create_sync_test_cpp_execution_context()):
    return build()


def to_struct(vector):
  vector = np.asarray(vector, np.float32)
  return collections.OrderedDict(
      kernel=vector[:6].reshape(3, 2), bias=[vector[6:8], np.float32(vector[8])])


def to_vector(struct):
  return np.concatenate([
      np.ravel(struct['kernel']), np.ravel(struct['bias'][0]),
      np.ravel(struct['bias'][1])]).astype(np.float64)


def run(proc, matrix, weights, state=None):
  """Runs `proc.next` on client rows `matrix`; returns (result vector, output)."""
  values = [to_struct(row) for row in matrix]
  weights = [np.float32(w) for w in weights]
  if state is None:
    state = proc.initialize()
  output = proc.next(state, values, weights)
  return to_vector(output.result), output


def relative_error(actual, expected):
  return np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-30)


def _rng(seed):
  return np.random.default_rng(seed)


def random_inputs(seed=0):
  return _rng(seed).normal(size=(NUM_CLIENTS, DIMENSION))


def huge_outlier_inputs(seed=1, magnitude=1e6):
  x = random_inputs(seed)
  x[3, 4] = magnitude
  return x


def clustered_attack_inputs(seed=2, fraction=0.2, offset=100.0):
  """Inliers around the clean centre 1, a `fraction` of clients at the same far point."""
  x = 1.0 + 0.1 * _rng(seed).normal(size=(NUM_CLIENTS, DIMENSION))
  num_attackers = int(round(fraction * NUM_CLIENTS))
  x[:num_attackers] = 1.0 + offset
  return x


def ties_inputs(seed=3):
  """Half the clients on one point, repeated values in every coordinate."""
  rng = _rng(seed)
  x = rng.integers(-2, 3, size=(NUM_CLIENTS, DIMENSION)).astype(np.float64)
  x[: NUM_CLIENTS // 2] = x[0]
  return x


def equal_weights():
  return np.ones(NUM_CLIENTS)


def random_weights(seed=5):
  return _rng(seed).uniform(0.5, 3.0, size=NUM_CLIENTS)


INPUTS = collections.OrderedDict(
    random=random_inputs,
    huge_outlier=huge_outlier_inputs,
    clustered_attackers=clustered_attack_inputs,
    ties=ties_inputs,
)
WEIGHTS = collections.OrderedDict(equal=equal_weights, weighted=random_weights)


def input_cases(inputs=tuple(INPUTS), weights=tuple(WEIGHTS)):
  """`named_parameters` cases over input kinds × weightings."""
  return [dict(testcase_name=f'{i}_{w}', inputs=i, weights=w)
          for i in inputs for w in weights]


@functools.cache
def _test_context():
  return tff.backends.test.create_sync_test_cpp_execution_context()


@contextlib.contextmanager
def secure_sum_context():
  """Within the block, TFF's test context is the default one, where secure-sum
  intrinsics run (as plain sums); the default context cannot embed them. One test
  context serves the whole test process, and the default context before the block
  comes back after it: a context compiles each computation once (TFF's compiler
  pipeline caches by computation), a new one would compile all of them again."""
  before = tff.framework.get_context_stack().current
  tff.framework.set_default_context(_test_context())
  try:
    yield
  finally:
    tff.framework.set_default_context(before)


class SecureSumContextMixin:
  """Runs a test case's tests in `secure_sum_context()`."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.enterClassContext(secure_sum_context())


def simulation_round(kind: str, seed: int, num_clients: int = 9):
  """One round of the simulation's inputs: updates (lists `[[3, 2], [4]]` of arrays)
  and weights. `kind` 'faulty' puts NaN and inf in two updates and a zero and a NaN
  weight; 'attacked' two equal clients at 1e30 and a tie; 'random' neither."""
  rng = np.random.default_rng(seed)
  matrix = rng.normal(size=(num_clients, 10)).astype(np.float32)
  weights = rng.integers(1, 50, size=num_clients).astype(np.float32)
  if kind == 'faulty':
    matrix[1, 3] = np.nan
    matrix[4, 0] = np.inf
    weights[6] = 0.0
    weights[7] = np.nan
  elif kind == 'attacked':
    matrix[:2] = -1e30 * matrix[2:].mean(axis=0)  # Far out, and equal.
    matrix[2] = matrix[3]                            # A tie.
  updates = [[row[:6].reshape(3, 2), row[6:]] for row in matrix]
  return updates, weights
