"""Iterative secure aggregates, each defined once, and the two ways to run them.

The geometric median (RFA), the γ-mean and secure centered clipping are chains of
*passes*: the server broadcasts what it knows (an estimate, a smoothing floor), every
client turns that and its own update into a weight or a transformed update (and a few
scalars), and one call of an inner weighted mean (e.g. a secure one) and sums of the
scalars give the server what the next pass needs. The server learns only those
aggregates, never a client's value.

An aggregate is defined once, as its `IterativeSteps` for one value type: the initial
state, how a call starts from the state, the passes of a call, and how it ends
(result, new state, measurements). Two drivers run the same steps:

*   `fused_process`: every pass inside one `tff.federated_computation`, the
    `tff.templates.AggregationProcess` that the factories' `create` returns (the
    drop-in for `model_aggregator=` of `build_weighted_fed_avg`).
*   `PassByPass`: one TFF computation per pass, called in order from Python
    (`tff_robust.distributed.passwise`). Each holds a single round of aggregation, so it runs in
    any TFF context, TFF's mergeable multi-worker one included, which refuses the fused
    process ("Detected one aggregate dependent on another").

Both trace the same federated code, so in one process they return the same values
(across workers, up to the order of floating-point sums). A factory of such an
aggregate derives from `IterativeAggregationFactory` and defines `steps(value_type)`.
"""

import abc
import collections
import contextlib
import functools
from typing import Callable, NamedTuple, Optional, Sequence

import tensorflow_federated as tff

from tff_robust.iterative import contributions
from tff_robust.iterative import iterative_mean
from tff_robust.common import weighted_or_unweighted

# What the server knows between passes: a structure of dicts and lists whose leaves
# are SERVER-placed federated values (estimates, inner states, per-pass statistics).
Carry = dict


class Pass(NamedTuple):
  """One round of aggregation of an iterative aggregate.

  `run(carry, value, alpha) → carry`, called inside a `tff.federated_computation`
  with the clients' values and float32 weights α at CLIENTS. Its aggregations (inner
  mean calls, `tff.federated_sum`s, `tff.federated_max`es) may depend on the carry and
  on the clients' own data, never on one another: that is what makes it one round
  (and one computation of the mergeable context). What comes after them (the next
  estimate, a freezing rule) is server-side work on their results.

  Passes of the same `name` run the same code; the pass-by-pass driver builds one
  computation per name and carry structure.
  """
  name: str
  run: Callable[[Carry, tff.Value, tff.Value], Carry]


class IterativeSteps(abc.ABC):
  """The steps of one iterative aggregate for one value type (`value_type`).

  `initialize`, `start` and `finish` are SERVER-only federated code (no client
  takes part: the drivers put `start` into the first pass's computation and `finish`
  into the last one's); the passes hold all the aggregation.
  """

  value_type: tff.Type

  @abc.abstractmethod
  def initialize(self) -> tff.Value:
    """The process's initial state at SERVER."""

  @abc.abstractmethod
  def start(self, state: tff.Value) -> Carry:
    """The carry before the first pass, from the state at SERVER."""

  @abc.abstractmethod
  def passes(self) -> Sequence[Pass]:
    """The passes of one call, in order. Fixed when the steps are made: a TFF
    computation has no data-dependent loop, so a converged estimate is kept by the
    passes' server update (freezing), not by leaving passes out."""

  @abc.abstractmethod
  def finish(self, carry: Carry) -> tff.templates.MeasuredProcessOutput:
    """`MeasuredProcessOutput(state, result, measurements)` of the call, each a
    federated value at SERVER, from the carry after the last pass."""

  def client_step(self, weight_type) -> Optional[Callable]:
    """None, or what the clients do before the passes: `(value, weight) at CLIENTS →
    (value, float32 α at CLIENTS, {name: SERVER value})`, the dict reported after
    `finish`'s measurements (e.g. the non-finite filter's count). The fused process
    runs it once; pass by pass, every pass runs it first (a deployed client keeps its
    update between passes, so every pass sees the same verdict) and the first pass's
    dict is reported. A wrapper of steps passes its inner steps' on."""
    del weight_type
    return None


