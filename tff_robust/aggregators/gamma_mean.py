"""The γ-mean (minimum γ-divergence location estimate) as an iterative secure aggregate.

Li, Hung, et al., "Robust Aggregation for Federated Learning by Minimum γ-Divergence
Estimation", Entropy 2022: Algorithm 2 (simple γ-mean, working model N(μ, I)) and
Algorithm 1 with an isotropic or the diagonal covariance the paper recommends for
small samples.
"""

import collections
import math
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_robust.common import arguments
from tff_robust.aggregators import geometric_median
from tff_robust.iterative import contributions
from tff_robust.iterative import iterative_steps
from tff_robust.iterative import iterative_mean
from tff_robust.common import numerics
from tff_robust.common import traced

COVARIANCES = ('identity', 'diagonal')
INITIAL_POINTS = ('mean', 'geometric_median')
GAMMA_SCALES = ('spread', 'absolute')
# γ per unit of the spread (see `GammaMeanFactory`): the best worst case of the study
# in docs/decisions.md.
DEFAULT_SPREAD_GAMMA = 2.0
# The paper's federated experiments (Section 4.2), for gamma_scale='absolute'.
PAPER_GAMMA = 0.5
# The nearest client's log-weight is kept at or above −LOG_HEADROOM (see
# `GammaMeanFactory`, "Range"): far enough below 0 to leave room for clients nearer than
# the estimate, far enough above float32's log(1.2e-38) ≈ −87 that clients up to 47
# nats worse than the nearest still count.
LOG_HEADROOM = 40.0
# An iteration whose total γ-weight is below this fraction of Σ α_i underflowed: the
# estimate is kept.
UNDERFLOW_WEIGHT = 1e-30
_FLOAT32_MAX = float(np.finfo(np.float32).max)

# The per-client float64 scalars every iteration sums (scalars, so that a secure
# deployment sums them as it sums the weights).
_ITERATION_SUMS = ('weight', 'weighted_distance', 'capped', 'alpha', 'alpha_distance')
_START_SUMS = ('moment', 'alpha')
# What an honest client contributes (`contributions`): its γ-weight in [0, α] (α in
# the mean pass), the sums of `_START_SUMS` and `_ITERATION_SUMS` in the order
# written there; the value (and the diagonal variant's squares) and the distances
# are unbounded above.
_MEAN_BOUND = contributions.pair(contributions.UNBOUNDED, contributions.EQUAL_TO_ALPHA)
_START_BOUND = contributions.fields(contributions.NONNEGATIVE,
                                    contributions.EQUAL_TO_ALPHA)
_ITERATION_BOUND = contributions.fields(
    contributions.AT_MOST_ALPHA, contributions.NONNEGATIVE, contributions.FLAG,
    contributions.EQUAL_TO_ALPHA, contributions.NONNEGATIVE)


def _iteration_pair_bound(gamma: float, headroom: float) -> contributions.Bound:
  """An iteration's (x, weight) for Σ = σ²I, from the broadcast estimate ⟨μ, σ², B⟩:
  weight = α·exp(−γ/2·(D − s)) capped at α, D = ‖x − μ‖²/σ², s = max(B − headroom,
  0), so weight·‖x − μ‖ ≤ α·σ·max(√s, e^{−(1 − γs)/2}/√γ if 1/γ > s)."""

  def admits(pair, alpha, estimate):
    estimate = numerics.as_nest(estimate)
    shift = tf.maximum(tf.cast(estimate['bound'], tf.float64) - headroom, 0.0)
    peak = tf.where(1.0 / gamma > shift,
                    tf.exp(-(1.0 - gamma * shift) / 2.0) / math.sqrt(gamma),
                    tf.constant(0.0, tf.float64))
    limit = tf.sqrt(tf.cast(estimate['scale'], tf.float64)) * tf.maximum(
        tf.sqrt(shift), peak)
    return contributions.weighted_distance_within(pair[0], pair[1], alpha,
                                                  estimate['mean'], limit)

  return contributions.Bound('weight ∈ [0, α], weight·‖x − μ‖ ≤ α·σ·max(√s, ...)',
                             admits)


def _scalars_type(names):
  return tff.StructWithPythonType([(n, np.float64) for n in names],
                                  collections.OrderedDict)


