"""The smoothed Weiszfeld geometric median (RFA) as an iterative secure aggregate.

Pillutla, Kakade, Harchaoui, "Robust Aggregation for Federated Learning", Algorithms 2
(smoothed Weiszfeld) and 3 (one step), with the passes of Appendix D.2.3 (R = 3) and,
by default, a smoothing ν relative to the clients' typical distance instead of its
absolute 1e-6 (see `GeometricMedianFactory`).
"""

import collections
import functools
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_robust.common import arguments
from tff_robust.iterative import contributions
from tff_robust.iterative import iterative_steps
from tff_robust.iterative import iterative_mean
from tff_robust.common import numerics
from tff_robust.aggregators import robust_scale
from tff_robust.common import traced
from tff_robust.common import type_checks

INITIAL_POINTS = ('trimmed', 'mean', 'zero', 'previous')
DEFAULT_INITIAL_POINT = 'trimmed'
# The state entry of `initial_point='previous'`: the last `next`'s result.
PREVIOUS_AGGREGATE = 'previous_aggregate'
# ν relative to the clients' robust typical distance (`tff_robust.aggregators.robust_scale`): the
# default (why 0.2: docs/decisions.md).
DEFAULT_RELATIVE_NU = 0.2
PAPER_NU = 1e-6  # Paper D.2.3: an absolute ν, one argument away (`nu=PAPER_NU`).
DEFAULT_TOLERANCE = 1e-6


def check_smoothing(nu, relative_nu, tolerance) -> tuple[Optional[float], float, float]:
  """(ν or None, relative ν or None, tolerance) of a smoothed Weiszfeld factory.

  At most one of `nu` (an absolute floor, the paper's) and `relative_nu` (a floor
  relative to the clients' robust typical distance) may be given; neither means
  `relative_nu=DEFAULT_RELATIVE_NU`. Both must be finite numbers > 0, `tolerance` a
  number in [0, 1) (None: `DEFAULT_TOLERANCE`). A positive `tolerance` without either
  is refused: in google-research/federated's `robust_aggregation` (the original TFF
  RFA) `tolerance` IS the smoothing ν, and code written for it would silently get an
  early stop instead. `tolerance=0` (every pass applied) has no ν reading and passes
  alone.

  Returns:
    (nu, relative_nu, tolerance) with exactly one of nu and relative_nu not None.

  Raises:
    TypeError: if an argument is not a number.
    ValueError: if one is out of range, both ν are given, or a positive `tolerance`
      comes without a ν.
  """
  if nu is not None:
    nu = arguments.check_positive_float('nu', nu)
  if relative_nu is not None:
    relative_nu = arguments.check_positive_float('relative_nu', relative_nu)
  if nu is not None and relative_nu is not None:
    raise ValueError(
        f'nu={nu!r} and relative_nu={relative_nu!r}: give one. `nu` is an absolute '
        'floor on the distances (the paper\'s 1e-6), `relative_nu` a floor relative to '
        'the clients\' typical distance (the default, 0.2).')
  if tolerance is not None:
    tolerance = arguments.check_number_in('tolerance', tolerance, 0, 1,
                                          high_inclusive=False)
  if nu is None and relative_nu is None and tolerance is not None and tolerance != 0:
    raise ValueError(
        f'tolerance={tolerance!r} without nu or relative_nu: here `tolerance` is the '
        'early-stop threshold on the relative gradient and the smoothing is `nu` '
        "(absolute) or `relative_nu`, whereas in google-research/federated's "
        'robust_aggregation `tolerance` IS ν. Pass both (e.g. relative_nu=0.2, '
        'tolerance=1e-6 for the defaults), or use '
        'tff_robust.aggregators.original_rfa.RobustWeiszfeldFactory(num_communication_passes, '
        "tolerance) for the original's meaning (ν = tolerance, weighted-mean start, "
        'no early stop).')
  if nu is None and relative_nu is None:
    relative_nu = DEFAULT_RELATIVE_NU
  return nu, relative_nu, DEFAULT_TOLERANCE if tolerance is None else tolerance


def check_initial_point(initial_point, num_passes: int) -> str:
  """`initial_point` if it is one of `INITIAL_POINTS` that R = `num_passes` allows.

  Raises:
    ValueError: for an unknown start, or 'trimmed' with fewer than 2 passes (it is
      the mean, then the trimmed mean).
  """
  if initial_point not in INITIAL_POINTS:
    raise ValueError(
        f'initial_point must be one of {INITIAL_POINTS}, got {initial_point!r}.')
  if initial_point == 'trimmed' and num_passes < 2:
    raise ValueError(
        f"initial_point='trimmed' takes 2 passes (the mean, then the mean of the "
        f'clients nearest to it) but num_communication_passes={num_passes}: give '
        "num_communication_passes >= 2, or initial_point='zero' for one-step RFA.")
  return initial_point


def smoothed_norm(distance, nu):
  """‖z‖_(ν) of the paper's eq. (12), given ‖z‖: quadratic below ν, the norm above."""
  return tf.where(distance > nu, distance, distance * distance / (2.0 * nu) + nu / 2.0)


def objective_term(weight, distance, nu):
  """A client's term α·‖w − v‖_(ν) of the objective g_ν, in float64."""
  return tf.cast(weight, tf.float64) * smoothed_norm(distance, nu)


