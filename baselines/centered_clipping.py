"""Centered clipping (Karimireddy, He, Jaggi, "Learning from History for Byzantine
Robust Optimization", ICML 2021, Algorithm 2 / eq. (CC)).

Gathers every client's update at the server (`baselines.gather`): NOT compatible with
secure aggregation. (The iteration only needs weighted means of client-clipped
differences: `tff_robust.aggregators.centered_clipping.SecureCenteredClippingFactory` computes the
same result through an inner, e.g. secure, mean; this baseline follows the paper's
server-side description.)
"""

import collections

import tensorflow as tf

from baselines import gather
from tff_robust.aggregators import centered_clipping as secure_centered_clipping
from tff_robust.iterative import iterative_mean

INITIAL_POINTS = secure_centered_clipping.INITIAL_POINTS


def clip_rows(differences, radius):
  """Each row z scaled by min(1, τ/‖z‖).

  Pass float64 rows: a float32 norm overflows to inf from ~1e19 on, and τ/inf = 0
  would silently drop the client instead of clipping it to τ (float32 squares of
  tiny rows also underflow to a norm of 0).
  """
  norms = tf.norm(differences, axis=1, keepdims=True)
  scale = tf.minimum(
      tf.ones_like(norms), tf.math.divide_no_nan(tf.cast(radius, norms.dtype), norms))
  # A zero row stays zero: divide_no_nan gives 0 for it, and 0 * 0 = 0.
  scale = tf.where(norms > 0, scale, tf.ones_like(norms))
  return differences * scale


class CenteredClippingFactory(gather.GatheringAggregationFactory):
  """Centered clipping: L steps of v ← v + Σ_i w_i clip_τ(x_i − v) / Σ_i w_i.

  clip_τ(z) = z·min(1, τ/‖z‖) over the whole model update. The paper averages with
  1/n; with client weights α_i the average is weighted (1/n for equal weights).

  Starting point v₀ (`initial_point`):
  *   'previous' (default, the paper's choice): the aggregate returned in the previous
      round, kept in the process state (zero in the first round). In the paper the
      clients send momenta, so consecutive aggregates are close; with model deltas of
      a steadily changing scale prefer 'mean'.
  *   'mean': the weighted mean of this round's updates (not robust by itself; the
      clipped steps then pull it towards the bulk of the clients).
  *   'zero': v₀ = 0.

  NOT compatible with secure aggregation: every client's update reaches the server.

  The created process's `next` has type signature
  `(<state, {value}@CLIENTS, {weight}@CLIENTS> -> <state, result=value@SERVER,
  measurements@SERVER>)`; the state is the flattened previous aggregate (a float
  vector) for 'previous' and `<>` otherwise. Measurements:
  *   `num_clients`: clients used (weight > 0; wrap the factory in
      `tff_robust.NonfiniteFilteringFactory`, as `tasks.registry` does, to give a
      client with a NaN or an infinity weight 0);
  *   `fraction_clipped`: fraction of the clients clipped in the last iteration.
  """

  def __init__(self, clip_radius: float = 1.0, num_iterations: int = 3,
               initial_point: str = 'previous'):
    """Initializes the factory.

    Args:
      clip_radius: τ > 0, the clipping radius.
      num_iterations: L >= 1 (the paper uses 1 with momentum).
      initial_point: 'previous', 'mean' or 'zero' (see the class docstring).

    Raises:
      TypeError: for a τ that is not a number or an L that is not an integer.
      ValueError: for τ <= 0, L < 1 or an unknown initial point.
    """
    self._radius, self._num_iterations, self._initial_point = (
        secure_centered_clipping.check_arguments(clip_radius, num_iterations,
                                                 initial_point))

  def _initial_state(self, dtype, size):
    if self._initial_point == 'previous':
      return tf.zeros([size], dtype)
    return ()

  def _server_aggregate(self, values, weights, state):
    if self._initial_point == 'previous':
      center = state
    elif self._initial_point == 'mean':
      center = gather.weighted_average_rows(values, weights)
    else:
      center = tf.zeros(tf.shape(values)[1:], values.dtype)
    # The whole iteration in float64: x_i − v of float32 values at ±3e38 overflows
    # float32, and so do the norms of rows beyond ~1e19.
    values64 = tf.cast(values, tf.float64)
    center = tf.cast(center, tf.float64)
    fraction_clipped = tf.constant(0.0)
    for _ in range(self._num_iterations):
      differences = values64 - center[tf.newaxis]
      center = center + gather.weighted_average_rows(
          clip_rows(differences, self._radius), weights)
      clipped = tf.norm(differences, axis=1) > self._radius
      fraction_clipped = tf.math.divide_no_nan(
          tf.reduce_sum(tf.cast(clipped, tf.float32)),
          tf.cast(tf.shape(values)[0], tf.float32))
    center = tf.cast(center, values.dtype)
    new_state = center if self._initial_point == 'previous' else state
    return center, new_state, collections.OrderedDict(fraction_clipped=fraction_clipped)