def _starting_calls(factory) -> int:
  """Secure-average calls of the factory computing the starting point; 0 for a factory
  that does not declare them (only GeometricMedianFactory does)."""
  return getattr(factory, 'num_communication_passes', 0)


def _leaves(structure):
  return tf.nest.flatten(numerics.as_nest(structure))


def squared_distance(value, center):
  """‖x − μ‖² over the whole structure (float64; see `numerics.global_l2_distance`)."""
  return tf.square(numerics.global_l2_distance(value, center))


def squared_ratios(value, center, scale):
  """((x_j − μ_j)/s_j)² per coordinate, in each tensor's dtype: +inf where x − μ
  overflows, which gives that client weight exp(−inf) = 0, the right limit."""
  return tf.nest.map_structure(
      lambda x, c, s: tf.square((x - c) / s), numerics.as_nest(value),
      numerics.as_nest(center), numerics.as_nest(scale))


def _sum_over_structure(structure):
  terms = [tf.reduce_sum(tf.cast(t, tf.float64)) for t in _leaves(structure)]
  return tf.add_n(terms) if terms else tf.constant(0.0, tf.float64)


def _std_floor(dtype: tf.DType, floor: float) -> float:
  """The least σ_j of a leaf of `dtype`: √floor, and at least the root of the dtype's
  smallest normal number (a mixed structure's floor is float64's, whose root is 0 in a
  float32 leaf, and (x − μ)/0 is NaN on a coordinate where every client agrees)."""
  return max(math.sqrt(floor), math.sqrt(float(np.finfo(dtype.as_numpy_dtype).tiny)))


def weight_dtype(value_type) -> tf.DType:
  """float64 γ-weights for a structure holding float64 tensors (so that float64 values
  are averaged to float64 accuracy), float32 otherwise."""
  dtypes = [spec.dtype for spec in tf.nest.flatten(iterative_mean.type_template(value_type))]
  return tf.float64 if tf.float64 in dtypes else tf.float32


