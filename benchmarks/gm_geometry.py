r"""The geometric median's starts against the exact median, wherever the clients are.

Runs `tff_robust.GeometricMedianFactory` (3 inner-mean calls) with each start — the
default 'trimmed', 'zero' (the default before it), the paper's Algorithm 2 ('mean'
with ν = 1e-6) — and one-step RFA, on two grids, against the float64 exact geometric
median (Weiszfeld to convergence):

*   Geometry: honest clients N(c, I) in d = 10 (100 clients), corrupted ones at a
    geometry of their own; the distance of each result to the honest mean in honest
    RMS spreads s, and the worst ratio to the bound 2 × exact + 0.1 s over the
    breakdown grid (ρ ∈ {0.1, 0.25, 0.4} × 5 geometries × shifts {0, 10, 100} s).
*   Real updates: EMNIST-linear deltas of 20 bundled clients
    (`benchmarks.gm_start_point`), clean and with 5 corrupted (omniscient, ×100,
    ×1000): the distance to the exact median relative to its norm.

  .venv/bin/python -m benchmarks.gm_geometry --output=results/gm_geometry.md
"""

import itertools
import sys

from absl import app
from absl import flags
import numpy as np

_OUTPUT = flags.DEFINE_string('output', '', 'Also write the markdown page here.')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds of the real-update grid.')

METHODS = ('exact', 'trimmed', 'zero', 'paper', 'one_step')
HEADERS = dict(exact='exact GM', trimmed="default ('trimmed')",
               zero="'zero' (old default)", paper="paper (Alg. 2, ν = 1e-6)",
               one_step='one-step RFA')
GEOMETRIES = ('zero', 'far_point', 'near_cloud', 'huge', 'opposite')


def _processes(dimension):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  import tff_robust  # pylint: disable=g-import-not-at-top
  factories = dict(
      trimmed=tff_robust.GeometricMedianFactory(),
      zero=tff_robust.GeometricMedianFactory(initial_point='zero'),
      paper=tff_robust.GeometricMedianFactory(
          nu=tff_robust.aggregators.geometric_median.PAPER_NU, initial_point='mean'),
      one_step=tff_robust.one_step_geometric_median_factory())
  return {name: factory.create(tff.TensorType(np.float32, [dimension]),
                               tff.TensorType(np.float32))
          for name, factory in factories.items()}


def _results(processes, points, alphas):
  from tasks import references  # pylint: disable=g-import-not-at-top
  results = {'exact': references.exact_geometric_median(points, alphas)}
  for name, process in processes.items():
    output = process.next(process.initialize(), [p.astype(np.float32) for p in points],
                          [np.float32(a) for a in alphas])
    results[name] = np.asarray(output.result, np.float64)
  return results


def _geometry_case(kind, rho, shift, num_clients=100, dimension=10, seed=0):
  """(points, honest mean, s), as `tests/tff_robust/aggregators/test_gm_equivariance`."""
  rng = np.random.default_rng(seed)
  num_corrupted = int(round(rho * num_clients))
  honest = rng.standard_normal((num_clients - num_corrupted, dimension))
  s = np.sqrt(np.mean(np.sum((honest - honest.mean(axis=0)) ** 2, axis=1)))
  honest += shift * s * np.eye(dimension)[0]
  center, away = honest.mean(axis=0), np.eye(dimension)[1]
  corrupted = {
      'zero': lambda: np.zeros((num_corrupted, dimension)),
      'far_point': lambda: np.tile(center + 100 * s * away, (num_corrupted, 1)),
      'near_cloud': lambda: center + 10 * s * away + rng.standard_normal(
          (num_corrupted, dimension)),
      'huge': lambda: np.tile(center + 1e30 * away, (num_corrupted, 1)),
      'opposite': lambda: -5.0 * honest[:num_corrupted],
  }[kind]()
  return np.vstack([honest, corrupted]), center, s


