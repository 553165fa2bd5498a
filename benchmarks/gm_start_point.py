r"""Passes the smoothed Weiszfeld GM needs per start point, on real client updates.

The updates are real EMNIST-linear model deltas: the bundled task
(`tasks.builders.build_task('emnist', 'linear', source='bundled')`, 5,000 real MNIST
digits dealt to clients with a label skew), 20 clients, each running `local_steps`
minibatch SGD steps (batch 10, learning rate 0.1) of softmax regression from the same random
global model (Keras' Glorot-uniform init); the update is initial − trained, as in TFF.
Softmax regression is written in numpy (the model is one Dense layer: kernel [784, 10]
and bias [10], 7,850 parameters), so generating a round takes well under a second.

5 of the 20 clients (25%) are corrupted (RFA paper D.2.1, docs/design.md):
  * omniscient: every corrupted client sends −(2 Σ_honest α_j w_j + Σ_C α_j w_j)/Σ_C α_j,
    making the weighted mean the negative of the clean one;
  * x100, x1000: a corrupted client sends its own update times 100 or 1000.

The geometric median v* is the float64 Weiszfeld iteration run to convergence (ν = 1e-6,
α = example counts). For each start ('mean': the paper's Algorithm 2; 'zero': one-step
RFA as pass 1) the script prints the passes (inner-mean calls, the first one included)
needed to get within 2% and 10% of ‖v*‖ of v*, the relative distance ‖v_R − v*‖/‖v*‖
after R = 3 passes, and where tolerance 1e-6 would freeze the iteration under the
relative-gradient rule of `GeometricMedianFactory` and under the paper's D.2.3 rule
(relative objective improvement), with the distance there.

  .venv/bin/python -m benchmarks.gm_start_point --seeds=0,1,2
"""

import numpy as np

NUM_CLIENTS = 20
NUM_CORRUPTED = 5
NUM_CLASSES = 10
PIXELS = 28 * 28
ATTACKS = ('omniscient', 'x100', 'x1000')
STARTS = ('mean', 'zero')
NU = 1e-6


def client_arrays(num_clients=NUM_CLIENTS, seed=0):
  """`num_clients` bundled EMNIST (MNIST digits) clients: [(x [n, 784], y [n])]."""
  from tasks import builders  # pylint: disable=g-import-not-at-top
  task = builders.build_task('emnist', 'linear', source='bundled', seed=seed)
  ids = sorted(task.train_data.client_ids)
  chosen = np.random.default_rng(seed).choice(len(ids), num_clients, replace=False)
  arrays = []
  for i in chosen:
    examples = list(task.train_data.create_tf_dataset_for_client(ids[i]).as_numpy_iterator())
    x = np.stack([e[0] for e in examples]).reshape(len(examples), PIXELS)
    y = np.array([e[1] for e in examples], np.int64)
    arrays.append((x.astype(np.float64), y))
  return arrays


def initial_model(seed=0):
  """Keras' Dense defaults: Glorot-uniform kernel, zero bias."""
  limit = np.sqrt(6.0 / (PIXELS + NUM_CLASSES))
  kernel = np.random.default_rng(seed).uniform(-limit, limit, (PIXELS, NUM_CLASSES))
  return kernel, np.zeros(NUM_CLASSES)


def local_update(kernel, bias, x, y, steps, rng, batch_size=10, learning_rate=0.1):
  """initial − trained after `steps` minibatch SGD steps of softmax cross-entropy."""
  w, b = kernel.copy(), bias.copy()
  order = rng.permutation(len(y))
  for step in range(steps):
    batch = np.take(order, range(step * batch_size, (step + 1) * batch_size), mode='wrap')
    logits = x[batch] @ w + b
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(batch)), y[batch]] -= 1.0
    w -= learning_rate * x[batch].T @ p / len(batch)
    b -= learning_rate * p.mean(axis=0)
  return np.concatenate([(kernel - w).ravel(), bias - b])


def real_updates(seed=0, local_steps=5):
  """(updates [20, 7850] float64, α = example counts [20]) of one clean round."""
  arrays = client_arrays(seed=seed)
  kernel, bias = initial_model(seed)
  rng = np.random.default_rng(seed)
  updates = np.stack([local_update(kernel, bias, x, y, local_steps, rng)
                      for x, y in arrays])
  return updates, np.array([len(y) for _, y in arrays], np.float64)


def corrupted_clients(num_clients, seed=0):
  """The `NUM_CORRUPTED` clients `corrupt` corrupts with this seed (a bool mask)."""
  corrupted = np.zeros(num_clients, bool)
  corrupted[np.random.default_rng(seed).permutation(num_clients)[:NUM_CORRUPTED]] = True
  return corrupted


def corrupt(updates, alphas, attack, seed=0):
  """The round's updates with `NUM_CORRUPTED` clients (chosen by `seed`) corrupted."""
  corrupted = corrupted_clients(len(alphas), seed)
  out = updates.copy()
  if attack == 'omniscient':
    honest_sum = alphas[~corrupted] @ updates[~corrupted]
    corrupt_sum = alphas[corrupted] @ updates[corrupted]
    out[corrupted] = -(2 * honest_sum + corrupt_sum) / alphas[corrupted].sum()
  elif attack in ('x100', 'x1000'):
    out[corrupted] *= float(attack[1:])
  else:
    raise ValueError(f'Unknown attack {attack!r}; known: {ATTACKS}.')
  return out


