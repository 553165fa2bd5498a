"""The simulation's TFF computations run in this process, on the values it holds.

A simulation calls TFF computations (the client work, the aggregator, the server
update) with values it holds in Python: the round's client datasets, the clients'
updates after an attack. TFF 0.87 runs every call in its C++ runtime, a separate
`worker_binary` process: each call serializes the computation, every client's
dataset (as a graph) and every value into protocol buffers, sends them over gRPC and
reads the results back, and the runtime keeps every intermediate value of a call
until it ends. For the main job's linear model that is nearly all of a round's time,
and for a 6.4M-parameter model the simulated mean's 22.7 GB.

`InProcessComputation` runs the same computation here instead: it compiles it as TFF
does for its runtime (`desugar_and_transform_to_native`: the same TensorFlow graphs,
the same lowering of every federated intrinsic to `federated_aggregate` with
TensorFlow reductions) and evaluates the compiled form with the runtime's semantics:

*   a CLIENTS value is a Python list with one value per client, in order; a SERVER
    value is the value itself;
*   `federated_map`/`federated_apply` call the function per client (or once),
    `federated_broadcast` repeats the server value, the zips zip;
*   a CLIENTS value that a map or a zip computes is computed client by client as its
    one consumer (e.g. `federated_aggregate`) reads it, so a chain of maps ending in
    an aggregate holds one client's intermediates at a time, not one list per step
    (`_ClientByClient`); a value read by more than one consumer (a name referenced
    twice) is computed once, as a list;
*   `federated_aggregate(value, zero, accumulate, merge, report)` folds the clients in
    order, `report(accumulate(...accumulate(zero, v_1)..., v_n))`, as the runtime's
    single executor does (`merge` is never needed here);
*   every TensorFlow computation of the compiled form runs as a function of its
    graph (`tf.compat.v1.wrap_function`), on the clients' tensors as they are
    (datasets are passed as datasets, never serialized);
*   a call whose arguments hold at most `FUSE_AT_MOST_BYTES` (and no dataset or
    variable) runs this evaluation traced into one `tf.function`, which calls those
    functions without inlining them: one call instead of hundreds, the same results.

Results, states and measurements equal the federated call's bit for bit in every case
tested (tests/tasks/simulation/test_in_process.py: every aggregator of the registry
and the wrappers, one round of each bundled task with its server update); the
federated process stays the reference. The client work is not run here: its local
training, evaluated this way, differs from the runtime's in the last bit (this
process's TensorFlow kernels are not the worker's), and it keeps TFF's runtime.

A computation that uses anything else (an intrinsic this module
does not know, e.g. a secure sum or `federated_select`) is refused when built
(`UnsupportedComputationError`), and the caller keeps TFF's runtime for it.

The process a user deploys is untouched: this is the simulation's way of calling it.
"""

import collections
import hashlib
import itertools
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_robust.common import tff_private
from tff_robust.common.tff_private import structure
from tff_robust.common.tff_private import native_compiler as compiler
from tff_robust.common.tff_private import building_blocks
from tff_robust.common.tff_private import tree_analysis
from tff_robust.common.tff_private import cardinalities_utils
from tff_robust.common.tff_private import computation_impl
from tff_robust.common.tff_private import function_utils
from tff_robust.common.tff_private import type_conversions
from tff_robust.common.tff_private import tensorflow_utils
from tff_robust.common.tff_private import graph_utils
from tff_robust.common.tff_private import serialization_utils

# The intrinsics TFF's native compiler leaves for its runtime in the computations of
# this repository (and of TFF's learning templates), which `_Evaluation` implements.
SUPPORTED_INTRINSICS = frozenset([
    'federated_aggregate', 'federated_apply', 'federated_broadcast',
    'federated_eval_at_clients', 'federated_eval_at_server', 'federated_map',
    'federated_map_all_equal', 'federated_value_at_clients',
    'federated_value_at_server', 'federated_zip_at_clients',
    'federated_zip_at_server'])