def weiszfeld_beta(weight, distance, nu):
  """β = α·ν / max(ν, d) in float64: the Weiszfeld weight α / max(ν, d) times the
  same ν for every client, which leaves the weighted mean unchanged and keeps β ≤ α,
  so β·w never exceeds FedAvg's α·w (a client exactly at the estimate, where the
  relative ν can be ~1e-49, would otherwise weigh α/ν, beyond float32's range). Not
  cast to float32: d may exceed the float32 range (a client at 3e38 in every
  coordinate), and a far client's β is below float32's smallest normal number, which
  TensorFlow flushes to zero; a float64 model needs a float64 weight anyway."""
  return tf.cast(weight, tf.float64) * (nu / tf.maximum(distance, nu))


def freeze_step(frozen, frozen_at, passes, this_pass, relative_gradient, tolerance):
  """The freezing rule of the Weiszfeld passes, the secure and the gathered GM's:
  `(apply, frozen, frozen_at, passes)` after pass `this_pass` whose relative gradient
  is `relative_gradient`. The step is applied unless the estimate was frozen before
  this pass (the pass that reveals convergence is itself applied, as its step is
  below the tolerance); `tolerance` 0 never freezes (a rounding-level gradient of 0
  must not stop the iteration); `passes` counts the applied passes."""
  converged = tf.logical_and(tolerance > 0, relative_gradient <= tolerance)
  apply = tf.logical_not(frozen)
  return (apply, tf.logical_or(frozen, converged),
          tf.where(tf.logical_and(apply, converged), this_pass, frozen_at),
          passes + tf.cast(apply, tf.int32))


