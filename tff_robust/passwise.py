"""Iterative secure aggregates driven pass by pass, one TFF computation per pass.

A geometric median (RFA) with R passes, a γ-mean with S iterations or secure centered
clipping with L iterations is a chain of secure averages, each depending on the result
of the one before (the server broadcasts v, clients weigh themselves by their distance
to v, or clip their difference to v, one weighted mean gives the next v). As *one*
TFF computation (`GeometricMedianFactory().create(...)`) that is the drop-in form for
`build_weighted_fed_avg`; but TFF's multi-worker runtime
(`tff.backends.native.create_mergeable_comp_execution_context`, see
`tff_robust.distributed`) only runs computations whose aggregations are independent,
and refuses it ("Detected one aggregate dependent on another").

A production FL server orchestrates the same thing as R rounds of secure aggregation.
This module does exactly that: `PasswiseFactory(factory).create(value_type,
weight_type)` returns a `PasswiseProcess` whose `next` calls, from Python on the
server side, one computation per pass:

    broadcast v → each client computes its weight (and scalar statistics)
                → one call of the factory's inner mean (e.g. secure sum) → v'

Every pass computation has a single logical aggregation (the inner mean plus sums of
client scalars, all independent), so any TFF context runs it, the mergeable
multi-worker one included. The passes reuse the factories' own math (the same
TensorFlow client functions, the same inner mean factory, the same freezing and
underflow rules), and `initialize`, the state, the result and the measurements have
exactly the structure and values of the single computation's (up to the order of
floating-point sums across workers).

Cost: a round makes R pass calls (plus one scalar-only call for the last entry of the
geometric median's `objective` when it is reported); with the geometric median's
default relative ν every pass is preceded by one more call that broadcasts v and
sums a small histogram (`tff_robust.robust_scale`), up to 2R + 1 calls. In a
deployment clients keep their update between passes, so each pass moves one or two
broadcasts and one model-sized partial sum per worker. A simulation that holds the updates in Python sends each
worker its clients' updates with every pass call.

Factories other than `GeometricMedianFactory`, `GammaMeanFactory` and
`SecureCenteredClippingFactory` are run as their own single computation (FedAvg's
mean, GMA, ... are mergeable as they are; the gathering baselines are not, and the
mergeable context refuses them).
"""

import collections
from typing import Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_robust import centered_clipping
from tff_robust import gamma_mean
from tff_robust import geometric_median
from tff_robust import iterative_mean
from tff_robust import nonfinite


class PasswiseProcess:
  """An aggregation process driven from Python, one TFF computation per pass.

  Same interface as the `tff.templates.AggregationProcess` of the factory it was made
  from, for code that calls it directly (e.g. a simulation loop), but not a TFF
  computation itself, so it cannot go inside another one (pass the factory itself as
  `model_aggregator=` for that):

  *   `initialize()` → the factory process's initial state.
  *   `next(state, values, weights)` → `tff.templates.MeasuredProcessOutput(state,
      result, measurements)` with the factory's state, result and measurements (see
      its docstring), as Python/numpy values. `values` and `weights` are lists with
      one entry per client.
  *   `computations_per_call`: TFF computations `next` invokes.
  """

  def __init__(self, initialize_fn, next_fn: Callable, computations_per_call: int):
    self._initialize_fn = initialize_fn
    self._next_fn = next_fn
    self.computations_per_call = computations_per_call

  def initialize(self):
    return self._initialize_fn()

  def next(self, state, values, weights) -> tff.templates.MeasuredProcessOutput:
    return self._next_fn(state, values, weights)