# The TensorFlow computations embedded so far, by building block (equal blocks hold
# the same graph): a sweep builds the same aggregator for run after run.
_EMBEDDED_FUNCTIONS: dict = {}
_MAX_EMBEDDED_FUNCTIONS = 4096
# Compiled forms by `_canonical_key` of their computation.
_COMPILED: dict = {}
_MAX_COMPILED = 256


# A call whose arguments hold at most this many bytes runs as one TensorFlow function
# (`InProcessComputation._fused_call`): 1.7× as fast even where the arithmetic
# dominates (a 3-pass GM of 50 × 1M float32, 200 MB: 0.230 → 0.133 s,
# `benchmarks.gm_in_process`), but TensorFlow's executor then holds every client's
# intermediates at once, about one more copy of the arguments. Above it, the
# client-by-client evaluation keeps the peak near the round's data (the paper's
# ConvNet at 50 clients, 1.2 GB: 1.1 GB more traced; at 10 clients, 248 MiB, traced).
FUSE_AT_MOST_BYTES = 256 << 20
# The calls of a computation (with the same shapes) evaluated call by call before it
# is traced: tracing costs 0.2–1 s, which a run's rounds repay and a call or two (a
# test, a short run) do not.
FUSE_AFTER_CALLS = 2


class UnsupportedComputationError(ValueError):
  """The computation needs something `InProcessComputation` does not implement."""


class InProcessComputation:
  """A federated TFF computation called like the computation, run in this process.

  `computation(*args)` takes and returns what calling the TFF computation does:
  Python containers of numpy values (a CLIENTS value is a list, one per client; a
  dataset a `tf.data.Dataset`), with the containers of the computation's type.
  """

  def __init__(self, computation: tff.Computation):
    """Compiles `computation` as TFF's runtime would.

    Raises:
      UnsupportedComputationError: the compiled form uses an intrinsic or a building
        block this module does not implement.
    """
    self.type_signature = computation.type_signature
    # A sweep builds the same aggregator run after run: equal computations (up to
    # the names TensorFlow numbers its traced functions with) share one compiled form
    # and its embedded functions.
    key = _canonical_key(computation)
    if key not in _COMPILED:
      if len(_COMPILED) >= _MAX_COMPILED:
        _COMPILED.clear()
      native = compiler.desugar_and_transform_to_native(computation)
      block = native.to_building_block()
      try:
        _check_supported(block)
        _COMPILED[key] = _Compiled(block, self.type_signature)
      except UnsupportedComputationError as e:
        _COMPILED[key] = e  # Refused again at once, without compiling.
    if isinstance(_COMPILED[key], UnsupportedComputationError):
      raise _COMPILED[key]
    self._compiled = _COMPILED[key]
    self._functions = _EMBEDDED_FUNCTIONS

  def __call__(self, *args, **kwargs):
    parameter = self.type_signature.parameter
    # TFF's own packing of a call's arguments, which refuses a missing, extra or
    # unknown one as calling the computation does.
    argument = function_utils.pack_args(parameter, args, kwargs)
    num_clients = _num_clients(argument, parameter)
    value = None if parameter is None else _ingest(argument, parameter)
    leaves = _flat_value(value)
    if (self._compiled.fusable and
        sum(_nbytes(leaf) for leaf in leaves) <= FUSE_AT_MOST_BYTES):
      value = self._fused_call(num_clients, value, leaves)
    else:
      value = self._evaluate(num_clients, value)
    return type_conversions.type_to_py_container(_to_numpy(value),
                                                 self.type_signature.result)

  def _evaluate(self, num_clients: Optional[int], value):
    """The computation on `value`, each TensorFlow computation called on its own."""
    evaluation = _Evaluation(self._functions, num_clients, self._compiled.references)
    try:
      function = evaluation.evaluate(self._compiled.block, evaluation.scope({}))
      return _as_lists(function() if value is None else function(value))
    finally:
      evaluation.release()

  def _fused_call(self, num_clients: Optional[int], value, leaves: list):
    """`_evaluate` traced into one TensorFlow function (per number of clients and
    argument shapes, shared by equal computations; after `FUSE_AFTER_CALLS` calls
    evaluated as they are): one call instead of hundreds of eager ones (a 3-pass GM
    of 10 clients calls 300). `leaves` are `value`'s tensors."""
    parameter, result = self.type_signature.parameter, self.type_signature.result
    specs = tuple(tf.TensorSpec(leaf.shape, leaf.dtype) for leaf in leaves)
    fused, calls = self._compiled.fused, self._compiled.calls
    if (num_clients, specs) not in fused:
      calls[num_clients, specs] = calls.get((num_clients, specs), 0) + 1
      if calls[num_clients, specs] <= FUSE_AFTER_CALLS:
        return self._evaluate(num_clients, value)

      def evaluate_flat(*flat):
        value = (None if parameter is None else
                 _packed_value(parameter, num_clients, iter(flat)))
        return _flat_value(self._evaluate(num_clients, value))

      fused[num_clients, specs] = tf.function(
          evaluate_flat, autograph=False).get_concrete_function(*specs)
    return _packed_value(result, num_clients,
                         iter(fused[num_clients, specs](*leaves)))


