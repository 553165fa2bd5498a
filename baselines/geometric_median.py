"""The smoothed Weiszfeld geometric median (RFA, Pillutla et al., Algorithm 2) computed
at the server on the gathered client updates.

It is the algorithm of `tff_robust.GeometricMedianFactory` (same ν, passes, starts and
freezing rule, the same answer to float32 rounding), run on the `[n, p]` matrix of
`baselines.gather` instead of through R calls of a secure mean. It exists so that
the pre-aggregation wrappers that transform the gathered updates (bucketing, NNM)
can wrap a geometric median: `tasks.registry` resolves 'bucketing+gm' and 'nnm+gm'
to this factory. It gathers every client's update at the server: NOT compatible with
secure aggregation (use `tff_robust.GeometricMedianFactory` for that).
"""

import collections
from typing import Optional

import tensorflow as tf

from baselines import gather
from tff_robust.common import arguments
from tff_robust.aggregators import geometric_median
from tff_robust.aggregators import robust_scale

INITIAL_POINTS = geometric_median.INITIAL_POINTS


def squared_distances_to(values, center, block: int = gather.COLUMN_BLOCK):
  """‖x_i − v‖² (float64 `[n]`) for every row x_i of `values`, v a float64 `[p]`.

  Accumulated over blocks of columns: the float64 differences of one block at a
  time, not a float64 copy of the whole matrix. Squares of float32 differences never
  overflow float64.
  """
  size = values.shape[1]
  total = tf.zeros(tf.shape(values)[:1], tf.float64)
  for start in range(0, size, block):
    # Sequential blocks: in parallel their temporaries would add up to the matrix's.
    with tf.control_dependencies([total]):
      columns = tf.cast(values[:, start:start + block], tf.float64)
      total = total + tf.reduce_sum(
          tf.math.squared_difference(columns, center[start:start + block]), axis=1)
  return total


def distances_to(values, center, block: int = gather.COLUMN_BLOCK):
  """‖x_i − v‖ (float64 `[n]`); rows whose squared distance overflows float64 (a
  float64 model with a client at 1e200) are measured scaled by their largest entry,
  as `tff_robust.common.numerics.global_l2_distance` does on the clients."""
  squared = squared_distances_to(values, center, block)

  def rescaled():
    largest = tf.zeros(tf.shape(values)[:1], tf.float64)
    for start in range(0, values.shape[1], block):
      columns = tf.cast(values[:, start:start + block], tf.float64)
      largest = tf.maximum(largest, tf.reduce_max(
          tf.abs(columns - center[start:start + block]), axis=1))
    safe = tf.where(largest > 0, largest, tf.ones_like(largest))
    total = tf.zeros_like(largest)
    for start in range(0, values.shape[1], block):
      columns = tf.cast(values[:, start:start + block], tf.float64)
      total += tf.reduce_sum(tf.square(
          (columns - center[start:start + block]) / safe[:, tf.newaxis]), axis=1)
    return tf.where(tf.math.is_inf(squared), safe * tf.sqrt(total), tf.sqrt(squared))

  return tf.cond(tf.reduce_any(tf.math.is_inf(squared)), rescaled,
                 lambda: tf.sqrt(squared))


def weighted_average(values, weights):
  """Σ w_i x_i / Σ w_i in float64 (`[p]`), zeros if the weights sum to zero; by
  column blocks, so no float64 copy of the matrix is made."""
  total = tf.reduce_sum(weights)
  return gather.by_column_blocks(
      lambda columns: tf.math.divide_no_nan(
          tf.linalg.matvec(tf.cast(columns, tf.float64), weights, transpose_a=True),
          total), values)


def weiszfeld_weights(alphas, distances, nu):
  """β_i = α_i / max(ν, ‖x_i − v‖) (float64)."""
  return alphas / tf.maximum(distances, nu)