class PasswiseFactory:
  """Makes `PasswiseProcess`es from a weighted aggregation factory.

  `create(value_type, weight_type)` takes the arguments of
  `tff.aggregators.WeightedAggregationFactory.create`, so a simulation that creates
  its aggregation process from a factory takes this object in its place.

  For a `GeometricMedianFactory` (RFA, one-step RFA) the passes are those of
  `geometric_median.WeiszfeldSteps`: the first inner mean (weights α_i, or
  α_i/max(ν, ‖w_i − v‖) from v = 0 or, for `initial_point='previous'`, from the
  previous result in the state), R − 1 Weiszfeld passes, and, when the factory reports
  `objective`, one scalar sum for g_ν of the final estimate. For a `GammaMeanFactory`:
  the starting point (the weighted mean, or the geometric median's passes and one
  round of scalar sums) and S iterations. For a
  `SecureCenteredClippingFactory`: the mean start if it has one, then L iterations, each
  one inner mean of the clients' clipped differences (and the clipped count, a sum of
  0/1 flags). Each may be wrapped in
  `tff_robust.NonfiniteFilteringFactory` (as `tasks.registry` does): every pass then
  filters its clients first and the count is reported as the wrapper does. Any other
  factory runs as its own single computation.
  """

  def __init__(self, factory: tff.aggregators.WeightedAggregationFactory):
    if not isinstance(factory, (tff.aggregators.WeightedAggregationFactory,
                                tff.aggregators.UnweightedAggregationFactory)):
      raise TypeError('PasswiseFactory takes a tff.aggregators aggregation factory, got '
                      f'{type(factory).__name__}.')
    self._factory = factory

  @property
  def factory(self):
    return self._factory

  def create(self, value_type, weight_type) -> PasswiseProcess:
    factory = self._factory
    filtered = isinstance(factory, nonfinite.NonfiniteFilteringFactory)
    if filtered:
      factory = factory.inner
    passes_class = next((passes for factory_class, passes in _PASSES
                         if isinstance(factory, factory_class)), None)
    if passes_class is not None:
      iterative_mean.check_float_structure(value_type)
      clean = _client_step(value_type, weight_type, filtered)
      passes = passes_class(factory, value_type, weight_type, clean)
      return PasswiseProcess(passes.initialize, _reporting_count(passes.next, filtered),
                             passes.computations_per_call)
    process = self._factory.create(value_type, weight_type)
    return PasswiseProcess(process.initialize, process.next, 1)


def _client_step(value_type, weight_type, filtered: bool):
  """What every pass does first at CLIENTS: `(value, weight) → (value, float32 α,
  num_dropped at SERVER or None)`, with the non-finite filter if the factory had it.

  Every pass recomputes it from the client's own update (a deployment's client keeps
  its update, so the verdict is the same every pass); the driver reports the first
  pass's count.
  """
  if filtered:
    return nonfinite.client_filter(value_type, weight_type)
  return lambda value, weight: (
      value, iterative_mean.float32_weights(weight_type, weight), None)


def _reporting_count(next_fn, filtered: bool):
  """`next_fn` whose measurements get `num_nonfinite_clients` appended, as
  `NonfiniteFilteringFactory` appends it, when the factory was filtered."""
  if not filtered:
    return lambda state, value, weight: next_fn(state, value, weight)[0]

  def next_with_count(state, value, weight):
    output, num_dropped = next_fn(state, value, weight)
    measurements = collections.OrderedDict(output.measurements)
    measurements[nonfinite.MEASUREMENT] = np.int32(num_dropped)
    return tff.templates.MeasuredProcessOutput(output.state, output.result, measurements)

  return next_with_count


def _inner_mean(factory, value_type):
  """The factory's inner mean process for `value_type`, and the type of its state."""
  inner = factory.inner_mean_factory.create(value_type, iterative_mean.WEIGHT_TYPE)
  return inner, inner.initialize.type_signature.result


def _pass_types(value_type, weight_type):
  """(estimate at SERVER, values at CLIENTS, weights at CLIENTS): a pass's types."""
  return (tff.FederatedType(value_type, tff.SERVER),
          tff.FederatedType(value_type, tff.CLIENTS),
          tff.FederatedType(weight_type, tff.CLIENTS))


def _with_dropped(result: collections.OrderedDict, num_dropped):
  if num_dropped is not None:
    result['num_dropped'] = num_dropped
  return result


class _Passes:
  """A factory's passes and their driver: `initialize` is the factory process's own
  (server-only); subclasses set `_process` and define `computations_per_call` and
  `next(state, value, weight) → (output, first pass's non-finite count or None)`."""

  _process: tff.templates.AggregationProcess

  @property
  def initialize(self):
    return self._process.initialize