class _Compiled:
  """A computation as compiled for TFF's runtime, and what its calls reuse."""

  def __init__(self, block, type_signature):
    self.block = block
    self.references = _reference_counts(block)
    self.fusable = _fusable(type_signature, block)
    # The traced functions of `_fused_call`, and the calls made before tracing
    # one, by number of clients and arguments' specs.
    self.fused = {}
    self.calls = {}


def process_next(process) -> Optional[Callable[..., Any]]:
  """`process.next` of a TFF process run in this process (`InProcessComputation`),
  returning what it returns (a `MeasuredProcessOutput` for a measured process), or
  None when its computation needs TFF's runtime or `next` is not one TFF
  computation (a Python driver, e.g. `tff_robust.passwise`'s)."""
  if not isinstance(process.next, computation_impl.ConcreteComputation):
    return None  # Python driving TFF computations (e.g. pass by pass, on workers).
  try:
    computation = InProcessComputation(process.next)
  except UnsupportedComputationError:
    return None
  if not isinstance(process, tff.templates.MeasuredProcess):
    return computation

  def next_fn(*args):
    output = computation(*args)
    if isinstance(output, tff.templates.MeasuredProcessOutput):
      return output
    # The result type of a measured process's `next` is the struct
    # <state, result, measurements>; TFF's runtime returns its container.
    return tff.templates.MeasuredProcessOutput(*(output[i] for i in range(3)))

  return next_fn


def aggregation(process: tff.templates.AggregationProcess
                ) -> Optional[Callable[..., tff.templates.MeasuredProcessOutput]]:
  """`aggregate(state, updates, weights)` computing the weighted `process.next` in
  this process, or None when its computation needs TFF's runtime.

  `updates` is a list of one value per client (numpy leaves); the call empties it
  (each client's update is dropped once converted), so that a caller holding no
  other reference (the simulation loop) never holds the round's updates twice. Pass
  a copy of the list to keep it.
  """
  computation = process_next(process)
  if computation is None:
    return None
  value_type = process.next.type_signature.parameter[1].member

  def aggregate(state, updates, weights):
    values = []
    for i, update in enumerate(updates):
      values.append(_ingest(update, value_type))
      updates[i] = None
    updates.clear()
    return computation(state, values, weights)

  return aggregate


