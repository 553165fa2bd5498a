r"""Krum's and NNM's pairwise distances: the Gram-matrix path against differences alone.

`baselines.krum.pairwise_squared_distances` (one float64 matrix product per column
block, the few pairs where rounding could cancel recomputed from their differences)
against `baselines.krum.exact_pairwise_squared_distances` (every pair from its
differences, the previous implementation), on the same `--clients` × `--parameters`
float32 matrix: N(0, 1) clients, a quarter of them shifted far away (ALIE-like
clients would be closer, omniscient ones farther; the path taken is the same). Both
are compiled `tf.function`s, called alternately `--repeats` times after one untimed
call each; prints the median seconds, their ratio and the largest relative
difference of the two results.

  .venv/bin/python -m benchmarks.pairwise_distances --clients=50 --parameters=640000
"""

import statistics
import time

from absl import flags
import numpy as np

from tasks.binaries import exit_status

_CLIENTS = flags.DEFINE_integer('clients', 50, 'Rows (clients).', lower_bound=2)
_PARAMETERS = flags.DEFINE_integer('parameters', 640_000, 'Columns (float32 each).',
                                   lower_bound=1)
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed calls of each.', lower_bound=1)


def client_matrix(num_clients: int, num_parameters: int, seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  matrix = rng.standard_normal((num_clients, num_parameters), dtype=np.float32)
  matrix[:num_clients // 4] += 100.0
  return matrix


def seconds(fn, values) -> float:
  start = time.perf_counter()
  fn(values).numpy()
  return time.perf_counter() - start


def main(argv):
  del argv
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from baselines import krum
  values = tf.constant(client_matrix(_CLIENTS.value, _PARAMETERS.value))
  gram = tf.function(krum.pairwise_squared_distances)
  exact = tf.function(krum.exact_pairwise_squared_distances)
  fast, reference = gram(values).numpy(), exact(values).numpy()
  off_diagonal = ~np.eye(len(fast), dtype=bool)
  difference = np.max(np.abs(fast - reference)[off_diagonal]
                      / reference[off_diagonal])
  times = {'gram': [], 'exact': []}
  for _ in range(_REPEATS.value):
    times['gram'].append(seconds(gram, values))
    times['exact'].append(seconds(exact, values))
  gram_s, exact_s = (statistics.median(times[k]) for k in ('gram', 'exact'))
  print(f'{_CLIENTS.value} clients x {_PARAMETERS.value} parameters, median of '
        f'{_REPEATS.value} calls:')
  print(f'  differences alone (exact path for every pair): {exact_s:.2f} s')
  print(f'  Gram matrix + exact recomputation:             {gram_s:.2f} s')
  print(f'  ratio exact / gram: {exact_s / gram_s:.1f}x; largest relative difference '
        f'{difference:.1e}')


if __name__ == '__main__':
  exit_status.run(main)