def geometry_page():
  processes = _processes(10)
  rows, worst = [], {m: 0.0 for m in METHODS if m != 'exact'}
  named = [('zero', 0.25, 10), ('zero', 0.4, 10), ('far_point', 0.4, 100),
           ('near_cloud', 0.4, 0), ('huge', 0.25, 100)]
  for kind, rho, shift in itertools.product(GEOMETRIES, (0.1, 0.25, 0.4), (0, 10, 100)):
    points, center, s = _geometry_case(kind, rho, shift)
    results = _results(processes, points, np.ones(len(points)))
    distance = {m: np.linalg.norm(r - center) / s for m, r in results.items()}
    bound = 2 * distance['exact'] + 0.1
    for m in worst:
      worst[m] = max(worst[m], distance[m] / bound)
    if (kind, rho, shift) in named:
      rows.append(f'| {kind}, ρ = {rho}, honest mean {shift} s from 0 | ' +
                  ' | '.join(f'{distance[m]:.3g}' for m in METHODS) + ' |')
  # Translation: 16 honest + 4 in a cloud 10 s away, every coordinate shifted by 1e3.
  points, _, s = _geometry_case('near_cloud', 0.2, 0, num_clients=20)
  base = _results(processes, points, np.ones(20))
  shifted = _results(processes, points + 1e3, np.ones(20))
  rows.append('| shift every coordinate by 1e3: ‖r(X + c) − c − r(X)‖ / s | ' + ' | '.join(
      f'{np.linalg.norm(shifted[m] - 1e3 - base[m]) / s:.2g}' for m in METHODS) + ' |')
  # A client with 60% of the weight, 5 s away: the exact weighted median.
  rng = np.random.default_rng(6)
  others = rng.standard_normal((20, 10))
  s = np.sqrt(np.mean(np.sum((others - others.mean(axis=0)) ** 2, axis=1)))
  points = np.vstack([others, others.mean(axis=0) + 5 * s * np.eye(10)[0]]) + 10 * s
  results = _results(processes, points, np.r_[np.full(20, 0.02), 0.6])
  rows.append('| one client with 60% of the weight, 5 s away: distance to it / s | ' +
              ' | '.join(f'{np.linalg.norm(results[m] - points[-1]) / s:.2g}'
                         for m in METHODS) + ' |')
  rows.append('| **worst ratio to 2 × exact + 0.1 s over the breakdown grid** | – | ' +
              ' | '.join(f'**{worst[m]:.2f}**' for m in METHODS if m != 'exact') + ' |')
  header = ('| case (distance to the honest mean, in s) | ' +
            ' | '.join(HEADERS[m] for m in METHODS) + ' |\n|---|' + '---:|' * len(METHODS))
  return header + '\n' + '\n'.join(rows)


def real_update_page(seeds):
  """Two tables: the distance to the honest clients' weighted mean in their RMS
  spread s (what robustness asks), and to the exact median relative to its norm
  (how well 3 passes compute it); the max over seeds."""
  from benchmarks import gm_start_point  # pylint: disable=g-import-not-at-top
  processes = _processes(gm_start_point.PIXELS * gm_start_point.NUM_CLASSES +
                         gm_start_point.NUM_CLASSES)
  attacks = ('clean',) + gm_start_point.ATTACKS
  to_honest = {(a, m): [] for a in attacks for m in METHODS}
  to_median = {(a, m): [] for a in attacks for m in METHODS}
  for seed in seeds:
    clean, alphas = gm_start_point.real_updates(seed)
    honest = ~gm_start_point.corrupted_clients(len(alphas), seed)
    center = np.average(clean[honest], axis=0, weights=alphas[honest])
    s = np.sqrt(np.average(np.sum((clean[honest] - center) ** 2, axis=1),
                           weights=alphas[honest]))
    for attack in attacks:
      points = clean if attack == 'clean' else gm_start_point.corrupt(
          clean, alphas, attack, seed)
      results = _results(processes, points, alphas)
      norm = np.linalg.norm(results['exact'])
      for m in METHODS:
        to_honest[(attack, m)].append(np.linalg.norm(results[m] - center) / s)
        to_median[(attack, m)].append(np.linalg.norm(results[m] - results['exact']) / norm)

  def table(title, values, methods):
    header = (f'| {title} | ' + ' | '.join(HEADERS[m] for m in methods) + ' |\n|---|' +
              '---:|' * len(methods))
    rows = [f'| {a} | ' + ' | '.join(f'{max(values[(a, m)]):.2g}' for m in methods) +
            ' |' for a in attacks]
    return header + '\n' + '\n'.join(rows)

  return '\n\n'.join([
      table('distance to the honest mean / s (max over seeds)', to_honest, METHODS),
      table('‖r − GM‖ / ‖GM‖ (max over seeds)', to_median, METHODS[1:])])


def main(argv):
  del argv
  from tff_robust.distributed import runtime  # pylint: disable=g-import-not-at-top
  with runtime.worker_binaries_stopped():
    seeds = [int(s) for s in _SEEDS.value]
    page = '\n\n'.join([
        '# Geometric median: the starts against the exact median',
        'Written by `python -m benchmarks.gm_geometry --output=results/gm_geometry.md` '
        '(3 inner-mean calls each; s is the honest clients\' RMS spread).',
        '## Synthetic geometries (100 clients, d = 10)', geometry_page(),
        f'## Real EMNIST-linear updates (20 clients, 5 corrupted; seeds {seeds})',
        real_update_page(seeds)]) + '\n'
  print(page)
  if _OUTPUT.value:
    with open(_OUTPUT.value, 'w') as f:
      f.write(page)


if __name__ == '__main__':
  sys.exit(app.run(main))