def _canonical_key(computation) -> str:
  """A digest of `computation` that is equal for equal computations: its proto with
  the functions of every TensorFlow graph renamed in the order they are first
  referenced (TensorFlow numbers traced functions with a process-wide counter, so
  tracing the same factory twice differs only there)."""
  # A copy: the building block's protos are the computation's own.
  proto = type(computation_impl.ConcreteComputation.get_proto(computation))()
  proto.CopyFrom(computation_impl.ConcreteComputation.get_proto(computation))
  block = building_blocks.ComputationBuildingBlock.from_proto(proto)
  digest = hashlib.sha256()

  def visit(node):
    if isinstance(node, building_blocks.CompiledComputation):
      graph = node.proto.tensorflow.graph_def
      graph.value = _canonical_graph_def(
          serialization_utils.unpack_graph_def(graph)).SerializeToString(
              deterministic=True)

  tree_analysis.visit_postorder(block, visit)
  digest.update(block.proto.SerializeToString(deterministic=True))
  return digest.hexdigest()


def _canonical_graph_def(graph_def):
  """`graph_def` with its library's functions named F0, F1, ... in the order the
  graph's nodes (then those functions' nodes) first reference them, and sorted."""
  names = {f.signature.name: f for f in graph_def.library.function}
  order = []

  def note_attr(attr):
    kind = attr.WhichOneof('value')
    funcs = ([attr.func] if kind == 'func' else
             list(attr.list.func) if kind == 'list' else [])
    for func in funcs:
      note(func.name)
      for value in func.attr.values():
        note_attr(value)

  def note(name):
    if name in names and name not in order:
      order.append(name)

  def note_nodes(nodes):
    for node in nodes:
      note(node.op)
      for key in sorted(node.attr):
        note_attr(node.attr[key])

  note_nodes(graph_def.node)
  index = 0
  while index < len(order):
    note_nodes(names[order[index]].node_def)
    index += 1
  for name in sorted(names):  # Unreferenced ones last, by name.
    note(name)
  renamed = {name: f'F{i}' for i, name in enumerate(order)}
  graph_def = _renamed_functions(graph_def, renamed)
  functions = sorted(graph_def.library.function, key=lambda f: f.signature.name)
  del graph_def.library.function[:]
  graph_def.library.function.extend(functions)
  return graph_def


def _check_supported(block) -> None:
  problems = set()

  def visit(node):
    if isinstance(node, building_blocks.Intrinsic):
      if node.uri not in SUPPORTED_INTRINSICS:
        problems.add(f'intrinsic {node.uri}')
    elif isinstance(node, building_blocks.CompiledComputation):
      if node.proto.WhichOneof('computation') != 'tensorflow':
        problems.add(f'{node.proto.WhichOneof("computation")} computation')
    elif isinstance(node, (building_blocks.Data, building_blocks.Placement)):
      problems.add(type(node).__name__)

  tree_analysis.visit_postorder(block, visit)
  if problems:
    raise UnsupportedComputationError(
        'Not run in process: the compiled computation uses '
        f'{", ".join(sorted(problems))}.')


def _reference_counts(block) -> collections.Counter:
  """How often each name is referenced in `block`. A name bound in two places (two
  lambdas' `x`) counts both places' references: such values become lists more often
  than needed, never less."""
  counts = collections.Counter()

  def visit(node):
    if isinstance(node, building_blocks.Reference):
      counts[node.name] += 1

  tree_analysis.visit_postorder(block, visit)
  return counts


def _num_clients(argument, parameter) -> Optional[int]:
  """The number of clients (the length of the CLIENTS-placed arguments, which TFF
  checks agree), None without any."""
  if parameter is None:
    return None
  return cardinalities_utils.infer_cardinalities(argument, parameter).get(tff.CLIENTS)