class _GeometricMedianPasses(_Passes):
  """The aggregations of `GeometricMedianFactory` (its own `WeiszfeldSteps`) as one
  computation each (with a relative ν, every pass is preceded by the computation of
  its floor ν), and their Python driver."""

  def __init__(self, factory: geometric_median.GeometricMedianFactory, value_type,
               weight_type, clean):
    self._factory = factory
    self._process = factory.create(value_type, weight_type)
    self._num_passes = factory.num_communication_passes
    self._report_objective = factory.report_objective
    inner = factory.inner_mean_factory.create(value_type, geometric_median.BETA_TYPE)
    state_type = inner.initialize.type_signature.result
    steps = geometric_median.WeiszfeldSteps(factory, value_type)
    self._steps = steps
    server_value, client_value, client_weight = _pass_types(value_type, weight_type)
    server_nu = tff.FederatedType(np.float64, tff.SERVER)
    several_passes = self._num_passes > 1
    self._warm_start = steps.warm_start
    # The warm start's pass 1 takes the whole state: the inner one and its start.
    first_state_type = (self._process.initialize.type_signature.result
                        if self._warm_start else state_type)

    @tff.federated_computation(server_value, client_value, client_weight)
    def smoothing_from(center, value, weight):
      value, alpha, _ = clean(value, weight)
      return steps.smoothing(center, value, alpha)

    @tff.federated_computation(client_value, client_weight)
    def smoothing_from_zero(value, weight):
      value, alpha, _ = clean(value, weight)
      return steps.smoothing(None, value, alpha)

    @tff.federated_computation(first_state_type, server_nu, client_value, client_weight)
    def first_pass(state, nu, value, weight):
      value, alpha, num_dropped = clean(value, weight)
      if self._warm_start:
        first = steps.first_pass(inner, state.inner, value, alpha, nu,
                                 start=state[geometric_median.PREVIOUS_AGGREGATE])
      else:
        first = steps.first_pass(inner, state, value, alpha, nu)
      result = collections.OrderedDict(
          state=first['output'].state, center=first['output'].result,
          measurements=first['output'].measurements)
      if 'max_weight' in first:
        result['max_weight'] = first['max_weight']
      if several_passes:
        result['alpha_sum'] = tff.federated_sum(alpha)
      return _with_dropped(result, num_dropped)

    @tff.federated_computation(
        state_type, server_value, tff.FederatedType(steps.loop_type, tff.SERVER),
        tff.FederatedType(np.int32, tff.SERVER), tff.FederatedType(np.float32, tff.SERVER),
        server_nu, client_value, client_weight)
    def weiszfeld_pass(state, center, loop, this_pass, alpha_sum, nu, value, weight):
      value, alpha, _ = clean(value, weight)
      step = steps.weiszfeld_pass(inner, state, center, loop, this_pass, value, alpha,
                                  alpha_sum, nu)
      result = collections.OrderedDict(
          state=step['output'].state, center=step['center'], loop=step['loop'],
          objective=step['objective'], relative_gradient=step['relative_gradient'],
          measurements=step['output'].measurements)
      if 'max_weight' in step:
        result['max_weight'] = step['max_weight']
      return result

    @tff.federated_computation(server_value, server_nu, client_value, client_weight)
    def objective_pass(center, nu, value, weight):
      value, alpha, _ = clean(value, weight)
      return steps.objective(center, value, alpha, nu)

    self.smoothing_from = smoothing_from
    self.smoothing_from_zero = smoothing_from_zero
    self.first_pass = first_pass
    self.weiszfeld_pass = weiszfeld_pass
    self.objective_pass = objective_pass

  @property
  def computations_per_call(self) -> int:
    floors = 0
    if self._steps.relative:
      # One before every Weiszfeld step; the mean start's pass 1 is none, but its
      # objective needs one when it is the only pass.
      mean_start = self._factory.initial_point == 'mean'
      floors = self._num_passes - mean_start + (
          mean_start and self._num_passes == 1 and self._report_objective)
    return self._num_passes + int(self._report_objective) + floors

  def _floor(self, center, value, weight):
    """ν for a step from `center` (None: from zero) as a numpy float64."""
    if not self._steps.relative:
      return np.float64(self._factory.nu)
    if center is None:
      return self.smoothing_from_zero(value, weight)
    return self.smoothing_from(center, value, weight)

  def next(self, state, value, weight):
    """The factory's `next`, pass by pass; also the first pass's non-finite count."""
    floors = []
    if self._warm_start:
      floors.append(self._floor(state[geometric_median.PREVIOUS_AGGREGATE], value,
                                weight))
    elif self._steps.zero_start_pass:
      floors.append(self._floor(None, value, weight))
    # The mean start's pass 1 takes no floor; any float64 fills the argument.
    first = self.first_pass(state, floors[0] if floors else np.float64(0), value, weight)
    state, center, inner_measurements = (first['state'], first['center'],
                                         first['measurements'])
    max_weights = [first.get('max_weight')]
    loop = collections.OrderedDict(frozen=np.bool_(False), frozen_at=np.int32(0),
                                   passes=np.int32(1))
    objectives, relative_gradients = [], []
    for r in range(2, self._num_passes + 1):
      floors.append(self._floor(center, value, weight))
      step = self.weiszfeld_pass(state, center, loop, np.int32(r), first['alpha_sum'],
                                 floors[-1], value, weight)
      state, center, loop, inner_measurements = (
          step['state'], step['center'], step['loop'], step['measurements'])
      objectives.append(step['objective'])
      relative_gradients.append(step['relative_gradient'])
      max_weights.append(step.get('max_weight'))
    if self._report_objective:
      nu = floors[-1] if floors else self._floor(center, value, weight)
      objectives.append(self.objective_pass(center, nu, value, weight))
    measurements = self._factory.measurements(
        objectives, np.int32(loop['passes']), np.int32(loop['frozen_at']),
        relative_gradients, max_weights, floors, inner_measurements,
        stack=lambda values, dtype: np.array(values, dtype.as_numpy_dtype),
        max_of=np.max, constant=lambda x: x)
    if self._warm_start:
      state = collections.OrderedDict(
          [('inner', state), (geometric_median.PREVIOUS_AGGREGATE, center)])
    output = tff.templates.MeasuredProcessOutput(state, center, measurements)
    return output, first.get('num_dropped')