def fused_process(steps: IterativeSteps,
                  weight_type) -> tff.templates.AggregationProcess:
  """Every pass of `steps` in one computation: the process
  `(<state, {value}@CLIENTS, {weight}@CLIENTS> -> <state, value@SERVER,
  measurements@SERVER>)` with `steps`' state, result and measurements."""

  init_fn = _initialize(steps)
  client_step = _client_step(steps, weight_type)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(steps.value_type, tff.CLIENTS),
      tff.FederatedType(weight_type, tff.CLIENTS))
  def next_fn(state, value, weight):
    value, alpha, reported = client_step(value, weight)
    carry = steps.start(state)
    for step in steps.passes():
      carry = step.run(carry, value, alpha)
    output = steps.finish(carry)
    if not reported:
      return output
    return tff.templates.MeasuredProcessOutput(
        output.state, output.result,
        tff.federated_zip(with_measurements(output.measurements, reported)))

  return tff.templates.AggregationProcess(init_fn, next_fn)


def _client_step(steps: IterativeSteps, weight_type) -> Callable:
  """`steps.client_step`, or the weights as float32 and nothing reported."""
  step = steps.client_step(weight_type)
  if step is not None:
    return step
  return lambda value, weight: (
      value, iterative_mean.float32_weights(weight_type, weight), None)


def with_measurements(measurements, extra) -> collections.OrderedDict:
  """The measurements (a SERVER-placed structure) kept flat (a structure that is not
  named under `inner`), plus the SERVER values of `extra` by name, after them.

  Raises:
    ValueError: if the measurements already hold one of the names.
  """
  fields = _named_fields(measurements)
  for name, value in extra.items():
    if name in fields:
      raise ValueError(f'The inner aggregator already reports {name!r}.')
    fields[name] = value
  return fields


def _named_fields(measurements) -> collections.OrderedDict:
  """The fields of a SERVER-placed named structure, or the whole value as `inner`."""
  member = measurements.type_signature.member
  if isinstance(member, tff.StructType):
    names = [name for name, _ in tff.structure.iter_elements(member)]
    if names and all(names):
      return collections.OrderedDict((name, measurements[name]) for name in names)
    if not names:
      return collections.OrderedDict()
  return collections.OrderedDict(inner=measurements)