def _ingest(value, type_: tff.Type):
  """A Python value of `type_` in this module's representation: CLIENTS values as
  lists, structs as `structure.Struct`, tensors as eager tensors."""
  if isinstance(type_, tff.FederatedType):
    if type_.placement is tff.CLIENTS and not type_.all_equal:
      return [_ingest(v, type_.member) for v in value]
    return _ingest(value, type_.member)
  if isinstance(value, structure.Struct) and _is_ingested(value):
    return value
  if isinstance(type_, tff.StructType):
    elements = structure.to_elements(structure.from_container(value))
    type_elements = structure.to_elements(type_)
    if len(elements) != len(type_elements):
      raise TypeError(f'{len(elements)} elements for the struct type {type_}.')
    return structure.Struct([
        (name, _ingest(element, element_type))
        for (name, element_type), (_, element) in zip(type_elements, elements)])
  if isinstance(type_, tff.TensorType):
    if isinstance(value, tf.Tensor):
      return value
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype != type_.dtype:
      # As TFF's runtime refuses it, rather than cast (a float64 1e40 would become
      # a float32 inf).
      raise TypeError(f'A value of dtype {value.dtype} for {type_}: convert it to '
                      f'{np.dtype(type_.dtype).name} first.')
    return tf.convert_to_tensor(np.asarray(value, type_.dtype))
  if isinstance(type_, tff.SequenceType):
    if not isinstance(value, tf.data.Dataset):
      raise TypeError(f'A tf.data.Dataset expected for {type_}, got '
                      f'{type(value).__name__}.')
    return value
  raise TypeError(f'Values of type {type_} are not supported.')


def _fusable(type_signature, block) -> bool:
  """Whether the computation can run as one traced function: no datasets (they pass
  as variants) and no variables (a model's, destroyed after each call)."""
  if _has_sequence(type_signature.parameter) or _has_sequence(type_signature.result):
    return False
  has_variables = []

  def visit(node):
    if isinstance(node, building_blocks.CompiledComputation):
      graph_def = serialization_utils.unpack_graph_def(node.proto.tensorflow.graph_def)
      if any(n.op == 'VarHandleOp' for n in graph_def.node):
        has_variables.append(node)

  tree_analysis.visit_postorder(block, visit)
  return not has_variables


def _has_sequence(type_) -> bool:
  if isinstance(type_, tff.FederatedType):
    return _has_sequence(type_.member)
  if isinstance(type_, tff.StructType):
    return any(_has_sequence(t) for _, t in structure.iter_elements(type_))
  return isinstance(type_, tff.SequenceType)


def _flat_value(value) -> list:
  """The tensors of a value of this module's representation (CLIENTS lists, structs),
  in order."""
  if isinstance(value, (list, _ClientByClient)):
    return [leaf for v in value for leaf in _flat_value(v)]
  if isinstance(value, structure.Struct):
    return [leaf for _, v in structure.iter_elements(value) for leaf in _flat_value(v)]
  return [] if value is None else [value]


def _packed_value(type_, num_clients: Optional[int], leaves):
  """The value of `type_` (this module's representation) of the tensors `leaves` (an
  iterator), `_flat_value`'s inverse."""
  if isinstance(type_, tff.FederatedType):
    if type_.placement is tff.CLIENTS and not type_.all_equal:
      return [_packed_value(type_.member, num_clients, leaves)
              for _ in range(num_clients)]
    return _packed_value(type_.member, num_clients, leaves)
  if isinstance(type_, tff.StructType):
    return structure.Struct([(name, _packed_value(element, num_clients, leaves))
                             for name, element in structure.iter_elements(type_)])
  return next(leaves)


def _nbytes(tensor) -> int:
  return tensor.shape.num_elements() * tensor.dtype.size


def _is_ingested(value) -> bool:
  return all(isinstance(leaf, (tf.Tensor, tf.data.Dataset)) for leaf in _flat(value))


def _to_numpy(value):
  if isinstance(value, (list, _ClientByClient)):
    return [_to_numpy(v) for v in value]
  if isinstance(value, structure.Struct):
    return structure.Struct([(name, _to_numpy(v))
                             for name, v in structure.iter_elements(value)])
  if isinstance(value, tf.Tensor):
    return value.numpy()
  return value