class _GammaMeanPasses(_Passes):
  """The rounds of `GammaMeanFactory` (its own `gamma_mean.GammaSteps`) as one
  computation each, and their Python driver."""

  def __init__(self, factory: gamma_mean.GammaMeanFactory, value_type, weight_type,
               clean):
    self._process = factory.create(value_type, weight_type)
    steps = gamma_mean.GammaSteps(factory, value_type)
    self._num_iterations = factory.num_iterations
    self._num_calls = factory.num_calls()
    inner = factory.inner_mean_factory.create(steps.inner_value_type,
                                              steps.inner_weight_type)
    self._use_gm = factory.initial_point == 'geometric_median'
    self._gm = None
    if self._use_gm:
      if not isinstance(factory.geometric_median_factory,
                        geometric_median.GeometricMedianFactory):
        raise TypeError('Pass by pass, the γ-mean starts from a GeometricMedianFactory '
                        f'only, got {type(factory.geometric_median_factory).__name__}.')
      # The starting point's passes see the values this γ-mean's passes see.
      self._gm = _GeometricMedianPasses(factory.geometric_median_factory, value_type,
                                        weight_type, clean)
    inner_state_type = inner.initialize.type_signature.result
    server_value, client_value, client_weight = _pass_types(value_type, weight_type)
    estimate_type = tff.FederatedType(steps.estimate_type, tff.SERVER)

    @tff.federated_computation(inner_state_type, client_value, client_weight)
    def mean_start(inner_state, value, weight):
      value, alpha, num_dropped = clean(value, weight)
      estimate, inner_state, inner_measurements = steps.start_at_mean(
          inner, inner_state, value, alpha)
      return _with_dropped(collections.OrderedDict(
          state=inner_state, estimate=estimate, measurements=inner_measurements),
                           num_dropped)

    @tff.federated_computation(server_value, client_value, client_weight)
    def after_geometric_median(center, value, weight):
      value, alpha, _ = clean(value, weight)
      return steps.start_at(center, value, alpha)

    @tff.federated_computation(inner_state_type, estimate_type, client_value,
                               client_weight)
    def iteration(inner_state, estimate, value, weight):
      value, alpha, _ = clean(value, weight)
      estimate, inner_state, inner_measurements, flags = steps.iterate(
          inner, inner_state, estimate, value, alpha)
      return collections.OrderedDict(
          state=inner_state, estimate=estimate, measurements=inner_measurements,
          flags=flags)

    self.mean_start = mean_start
    self.after_geometric_median = after_geometric_median
    self.iteration = iteration

  @property
  def computations_per_call(self) -> int:
    start = self._gm.computations_per_call + 1 if self._use_gm else 1
    return start + self._num_iterations

  def next(self, state, value, weight):
    """The factory's `next`, round by round (see `GammaMeanFactory`); also the first
    pass's non-finite count."""
    inner_state = state['inner']
    measurements = collections.OrderedDict()
    if self._use_gm:
      gm_output, num_dropped = self._gm.next(state['initial_point'], value, weight)
      estimate = self.after_geometric_median(gm_output.result, value, weight)
      inner_measurements = None
    else:
      start = self.mean_start(inner_state, value, weight)
      inner_state, estimate, inner_measurements = (
          start['state'], start['estimate'], start['measurements'])
      num_dropped = start.get('num_dropped')
    flags = []
    for _ in range(self._num_iterations):
      step = self.iteration(inner_state, estimate, value, weight)
      inner_state, estimate, inner_measurements = (
          step['state'], step['estimate'], step['measurements'])
      flags.append(step['flags'])
    column = lambda k: np.array([f[k] for f in flags], np.float32)
    underflow = column(0)
    measurements['num_secure_average_calls'] = np.int32(self._num_calls)
    measurements['underflow'] = underflow
    measurements['num_underflow_passes'] = np.int32(np.sum(underflow))
    measurements['capped_clients'] = column(1)
    measurements['retained_weight'] = column(2)
    if self._use_gm:
      measurements['initial_point'] = gm_output.measurements
    measurements['inner'] = inner_measurements
    new_state = collections.OrderedDict(inner=inner_state)
    if self._use_gm:
      new_state['initial_point'] = gm_output.state
    return (tff.templates.MeasuredProcessOutput(
        state=new_state, result=estimate['mean'], measurements=measurements),
            num_dropped)