class PassByPass:
  """The calls of `steps` as one TFF computation per pass, driven from Python.

  *   `initialize()`: the initial state (the fused process's).
  *   `next(state, values, weights)` → `MeasuredProcessOutput`: the fused process's
      output as Python/numpy values. `values` and `weights` hold one entry per
      client.
  *   `output(first, last)`: that output from the results of the first and the last
      computation (for a driver that calls `computations` itself).
  *   `computations`: the computations one `next` calls, in order (the same object
      where passes share a name and the structure of their carry).

  Between passes the carry comes back to Python, flattened into one SERVER value,
  and goes into the next computation as its server argument; the first takes the
  state, the last returns the output.
  """

  def __init__(self, steps: IterativeSteps, weight_type,
               flags_type: Optional[tff.Type] = None,
               interceptor_for: Optional[Callable] = None):
    """Builds the computations.

    Args:
      steps: the aggregate's `IterativeSteps` (their `client_step` runs first in
        every pass).
      weight_type: the clients' weight type.
      flags_type, interceptor_for: for a simulation of the clients' contributions
        (`tff_robust.iterative.contributions`): every computation takes a fourth
        argument, one value of `flags_type` per client, and pass `index` of `n` is
        traced under `contributions.intercepted(interceptor_for(index, n, flags))`.
        What the interceptor's `outputs()` returns (SERVER values) comes back
        under the output's 'intercepted'. Each pass is then its own computation.
    """
    if (flags_type is None) != (interceptor_for is None):
      raise ValueError('Pass flags_type and interceptor_for together.')
    client_step = _client_step(steps, weight_type)
    self._steps = steps

    self._initialize = _initialize(steps)
    clients = (tff.FederatedType(steps.value_type, tff.CLIENTS),
               tff.FederatedType(weight_type, tff.CLIENTS))
    if flags_type is not None:
      clients += (tff.FederatedType(flags_type, tff.CLIENTS),)
    passes = list(steps.passes())
    if not passes:
      raise ValueError('An iterative aggregate needs at least one pass.')
    built = {}
    server_type, template = self._initialize.type_signature.result, None  # None: state.
    self.computations = []
    for index, step in enumerate(passes):
      last = index == len(passes) - 1
      key = (step.name, last, repr(template), str(server_type))
      if interceptor_for is not None:
        key += (index,)
      if key not in built:
        intercept = None
        if interceptor_for is not None:
          intercept = functools.partial(interceptor_for, index, len(passes))
        built[key] = _pass_computation(steps, step, server_type, template, last,
                                       clients, client_step, intercept)
      computation, template = built[key]
      self.computations.append(computation)
      if not last:
        server_type = computation.type_signature.result['carry']

  def initialize(self):
    return self._initialize()

  def next(self, state, values, weights, *flags):
    server, first = state, None
    for computation in self.computations:
      output = computation(server, values, weights, *flags)
      first = output if first is None else first
      server = output.get('carry')
    return self.output(first, output)

  @staticmethod
  def output(first, last) -> tff.templates.MeasuredProcessOutput:
    """The call's output: the last computation's state, result and measurements,
    then what the first one's client step reported."""
    measurements = collections.OrderedDict(last['measurements'])
    measurements.update(first.get('reported') or {})
    return tff.templates.MeasuredProcessOutput(last['state'], last['result'],
                                               measurements)


def _initialize(steps: IterativeSteps) -> tff.Computation:
  """`steps.initialize()` as a process's `initialize` computation."""

  @tff.federated_computation()
  def init_fn():
    return steps.initialize()

  return init_fn


def _pass_computation(steps, step, server_type, template, last, clients, client_step,
                      intercept=None):
  """(computation, template of the carry it returns) of `step`: from the state
  (`template` None) or a flattened carry, to the next flattened carry or, if `last`,
  the output; with `intercept`, `PassByPass`'s simulation of the contributions."""
  traced = {}

  def run_pass(server, value, weight, flags):
    value, alpha, reported = client_step(value, weight)
    carry = steps.start(server) if template is None else _unflatten(server, template)
    interceptor = intercept(flags) if intercept is not None else None
    with (contributions.intercepted(interceptor) if interceptor is not None
          else contextlib.nullcontext()):
      carry = step.run(carry, value, alpha)
    result = collections.OrderedDict()
    if interceptor is not None and interceptor.outputs():
      result['intercepted'] = tff.federated_zip(interceptor.outputs())
    if last:
      output = steps.finish(carry)
      result.update(state=output.state, result=output.result,
                    measurements=output.measurements)
    else:
      leaves, traced['template'] = _flatten(carry)
      result['carry'] = tff.federated_zip(collections.OrderedDict(
          (f'c{i}', leaf) for i, leaf in enumerate(leaves)))
    if template is None and reported:
      result['reported'] = tff.federated_zip(collections.OrderedDict(reported))
    return result

  if intercept is None:
    computation = tff.federated_computation(
        lambda server, value, weight: run_pass(server, value, weight, None),
        server_type, *clients)
  else:
    computation = tff.federated_computation(run_pass, server_type, *clients)
  return computation, traced.get('template')