class GammaMeanFactory(iterative_steps.IterativeAggregationFactory):
  """The γ-mean of client updates: Gaussian-likelihood-weighted fixed-point means.

  The created `tff.templates.AggregationProcess` takes a value at CLIENTS (any
  structure of float tensors, treated as one vector x_i of dimension p) and a weight
  α_i, and returns at SERVER the γ-mean μ. Every iteration broadcasts the current
  estimate; each client computes its own weight; one call of `inner_mean_factory`
  returns the next estimate, and one federated sum of five per-client float64 scalars
  returns what the next weights need. The server learns nothing but the inner
  factory's outputs and those sums.

  Every iteration is the fixed-point step of the paper's Algorithm 1,
  d_i = exp(−γ'/2 · D_i), D_i = (x_i − μ)ᵀ Σ⁻¹ (x_i − μ), μ ← Σ α_i d_i x_i / Σ α_i d_i,
  with the working covariance Σ given by `covariance` and `gamma_scale`:

  *   `gamma_scale='spread'` (default): γ' = γ/p and Σ is estimated, so the weights
      depend on D_i relative to the clients' spread: `covariance='identity'` takes
      Σ = σ²I with σ² = (1+γ') Σ w_i ‖x_i − μ_old‖² / p (w_i the normalised weights),
      `covariance='diagonal'` Σ = diag(σ_j²) with σ_j² = (1+γ') Σ w_i (x_ij − μ_old,j)².
      The result is scale-equivariant (while σ² stays above the floor,
      `variance_floor_for`; a common shift changes the first iteration's
      over-estimate of the spread, see below), and the weights never all underflow: since μ_new is the w-weighted
      mean, Σ w_i D_i(μ_new) ≤ p/(1+γ'), so the client nearest to the new estimate
      has d_i ≥ exp(−γ/2).
  *   `gamma_scale='absolute'`: γ' = `gamma` (or `gamma_per_dimension` / p), the
      paper's own parameterisation. `covariance='identity'` is Algorithm 2 (Σ = I);
      `'diagonal'` is Algorithm 1 with diag(Σ) as above. The paper's exact setting is
      `GammaMeanFactory(gamma=0.5, gamma_scale='absolute')`.

  Both variances are taken about the broadcast estimate μ_old, where the paper takes
  them about μ_new: they differ by (1+γ')(μ_new − μ_old)², 0 at the fixed point, and
  the paper's difference Σ w (x − μ_old)² − (μ_new − μ_old)² cancels catastrophically
  when the estimate moves by far more than the inliers' spread (the first iteration
  after a mean pulled by one client at 1e20). Every σ² is at least the floor.

  Why γ is scaled by the spread, and why γ = 2: an absolute γ underflows every weight
  (or keeps every weight ~1) unless the updates happen to be on the scale it suits,
  and γ = 2 has the best worst case over one far client and a cluster of attackers
  (docs/decisions.md, "The γ-mean's γ is relative to the clients' spread").

  Initial point μ₀: `'mean'` (one call, weights α_i) or `'geometric_median'` (the
  passes of `geometric_median_factory`, default
  `GeometricMedianFactory(inner_mean_factory=inner_mean_factory)`; a factory that is
  not a `tff_robust.iterative.iterative_steps.IterativeAggregationFactory` runs as its own process,
  one pass). Then `num_iterations` iterations S follow. The first iteration's
  covariance is isotropic, from a sum of α_i‖x_i − c‖²: for the mean start c = 0 (the
  same call, so no extra round; uncentred, an over-estimate of the spread about μ₀
  that cannot cancel), after the geometric median c = μ₀ (one extra round of scalar
  sums).

  Range: weights are computed as α_i·exp(min(0, −γ'/2·(D_i − t))), in float64, and
  passed to the inner mean in float32 (float64 for float64 values). The shift
  t = max(0, B − 2·40/γ') uses a bound B ≥ min_i D_i from the previous round's sums
  (p/(1+γ') for an estimated Σ; for Σ = I, Σ w_i ‖x_i − μ_old‖², and before the
  first iteration Σ α_i ‖x_i − μ₀‖² / Σ α_i, from the start's sums), so the nearest
  client's log-weight is ≥ −40 and the total never underflows: t = 0 whenever
  γ'·B ≤ 80, in particular always for the default spread scale, where the weights are
  exactly the paper's. With an absolute γ and a spread of γ'/2·D_i beyond float32's
  range, clients nearer than t are *capped* at α_i: the iteration is then a capped
  γ-mean (equal weights for the nearest clients, γ-weights beyond), still robust, and
  counted in `capped_clients` and `underflow`. Normalised weights do not depend on t.
  A structure holding float64 tensors gets float64 weights and float64 variances, so
  it is averaged to float64 accuracy; float32 values stay float32 (their result too).
  The diagonal covariance is sent as the standard deviations in the values' dtype and
  each client sends its squared standardised deviations ((x_ij − μ_j)/σ_j)², so no
  square of a client at 3e38 is formed.

  Inputs must be finite: wrap the factory in `tff_robust.NonfiniteFilteringFactory`
  (the learning builders and `tasks.registry` do) to give a NaN or infinite client
  weight 0.

  The process's `next` has type signature
  `(<state, {value}@CLIENTS, {weight}@CLIENTS> -> <state, value@SERVER, measurements>)`
  (state: `<inner=..., initial_point=...>`, the inner and geometric-median states) and
  reports at SERVER:

  *   `num_secure_average_calls`: rounds of secure aggregation this round: the inner
      mean's calls (the initial point's included) and, after the geometric median,
      the round of scalar sums.
  *   `underflow`: float32 vector of length S, 1.0 for an iteration whose weights could
      not be represented: every weight underflowed (the estimate is kept; the next
      iteration's shift comes from the unweighted distances) or some were capped.
  *   `num_underflow_passes`: their number (0 at the default spread scale).
  *   `capped_clients`: float32 vector of length S, the clients capped at α_i.
  *   `retained_weight`: float32 vector of length S, Σ α_i d_i / Σ α_i per iteration
      (d_i relative to the shift: how much weight the γ-weights keep).
  *   `initial_point`: the geometric-median process's measurements (only for
      `initial_point='geometric_median'`).
  *   `inner`: the inner factory's measurements of the last call.
  """

  # Client values reach the server only through sums (see the privacy tests).
  secure_compatible = True

  def __init__(
      self,
      gamma: Optional[float] = None,
      gamma_per_dimension: Optional[float] = None,
      num_iterations: int = 3,
      covariance: str = 'identity',
      initial_point: str = 'mean',
      inner_mean_factory: Optional[tff.aggregators.WeightedAggregationFactory] = None,
      geometric_median_factory: Optional[
          geometric_median.GeometricMedianFactory] = None,
      variance_floor: Optional[float] = None,
      gamma_scale: Optional[str] = None,
  ):
    """Initializes the factory.

    Args:
      gamma: γ > 0. Default 2 for `gamma_scale='spread'`, 0.5 (the paper's) for
        'absolute', unless `gamma_per_dimension` is given.
      gamma_per_dimension: c > 0 for an absolute γ' = c/p, p the number of scalar
        parameters of the value type (known at `create`). Exclusive with `gamma` and
        with `gamma_scale='spread'` (which already divides by p).
      num_iterations: S >= 1 fixed-point iterations after the initial point.
      covariance: 'identity' or 'diagonal'.
      initial_point: 'mean' or 'geometric_median'.
      inner_mean_factory: the weighted mean every iteration goes through; default
        `tff_robust.iterative.iterative_mean.Float64MeanFactory()`.
      geometric_median_factory: the factory of the initial point for
        `initial_point='geometric_median'`.
      variance_floor: lower bound (> 0) on every σ², so that coordinates on which all
        clients agree do not divide by zero. Default: the smallest normal number of
        the values' float type (1.2e-38 for float32), so that the result stays
        scale-equivariant while σ² is a normal number (an absolute floor caps the
        weights' contrast once the updates' spread falls near it:
        docs/decisions.md).
      gamma_scale: 'spread' (γ relative to the estimated spread; the default) or
        'absolute' (the paper's γ; the default with `gamma_per_dimension`).

    Raises:
      ValueError: for γ <= 0 or c <= 0 (or both given), S < 1, an unknown
        covariance, initial point or scale, or `variance_floor` <= 0.
      TypeError: for arguments of the wrong type (e.g. a float S), including
        factories of the wrong kind.
    """
    if gamma is not None and gamma_per_dimension is not None:
      raise ValueError('Give gamma or gamma_per_dimension, not both; got '
                       f'gamma={gamma!r}, gamma_per_dimension={gamma_per_dimension!r}.')
    if gamma_scale is None:
      gamma_scale = 'absolute' if gamma_per_dimension is not None else 'spread'
    if gamma_scale not in GAMMA_SCALES:
      raise ValueError(f'gamma_scale must be one of {GAMMA_SCALES}, got {gamma_scale!r}.')
    if gamma_scale == 'spread' and gamma_per_dimension is not None:
      raise ValueError("gamma_per_dimension is an absolute γ; gamma_scale='spread' "
                       'already divides gamma by the dimension.')
    self._gamma_scale = gamma_scale
    self._gamma = None
    self._gamma_per_dimension = None
    if gamma_per_dimension is not None:
      self._gamma_per_dimension = arguments.check_positive_float(
          'gamma_per_dimension', gamma_per_dimension)
    else:
      default = DEFAULT_SPREAD_GAMMA if gamma_scale == 'spread' else PAPER_GAMMA
      self._gamma = arguments.check_positive_float(
          'gamma', default if gamma is None else gamma)
    self._num_iterations = arguments.check_positive_int(
        'num_iterations', num_iterations)
    if covariance not in COVARIANCES:
      raise ValueError(f'covariance must be one of {COVARIANCES}, got {covariance!r}.')
    self._covariance = covariance
    if initial_point not in INITIAL_POINTS:
      raise ValueError(
          f'initial_point must be one of {INITIAL_POINTS}, got {initial_point!r}.')
    self._initial_point = initial_point
    self._inner = iterative_mean.check_inner_mean_factory(inner_mean_factory)
    # Built only for the median start: a mean-start γ-mean holds no median factory.
    if geometric_median_factory is None and initial_point == 'geometric_median':
      geometric_median_factory = geometric_median.GeometricMedianFactory(
          inner_mean_factory=self._inner)
    elif geometric_median_factory is not None and not isinstance(geometric_median_factory,
                        tff.aggregators.WeightedAggregationFactory):
      raise TypeError('geometric_median_factory must be a weighted aggregation '
                      f'factory, got {type(geometric_median_factory).__name__}.')
    self._gm_factory = geometric_median_factory
    self._variance_floor = None if variance_floor is None else (
        arguments.check_positive_float('variance_floor', variance_floor))

  # The configuration, read by the factory's steps (`GammaSteps`).
  num_iterations = property(lambda self: self._num_iterations, doc='S.')
  covariance = property(lambda self: self._covariance)
  initial_point = property(lambda self: self._initial_point)
  gamma_scale = property(lambda self: self._gamma_scale)
  inner_mean_factory = property(lambda self: self._inner)
  geometric_median_factory = property(lambda self: self._gm_factory)
  variance_floor = property(lambda self: self._variance_floor,
                            doc='The σ² floor given, or None for `variance_floor_for`.')

  def variance_floor_for(self, value_type) -> float:
    """The floor on every σ² for values of `value_type`."""
    if self._variance_floor is not None:
      return self._variance_floor
    return float(np.finfo(weight_dtype(value_type).as_numpy_dtype).tiny)

  def gamma_for(self, value_type) -> float:
    """γ' of the weights exp(−γ'/2·D_i) for values of `value_type`."""
    p = max(iterative_mean.num_parameters(value_type), 1)
    if self._gamma_per_dimension is not None:
      return self._gamma_per_dimension / p
    return self._gamma / p if self._gamma_scale == 'spread' else self._gamma

  def num_calls(self) -> int:
    """`num_secure_average_calls`: S, plus the mean, or the median's and one more."""
    if self._initial_point == 'mean':
      return self._num_iterations + 1
    return self._num_iterations + _starting_calls(self._gm_factory) + 1

  def steps(self, value_type) -> 'GammaSteps':
    return GammaSteps(self, value_type)