class _CenteredClippingPasses(_Passes):
  """The iterations of `SecureCenteredClippingFactory` (its own
  `CenteredClippingSteps`) as one computation each, and their Python driver."""

  def __init__(self, factory: centered_clipping.SecureCenteredClippingFactory,
               value_type, weight_type, clean):
    self._process = factory.create(value_type, weight_type)
    self._num_iterations = factory.num_iterations
    self._start = factory.initial_point
    inner, inner_state_type = _inner_mean(factory, value_type)
    steps = centered_clipping.CenteredClippingSteps(factory, value_type)
    server_value, client_value, client_weight = _pass_types(value_type, weight_type)

    @tff.federated_computation(inner_state_type, client_value, client_weight)
    def mean_start(inner_state, value, weight):
      value, alpha, num_dropped = clean(value, weight)
      output = inner.next(inner_state, value, alpha)
      return _with_dropped(collections.OrderedDict(
          state=output.state, center=output.result, measurements=output.measurements),
                           num_dropped)

    def iteration_computation(last: bool):
      """One iteration; the last also counts the clipped clients and reports the
      factory's measurements (the others would compute every distance twice)."""

      @tff.federated_computation(inner_state_type, server_value, client_value,
                                 client_weight)
      def iteration(inner_state, center, value, weight):
        value, alpha, num_dropped = clean(value, weight)
        inner_state, center, inner_measurements, counts = steps.iteration(
            inner, inner_state, center, value, alpha, count_clipped=last)
        result = collections.OrderedDict(state=inner_state, center=center)
        if last:
          result['measurements'] = steps.measurements(counts, inner_measurements)
        return _with_dropped(result, num_dropped)

      return iteration

    # The 'zero' start's centre, made here (no computation in whatever context is
    # installed when the process is created).
    self._zeros = tf.nest.map_structure(
        lambda spec: np.zeros(spec.shape, spec.dtype.as_numpy_dtype),
        iterative_mean.type_template(value_type))
    self.mean_start = mean_start
    self.iteration = iteration_computation(last=False)
    self.last_iteration = iteration_computation(last=True)

  @property
  def computations_per_call(self) -> int:
    return self._num_iterations + (self._start == 'mean')

  def next(self, state, value, weight):
    """The factory's `next`, iteration by iteration; also the first pass's non-finite
    count."""
    inner_state, num_dropped = state['inner'], None
    if self._start == 'previous':
      center = state['previous']
    elif self._start == 'zero':
      center = self._zeros
    else:
      start = self.mean_start(inner_state, value, weight)
      inner_state, center, num_dropped = (start['state'], start['center'],
                                          start.get('num_dropped'))
    for l in range(self._num_iterations):
      last = l == self._num_iterations - 1
      iteration = self.last_iteration if last else self.iteration
      step = iteration(inner_state, center, value, weight)
      inner_state, center = step['state'], step['center']
      if num_dropped is None:
        num_dropped = step.get('num_dropped')
    new_state = collections.OrderedDict()
    if self._start == 'previous':
      new_state['previous'] = center
    new_state['inner'] = inner_state
    return (tff.templates.MeasuredProcessOutput(new_state, center,
                                                step['measurements']), num_dropped)


_PASSES = (
    (geometric_median.GeometricMedianFactory, _GeometricMedianPasses),
    (gamma_mean.GammaMeanFactory, _GammaMeanPasses),
    (centered_clipping.SecureCenteredClippingFactory, _CenteredClippingPasses),
)