class GeometricMedianFactory(iterative_steps.IterativeAggregationFactory):
  """Geometric median of client updates by the smoothed Weiszfeld algorithm.

  The created `tff.templates.AggregationProcess` takes a value at CLIENTS (a model
  update, any structure of float tensors, treated as one vector) and a weight α_i
  (e.g. the number of examples), and returns at SERVER an approximate minimizer of
  g(v) = Σ_i α_i ‖v − w_i‖ (Pillutla et al., "Robust Aggregation for Federated
  Learning", https://arxiv.org/abs/1912.13445, Algorithms 2 and 3). It is an
  *iterative secure aggregate*: the server learns nothing but the outputs of
  `num_communication_passes` (R) calls of `inner_mean_factory` and sums of
  per-client scalars and histograms.

  Start (`initial_point`):

  *   'trimmed' (default; R ≥ 2): pass 1 is the α-weighted mean m; pass 2 the
      α-weighted mean of the clients nearest to m that hold half of the weight (from
      a secure-summed histogram of their distances to m in quarter-octave buckets of
      d / D̄, D̄ the α-weighted mean distance); pass 3 a Weiszfeld step over the
      clients within about twice the weighted median distance to that trimmed mean.
      Translation-, rotation- and scale-equivariant, breakdown point 1/2.
  *   'mean': pass 1 is the weighted mean (with `nu=PAPER_NU`: Algorithm 2 exactly).
  *   'zero': pass 1 is a Weiszfeld step from v = 0, the current model (R = 1:
      Algorithm 3, one-step RFA).
  *   'previous': pass 1 is a Weiszfeld step from the previous `next`'s result,
      which the state carries at SERVER (zero before the first call).

  Every later pass broadcasts the current v; each client computes its own weight
  β_i = α_i·ν / max(ν, ‖v − w_i‖) over the whole structure (`weiszfeld_beta`, in
  float64) and the inner factory returns Σ β_i w_i / Σ β_i. The floor ν is
  `relative_nu` (0.2) × the clients' robust typical distance to v
  (`tff_robust.aggregators.robust_scale`, one secure sum of a small histogram before
  each Weiszfeld step), or the absolute `nu` (the paper's 1e-6: `nu=PAPER_NU`).

  Stopping: a TFF computation has no data-dependent loop, so all passes always run;
  once the relative gradient ‖∇g_ν(v⁽ʳ⁻¹⁾)‖ / Σα = ‖v⁽ʳ⁾ − v⁽ʳ⁻¹⁾‖·Σβ/(ν·Σα) (in
  [0, 1], 0 at the median, invariant to shifts and scalings) is at most `tolerance`,
  v⁽ʳ⁾ is kept and the later passes' results are discarded; `tolerance=0` applies
  every pass.

  Inputs must be finite: wrap the factory in `tff_robust.NonfiniteFilteringFactory`
  (`build_robust_federated_aggregation_process` and `tasks.registry` do) to give a NaN
  or infinite client weight 0. If every weight is zero the result is zero (with the
  default inner factory).

  Why the defaults are the trimmed start, the relative ν and this stopping rule (they
  keep the estimate with the larger group of clients wherever the clients are):
  docs/decisions.md, with the measurements and the commands that repeat them.

  The process's `next` has type signature
  `(<state, {value}@CLIENTS, {weight}@CLIENTS> -> <state, value@SERVER, measurements>)`
  (state: the inner factory's state; with `initial_point='previous'`,
  `<inner=..., previous_aggregate=value>`) and reports at SERVER (the Weiszfeld
  steps from a broadcast estimate are passes 2..R, or 3..R for 'trimmed'):

  *   `objective`: float64 vector, the smoothed objective
      g_ν(v) = Σ α_i ‖v − w_i‖_(ν) (paper eq. 12) at the estimate each of those
      steps starts from and at the result (R entries, R − 1 for 'trimmed'; absent
      if `report_objective=False`).
  *   `num_secure_average_calls`: calls of the inner mean factory (its `next`), the
      model-sized aggregations; the relative ν's histogram sums (one before each
      Weiszfeld step) are not counted in it.
  *   `num_passes_applied`: passes whose result was kept (smaller than the number of
      calls when the tolerance froze the estimate).
  *   `frozen_at_pass`: the pass r whose relative gradient fell to `tolerance`, i.e.
      after which the estimate was frozen (it equals `num_passes_applied`); 0 if the
      estimate never froze.
  *   `relative_gradient`: float64 vector, the stopping criterion ‖∇g_ν(v)‖ / Σα at
      the estimate each of those steps starts from (why and when it froze).
  *   `nu`: float64 vector, the floor ν of every Weiszfeld step (R entries for
      'zero' and 'previous', R − 1 for 'mean', R − 2 for 'trimmed'); constant for
      an absolute `nu`.
  *   `trim_radius` ('trimmed' only): the distance to the mean within which the
      clients of pass 2 lie (float64).
  *   `max_effective_weight`: max over passes and clients of β_i / Σ_j β_j, the
      quantity Proposition 3 bounds away from 1 (absent if
      `report_max_effective_weight=False`).
  *   `inner`: the inner factory's measurements of the last pass.

  Privacy: client values reach the server only through `inner_mean_factory`; pass e.g.
  `tff.aggregators.MeanFactory(value_sum_factory=tff.aggregators.SecureSumFactory(b))`
  for secure aggregation (its bound applies to β_i·w_i, not to w_i), or
  `tff_robust.DifferentiallyPrivateWeightedMeanFactory(...)` for differential
  privacy. The objective and counts are plain federated sums of per-client scalars;
  `max_effective_weight` uses `tff.federated_max` of the clients' scalar weights; the
  relative ν and the trimmed start's radius `tff.federated_sum`s of the clients'
  one-hot log-distance histograms, and its unit D̄ a sum of client scalars (they
  reveal the distribution of the distances, not whose they are; in a DP
  configuration these are `tff_robust.aggregators.privacy.SIDE_CHANNELS`).
  """

  # Client values reach the server only through sums (see the privacy tests).
  secure_compatible = True

  def __init__(
      self,
      num_communication_passes: int = 3,
      nu: Optional[float] = None,
      tolerance: Optional[float] = None,
      inner_mean_factory: Optional[tff.aggregators.WeightedAggregationFactory] = None,
      initial_point: str = DEFAULT_INITIAL_POINT,
      report_max_effective_weight: bool = True,
      report_objective: bool = True,
      relative_nu: Optional[float] = None,
  ):
    """Initializes the factory.

    Args:
      num_communication_passes: R >= 1, the number of calls of the inner mean
        (secure-average calls), the first one included. Paper default 3.
      nu: an absolute smoothing floor ν > 0 on the distances (the paper's D.2.3
        setting is `nu=PAPER_NU`, 1e-6). Give at most one of `nu` and `relative_nu`.
      tolerance: relative gradient ‖∇g_ν‖ / Σα in [0, 1) at or below which the
        estimate is frozen (see the class docstring); 0 applies every pass; None
        means 1e-6 (`DEFAULT_TOLERANCE`). NOT the `tolerance` of google-research/
        federated's `robust_aggregation`, which is ν: a positive `tolerance` without
        `nu` or `relative_nu` raises (see `check_smoothing`);
        `tff_robust.aggregators.original_rfa.RobustWeiszfeldFactory` takes the original's
        arguments with the original's meaning.
      inner_mean_factory: the weighted mean each pass goes through (its weights are
        float64). Defaults to `tff_robust.iterative.iterative_mean.Float32MeanFactory()`
        (TFF's `MeanFactory`, safe for the tiny weights of far-away clients).
      initial_point: 'trimmed' (default: the mean, then the mean of the clients
        nearest to it holding half of the weight; R >= 2), 'mean' (the paper's
        Algorithm 2), 'zero' (Algorithms 2 and 3 from v = 0) or 'previous' (a
        Weiszfeld step from the previous `next`'s result, kept in the state; zero
        at first). See the class docstring.
      report_max_effective_weight: whether to report `max_effective_weight`.
      report_objective: whether to report `objective` (its last entry is one more
        sum that depends on the last pass's result).
      relative_nu: ν relative to the clients' robust typical distance to the
        broadcast estimate (`tff_robust.aggregators.robust_scale`), recomputed every pass;
        None (and no `nu`) means `DEFAULT_RELATIVE_NU` (0.2).

    Raises:
      ValueError: if `num_communication_passes` < 1, `nu` or `relative_nu` is not a
        finite number > 0 or both are given, `tolerance` not in [0, 1), a positive
        `tolerance` comes without a ν, or `initial_point` is unknown (or
        'trimmed' with R < 2).
      TypeError: for arguments of the wrong type (e.g. a float
        `num_communication_passes`), including an `inner_mean_factory` that is not
        a weighted aggregation factory.
    """
    self._num_passes = arguments.check_positive_int(
        'num_communication_passes', num_communication_passes)
    self._nu, self._relative_nu, self._tolerance = check_smoothing(
        nu, relative_nu, tolerance)
    self._inner = (iterative_mean.Float32MeanFactory() if inner_mean_factory is None
                   else iterative_mean.check_inner_mean_factory(inner_mean_factory))
    self._initial_point = check_initial_point(initial_point, self._num_passes)
    self._report_max_weight = bool(report_max_effective_weight)
    self._report_objective = bool(report_objective)

  @property
  def num_communication_passes(self) -> int:
    """R: the inner-mean (secure-average) calls of every `next`."""
    return self._num_passes

  # The configuration, read by the factory's steps (`WeiszfeldSteps`).
  nu = property(lambda self: self._nu,
                doc='The absolute smoothing floor ν, or None if it is relative.')
  relative_nu = property(lambda self: self._relative_nu,
                         doc='ν relative to the robust scale, or None if absolute.')
  tolerance = property(lambda self: self._tolerance, doc='The freezing tolerance.')
  initial_point = property(lambda self: self._initial_point,
                           doc="'trimmed', 'mean', 'zero' or 'previous'.")
  inner_mean_factory = property(lambda self: self._inner, doc='The inner mean.')
  report_max_effective_weight = property(lambda self: self._report_max_weight)
  report_objective = property(lambda self: self._report_objective)

  def steps(self, value_type) -> 'WeiszfeldSteps':
    return WeiszfeldSteps(self, value_type)