@tff.tensorflow.computation(tff.TensorType(np.float32, [None]))
def _count_ones(vector):
  return tf.cast(tf.reduce_sum(vector), tf.int32)


class GammaSteps(iterative_steps.IterativeSteps):
  """The passes of one `GammaMeanFactory` for one value type.

  Passes (`tff_robust.iterative.iterative_steps`): the starting point, either 'mean' (one inner
  mean of the α-weighted values and, in the same round, the sum Σ α_i‖x_i‖² behind
  the first covariance) or the passes of the geometric-median factory's steps
  (`geometric_median_factory`, run on the carry's `initial_point`) followed by
  'after_initial_point' (its result μ₀ and one round of scalar sums
  Σ α_i‖x_i − μ₀‖²); then S 'iteration's, each one inner mean of the γ-weighted
  values and one sum of five client scalars.

  The estimate at SERVER is `<mean, scale, bound>`: μ (value type); the covariance,
  a float64 σ² for 'identity' or the standard deviations σ_j (value type) for
  'diagonal'; and B (float64), the bound behind the log-domain shift (see
  `GammaMeanFactory`, "Range"). The inner mean averages x ('identity') or the pair
  `<value=x, square=((x − μ)/σ)²>` ('diagonal').
  """

  def __init__(self, factory: GammaMeanFactory, value_type):
    self.value_type = value_type
    self._num_iterations = factory.num_iterations
    self._num_calls = factory.num_calls()
    gamma = factory.gamma_for(value_type)
    floor = factory.variance_floor_for(value_type)
    diagonal = factory.covariance == 'diagonal'
    # Σ = I for the absolute simple γ-mean (Algorithm 2); estimated otherwise.
    estimated = diagonal or factory.gamma_scale == 'spread'
    headroom = 2.0 * LOG_HEADROOM / gamma
    computations = _gamma_computations(value_type, gamma, floor, diagonal, estimated,
                                       headroom, UNDERFLOW_WEIGHT)
    self._diagonal = diagonal
    self.inner_value_type = computations.inner_value_type
    self.inner_weight_type = computations.inner_weight_type
    self.estimate_type = computations.estimate_type
    self._iteration_bound = (contributions.pair(contributions.UNBOUNDED,
                                                contributions.AT_MOST_ALPHA)
                             if diagonal else _iteration_pair_bound(gamma, headroom))
    self._computations = computations

    self._inner = factory.inner_mean_factory.create(self.inner_value_type,
                                                    self.inner_weight_type)
    # The starting point's own steps (a factory that is not iterative: its process).
    self._initial_point = None
    if factory.initial_point == 'geometric_median':
      self._initial_point = iterative_steps.steps_of(factory.geometric_median_factory,
                                               value_type)

  def initialize(self):
    state = collections.OrderedDict(inner=self._inner.initialize())
    if self._initial_point is not None:
      state['initial_point'] = self._initial_point.initialize()
    return tff.federated_zip(state)

  def start(self, state):
    carry = {'inner': state.inner}
    if self._initial_point is not None:
      carry['initial_point'] = self._initial_point.start(state.initial_point)
    return carry

  def passes(self):
    if self._initial_point is None:
      passes = [iterative_steps.Pass('mean', self._start_at_mean)]
    else:
      passes = iterative_steps.nested(self._initial_point, 'initial_point') + [
          iterative_steps.Pass('after_initial_point', self._start_at_initial_point)]
    return passes + [iterative_steps.Pass('iteration', self._iterate)] * self._num_iterations

  def _start_at_mean(self, carry, value, alpha):
    """μ₀ = the α-weighted mean (one inner call) and, from the same round, the
    uncentred Σ α_i‖x_i‖² behind the first covariance."""
    step = tff.federated_map(self._computations.start_client, (value, alpha))
    output = contributions.mean_of('mean', self._inner, carry['inner'], step[0],
                                   step[1], alpha, _MEAN_BOUND)
    sums = contributions.sum_of('start_sums', step[2], alpha, _START_BOUND)
    estimate = tff.federated_map(self._computations.mean_estimate,
                                 (output.result, sums))
    return {'inner': output.state, 'estimate': estimate,
            'inner_measurements': output.measurements, 'flags': []}

  def _start_at_initial_point(self, carry, value, alpha):
    """μ₀ = the starting point's result, and one round of scalar sums
    Σ α_i‖x_i − μ₀‖² behind the first covariance."""
    start = self._initial_point.finish(carry['initial_point'])
    moments = tff.federated_map(
        self._computations.centered_moment,
        (tff.federated_broadcast(start.result), value, alpha))
    estimate = tff.federated_map(self._computations.centered_estimate, (
        start.result, contributions.sum_of('centered_moments', moments, alpha,
                                           _START_BOUND)))
    return {'inner': carry['inner'], 'estimate': estimate,
            'initial_point_state': start.state,
            'initial_point_measurements': start.measurements, 'flags': []}

  def _iterate(self, carry, value, alpha):
    """One fixed-point iteration: the clients' γ-weights from the broadcast
    estimate, one inner mean and the sums of `_ITERATION_SUMS`, the next estimate
    (the same one where every weight underflowed) and <underflow, capped clients,
    retained weight>."""
    estimate = carry['estimate']
    estimate_at_clients = tff.federated_broadcast(estimate)
    step = tff.federated_map(self._computations.client_step,
                             (estimate_at_clients, value, alpha))
    output = contributions.mean_of('gamma_mean', self._inner, carry['inner'], step[0],
                                   step[1], alpha, self._iteration_bound,
                                   (estimate_at_clients,))
    advanced = tff.federated_map(self._computations.advance, (
        estimate, output.result,
        contributions.sum_of('iteration_sums', step[2], alpha, _ITERATION_BOUND)))
    return dict(carry, inner=output.state, estimate=advanced[0],
                inner_measurements=output.measurements,
                flags=carry['flags'] + [advanced[1]])

  def finish(self, carry):
    flags = carry['flags']
    underflow = iterative_mean.stack_at_server([f[0] for f in flags])
    measurements = collections.OrderedDict()
    measurements['num_secure_average_calls'] = tff.federated_value(
        self._num_calls, tff.SERVER)
    measurements['underflow'] = underflow
    measurements['num_underflow_passes'] = tff.federated_map(_count_ones, underflow)
    measurements['capped_clients'] = iterative_mean.stack_at_server(
        [f[1] for f in flags])
    measurements['retained_weight'] = iterative_mean.stack_at_server(
        [f[2] for f in flags])
    state = collections.OrderedDict(inner=carry['inner'])
    if self._initial_point is not None:
      measurements['initial_point'] = carry['initial_point_measurements']
      state['initial_point'] = carry['initial_point_state']
    measurements['inner'] = carry['inner_measurements']
    return tff.templates.MeasuredProcessOutput(
        state=tff.federated_zip(state),
        result=tff.federated_map(self._computations.mean_of, carry['estimate']),
        measurements=tff.federated_zip(measurements))