class GatheredGeometricMedianFactory(gather.GatheringAggregationFactory):
  """Geometric median of the gathered client updates by the smoothed Weiszfeld
  algorithm (RFA, Algorithm 2), computed at the server in float64.

  With weights α_i, pass r computes β_i = α_i / max(ν, ‖v − x_i‖) at the current
  estimate v and the proposal v⁺ = Σ β_i x_i / Σ β_i. The starts are those of
  `tff_robust.GeometricMedianFactory`: 'trimmed' (default: the weighted mean, then
  the weighted mean of the clients nearest to it holding half of the weight, by the
  same histogram), 'mean' (the paper's), 'zero' (a step from the zero update) or
  'previous' (a step from the previous round's result, kept in the state). The
  Weiszfeld passes freeze the estimate once the relative gradient
  ‖v⁺ − v‖ · Σβ / Σα (the pass that reveals it is applied) is at most `tolerance`
  (`tolerance=0`: every pass applied). These are exactly the semantics of
  `tff_robust.GeometricMedianFactory`, which computes the same passes through a
  secure mean; see its docstring.

  NOT compatible with secure aggregation: every client's update reaches the server.
  Use it where the updates are gathered anyway: inside bucketing or nearest-neighbour
  mixing ('bucketing+gm', 'nnm+gm' by name).

  The created process's `next` has type signature
  `(<state, {value}@CLIENTS, {weight}@CLIENTS> -> <state, result=value@SERVER,
  measurements@SERVER>)`; the state is the flattened previous result (a float vector,
  zeros at first) for 'previous' and `<>` otherwise. Measurements:
  *   `num_clients`: clients used (weight > 0; wrap the factory in
      `tff_robust.NonfiniteFilteringFactory`, as `tasks.registry` does, to give a
      client with a NaN or an infinity weight 0);
  *   `objective`, `relative_gradient`, `num_passes_applied`, `frozen_at_pass`
      (0 if never frozen), `nu`, `trim_radius` ('trimmed' only) and
      `max_effective_weight`: as the secure factory's.
  With no client of weight > 0 the result is zero.
  """

  def __init__(self,
               num_communication_passes: int = 3,
               nu: Optional[float] = None,
               tolerance: Optional[float] = None,
               initial_point: str = geometric_median.DEFAULT_INITIAL_POINT,
               relative_nu: Optional[float] = None):
    """Initializes the factory.

    Args:
      num_communication_passes: R >= 1, the number of Weiszfeld passes (named as in
        `tff_robust.GeometricMedianFactory`, where each pass is one secure mean).
      nu: an absolute smoothing floor ν > 0 on distances (the paper's is 1e-6).
      tolerance: the freezing threshold on the relative gradient, in [0, 1); None
        means 1e-6. As in `tff_robust.GeometricMedianFactory`, a positive
        `tolerance` without a ν raises (the original TFF RFA's `tolerance` is ν).
      initial_point: 'trimmed' (default), 'zero', 'mean' or 'previous', as in
        `tff_robust.GeometricMedianFactory`.
      relative_nu: ν relative to the clients' robust typical distance to each
        pass's estimate (`tff_robust.aggregators.robust_scale`); None and no `nu`: 0.2.

    Raises:
      TypeError: if R is not an integer, or ν or `tolerance` not a number.
      ValueError: if R < 1, ν is not a finite number > 0, `tolerance` is not in
        [0, 1) or comes without `nu`, or `initial_point` is unknown (or 'trimmed'
        with R < 2).
    """
    self._num_passes = arguments.check_positive_int(
        'num_communication_passes', num_communication_passes)
    self._nu, self._relative_nu, self._tolerance = geometric_median.check_smoothing(
        nu, relative_nu, tolerance)
    self._initial_point = geometric_median.check_initial_point(initial_point,
                                                               self._num_passes)

  def _initial_state(self, dtype, size):
    if self._initial_point == 'previous':
      return tf.zeros([size], dtype)
    return ()

  def _start(self, values, state):
    """v⁽⁰⁾ (float64), or None for the mean and trimmed starts (pass 1 with β = α)."""
    if self._initial_point == 'previous':
      return tf.cast(state, tf.float64)
    if self._initial_point == 'zero':
      return tf.zeros(tf.shape(values)[1:], tf.float64)
    return None

  def _floor(self, alphas, distances, float64: bool, count_zero: bool = True):
    """ν for a pass with these distances: the absolute one, or the relative one
    from the same histogram the secure factory sums over its clients (a distance 0
    counted, except from the zero start)."""
    if self._relative_nu is None:
      return tf.constant(self._nu, tf.float64)
    statistics = tf.reduce_sum(robust_scale.client_statistics(
        distances, alphas, float64, count_zero=count_zero), axis=1)
    return robust_scale.relative_floor(statistics, self._relative_nu)

  def _trimmed(self, values, alphas, mean):
    """The trimmed start's pass 2: (the α-weighted mean of the clients whose d / D̄
    to `mean` is in the bucket of the weighted median or below, the radius, their
    weights), by the secure factory's histogram."""
    distances = distances_to(values, mean)
    unit = tf.math.divide_no_nan(tf.reduce_sum(alphas * distances), tf.reduce_sum(alphas))
    bucket, near = _median_bucket_and_mask(distances, unit, alphas, 0)
    near = tf.where(near, alphas, tf.zeros_like(alphas))
    return (weighted_average(values, near), robust_scale.bucket_upper_edge(bucket, unit),
            near)

  def _pass(self, values, alphas, center, count_zero: bool = True, radius=None):
    """One Weiszfeld pass from `center`: (proposal, Σβ, g_ν(center), max β/Σβ, ν);
    with pass 2's `radius`, the trimmed start's restricted pass 3 (β only for the
    clients within about twice the weighted median distance)."""
    distances = distances_to(values, center)
    nu = self._floor(alphas, distances, values.dtype == tf.float64, count_zero)
    betas = weiszfeld_weights(alphas, distances, nu)
    if radius is not None:
      _, near = _median_bucket_and_mask(distances, radius, alphas,
                                        robust_scale.NEAR_BUCKETS)
      betas = tf.where(near, betas, tf.zeros_like(betas))
    beta_sum = tf.reduce_sum(betas)
    objective = tf.reduce_sum(alphas * geometric_median.smoothed_norm(distances, nu))
    return (weighted_average(values, betas), beta_sum, objective,
            _max_share(betas, beta_sum), nu)

  def _server_aggregate(self, values, weights, state):
    alphas = tf.cast(weights, tf.float64)
    alpha_sum = tf.reduce_sum(alphas)
    start = self._start(values, state)
    floors, extra = [], collections.OrderedDict()
    if start is None:
      center = weighted_average(values, alphas)
      max_shares = [_max_share(alphas, alpha_sum)]
    else:
      center, _, _, max_share, nu = self._pass(
          values, alphas, start, count_zero=self._initial_point != 'zero')
      max_shares = [max_share]
      floors.append(nu)
    frozen, frozen_at, passes = tf.constant(False), tf.constant(0), tf.constant(1)
    first_weiszfeld_pass = 2
    if self._initial_point == 'trimmed':
      center, extra['trim_radius'], near = self._trimmed(values, alphas, center)
      max_shares.append(_max_share(near, tf.reduce_sum(near)))
      passes, first_weiszfeld_pass = tf.constant(2), 3
    objectives, relative_gradients = [], []
    for this_pass in range(first_weiszfeld_pass, self._num_passes + 1):
      restrict = 'trim_radius' in extra and this_pass == 3
      proposal, beta_sum, objective, max_share, nu = self._pass(
          values, alphas, center, radius=extra['trim_radius'] if restrict else None)
      floors.append(nu)
      relative_gradient = tf.math.divide_no_nan(
          tf.norm(proposal - center) * beta_sum, alpha_sum)
      apply, frozen, frozen_at, passes = geometric_median.freeze_step(
          frozen, frozen_at, passes, this_pass, relative_gradient, self._tolerance)
      center = tf.where(apply, proposal, center)
      objectives.append(objective)
      relative_gradients.append(relative_gradient)
      max_shares.append(max_share)
    distances = distances_to(values, center)
    last_nu = floors[-1] if floors else self._floor(alphas, distances,
                                                    values.dtype == tf.float64)
    objectives.append(tf.reduce_sum(
        alphas * geometric_median.smoothed_norm(distances, last_nu)))
    result = tf.cast(center, values.dtype)
    new_state = result if self._initial_point == 'previous' else state
    return result, new_state, collections.OrderedDict(
        objective=tf.stack(objectives),
        relative_gradient=_vector(relative_gradients),
        num_passes_applied=passes,
        frozen_at_pass=frozen_at,
        nu=_vector(floors),
        **extra,
        max_effective_weight=tf.reduce_max(tf.stack(max_shares)))


def _median_bucket_and_mask(distances, unit, alphas, extra_buckets: int):
  """(the bucket of the α-weighted median of d / unit, the clients at most
  `extra_buckets` above it), by the histogram the secure factory sums."""
  bucket = robust_scale.half_weight_bucket(tf.reduce_sum(
      robust_scale.client_radius_histogram(distances, unit, alphas), axis=0))
  return bucket, robust_scale.radius_bucket(distances, unit) <= bucket + extra_buckets


def _max_share(betas, beta_sum):
  # 0 for an empty round: reduce_max of nothing is -inf.
  return tf.cast(tf.math.divide_no_nan(
      tf.reduce_max(tf.concat([betas, tf.zeros([1], betas.dtype)], axis=0)), beta_sum),
      tf.float32)


def _vector(scalars):
  # One-pass GM (R = 1) has no relative gradient: an empty vector.
  return tf.stack(scalars) if scalars else tf.zeros([0], tf.float64)
