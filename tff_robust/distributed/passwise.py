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
multi-worker one included. The passes are the factories' own steps
(`tff_robust.iterative.iterative_steps`: the fused process runs the same ones inside one
computation), so `initialize`, the state, the result and the measurements are
exactly the single computation's (up to the order of floating-point sums across
workers).

Cost: a round makes R pass calls (plus one scalar-only call for the last entry of the
geometric median's `objective` when it is reported); with the geometric median's
default relative ν every pass is preceded by one more call that broadcasts v and
sums a small histogram (`tff_robust.aggregators.robust_scale`), up to 2R + 1 calls. In a
deployment clients keep their update between passes, so each pass moves one or two
broadcasts and one model-sized partial sum per worker. On
`tff_robust.distributed.DistributedContext`'s workers the same holds: `next` sends
each worker its clients' updates and weights once (`keep_on_workers`; none at all
when they are still there from training, as in the learning processes' `next`), and
every pass call then sends v and refers to them.

Factories other than `tff_robust.iterative.iterative_steps.IterativeAggregationFactory`s are run as
their own single computation (FedAvg's mean, GMA, ... are mergeable as they are; the
gathering baselines are not, and the mergeable context refuses them).

Whole computations can have a pass-by-pass equivalent too: `register_equivalent`
records, for a computation (e.g. the `next` of a learning process that
`tff_robust.learning` builds), a Python function computing the same from the same
argument with one computation per pass. `tff_robust.distributed.DistributedContext`
runs that function when TFF cannot merge the computation, so `process.next(state,
data)` works unchanged on the workers.
"""

from typing import Callable, Optional
import weakref

import tensorflow_federated as tff

from tff_robust.iterative import iterative_steps
from tff_robust.iterative import iterative_mean


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

  An `tff_robust.iterative.iterative_steps.IterativeAggregationFactory` (`GeometricMedianFactory`,
  one-step RFA, `GammaMeanFactory`, `SecureCenteredClippingFactory`) runs its own
  steps with `tff_robust.iterative.iterative_steps.PassByPass`, one computation per pass (their
  docstrings list the passes), and so do the wrappers that transform steps
  (`tff_robust.NonfiniteFilteringFactory`, which filters the clients first in every
  pass and reports the first pass's count, `tff_robust.WeightCappingFactory`). Any
  other factory runs as its own single computation; an unweighted one ignores the
  weights (TFF's `tff.aggregators.factory_utils.as_weighted_aggregator`).
  """

  def __init__(self, factory: tff.aggregators.WeightedAggregationFactory):
    if not isinstance(factory, (tff.aggregators.WeightedAggregationFactory,
                                tff.aggregators.UnweightedAggregationFactory)):
      raise TypeError('PasswiseFactory takes a tff.aggregators aggregation factory, got '
                      f'{type(factory).__name__}.')
    if not isinstance(factory, tff.aggregators.WeightedAggregationFactory):
      factory = tff.aggregators.factory_utils.as_weighted_aggregator(factory)
    self._factory = factory

  @property
  def factory(self):
    return self._factory

  def create(self, value_type, weight_type) -> PasswiseProcess:
    factory = self._factory
    if isinstance(factory, iterative_steps.IterativeAggregationFactory):
      iterative_mean.check_float_structure(value_type)
      passes = iterative_steps.PassByPass(factory.steps(value_type), weight_type)
      return PasswiseProcess(passes.initialize,
                             _keeping_clients(passes.next, value_type, weight_type),
                             len(passes.computations))
    process = self._factory.create(value_type, weight_type)
    return PasswiseProcess(process.initialize,
                           _keeping_clients(process.next, value_type, weight_type), 1)


def _keeping_clients(next_fn, value_type, weight_type):
  """`next_fn` whose clients' values and weights, in a context that keeps values on
  its workers (`tff_robust.distributed.DistributedContext.keep_on_workers`), go to
  the workers once for all its pass computations (in a deployment the clients
  hold them; otherwise every pass would send them again)."""
  value_type = tff.FederatedType(value_type, tff.CLIENTS)
  weight_type = tff.FederatedType(weight_type, tff.CLIENTS)

  def next_keeping(state, values, weights):
    keep = getattr(tff.framework.get_context_stack().current, 'keep_on_workers', None)
    if keep is None:
      return next_fn(state, values, weights)
    with keep(values, value_type) as values, keep(weights, weight_type) as weights:
      return next_fn(state, values, weights)

  return next_keeping


class Equivalent:
  """A pass-by-pass equivalent of a computation: `equivalent(arg)` returns what the
  computation returns for `arg` (its argument as the context's `invoke` receives it).
  The function is built on first use (`build()`, e.g. tracing a model), once.

  Attributes:
    mergeable: whether TFF's mergeable context runs the computation itself (None:
      not tried yet); set by the context that tried it.
  """

  def __init__(self, build: Callable[[], Callable]):
    self._build = build
    self._function: Optional[Callable] = None
    self.mergeable: Optional[bool] = None

  def __call__(self, arg):
    if self._function is None:
      self._function = self._build()
    return self._function(arg)


# id(computation) → (a weak reference to it, its `Equivalent`). By identity: TFF
# computations hash their serialized form, which is costly to compute every call.
_EQUIVALENTS: dict[int, tuple[weakref.ref, Equivalent]] = {}


def register_equivalent(computation: tff.Computation,
                        build: Callable[[], Callable]) -> Equivalent:
  """Records that `build()` returns a function computing what `computation` does,
  pass by pass; the record goes when `computation` does."""
  key = id(computation)
  equivalent = Equivalent(build)
  _EQUIVALENTS[key] = (weakref.ref(computation), equivalent)
  weakref.finalize(computation, _EQUIVALENTS.pop, key, None)
  return equivalent


def equivalent(computation) -> Optional[Equivalent]:
  """The `Equivalent` registered for `computation`, or None."""
  entry = _EQUIVALENTS.get(id(computation))
  if entry is None or entry[0]() is not computation:
    return None
  return entry[1]
