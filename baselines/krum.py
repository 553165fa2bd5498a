"""Krum and multi-Krum (Blanchard et al. 2017, ref. [16] of the RFA paper).

Both gather every client's update at the server (`baselines.gather`): NOT compatible
with secure aggregation.
"""

import collections
from typing import Optional

import numpy as np
import tensorflow as tf

from baselines import gather


# Pair differences per block of columns (float64 values): P·b ≈ 2^18 (2 MiB per
# temporary) stays in cache. Larger blocks are slower (cache), smaller ones pay the
# loop's per-iteration overhead (`benchmarks/aggregator_memory_time.py`).
PAIR_BLOCK_VALUES = 1 << 18


def pairwise_squared_distances(values, block_values: int = PAIR_BLOCK_VALUES):
  """‖x_i − x_j‖² for all pairs, from the differences themselves, in float64.

  Not through the Gram matrix ‖x_i‖² + ‖x_j‖² − 2⟨x_i, x_j⟩: once one client is far
  away (1e10 among N(0, 1) clients), centring puts the mean near it and the honest
  clients' distances cancel away in float64 rounding; Krum then picks an arbitrary
  honest client. In float64 the difference and square of float32 values never
  overflow or underflow, so every distance is exact to float64 rounding.

  Column-blocked: for a block of b columns (b = `block_values` / P, P = n(n − 1)/2
  pairs) the squared differences of every pair i < j are summed into P float64
  accumulators, block after block. Each pair is computed once (half of all ordered
  pairs) while its block is in cache; the matrix is never copied whole (no float64
  copy), so memory is the n·p input plus O(`block_values`). Costs n²·p/2 operations.
  """
  n = tf.shape(values)[0]
  size = tf.shape(values)[1]
  rows, columns = tf.meshgrid(tf.range(n), tf.range(n), indexing='ij')
  upper = rows < columns
  first, second = tf.boolean_mask(rows, upper), tf.boolean_mask(columns, upper)
  num_pairs = tf.shape(first)[0]
  block = tf.maximum(1, block_values // tf.maximum(num_pairs, 1))

  def add_block(start, sums):
    block_columns = tf.cast(values[:, start:start + block], tf.float64)
    return start + block, sums + tf.reduce_sum(tf.math.squared_difference(
        tf.gather(block_columns, first), tf.gather(block_columns, second)), axis=1)

  _, sums = tf.while_loop(
      lambda start, _: start < size, add_block,
      (tf.constant(0), tf.zeros([num_pairs], tf.float64)),
      # One block at a time: in parallel their temporaries would add up.
      parallel_iterations=1)
  upper_triangle = tf.scatter_nd(tf.stack([first, second], axis=1), sums, [n, n])
  return upper_triangle + tf.transpose(upper_triangle)


def krum_scores(values, num_byzantine):
  """Score of client i: the sum of its squared distances to its n − f − 2 nearest
  other clients (Blanchard et al., Section 4)."""
  n = tf.shape(values)[0]
  distances = pairwise_squared_distances(values)
  # A client is not its own neighbour.
  distances = tf.linalg.set_diag(
      distances, tf.fill([n], tf.constant(float('inf'), tf.float64)))
  nearest = tf.sort(distances, axis=1)[:, :n - num_byzantine - 2]
  return tf.reduce_sum(nearest, axis=1)


class KrumFactory(gather.GatheringAggregationFactory):
  """Krum (`num_selected=1`) and multi-Krum.

  With n clients (of weight > 0) of which at most f are assumed Byzantine, every client gets
  the score s_i = Σ_{j ∈ N_i} ‖x_i − x_j‖², N_i its n − f − 2 nearest other clients.
  Krum returns the update of lowest score; multi-Krum returns the average of the m
  updates of lowest scores (m = `num_selected`, default n − f, as in Blanchard et al.).
  The average is weighted by the clients' weights (a plain average with equal
  weights). Ties are broken by client order (stable sort).

  Krum needs n > 2f + 2. n is only known when the process runs: a caller that knows
  it calls `check_num_clients(n)` first for a plain Python `ValueError` (the
  simulation does, through `tasks.registry.check_num_clients`); otherwise the round
  fails inside TFF's executor (a gRPC INTERNAL error) whose message is this one,
  naming `num_byzantine`.

  NOT compatible with secure aggregation: every client's update reaches the server.

  The created process's `next` has type signature
  `(<state=<>@SERVER, {value}@CLIENTS, {weight}@CLIENTS> ->
    <state=<>@SERVER, result=value@SERVER, measurements@SERVER>)`, with measurements
  *   `num_clients`: clients used (weight > 0; wrap the factory in
      `tff_robust.NonfiniteFilteringFactory`, as `tasks.registry` does, to give a
      client with a NaN or an infinity weight 0);
  *   `num_byzantine`: f used this round;
  *   `num_selected`: m used this round.
  """

  def __init__(self,
               num_byzantine: Optional[int] = None,
               byzantine_fraction: Optional[float] = None,
               num_selected: Optional[int] = 1):
    """Initializes the factory.

    Args:
      num_byzantine: f, the assumed number of corrupted clients.
      byzantine_fraction: alternatively ρ in [0, 0.5): f = ⌊ρ·n⌋ for the n finite
        clients of each round. Exactly one of the two must be given.
      num_selected: m >= 1, the number of lowest-score updates averaged (1: Krum);
        `None` means n − f (multi-Krum).

    Raises:
      ValueError: if neither or both of `num_byzantine` and `byzantine_fraction` are
        given, or one of the arguments is out of range.
    """
    if (num_byzantine is None) == (byzantine_fraction is None):
      raise ValueError(
          'Give exactly one of num_byzantine (f) and byzantine_fraction (f = '
          f'floor(fraction * n)); got num_byzantine={num_byzantine!r}, '
          f'byzantine_fraction={byzantine_fraction!r}.')
    self._num_byzantine = gather.optional_int('num_byzantine', num_byzantine)
    self._fraction = (None if byzantine_fraction is None else gather.check_fraction(
        'byzantine_fraction', byzantine_fraction, 0.5, upper_inclusive=False))
    if num_selected is not None:
      if (isinstance(num_selected, bool) or not isinstance(num_selected, int)
          or num_selected < 1):
        raise ValueError(
            f'num_selected must be an integer >= 1 or None, got {num_selected!r}.')
    self._num_selected = num_selected

  def num_byzantine_for(self, num_clients: int) -> int:
    """f for a round of `num_clients` clients (of weight > 0)."""
    if self._num_byzantine is not None:
      return self._num_byzantine
    return int(np.floor(self._fraction * num_clients))

  def check_num_clients(self, num_clients: int) -> None:
    """Raises a ValueError if a round of `num_clients` clients (of weight > 0)
    breaks Krum's n > 2f + 2 or has fewer than `num_selected` clients."""
    f = self.num_byzantine_for(num_clients)
    if num_clients <= 2 * f + 2:
      raise ValueError(
          f'KrumFactory: Krum needs more than 2 * num_byzantine + 2 = {2 * f + 2} '
          f'finite clients (n > 2f + 2), got n = {num_clients} with f = {f}; lower '
          'num_byzantine (or byzantine_fraction) or sample more clients.')
    if self._num_selected is not None and self._num_selected > num_clients:
      raise ValueError(
          f'KrumFactory: num_selected = {self._num_selected} exceeds the '
          f'{num_clients} clients of the round.')

  def _server_aggregate(self, values, weights, state):
    n = tf.shape(values)[0]
    if self._num_byzantine is not None:
      f = tf.constant(self._num_byzantine, tf.int32)
    else:
      f = tf.cast(tf.floor(self._fraction * tf.cast(n, tf.float64)), tf.int32)
    m = n - f if self._num_selected is None else tf.constant(self._num_selected)
    checks = [
        tf.debugging.assert_greater(
            n, 2 * f + 2,
            message=('KrumFactory: Krum needs more than 2 * num_byzantine + 2 finite '
                     'clients (n > 2f + 2); lower num_byzantine or sample more '
                     'clients. [n, f] =')),
        tf.debugging.assert_less_equal(
            m, n, message='KrumFactory: num_selected exceeds the number of clients.'),
    ]
    with tf.control_dependencies(checks):
      scores = krum_scores(values, f)
      selected = tf.argsort(scores, stable=True)[:m]
    average = gather.weighted_average_rows(
        tf.gather(values, selected), tf.gather(weights, selected))
    return average, state, collections.OrderedDict(num_byzantine=f, num_selected=m)