class _Scope:
  """Names bound by lambdas and blocks, innermost first."""

  def __init__(self, names: Optional[dict] = None, parent: Optional['_Scope'] = None):
    self._names = names or {}
    self._parent = parent

  def lookup(self, name: str):
    scope = self
    while scope is not None:
      if name in scope._names:  # pylint: disable=protected-access
        return scope._names[name]  # pylint: disable=protected-access
      scope = scope._parent  # pylint: disable=protected-access
    raise KeyError(f'Unbound reference {name!r}.')

  def bind(self, name: str, value) -> None:
    self._names[name] = value

  def clear(self) -> None:
    self._names = {}


class _Evaluation:
  """One call's evaluation of a compiled computation (the number of clients is the
  call's)."""

  def __init__(self, functions: dict, num_clients: Optional[int],
               references: collections.Counter):
    self._functions = functions
    self._num_clients = num_clients
    self._references = references
    self._scopes = []

  def scope(self, names: dict, parent: Optional[_Scope] = None) -> _Scope:
    """A new scope of this evaluation (`release` empties it)."""
    self._scopes.append(_Scope(names, parent))
    return self._scopes[-1]

  def release(self) -> None:
    """Drops every value the evaluation's scopes hold. A client-by-client value
    refers to its function, whose closure refers to the scope holding the value:
    without this, the round's intermediates would wait for Python's cycle collector,
    and each call would add their size to the process's memory."""
    for scope in self._scopes:
      scope.clear()
    self._scopes = []

  def _bound(self, name: str, value):
    """`value` as `name` holds it: computed client by client only for one reader."""
    return value if self._references[name] <= 1 else _as_lists(value)

  def evaluate(self, block, scope: _Scope):
    if isinstance(block, building_blocks.Reference):
      return scope.lookup(block.name)
    if isinstance(block, building_blocks.Selection):
      return self.evaluate(block.source, scope)[block.as_index()]
    if isinstance(block, building_blocks.Struct):
      return structure.Struct([(name, self.evaluate(element, scope))
                               for name, element in structure.iter_elements(block)])
    if isinstance(block, building_blocks.Call):
      function = self.evaluate(block.function, scope)
      if block.argument is None:
        return function()
      return function(self.evaluate(block.argument, scope))
    if isinstance(block, building_blocks.Lambda):
      return self._closure(block, scope)
    if isinstance(block, building_blocks.Block):
      inner = self.scope({}, scope)
      for name, local in block.locals:
        inner.bind(name, self._bound(name, self.evaluate(local, inner)))
      return self.evaluate(block.result, inner)
    if isinstance(block, building_blocks.Intrinsic):
      return getattr(self, '_' + block.uri)
    if isinstance(block, building_blocks.CompiledComputation):
      if block not in self._functions:
        if len(self._functions) >= _MAX_EMBEDDED_FUNCTIONS:
          self._functions.clear()
        self._functions[block] = _embedded(block)
      return self._functions[block]
    if isinstance(block, building_blocks.Literal):
      return tf.constant(block.value, block.type_signature.dtype)
    raise UnsupportedComputationError(f'Building block {type(block).__name__}.')

  def _closure(self, block: building_blocks.Lambda, scope: _Scope):
    if block.parameter_name is None:
      return lambda: self.evaluate(block.result, scope)
    name = block.parameter_name
    return lambda argument: self.evaluate(
        block.result, self.scope({name: self._bound(name, argument)}, scope))

  def _clients(self) -> int:
    if self._num_clients is None:
      raise UnsupportedComputationError(
          'A CLIENTS value without a CLIENTS-placed argument (unknown count).')
    return self._num_clients

  # The intrinsics, as TFF's runtime computes them.

  def _federated_map(self, argument):
    function, value = argument[0], argument[1]
    if isinstance(value, (list, _ClientByClient)):
      return _ClientByClient(lambda: map(function, value), len(value))
    return function(value)

  _federated_map_all_equal = _federated_map

  def _federated_apply(self, argument):
    return argument[0](argument[1])

  def _federated_broadcast(self, value):
    return [value] * self._clients()

  def _federated_value_at_server(self, value):
    return value

  def _federated_value_at_clients(self, value):
    return [value] * self._clients()

  def _federated_eval_at_server(self, function):
    return function()

  def _federated_eval_at_clients(self, function):
    return [function() for _ in range(self._clients())]

  def _federated_zip_at_server(self, value):
    return value

  def _federated_zip_at_clients(self, value):
    return _ClientByClient(lambda: _zipped(value), self._clients())

  def _federated_aggregate(self, argument):
    values, zero, accumulate, _, report = (argument[i] for i in range(5))
    accumulator = zero
    for value in values:
      accumulator = accumulate(structure.Struct([(None, accumulator), (None, value)]))
    return report(accumulator)