# The Weiszfeld weights β_i reach the inner mean in float64 (see `weiszfeld_beta`).
BETA_TYPE = tff.TensorType(np.float64)


class WeiszfeldSteps(iterative_steps.IterativeSteps):
  """The passes of one `GeometricMedianFactory` for one value type.

  Passes (`tff_robust.iterative.iterative_steps`), for R = `num_communication_passes`:

  *   'floor' (relative ν only, before every step from an estimate): ν from the sum
      of the clients' histograms of distances to the estimate (to zero for the zero
      start's pass 1).
  *   'first': pass 1, one inner mean with β_i = α_i·ν / max(ν, ‖w_i − v‖) from
      v = 0 or the previous aggregate (β_i = α_i for the mean and trimmed starts),
      and Σα for the relative gradients.
  *   'spread', 'radius', 'trim' (the trimmed start): D̄, the half-weight radius's
      histogram and pass 2, the α-weighted mean of the clients within that radius;
      then 'near' and 'restricted' (R ≥ 3): ν and the near clients' histogram in one
      round, and pass 3, the Weiszfeld step over those clients.
  *   'weiszfeld' (the remaining passes up to R): β_i and g_ν(v) from the broadcast
      v, one inner mean, and the freezing rule at SERVER.
  *   'objective' (with `report_objective`): g_ν of the final estimate, a sum of
      client scalars (after a 'floor' of its own for the mean start's single pass).

  The carry: `inner` (the inner mean's state), `center` (the estimate; before pass 1
  the warm start's previous aggregate, absent for the zero and mean starts), `nu` (the
  last relative floor), and from pass 1 on `loop` (<frozen, frozen_at, passes>),
  `alpha_sum` (R > 1), `inner_measurements` and the per-pass lists behind the
  measurements (`floors`, `objectives`, `relative_gradients`, `max_weights`).
  `alpha` are float32 client weights, β float64.
  """

  def __init__(self, factory: GeometricMedianFactory, value_type):
    self.value_type = value_type
    self._tolerance = factory.tolerance
    self._num_passes = factory.num_communication_passes
    self._start = factory.initial_point
    self._absolute_nu = factory.nu
    self._report_max_weight = factory.report_max_effective_weight
    self._report_objective = factory.report_objective
    self._relative_nu = factory.relative_nu
    self._inner = factory.inner_mean_factory.create(value_type, BETA_TYPE)

  @property
  def _trim(self) -> '_TrimComputations':
    return _trim_computations(self.value_type)

  @property
  def _relative_floor(self) -> '_FloorComputations':
    return _floor_computations(self.value_type, self._relative_nu)

  def initialize(self):
    if self._start == 'previous':
      # The zero update before the first `next`: the first call equals the zero start.
      zeros = tff.federated_eval(iterative_mean.zeros(self.value_type), tff.SERVER)
      return _warm_state(self._inner.initialize(), zeros)
    return self._inner.initialize()

  def start(self, state):
    if self._start == 'previous':
      return {'inner': state.inner, 'center': state[PREVIOUS_AGGREGATE]}
    return {'inner': state}

  @property
  def _first_weiszfeld_pass(self) -> int:
    """The pass r of the first Weiszfeld step from a broadcast estimate."""
    return 3 if self._start == 'trimmed' else 2

  def passes(self):
    floor = ([iterative_steps.Pass('floor', self._floor)]
             if self._relative_nu is not None else [])
    passes = []
    if self._start in ('zero', 'previous'):
      passes += floor
    passes.append(iterative_steps.Pass('first', self._first_pass))
    if self._start == 'trimmed':
      passes += [iterative_steps.Pass('spread', self._spread_pass),
                 iterative_steps.Pass('radius', self._radius_pass),
                 iterative_steps.Pass('trim', self._trim_pass)]
      if self._num_passes >= 3:
        passes += [iterative_steps.Pass('near', self._near_pass),
                   iterative_steps.Pass('restricted', functools.partial(
                       self._weiszfeld_pass, restricted=True))]
    first_plain = self._first_weiszfeld_pass + (self._start == 'trimmed')
    for _ in range(first_plain, self._num_passes + 1):
      passes += floor + [iterative_steps.Pass('weiszfeld', self._weiszfeld_pass)]
    if self._report_objective:
      if self._num_passes < self._first_weiszfeld_pass and self._start in (
          'mean', 'trimmed'):
        passes += floor  # No Weiszfeld step left a floor to reuse.
      passes.append(iterative_steps.Pass('objective', self._objective_pass))
    return passes

  def _nu(self, carry):
    """ν of a step at SERVER (float64): the last relative floor, or the constant."""
    if self._relative_nu is not None:
      return carry['nu']
    return tff.federated_value(np.float64(self._absolute_nu), tff.SERVER)

  def _floor(self, carry, value, alpha):
    """Relative: `relative_nu` × the robust typical distance of the clients to the
    estimate (to zero before the zero start's pass 1), from one federated sum of
    `robust_scale.client_statistics`, before the step that uses it."""
    if 'center' in carry:
      statistics = tff.federated_map(
          self._relative_floor.statistics_from_distance,
          (tff.federated_broadcast(carry['center']), value, alpha))
    else:
      statistics = tff.federated_map(_statistics_from_norm(self.value_type),
                                     (value, alpha))
    nu = tff.federated_map(
        self._relative_floor.floor_from_statistics,
        contributions.sum_of('scale_statistics', statistics, alpha,
                             self._relative_floor.bound))
    return dict(carry, nu=nu)

  def _first_pass(self, carry, value, alpha):
    """Pass 1: a Weiszfeld step from zero or the previous aggregate, or the mean."""
    if self._start in ('mean', 'trimmed'):
      nu, beta = None, tff.federated_map(_as_beta, alpha)
      weight_bound, context = contributions.EQUAL_TO_ALPHA, ()
      bound = contributions.pair(contributions.UNBOUNDED, weight_bound)
    else:
      weight_bound = contributions.AT_MOST_ALPHA
      nu = self._nu(carry)
      if self._start == 'previous':
        context = (tff.federated_broadcast(carry['center']), tff.federated_broadcast(nu))
        beta = tff.federated_map(_weight_from_distance(self.value_type),
                                 (context[0], value, alpha, context[1]))
        bound = _WEISZFELD_BOUND
      else:
        context = (tff.federated_broadcast(nu),)
        beta = tff.federated_map(_weight_from_norm(self.value_type),
                                 (value, alpha, context[0]))
        bound = _FIRST_STEP_BOUND
    output = contributions.mean_of('first_mean', self._inner, carry['inner'], value,
                                   beta, alpha, bound, context)
    carry = dict(carry, inner=output.state, center=output.result,
                 inner_measurements=output.measurements,
                 loop=tff.federated_eval(_unfrozen_loop(passes_applied=1), tff.SERVER),
                 floors=[] if nu is None else [nu], objectives=[],
                 relative_gradients=[], max_weights=[])
    if self._report_max_weight:
      carry['max_weights'] = [_max_effective_weight(
          beta, alpha, contributions.sum_of('first_beta_sum', beta, alpha, weight_bound))]
    if self._num_passes > 1:
      carry['alpha_sum'] = contributions.sum_of('alpha_sum', alpha, alpha,
                                                contributions.EQUAL_TO_ALPHA)
    return carry

  def _spread_pass(self, carry, value, alpha):
    """The trimmed start's unit: the α-weighted mean distance D̄ to the mean, from
    one federated sum of client scalars."""
    distance_sum = contributions.sum_of('distance_sum', tff.federated_map(
        self._trim.weighted_distance,
        (tff.federated_broadcast(carry['center']), value, alpha)),
        alpha, contributions.NONNEGATIVE)
    return dict(carry, trim_unit=tff.federated_map(
        self._trim.mean_distance, (distance_sum, carry['alpha_sum'])))

  def _radius_pass(self, carry, value, alpha):
    """The trimmed start's radius: the bucket of the α-weighted median of d / D̄, from
    one federated sum of the clients' histograms."""
    histogram = contributions.sum_of('radius_histogram', tff.federated_map(
        self._trim.radius_histogram,
        (tff.federated_broadcast(carry['center']), value, alpha,
         tff.federated_broadcast(carry['trim_unit']))),
        alpha, _HISTOGRAM_BOUND)
    return dict(carry,
                trim_bucket=tff.federated_map(self._trim.median_bucket, histogram))

  def _near_pass(self, carry, value, alpha):
    """Before the trimmed start's pass 3, in one round: ν, and the bucket of the
    α-weighted median distance to the trimmed mean (in units of pass 2's radius)."""
    if self._relative_nu is not None:
      carry = self._floor(carry, value, alpha)
    histogram = contributions.sum_of('near_histogram', tff.federated_map(
        self._trim.radius_histogram,
        (tff.federated_broadcast(carry['center']), value, alpha,
         tff.federated_broadcast(carry['trim_radius']))),
        alpha, _HISTOGRAM_BOUND)
    return dict(carry,
                near_bucket=tff.federated_map(self._trim.median_bucket, histogram))

  def _trim_pass(self, carry, value, alpha):
    """Pass 2 of the trimmed start: the α-weighted mean of the clients within the
    radius of the mean (β_i = α_i inside, 0 outside), one inner mean."""
    bucket, unit = carry['trim_bucket'], carry['trim_unit']
    center_at_clients = tff.federated_broadcast(carry['center'])
    beta = tff.federated_map(self._trim.trimmed_weight, (
        center_at_clients, value, alpha, tff.federated_broadcast(unit),
        tff.federated_broadcast(bucket)))
    radius = tff.federated_map(self._trim.radius, (bucket, unit))
    output = contributions.mean_of(
        'trimmed_mean', self._inner, carry['inner'], value, beta, alpha, _TRIMMED_BOUND,
        lambda: (center_at_clients, tff.federated_broadcast(radius)))
    carry = dict(carry, inner=output.state, center=output.result,
                 inner_measurements=output.measurements,
                 trim_radius=radius,
                 loop=tff.federated_eval(_unfrozen_loop(passes_applied=2), tff.SERVER))
    if self._report_max_weight:
      carry['max_weights'] = carry['max_weights'] + [_max_effective_weight(
          beta, alpha, contributions.sum_of('trimmed_beta_sum', beta, alpha,
                                            contributions.ZERO_OR_ALPHA))]
    return carry

  def _weiszfeld_pass(self, carry, value, alpha, restricted=False):
    """A Weiszfeld step from the broadcast estimate v: β_i and the objective g_ν(v),
    one inner mean, and v kept instead of the step once the relative gradient is at
    most `tolerance`. `restricted` (the trimmed start's pass 3): β_i only for the
    clients within about twice the α-weighted median distance to v (`_near_pass`)."""
    this_pass = len(carry['relative_gradients']) + self._first_weiszfeld_pass
    nu, center, loop = self._nu(carry), carry['center'], carry['loop']
    arguments_ = (tff.federated_broadcast(center), value, alpha,
                  tff.federated_broadcast(nu))
    if restricted:
      beta_and_term = tff.federated_map(
          self._trim.restricted_weiszfeld_weight,
          arguments_ + (tff.federated_broadcast(carry['trim_radius']),
                        tff.federated_broadcast(carry['near_bucket'])))
    else:
      beta_and_term = tff.federated_map(_weiszfeld_weight(self.value_type), arguments_)
    beta = beta_and_term[0]
    # One sum of the pair gives Σβ and g_ν(center) (fewer per-client operations).
    beta_sum_and_objective = contributions.sum_of(
        'beta_and_objective', beta_and_term, alpha, _BETA_AND_OBJECTIVE_BOUND)
    output = contributions.mean_of('weiszfeld', self._inner, carry['inner'], value,
                                   beta, alpha, _WEISZFELD_BOUND,
                                   (arguments_[0], arguments_[3]))
    advanced = tff.federated_map(_advance(self.value_type, self._tolerance), (
        center, output.result, loop['frozen'], loop['frozen_at'], loop['passes'],
        tff.federated_value(this_pass, tff.SERVER), beta_sum_and_objective[0],
        carry['alpha_sum'], nu))
    carry = dict(
        carry, inner=output.state, center=advanced['center'],
        inner_measurements=output.measurements,
        loop=tff.federated_zip(collections.OrderedDict(
            frozen=advanced['frozen'], frozen_at=advanced['frozen_at'],
            passes=advanced['passes'])),
        floors=carry['floors'] + [nu],
        objectives=carry['objectives'] + [beta_sum_and_objective[1]],
        relative_gradients=carry['relative_gradients'] + [
            advanced['relative_gradient']])
    if self._report_max_weight:
      carry['max_weights'] = carry['max_weights'] + [
          _max_effective_weight(beta, alpha, beta_sum_and_objective[0])]
    return carry

  def _objective_pass(self, carry, value, alpha):
    """g_ν of the final estimate, with the floor of the last step (the mean start's
    single pass: the floor a step from its estimate would use)."""
    nu = self._nu(carry)
    objective = contributions.sum_of('objective', tff.federated_map(
        _objective_term(self.value_type),
        (tff.federated_broadcast(carry['center']), value, alpha,
         tff.federated_broadcast(nu))),
        alpha, contributions.NONNEGATIVE)
    return dict(carry, objectives=carry['objectives'] + [objective])

  def finish(self, carry):
    stack = iterative_mean.stack_at_server
    measurements = collections.OrderedDict()
    if self._report_objective:
      measurements['objective'] = stack(carry['objectives'], tf.float64)
    measurements['num_secure_average_calls'] = tff.federated_value(
        np.int32(self._num_passes), tff.SERVER)
    measurements['num_passes_applied'] = carry['loop']['passes']
    measurements['frozen_at_pass'] = carry['loop']['frozen_at']
    measurements['relative_gradient'] = stack(carry['relative_gradients'], tf.float64)
    measurements['nu'] = stack(carry['floors'], tf.float64)
    if self._start == 'trimmed':
      measurements['trim_radius'] = carry['trim_radius']
    if self._report_max_weight:
      measurements['max_effective_weight'] = tff.federated_map(
          iterative_mean.max_of_vector, stack(carry['max_weights'], tf.float32))
    measurements['inner'] = carry['inner_measurements']
    state = carry['inner']
    if self._start == 'previous':
      state = _warm_state(state, carry['center'])
    return tff.templates.MeasuredProcessOutput(
        state=state, result=carry['center'],
        measurements=tff.federated_zip(measurements))


