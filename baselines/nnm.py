"""Nearest-neighbour mixing (Allouah, Farhadkhani, Guerraoui, Gupta, Pinot, Stephan,
"Fixing by Mixing: A Recipe for Optimal Byzantine ML under Heterogeneity",
AISTATS 2023, Algorithm 1) around a gathering baseline.

Each round, with n client updates of which at most f are assumed Byzantine, every
update x_i is replaced by the average of its n − f nearest neighbours (x_i itself
included, Euclidean distance), and the robust aggregator runs on the mixed updates:
mixing pulls every honest update towards the honest majority, which is what brings
median, Krum and the like to the optimal error under heterogeneity.

It transforms the gathered matrix, so it wraps the gathering baselines only and is NOT
compatible with secure aggregation. Memory is n² distances plus the n × p mixed
matrix: the mixing is one `[n, n] × [n, p]` product, never an `[n, n − f, p]` gather.
"""

import collections
from typing import Optional

import tensorflow as tf

from baselines import gather
from baselines import krum


def mixing_matrix(values, num_byzantine):
  """M `[n, n]` float64 with M_ij = 1/(n − f) when x_j is one of the n − f nearest
  neighbours of x_i, else 0; mixed = M X.

  Squared distances are Krum's, in float64 (`krum.pairwise_squared_distances`: from
  the Gram matrix, pairs where rounding could matter recomputed from differences).
  Ties are broken by client order, lower index first (`tf.math.top_k` is stable), so
  x_i is always among its own neighbours unless n − f earlier clients coincide with
  it, which gives the same average.
  """
  n = tf.shape(values)[0]
  k = n - num_byzantine
  distances = krum.pairwise_squared_distances(values)
  _, nearest = tf.math.top_k(-distances, k=k, sorted=True)
  rows = tf.repeat(tf.range(n), k)
  indices = tf.stack([rows, tf.reshape(nearest, [-1])], axis=1)
  share = tf.fill([n * k], 1.0 / tf.cast(k, tf.float64))
  return tf.scatter_nd(indices, share, [n, n])


def mix(values, num_byzantine):
  """Each row of `values` replaced by the mean of its n − f nearest rows (values'
  dtype; accumulated in float64, so float32 rows near 3e38 do not overflow)."""
  def mixed():
    return tf.cast(tf.linalg.matmul(mixing_matrix(values, num_byzantine),
                                    tf.cast(values, tf.float64)), values.dtype)

  # No client of weight > 0: nothing to mix.
  return tf.cond(tf.shape(values)[0] > 0, mixed, lambda: values)


class NearestNeighborMixingFactory(gather.GatheringAggregationFactory):
  """Nearest-neighbour mixing of the client updates, then a gathering baseline.

  y_i = (1 / (n − f)) Σ_{j ∈ N_i} x_j, N_i the n − f clients nearest to x_i (itself
  included), an unweighted average as in the paper; the inner aggregator sees
  (y_i, α_i), so client i's mixed update keeps its weight. f is `num_byzantine`, or
  ⌊ρ·n⌋ for the n clients of the round with `byzantine_fraction` ρ. A round with
  f ≥ n > 0 clients fails with an `InvalidArgumentError` naming `num_byzantine`.

  The created process's `next` has type signature
  `(<state, {value}@CLIENTS, {weight}@CLIENTS> -> <state, result=value@SERVER,
  measurements@SERVER>)`; the state is the inner aggregator's. Measurements: the
  inner aggregator's (computed on the mixed updates), `num_clients` of the clients,
  and `num_neighbors`, n − f.

  NOT compatible with secure aggregation: every client's update reaches the server.
  """

  # The factories it wraps (checked by the constructor; `tasks.registry` reads it).
  wraps = gather.GatheringAggregationFactory

  def __init__(self, inner: gather.GatheringAggregationFactory,
               num_byzantine: Optional[int] = None,
               byzantine_fraction: Optional[float] = None):
    """Initializes the factory.

    Args:
      inner: A gathering baseline (median, trimmed mean, Krum, centered clipping,
        the gathered geometric median).
      num_byzantine: f >= 0, the assumed number of corrupted clients per round.
      byzantine_fraction: alternatively ρ in [0, 0.5): f = ⌊ρ·n⌋. Exactly one of the
        two must be given.

    Raises:
      TypeError: if `inner` is not a gathering baseline.
      TypeError: if `num_byzantine` is not an integer or `byzantine_fraction` not a
        number.
      ValueError: if neither or both of `num_byzantine` and `byzantine_fraction` are
        given, or one is out of range.
    """
    if not isinstance(inner, self.wraps):
      raise TypeError(
          'nnm wraps the gathering baselines (median, trimmed_mean, krum, multi_krum, '
          'centered_clipping, gathered_gm), which see the individual updates; got '
          f'{type(inner).__name__}. By name, nnm+gm uses gathered_gm.')
    self._inner = inner
    self._num_byzantine, self._fraction = gather.check_assumed_byzantine(
        'nnm', num_byzantine, byzantine_fraction)

  inner = property(lambda self: self._inner, doc='The aggregator of the mixed updates.')

  def check_num_clients(self, num_clients: int) -> None:
    """Raises a ValueError if a round of `num_clients` clients breaks n > f."""
    gather.check_more_clients_than_assumed_byzantine(
        'NearestNeighborMixingFactory', num_clients, self._num_byzantine)

  def _initial_state(self, dtype, size):
    return self._inner._initial_state(dtype, size)  # pylint: disable=protected-access

  def _server_aggregate(self, values, weights, state):
    n = tf.shape(values)[0]
    f = gather.assumed_byzantine(self._num_byzantine, self._fraction, n)
    check = gather.assert_more_clients_than_assumed_byzantine(
        'NearestNeighborMixingFactory', n, f)
    f = tf.minimum(f, n)  # A round without clients mixes nothing.
    with tf.control_dependencies([check]):
      mixed = mix(values, f)
    result, inner_state, measurements = self._inner._server_aggregate(  # pylint: disable=protected-access
        mixed, weights, state)
    measurements = collections.OrderedDict(measurements)
    measurements['num_neighbors'] = n - f
    return result, inner_state, measurements