def _flatten(carry):
  """(leaves, template): the carry's federated values in order, and its structure
  with each leaf's index in its place."""
  leaves = []

  def walk(node):
    if isinstance(node, dict):
      return {key: walk(value) for key, value in node.items()}
    if isinstance(node, list):
      return [walk(value) for value in node]
    node_type = getattr(node, 'type_signature', None)
    if not (isinstance(node_type, tff.FederatedType) and
            node_type.placement == tff.SERVER):
      raise TypeError('A carry holds dicts, lists and federated values at SERVER, '
                      f'found {node!r}.')
    leaves.append(node)
    return len(leaves) - 1

  return leaves, walk(carry)


def _unflatten(server, template):
  if isinstance(template, dict):
    return {key: _unflatten(server, value) for key, value in template.items()}
  if isinstance(template, list):
    return [_unflatten(server, value) for value in template]
  return server[f'c{template}']


def nested(steps: IterativeSteps, key: str) -> list[Pass]:
  """`steps`' passes as passes of an outer aggregate that keeps their carry under
  `key` of its own: the outer `start` puts `steps.start(...)` there, and the outer
  pass after them ends it with `steps.finish(carry[key])` (server-side, so it shares
  that pass's computation)."""

  def inside(step):
    def run(carry, value, alpha):
      return dict(carry, **{key: step.run(carry[key], value, alpha)})

    return Pass(f'{key}.{step.name}', run)

  return [inside(step) for step in steps.passes()]


class WrappedSteps(IterativeSteps):
  """Base of a transformer of steps (a wrapper's): `inner`'s state and client step,
  the carry's `inner` entry holding `inner`'s carry. A subclass defines `passes`
  (`inner`'s, transformed, and its own) and `finish`."""

  def __init__(self, inner: IterativeSteps):
    self._inner = inner
    self.value_type = inner.value_type

  def initialize(self):
    return self._inner.initialize()

  def client_step(self, weight_type):
    return self._inner.client_step(weight_type)

  def start(self, state):
    return {'inner': self._inner.start(state)}


class ProcessSteps(IterativeSteps):
  """Any aggregation process as steps of one pass, its `next` (e.g. the γ-mean's
  starting point from a factory that is not iterative). Pass by pass that is one
  computation, which the mergeable context runs only if the process itself is
  mergeable."""

  def __init__(self, process: tff.templates.AggregationProcess):
    self._process = process
    self.value_type = process.next.type_signature.parameter[1].member

  def initialize(self):
    return self._process.initialize()

  def start(self, state):
    return {'state': state}

  def passes(self):
    return [Pass('next', self._next)]

  def _next(self, carry, value, alpha):
    output = self._process.next(carry['state'], value, alpha)
    return {'state': output.state, 'result': output.result,
            'measurements': output.measurements}

  def finish(self, carry):
    return tff.templates.MeasuredProcessOutput(carry['state'], carry['result'],
                                               carry['measurements'])


class IterativeAggregationFactory(weighted_or_unweighted.WeightedOrUnweightedFactory):
  """Base of the factories of iterative aggregates: a subclass validates its
  arguments in `__init__` and defines `steps(value_type)`.

  `create(value_type, weight_type)` returns `fused_process` of the steps (and
  `create(value_type)` the same with weight 1 per client);
  `tff_robust.distributed.passwise.PasswiseFactory` runs the same steps pass by pass.
  """

  @abc.abstractmethod
  def steps(self, value_type) -> IterativeSteps:
    """The aggregate's steps for `value_type` (a checked structure of floats)."""

  def create_weighted(self, value_type,
                      weight_type) -> tff.templates.AggregationProcess:
    iterative_mean.check_float_structure(value_type)
    return fused_process(self.steps(value_type), weight_type)


def steps_of(factory: tff.aggregators.WeightedAggregationFactory,
             value_type) -> IterativeSteps:
  """The steps of an `IterativeAggregationFactory`; for any other weighted factory,
  its process for float32 weights as one pass (`ProcessSteps`)."""
  if isinstance(factory, IterativeAggregationFactory):
    return factory.steps(value_type)
  return ProcessSteps(factory.create(value_type, iterative_mean.WEIGHT_TYPE))