def _step_bound(centered: bool) -> contributions.Bound:
  """A Weiszfeld step's (w, β) from the broadcast estimate v (`centered`; v = 0
  otherwise) and floor ν (the context): β = α·ν/max(ν, d) gives β ∈ [0, α] and
  β·‖w − v‖ ≤ α·ν, so a client moves the step by at most α·ν/Σβ whatever it sends."""

  def admits(pair, alpha, *context):
    center, nu = context if centered else (None, context[0])
    return contributions.weighted_distance_within(pair[0], pair[1], alpha, center, nu)

  return contributions.Bound('β ∈ [0, α], β·‖w − v‖ ≤ α·ν', admits)


def _trimmed_admits(pair, alpha, center, radius):
  # β ∈ {0, α}, and a client counted (β = α) is within the radius of the mean.
  beta = tf.cast(pair[1], tf.float64)
  return tf.logical_and(
      tf.logical_or(tf.equal(beta, 0), tf.equal(beta, tf.cast(alpha, tf.float64))),
      contributions.weighted_distance_within(pair[0], pair[1], alpha, center, radius))


# What an honest client contributes to each aggregation (`contributions`): β_i is in
# [0, α_i] (it carries ν) and β_i·‖w_i − v‖ ≤ α_i·ν in a Weiszfeld step, α_i itself
# in the mean start's pass (the update there unbounded: it is the mean), 0 or α_i
# within the radius in the trimmed mean's; the distances behind the objective and
# the weighted distance are unbounded above.
_WEISZFELD_BOUND = _step_bound(centered=True)
_FIRST_STEP_BOUND = _step_bound(centered=False)
_TRIMMED_BOUND = contributions.Bound('β ∈ {0, α}, β·‖w − v‖ ≤ α·radius',
                                     _trimmed_admits)
