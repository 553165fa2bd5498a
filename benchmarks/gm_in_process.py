r"""The simulation's in-process geometric median against plain numpy and the memory
bandwidth, on one round of n clients × p float32 parameters, in one run.

*   in process: `tasks.simulation.in_process.aggregation` of RFA's federated process
    (`tff_robust.GeometricMedianFactory`, R = 3 passes from zero, the paper's absolute
    ν = 1e-6, every pass applied), the simulation's path for it: traced into one
    TensorFlow function (from a run's third round, for arguments of at most
    `in_process.FUSE_AT_MOST_BYTES`), and client by client (larger calls, and the
    first two);
*   numpy: the same three smoothed Weiszfeld passes written plainly
    (`β_i = α_i / max(ν, ‖x_i − z‖)`, `z ← Σ β_i x_i / Σ β_i`), as a popular torch
    library writes them, on the `[n, p]` matrix;
*   XLA: the same passes on the `[n, p]` tensor in one `tf.function(jit_compile=True)`,
    the best this arithmetic gets when TensorFlow may fuse each pass's distances and
    weighted sum into few kernels (its sums run in another order, so its result is not
    the federated process's to the bit: the simulation cannot use it);
*   one read: `np.add.reduce(matrix, axis=0)`, one pass reading the matrix: the
    memory bandwidth's bound per pass over the data. Three Weiszfeld passes need at
    least three reads (each pass's weights need the distances to the previous
    estimate, then the weighted sum reads the matrix again unless fused: six reads as
    written).

Calls are interleaved (in process traced, client by client, numpy, XLA, one read;
repeated) and the medians printed, with the ratios and each result's largest
difference to numpy's, relative to numpy's largest entry.

  .venv/bin/python -m benchmarks.gm_in_process --clients=50 --parameters=1000000
"""

import time

from absl import flags
import numpy as np

from tasks.binaries import exit_status

_CLIENTS = flags.DEFINE_integer('clients', 50, 'Clients n.', lower_bound=1)
_PARAMETERS = flags.DEFINE_integer('parameters', 1_000_000, 'Parameters p.',
                                   lower_bound=1)
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed calls of each.', lower_bound=1)
_PASSES = 3
_NU = 1e-6


def numpy_weiszfeld(matrix: np.ndarray, alpha: np.ndarray) -> np.ndarray:
  """R smoothed Weiszfeld passes from zero, plainly in numpy (float32 matrix, float64
  weights, as the federated version's scalars)."""
  estimate = np.zeros(matrix.shape[1], np.float32)
  for _ in range(_PASSES):
    distances = np.linalg.norm(matrix - estimate, axis=1).astype(np.float64)
    beta = alpha / np.maximum(_NU, distances)
    estimate = ((beta / beta.sum()).astype(np.float32) @ matrix)
  return estimate


def xla_weiszfeld():
  """The passes of `numpy_weiszfeld` as one XLA computation on the matrix: a
  `tf.function` of (matrix, alpha)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  @tf.function(jit_compile=True)
  def weiszfeld(matrix, alpha):
    estimate = tf.zeros(matrix.shape[1], tf.float32)
    for _ in range(_PASSES):
      distances = tf.sqrt(tf.reduce_sum(tf.math.squared_difference(matrix, estimate),
                                        axis=1))
      beta = alpha / tf.maximum(tf.cast(distances, tf.float64), _NU)
      estimate = tf.linalg.matvec(
          matrix, tf.cast(beta / tf.reduce_sum(beta), tf.float32), transpose_a=True)
    return estimate

  return weiszfeld


def main(argv):
  del argv
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  import tensorflow_federated as tff
  from tasks.simulation import in_process
  import tff_robust
  n, p = _CLIENTS.value, _PARAMETERS.value
  rng = np.random.default_rng(0)
  matrix = rng.normal(size=(n, p)).astype(np.float32)
  alpha = rng.integers(10, 60, size=n).astype(np.float64)
  factory = tff_robust.GeometricMedianFactory(
      num_communication_passes=_PASSES, nu=_NU, initial_point='zero', tolerance=0.0)
  process = factory.create(tff.TensorType(np.float32, [p]), tff.TensorType(np.float32))
  aggregate = in_process.aggregation(process)
  state = process.initialize()
  weights = [np.float32(a) for a in alpha]

  def run_in_process():
    return aggregate(state, [row for row in matrix], weights).result

  def run_client_by_client():
    fuse_at_most_bytes = in_process.FUSE_AT_MOST_BYTES
    in_process.FUSE_AT_MOST_BYTES = 0
    try:
      return run_in_process()
    finally:
      in_process.FUSE_AT_MOST_BYTES = fuse_at_most_bytes

  matrix_tensor, alpha_tensor = tf.constant(matrix), tf.constant(alpha)
  weiszfeld = xla_weiszfeld()

  def run_xla():
    return weiszfeld(matrix_tensor, alpha_tensor).numpy()

  timings = {'in process': [], 'client by client': [], 'numpy': [], 'XLA': [],
             'one read': []}
  results = {}
  # Untimed: embeds the computation's TensorFlow graphs, then traces the call into
  # one function, as a run's third round does.
  for _ in range(in_process.FUSE_AFTER_CALLS + 1):
    run_in_process()
  run_xla()  # Compiles it.
  for _ in range(_REPEATS.value):
    for name, call in (('in process', run_in_process),
                       ('client by client', run_client_by_client),
                       ('numpy', lambda: numpy_weiszfeld(matrix, alpha)),
                       ('XLA', run_xla),
                       ('one read', lambda: np.add.reduce(matrix, axis=0))):
      start = time.perf_counter()
      results[name] = call()
      timings[name].append(time.perf_counter() - start)
  median = {name: float(np.median(t)) for name, t in timings.items()}

  def difference(name):
    return np.max(np.abs(results[name] - results['numpy'])) / np.max(
        np.abs(results['numpy']))

  print(f'{n} clients × {p:,} float32 ({matrix.nbytes / 2**20:.0f} MiB), '
        f'{_PASSES} passes, median of {_REPEATS.value} interleaved calls:')
  traced = ('traced into one function' if matrix.nbytes <= in_process.FUSE_AT_MOST_BYTES
            else 'client by client: above FUSE_AT_MOST_BYTES')
  for name, label in (('in process', f'in process ({traced})'),
                      ('client by client', 'in process, client by client'),
                      ('numpy', 'numpy Weiszfeld'),
                      ('XLA', 'XLA-fused Weiszfeld on the matrix'),
                      ('one read', 'one read of the matrix')):
    print(f'  {label:<48} {median[name]:.3f} s')
  print(f'in process / numpy: {median["in process"] / median["numpy"]:.2f} (client by '
        f'client {median["client by client"] / median["numpy"]:.2f}); '
        f'in process / one read: {median["in process"] / median["one read"]:.1f} '
        f'(the bound for {_PASSES} passes is {_PASSES} reads: '
        f'{median["in process"] / (_PASSES * median["one read"]):.1f}× it; XLA '
        f'{median["XLA"] / (_PASSES * median["one read"]):.1f}×); '
        f'largest relative difference to numpy\'s result {difference("in process"):.1e} '
        f'(client by client {difference("client by client"):.1e}, XLA '
        f'{difference("XLA"):.1e})')


if __name__ == '__main__':
  exit_status.run(main)