_GammaComputations = collections.namedtuple('_GammaComputations', [
    'inner_value_type', 'inner_weight_type', 'estimate_type', 'start_client',
    'centered_moment', 'mean_estimate', 'centered_estimate', 'client_step', 'advance',
    'mean_of'])


@traced.once
def _gamma_computations(value_type, gamma: float, floor: float, diagonal: bool,
                        estimated: bool, headroom: float,
                        underflow_weight: float) -> _GammaComputations:
  """The client and server computations of `GammaSteps` and the types they exchange,
  for γ, the variance floor, a diagonal covariance or not, Σ estimated or I, the
  log-domain headroom and the fraction of Σα below which the weights underflowed."""
  p = max(iterative_mean.num_parameters(value_type), 1)
  # Σ w_i D_i(μ_new) ≤ p/(1+γ') under an estimated Σ (see the factory's docstring).
  estimated_bound = p / (1.0 + gamma)
  weight_dtype_ = weight_dtype(value_type)
  inner_weight_type = tff.TensorType(weight_dtype_.as_numpy_dtype)
  template = iterative_mean.type_template(value_type)
  if diagonal:
    pair_type = tff.StructWithPythonType(
        [('value', value_type), ('square', value_type)], collections.OrderedDict)
    inner_value_type = pair_type
    scale_type = value_type
  else:
    inner_value_type = value_type
    scale_type = tff.TensorType(np.float64)
  estimate_type = tff.StructWithPythonType(
      [('mean', value_type), ('scale', scale_type), ('bound', np.float64)],
      collections.OrderedDict)

  def inner_value(value, square):
    if not diagonal:
      return numerics.as_nest(value)
    return collections.OrderedDict(value=numerics.as_nest(value), square=square)

  def zeros_like_value(value):
    return tf.nest.map_structure(tf.zeros_like, numerics.as_nest(value))

  def first_estimate(mean, second_moment):
    """The estimate before iteration 1 from Σα‖x − c‖²/Σα: an isotropic σ² (or Σ = I
    and the bound itself, for the absolute simple γ-mean)."""
    if not estimated:
      return collections.OrderedDict(mean=mean, scale=tf.constant(1.0, tf.float64),
                                     bound=second_moment)
    variance = tf.maximum((1.0 + gamma) * second_moment / p, floor)
    if diagonal:
      std = tf.minimum(tf.sqrt(variance), _FLOAT32_MAX)
      scale = tf.nest.map_structure(
          lambda spec: tf.fill(spec.shape, tf.cast(
              tf.maximum(std, _std_floor(spec.dtype, floor)), spec.dtype)), template)
    else:
      scale = variance
    return collections.OrderedDict(mean=mean, scale=scale,
                                   bound=tf.constant(estimated_bound, tf.float64))

  @tff.tensorflow.computation(value_type, tf.float32)
  def start_client(value, alpha):
    alpha64 = tf.cast(alpha, tf.float64)
    moment = tf.where(alpha64 > 0, alpha64 * tf.square(numerics.global_l2_norm(value)),
                      tf.constant(0.0, tf.float64))
    square = zeros_like_value(value) if diagonal else None
    return (inner_value(value, square), tf.cast(alpha, weight_dtype_),
            collections.OrderedDict(moment=moment, alpha=alpha64))

  @tff.tensorflow.computation(value_type, value_type, tf.float32)
  def centered_moment(center, value, alpha):
    alpha64 = tf.cast(alpha, tf.float64)
    moment = tf.where(alpha64 > 0, alpha64 * squared_distance(value, center),
                      tf.constant(0.0, tf.float64))
    return collections.OrderedDict(moment=moment, alpha=alpha64)

  @tff.tensorflow.computation(inner_value_type, _scalars_type(_START_SUMS))
  def mean_estimate(inner_mean, sums):
    mean = numerics.as_nest(inner_mean)
    mean = mean['value'] if diagonal else mean
    second_moment = tf.math.divide_no_nan(sums['moment'], sums['alpha'])
    if not estimated:
      # The shift of Σ = I wants min_i D_i itself, not an upper bound: centred here.
      # Should the difference cancel, the shift errs (flagged) for one iteration.
      second_moment = tf.maximum(
          second_moment - tf.square(numerics.global_l2_norm(mean)), 0.0)
    return first_estimate(mean, second_moment)

  @tff.tensorflow.computation(value_type, _scalars_type(_START_SUMS))
  def centered_estimate(center, sums):
    return first_estimate(numerics.as_nest(center),
                          tf.math.divide_no_nan(sums['moment'], sums['alpha']))

  def distance_for_bound(raw, distance):
    # What the next variance or bound averages: ‖x − μ‖² for 'identity' (in the
    # values' units), the standardised D_i for 'diagonal' (used for nothing but
    # the flag computations, since its bound is p/(1+γ')).
    return distance if diagonal else raw

  @tff.tensorflow.computation(estimate_type, value_type, tf.float32)
  def client_step(estimate, value, alpha):
    estimate = numerics.as_nest(estimate)
    center, scale = estimate['mean'], estimate['scale']
    raw = squared_distance(value, center)  # ‖x − μ‖², float64.
    if diagonal:
      ratios = squared_ratios(value, center, scale)
      distance = _sum_over_structure(ratios)
    else:
      distance = raw / scale
    shift = tf.maximum(estimate['bound'] - headroom, 0.0)
    exponent = -0.5 * gamma * (distance - shift)
    capped = tf.cast(exponent > 0.0, tf.float64)
    alpha64 = tf.cast(alpha, tf.float64)
    weight = alpha64 * tf.exp(tf.minimum(exponent, 0.0))
    if weight_dtype_ == tf.float32:
      # TensorFlow flushes float32 subnormals to zero; make it explicit, so the
      # scalar sums count exactly the weights the inner mean uses.
      weight = tf.where(weight < numerics.FLOAT32_TINY, tf.zeros_like(weight), weight)
    weight = tf.cast(tf.cast(weight, weight_dtype_), tf.float64)
    kept = weight > 0.0
    square = None
    if diagonal:
      # A client of weight 0 sends zeros: 0·inf would be NaN in a float32 mean.
      square = tf.nest.map_structure(
          lambda r: tf.where(kept, r, tf.zeros_like(r)), ratios)
    statistics = collections.OrderedDict(
        weight=weight,
        weighted_distance=tf.where(
            kept, weight * distance_for_bound(raw, distance), 0.0),
        capped=tf.where(alpha64 > 0, capped, 0.0),
        alpha=alpha64,
        alpha_distance=tf.where(
            alpha64 > 0, alpha64 * distance_for_bound(raw, distance), 0.0))
    return inner_value(value, square), tf.cast(weight, weight_dtype_), statistics

  @tff.tensorflow.computation(estimate_type, inner_value_type,
                              _scalars_type(_ITERATION_SUMS))
  def advance(estimate, inner_mean, sums):
    estimate, inner_mean = numerics.as_nest(estimate), numerics.as_nest(inner_mean)
    weight_sum, alpha_sum = sums['weight'], sums['alpha']
    underflow = tf.logical_and(weight_sum <= underflow_weight * alpha_sum,
                               alpha_sum > 0)
    spread = tf.math.divide_no_nan(sums['weighted_distance'], weight_sum)
    if diagonal:
      mean = inner_mean['value']
      scale = tf.nest.map_structure(
          lambda s, m: tf.cast(tf.clip_by_value(
              tf.cast(s, tf.float64) * tf.sqrt((1.0 + gamma) * tf.cast(m, tf.float64)),
              _std_floor(s.dtype, floor), _FLOAT32_MAX), s.dtype),
          estimate['scale'], inner_mean['square'])
      bound = tf.constant(estimated_bound, tf.float64)
    elif estimated:
      mean = inner_mean
      scale = tf.maximum((1.0 + gamma) * spread / p, floor)
      bound = tf.constant(estimated_bound, tf.float64)
    else:
      mean, scale, bound = inner_mean, estimate['scale'], spread
    proposal = collections.OrderedDict(mean=mean, scale=scale, bound=bound)
    kept = collections.OrderedDict(estimate)
    if not estimated:
      # Kept at an unchanged centre, the unweighted mean of D_i bounds min_i D_i.
      kept['bound'] = tf.math.divide_no_nan(sums['alpha_distance'], alpha_sum)
    new = tf.nest.map_structure(lambda k, n: tf.where(underflow, k, n), kept, proposal)
    capped = sums['capped']
    flags = (tf.cast(tf.logical_or(underflow, capped > 0), tf.float32),
             tf.cast(capped, tf.float32),
             tf.cast(tf.math.divide_no_nan(weight_sum, alpha_sum), tf.float32))
    return new, flags

  @tff.tensorflow.computation(estimate_type)
  def mean_of(estimate):
    return numerics.as_nest(estimate)['mean']

  return _GammaComputations(inner_value_type, inner_weight_type, estimate_type,
                            start_client, centered_moment, mean_estimate,
                            centered_estimate, client_step, advance, mean_of)