_HISTOGRAM_BOUND = contributions.one_hot('alpha')
_BETA_AND_OBJECTIVE_BOUND = contributions.fields(contributions.AT_MOST_ALPHA,
                                                 contributions.NONNEGATIVE)


@traced.once
def _unfrozen_loop(passes_applied: int):
  """The computation of the freezing rule's state before any Weiszfeld step:
  not frozen, with `passes_applied` passes applied."""

  @tff.tensorflow.computation
  def loop():
    return collections.OrderedDict(frozen=tf.constant(False), frozen_at=tf.constant(0),
                                   passes=tf.constant(passes_applied))

  return loop


@traced.once
def _weight_from_norm(value_type):
  """The zero start's client weights β_i = α_i·ν / max(ν, ‖w_i‖)."""
  @tff.tensorflow.computation(value_type, tf.float32, tf.float64)
  def weight_from_norm(value, weight, nu):
    # Algorithm 3: the first Weiszfeld step from v = 0.
    return weiszfeld_beta(weight, numerics.global_l2_norm(value), nu)
  return weight_from_norm


@traced.once
def _weight_from_distance(value_type):
  """The warm start's client weights β_i = α_i·ν / max(ν, ‖w_i − v‖)."""
  @tff.tensorflow.computation(value_type, value_type, tf.float32, tf.float64)
  def weight_from_distance(center, value, weight, nu):
    # The warm start's first step, from the previous aggregate.
    return weiszfeld_beta(weight, numerics.global_l2_distance(value, center), nu)
  return weight_from_distance