class _ClientByClient:
  """A CLIENTS value computed one client at a time, each time it is read: a map's or
  a zip's result read once (by an aggregate, a map or a zip) never exists as a whole.
  Reading it again computes it again, so `_Evaluation` gives it only to a single
  reader (the others get `_as_lists`)."""

  def __init__(self, clients: Callable[[], Any], num_clients: int):
    self._clients = clients  # Returns a new iterator over the clients' values.
    self._num_clients = num_clients

  def __iter__(self):
    return iter(self._clients())

  def __len__(self) -> int:
    return self._num_clients


def _as_lists(value):
  """`value` with every client-by-client value in it computed into a list."""
  if isinstance(value, _ClientByClient):
    return list(value)
  if isinstance(value, structure.Struct):
    return structure.Struct([(name, _as_lists(v))
                             for name, v in structure.iter_elements(value)])
  return value


def _zipped(value):
  """The clients' elements of a struct of CLIENTS values, one struct per client."""
  if not isinstance(value, structure.Struct):
    yield from value
    return
  names = [name for name, _ in structure.iter_elements(value)]
  members = [_zipped(v) for _, v in structure.iter_elements(value)]
  for elements in zip(*members):
    yield structure.Struct(list(zip(names, elements)))


def _leaf_types(type_) -> list:
  if type_ is None:
    return []
  if isinstance(type_, tff.StructType):
    return [leaf for _, element in structure.iter_elements(type_)
            for leaf in _leaf_types(element)]
  return [type_]


def _pack(type_, leaves):
  """The flat `leaves` (an iterator) as a value of `type_`."""
  if isinstance(type_, tff.StructType):
    return structure.Struct([(name, _pack(element, leaves))
                             for name, element in structure.iter_elements(type_)])
  return next(leaves)


def _flat(value) -> list:
  if isinstance(value, structure.Struct):
    return [leaf for _, element in structure.iter_elements(value)
            for leaf in _flat(element)]
  return [value]