def _weights(points, alphas, v, nu=NU):
  return alphas / np.maximum(nu, np.linalg.norm(points - v, axis=1))


def weiszfeld_iterates(points, alphas, passes, start, nu=NU):
  """v⁽¹⁾, ..., v⁽ᴿ⁾ of the smoothed Weiszfeld algorithm (pass 1 = the start pass)."""
  if start == 'zero':
    beta = _weights(points, alphas, np.zeros(points.shape[1]), nu)
  else:
    beta = alphas
  iterates = [beta @ points / beta.sum()]
  for _ in range(passes - 1):
    beta = _weights(points, alphas, iterates[-1], nu)
    iterates.append(beta @ points / beta.sum())
  return iterates


def geometric_median(points, alphas, nu=NU, passes=100_000, tolerance=1e-15):
  """v*: Weiszfeld from the coordinate-wise median until the step is below
  `tolerance` × the smallest client distance scale."""
  v = np.median(points, axis=0)
  for _ in range(passes):
    beta = _weights(points, alphas, v, nu)
    proposal = beta @ points / beta.sum()
    step = np.linalg.norm(proposal - v)
    v = proposal
    if step * beta.sum() / alphas.sum() <= tolerance:
      break
  return v


def relative_gradients(points, alphas, iterates, nu=NU):
  """‖∇g_ν(v)‖/Σα at v⁽¹⁾, ..., v⁽ᴿ⁻¹⁾ (the factory's stopping criterion)."""
  out = []
  for v in iterates[:-1]:
    beta = _weights(points, alphas, v, nu)
    out.append(np.linalg.norm(beta @ (points - v)) / alphas.sum())
  return out


def objectives(points, alphas, iterates, nu=NU):
  out = []
  for v in iterates:
    d = np.linalg.norm(points - v, axis=1)
    out.append(np.sum(alphas * np.where(d > nu, d, d * d / (2 * nu) + nu / 2)))
  return out


def measure(points, alphas, start, max_passes=60, tolerance=1e-6):
  """Dict of the numbers the script prints for one start point."""
  v_star = geometric_median(points, alphas)
  scale = np.linalg.norm(v_star)
  iterates = weiszfeld_iterates(points, alphas, max_passes, start)
  distances = [np.linalg.norm(v - v_star) / scale for v in iterates]

  def first(threshold):
    return next((r + 1 for r, d in enumerate(distances) if d <= threshold), None)

  # Relative-gradient rule: the criterion at v⁽ʳ⁻¹⁾ decides on pass r; v⁽ʳ⁾ is kept.
  criteria = relative_gradients(points, alphas, iterates)
  frozen = next((r + 2 for r, c in enumerate(criteria) if c <= tolerance), None)
  # D.2.3 rule: g(v⁽ʳ⁻¹⁾) against g(v⁽ʳ⁻²⁾); v⁽ʳ⁻¹⁾ is kept.
  g = objectives(points, alphas, iterates)
  paper = next((r + 1 for r in range(1, len(g))
                if abs(g[r - 1] - g[r]) <= tolerance * g[r]), None)
  return dict(
      passes_2pct=first(0.02), passes_10pct=first(0.1), after_3=distances[2],
      frozen_pass=frozen, frozen_distance=distances[frozen - 1] if frozen else None,
      paper_frozen_pass=paper,
      paper_frozen_distance=distances[paper - 1] if paper else None)


def main(argv):
  del argv
  seeds = [int(s) for s in _SEEDS.value]
  print(f'{"attack":>10} {"start":>5} {"seed":>4} {"R(2%)":>6} {"R(10%)":>6} '
        f'{"dist@3":>9} {"freeze@":>7} {"dist":>9} {"D.2.3@":>6} {"dist":>9}')
  for attack in ATTACKS:
    for seed in seeds:
      updates, alphas = real_updates(seed, _STEPS.value)
      points = corrupt(updates, alphas, attack, seed)
      for start in STARTS:
        m = measure(points, alphas, start)
        fmt = lambda x: '-' if x is None else (f'{x:.2e}' if isinstance(x, float) else x)
        print(f'{attack:>10} {start:>5} {seed:>4} {fmt(m["passes_2pct"]):>6} '
              f'{fmt(m["passes_10pct"]):>6} {fmt(m["after_3"]):>9} '
              f'{fmt(m["frozen_pass"]):>7} {fmt(m["frozen_distance"]):>9} '
              f'{fmt(m["paper_frozen_pass"]):>6} {fmt(m["paper_frozen_distance"]):>9}')


if __name__ == '__main__':
  from absl import flags  # pylint: disable=g-import-not-at-top
  _SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Rounds (client draws) to measure.')
  _STEPS = flags.DEFINE_integer('local_steps', 5, 'Local SGD steps per client.')
  from tasks.binaries import exit_status  # pylint: disable=g-import-not-at-top
  exit_status.run(main)  # Stops the TFF worker that `main`'s task building starts.