@traced.once
def _weiszfeld_weight(value_type):
  """A Weiszfeld step's client weight β_i and objective term α_i·‖w_i − v‖_(ν)."""
  @tff.tensorflow.computation(value_type, value_type, tf.float32, tf.float64)
  def weiszfeld_weight(center, value, weight, nu):
    distance = numerics.global_l2_distance(value, center)
    return (weiszfeld_beta(weight, distance, nu),
            objective_term(weight, distance, nu))
  return weiszfeld_weight


@traced.once
def _objective_term(value_type):
  """The client's objective term α_i·‖w_i − v‖_(ν) alone."""
  @tff.tensorflow.computation(value_type, value_type, tf.float32, tf.float64)
  def client_objective_term(center, value, weight, nu):
    return objective_term(weight, numerics.global_l2_distance(value, center), nu)
  return client_objective_term


@traced.once
def _advance(value_type, tolerance: float):
  """The step v⁺ kept or not by the freezing rule at SERVER, and its relative
  gradient."""

  @tff.tensorflow.computation(value_type, value_type, tf.bool, tf.int32, tf.int32,
                              tf.int32, tf.float64, tf.float32, tf.float64)
  def advance(center, proposal, frozen, frozen_at, passes, this_pass, beta_sum,
              alpha_sum, nu):
    # ‖v⁺ − v‖·Σβ/ν = ‖Σ α_i (w_i − v)/max(ν, d_i)‖ = ‖∇g_ν(v)‖ (β carries a factor
    # ν): the relative gradient needs no client statistic beyond Σβ and Σα.
    # Distances in float64, rescaled if needed.
    relative_gradient = tf.math.divide_no_nan(
        numerics.global_l2_distance(proposal, center) * (beta_sum / nu),
        tf.cast(alpha_sum, tf.float64))
    apply, frozen, frozen_at, passes = freeze_step(
        frozen, frozen_at, passes, this_pass, relative_gradient, tolerance)
    # tf.cond, unlike tf.where, hands the chosen model through without a copy.
    kept = tf.cond(apply, lambda: numerics.as_nest(proposal),
                   lambda: numerics.as_nest(center))
    return collections.OrderedDict(
        center=kept, frozen=frozen, frozen_at=frozen_at, passes=passes,
        relative_gradient=relative_gradient)
  return advance


_TrimComputations = collections.namedtuple('_TrimComputations', [
    'weighted_distance', 'mean_distance', 'radius_histogram', 'trimmed_weight',
    'restricted_weiszfeld_weight', 'median_bucket', 'radius'])