def _embedded(block: building_blocks.CompiledComputation) -> Callable:
  """The TensorFlow computation `block` as a Python function of this module's values,
  running its graph (as compiled for TFF's runtime) as an eager function."""
  proto = block.proto.tensorflow
  function_type = block.type_signature
  parameter, result = function_type.parameter, function_type.result
  inputs = (tensorflow_utils.extract_tensor_names_from_binding(proto.parameter)
            if parameter is not None else [])
  outputs = tensorflow_utils.extract_tensor_names_from_binding(proto.result)
  graph_def = serialization_utils.unpack_graph_def(proto.graph_def)
  graph_def = _renamed_functions(graph_def, f'_in_process_{next(_EMBEDDED)}')
  if proto.initialize_op:
    graph_def = _initialized_first(graph_def, proto.initialize_op)
  parameter_leaves = _leaf_types(parameter)
  result_leaves = _leaf_types(result)
  token = proto.session_token_tensor_name

  def import_graph(*args):
    input_map = dict(zip(inputs, args))
    if token:
      input_map[token] = tf.constant('in_process')
    # Control edges on an input (`^arg`) follow its replacement, as in TFF.
    input_map = graph_utils.add_control_dep_mappings(input_map)
    return tf.graph_util.import_graph_def(graph_def, input_map=input_map,
                                         return_elements=outputs)

  signature = [tf.TensorSpec([], tf.variant) if isinstance(t, tff.SequenceType)
               else tf.TensorSpec(t.shape, t.dtype) for t in parameter_leaves]
  # Inlined, TensorFlow would optimize across the embedded graphs of a fused call
  # (`InProcessComputation._fused_call`) and round differently than TFF's runtime,
  # which runs each graph on its own (GM's result moved by 1 ulp).
  wrapped = tff_private.never_inlined(
      tf.compat.v1.wrap_function(import_graph, signature), signature)
  # Variables of the graph (a model's, trained from scratch every call) live in the
  # resource manager under their shared names: destroyed after each call, as TFF's
  # runtime drops them with its graph.
  handles = [op.outputs[0] for op in wrapped.graph.get_operations()
             if op.type == 'VarHandleOp']
  destroy = wrapped.prune(feeds=[], fetches=handles) if handles else None
  converters = [_from_variant(t) if isinstance(t, tff.SequenceType) else None
                for t in result_leaves]

  def call(argument=None):
    leaves = _flat(argument) if parameter is not None else []
    leaves = [tf.data.experimental.to_variant(v) if isinstance(v, tf.data.Dataset)
              else v for v in leaves]
    values = wrapped(*leaves)
    if destroy is not None:
      for handle in destroy():
        tf.raw_ops.DestroyResourceOp(resource=handle, ignore_lookup_error=True)
    values = [v if convert is None else convert(v)
              for v, convert in zip(values, converters)]
    return _pack(result, iter(values))

  return call


_EMBEDDED = itertools.count()


def _renamed_functions(graph_def, rename):
  """`graph_def` with every function of its library renamed (and every reference to
  one): `rename` a suffix to append, or a dict old name → new name."""
  graph_def = type(graph_def).FromString(graph_def.SerializeToString())
  names = {f.signature.name for f in graph_def.library.function}
  if not names:
    return graph_def
  if isinstance(rename, str):
    suffix = rename
    rename = {name: name + suffix for name in names}

  def rename_attr(attr):
    kind = attr.WhichOneof('value')
    if kind == 'func':
      rename_func(attr.func)
    elif kind == 'list':
      for func in attr.list.func:
        rename_func(func)

  def rename_func(func):
    if func.name in names:
      func.name = rename[func.name]
    for value in func.attr.values():
      rename_attr(value)

  def rename_nodes(nodes):
    for node in nodes:
      if node.op in names:
        node.op = rename[node.op]
      for value in node.attr.values():
        rename_attr(value)

  rename_nodes(graph_def.node)
  for function in graph_def.library.function:
    function.signature.name = rename[function.signature.name]
    rename_nodes(function.node_def)
    for value in function.attr.values():
      rename_attr(value)
  for gradient in graph_def.library.gradient:
    if gradient.function_name in names:
      gradient.function_name = rename[gradient.function_name]
    if gradient.gradient_func in names:
      gradient.gradient_func = rename[gradient.gradient_func]
  return graph_def


def _from_variant(sequence_type):
  element = type_conversions.type_to_tf_structure(sequence_type.element)
  return lambda variant: tf.data.experimental.from_variant(variant, element)


def _initialized_first(graph_def, init_op: str):
  """`graph_def` with every node outside the initializer's own inputs made to wait for
  the initializer (`init_op`), as TFF's runtime runs it before the computation."""
  init_name = init_op.split(':')[0].lstrip('^')
  nodes = {node.name: node for node in graph_def.node}
  upstream, stack = set(), [init_name]
  while stack:
    name = stack.pop()
    if name in upstream or name not in nodes:
      continue
    upstream.add(name)
    stack.extend(i.split(':')[0].lstrip('^') for i in nodes[name].input)
  graph_def = type(graph_def).FromString(graph_def.SerializeToString())
  for node in graph_def.node:
    if node.name not in upstream and node.op not in ('Placeholder', 'Const'):
      node.input.append('^' + init_name)
  return graph_def
