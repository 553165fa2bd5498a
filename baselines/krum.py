"""Krum and multi-Krum (Blanchard et al. 2017, ref. [16] of the RFA paper).

Both gather every client's update at the server (`baselines.gather`): NOT compatible
with secure aggregation.
"""

import collections
from typing import Optional

import numpy as np
import tensorflow as tf

from baselines import gather
from tff_robust.common import arguments


# Columns per block (float64 values in the block's temporaries): ≈ 2^18 values (2 MiB)
# stay in cache. Larger blocks are slower (cache), smaller ones pay the loop's
# per-iteration overhead (`benchmarks/aggregator_memory_time.py`).
PAIR_BLOCK_VALUES = 1 << 18
# A Gram-matrix distance is kept when it is at least this fraction of ‖y_i‖² + ‖y_j‖²
# (y = x − the centre row). Its three rounded terms err by at most about
# 2·p·2^-53·(‖y_i‖² + ‖y_j‖²) together (in practice √p times less), so a kept distance
# is within 1.4e-7 relative at p = 6.4M at worst, float32's resolution. Smaller
# distances are recomputed from differences.
GRAM_RELATIVE_FLOOR = 1e-2


def _sum_over_column_blocks(values, rows, block_values, block_term, initial,
                            num_columns=None):
  """Σ over column blocks of `block_term(float64 block of values)`, starting from
  `initial`: a block has about `block_values` / `rows` columns (at least 1), so
  there is never a float64 copy of the whole matrix. Only the first `num_columns`
  columns (default all) are visited."""
  size = tf.shape(values)[1] if num_columns is None else num_columns
  block = tf.maximum(1, block_values // tf.maximum(rows, 1))

  def add_block(start, total):
    block_columns = tf.cast(values[:, start:start + block], tf.float64)
    return start + block, total + block_term(block_columns)

  _, total = tf.while_loop(
      lambda start, _: start < size, add_block, (tf.constant(0), initial),
      # One block at a time: in parallel their temporaries would add up.
      parallel_iterations=1)
  return total


def _pair_sums(values, first, second, block_values):
  """Σ_k (x_ik − x_jk)² in float64 for the pairs (first[t], second[t]), column block by
  column block: O(pairs · block) temporaries."""
  num_pairs = tf.shape(first)[0]
  return _sum_over_column_blocks(
      values, tf.maximum(num_pairs, tf.shape(values)[0]), block_values,
      lambda block: tf.reduce_sum(tf.math.squared_difference(
          tf.gather(block, first), tf.gather(block, second)), axis=1),
      tf.zeros([num_pairs], tf.float64),
      # Without pairs, no block at all (each would still be cast).
      num_columns=tf.where(num_pairs > 0, tf.shape(values)[1], 0))


def _centred_gram(values, center, block_values):
  """Y Yᵀ in float64 for Y = X − x_center (row `center`), column block by column
  block."""
  n = tf.shape(values)[0]

  def block_gram(block):
    centred = block - block[center]
    return tf.matmul(centred, centred, transpose_b=True)

  return _sum_over_column_blocks(values, n, block_values, block_gram,
                                 tf.zeros([n, n], tf.float64))


def _row_squared_norms(values, block_values):
  """‖x_i‖² in float64 (float32 squares of 3e38 would overflow), by column blocks."""
  n = tf.shape(values)[0]
  return _sum_over_column_blocks(
      values, n, block_values, lambda block: tf.reduce_sum(tf.square(block), axis=1),
      tf.zeros([n], tf.float64))


def pairwise_squared_distances(values, block_values: int = PAIR_BLOCK_VALUES):
  """‖x_i − x_j‖² for all pairs of rows, in float64, each within a relative
  2·p·2^-53 / `GRAM_RELATIVE_FLOOR` of the exact value at worst (1.4e-7 for p = 6.4M;
  in practice far less), and exact to float64 rounding when recomputed (see below).

  Fast path, one matrix product: with y_i = x_i − x_c, d_ij = ‖y_i‖² + ‖y_j‖² −
  2⟨y_i, y_j⟩ from the float64 Gram matrix of Y (n²·p multiply-adds in BLAS, column
  block by column block, so no float64 copy of the matrix). The centre row c is the
  one of median norm: with fewer than half of the clients corrupted its norm lies
  between honest clients' norms, so the honest y_i stay on the honest clients' scale
  wherever the corrupted clients are (the mean as centre would sit near a client at
  1e10, and every honest distance would cancel away in rounding).

  Exact path: a pair whose Gram distance is not at least `GRAM_RELATIVE_FLOOR`·
  (‖y_i‖² + ‖y_j‖²), where cancellation could matter (e.g. two clients far from the
  centre and close to each other), or is not a number (a row holding an infinity,
  e.g. a bucket mean that overflowed, makes inf − inf), is recomputed from the
  differences themselves, Σ(x_ik − x_jk)², which in float64 never overflows or
  underflows for finite float32 inputs and is +inf for an infinite row, as Krum's
  ranking needs. In the worst case (e.g. an infinite centre) every pair takes this
  path: n²·p/2 operations.
  """
  n = tf.shape(values)[0]

  def distances():
    center = tf.argsort(_row_squared_norms(values, block_values), stable=True)[n // 2]
    gram = _centred_gram(values, center, block_values)
    centred_norms = tf.linalg.diag_part(gram)
    scale = centred_norms[:, None] + centred_norms[None, :]
    from_gram = tf.maximum(scale - 2.0 * gram, 0.0)
    rows, columns = tf.meshgrid(tf.range(n), tf.range(n), indexing='ij')
    # `not >=` rather than `<`: a NaN distance must be recomputed too.
    trusted = from_gram >= GRAM_RELATIVE_FLOOR * scale
    doubtful = tf.where((rows < columns) & tf.logical_not(trusted))
    exact = _pair_sums(values, doubtful[:, 0], doubtful[:, 1], block_values)
    upper = tf.tensor_scatter_nd_update(tf.linalg.band_part(from_gram, 0, -1),
                                        doubtful, exact)
    return tf.linalg.set_diag(upper + tf.transpose(upper), tf.zeros([n], tf.float64))

  return tf.cond(n < 2, lambda: tf.zeros([n, n], tf.float64), distances)


def exact_pairwise_squared_distances(values, block_values: int = PAIR_BLOCK_VALUES):
  """‖x_i − x_j‖² for all pairs from the differences alone (the exact path for every
  pair, n²·p/2 operations): the reference `pairwise_squared_distances` is timed
  against (`benchmarks/pairwise_distances.py`)."""
  n = tf.shape(values)[0]
  rows, columns = tf.meshgrid(tf.range(n), tf.range(n), indexing='ij')
  pairs = tf.where(rows < columns)
  upper = tf.scatter_nd(pairs, _pair_sums(values, pairs[:, 0], pairs[:, 1],
                                          block_values), [n, n])
  return upper + tf.transpose(upper)


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
      TypeError: if an argument is of the wrong type (e.g. a float `num_selected`).
      ValueError: if neither or both of `num_byzantine` and `byzantine_fraction` are
        given, or one of the arguments is out of range.
    """
    self._num_byzantine, self._fraction = gather.check_assumed_byzantine(
        'krum', num_byzantine, byzantine_fraction)
    self._num_selected = (None if num_selected is None else
                          arguments.check_positive_int('num_selected', num_selected))

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
    f = gather.assumed_byzantine(self._num_byzantine, self._fraction, n)
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
    average = gather.weighted_average_rows(values, weights, rows=selected)
    return average, state, collections.OrderedDict(num_byzantine=f, num_selected=m)