@traced.once
def _trim_computations(value_type) -> _TrimComputations:
  """The client and server computations of the trimmed start (`_spread_pass`,
  `_radius_pass`, `_trim_pass`, `_near_pass` and its restricted Weiszfeld pass)."""

  @tff.tensorflow.computation(value_type, value_type, tf.float32)
  def weighted_distance(center, value, weight):
    return tf.cast(weight, tf.float64) * numerics.global_l2_distance(value, center)

  @tff.tensorflow.computation(tf.float64, tf.float32)
  def mean_distance(distance_sum, alpha_sum):
    return tf.math.divide_no_nan(distance_sum, tf.cast(alpha_sum, tf.float64))

  @tff.tensorflow.computation(value_type, value_type, tf.float32, tf.float64)
  def radius_histogram(center, value, weight, unit):
    return robust_scale.client_radius_histogram(
        numerics.global_l2_distance(value, center), unit, weight)

  @tff.tensorflow.computation(value_type, value_type, tf.float32, tf.float64,
                              tf.int32)
  def trimmed_weight(center, value, weight, unit, bucket):
    near = robust_scale.radius_bucket(
        numerics.global_l2_distance(value, center), unit) <= bucket
    return tf.where(near, tf.cast(weight, tf.float64), tf.constant(0.0, tf.float64))

  @tff.tensorflow.computation(value_type, value_type, tf.float32, tf.float64,
                              tf.float64, tf.int32)
  def restricted_weiszfeld_weight(center, value, weight, nu, unit, bucket):
    # β over the clients near the estimate; the objective over every client.
    distance = numerics.global_l2_distance(value, center)
    near = robust_scale.radius_bucket(distance, unit) <= (
        bucket + robust_scale.NEAR_BUCKETS)
    beta = tf.where(near, weiszfeld_beta(weight, distance, nu),
                    tf.constant(0.0, tf.float64))
    return beta, objective_term(weight, distance, nu)

  @tff.tensorflow.computation(radius_histogram.type_signature.result)
  def median_bucket(histogram):
    return robust_scale.half_weight_bucket(histogram)

  @tff.tensorflow.computation(tf.int32, tf.float64)
  def radius(bucket, unit):
    return robust_scale.bucket_upper_edge(bucket, unit)

  return _TrimComputations(weighted_distance, mean_distance, radius_histogram,
                           trimmed_weight, restricted_weiszfeld_weight, median_bucket,
                           radius)


_FloorComputations = collections.namedtuple(
    '_FloorComputations', ['statistics_from_distance', 'floor_from_statistics', 'bound'])


@traced.once
def _floor_computations(value_type, relative_nu: float) -> _FloorComputations:
  """The client and server computations of the relative ν (`smoothing`), and what
  bounds an honest client's statistics."""
  float64 = type_checks.has_float64(value_type)

  @tff.tensorflow.computation(value_type, value_type, tf.float32)
  def statistics_from_distance(center, value, weight):
    return robust_scale.client_statistics(
        numerics.global_l2_distance(value, center), weight, float64, count_zero=True)

  @tff.tensorflow.computation(statistics_from_distance.type_signature.result)
  def floor_from_statistics(statistics):
    return robust_scale.relative_floor(statistics, relative_nu)

  return _FloorComputations(statistics_from_distance, floor_from_statistics,
                            robust_scale.statistics_bound(float64))


@traced.once
def _statistics_from_norm(value_type):
  """The zero start's client statistics for the relative ν of its pass 1."""
  float64 = type_checks.has_float64(value_type)

  @tff.tensorflow.computation(value_type, tf.float32)
  def statistics_from_norm(value, weight):
    return robust_scale.client_statistics(numerics.global_l2_norm(value), weight,
                                          float64)
  return statistics_from_norm


def _warm_state(inner_state, previous_aggregate):
  """The state of `initial_point='previous'` at SERVER."""
  return tff.federated_zip(collections.OrderedDict(
      [('inner', inner_state), (PREVIOUS_AGGREGATE, previous_aggregate)]))


@tff.tensorflow.computation(tf.float32)
def _as_beta(alpha):
  return tf.cast(alpha, tf.float64)


@tff.tensorflow.computation(tf.float64, tf.float64)
def _effective_weight(max_weight, weight_sum):
  return tf.cast(tf.math.divide_no_nan(max_weight, weight_sum), tf.float32)


def _max_effective_weight(weights, alpha, weight_sum):
  """max_i β_i / Σβ of one pass at SERVER (float32)."""
  return tff.federated_map(_effective_weight, (contributions.max_of(
      'max_beta', weights, alpha, contributions.AT_MOST_ALPHA), weight_sum))


def one_step_geometric_median_factory(
    nu: Optional[float] = None,
    inner_mean_factory: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    report_max_effective_weight: bool = True,
    report_objective: bool = True,
    relative_nu: Optional[float] = None,
) -> GeometricMedianFactory:
  """One-step RFA (Algorithm 3): one inner-mean call with β_i ∝ α_i / max(ν, ‖w_i‖).

  ν is relative to the clients' robust typical norm by default (one federated sum of
  a small histogram before the mean); `nu=geometric_median.PAPER_NU` is the paper's
  absolute ν, with which one-step RFA is a single aggregation (TFF's mergeable
  multi-worker context runs it as it is when `report_objective=False`).
  """
  return GeometricMedianFactory(
      num_communication_passes=1,
      nu=nu,
      relative_nu=relative_nu,
      inner_mean_factory=inner_mean_factory,
      initial_point='zero',
      report_max_effective_weight=report_max_effective_weight,
      report_objective=report_objective,
  )
