"""The tables and plot of the Figure-6 generator (`benchmarks.personalization`): flag
free, so tests import it without the generator's absl flags."""

import collections

import matplotlib
matplotlib.use('Agg')  # Files only; no display on a server.
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

NAME = 'fig6_personalization'
AGGREGATORS = (('mean', 'FedAvg'), ('gm', 'RFA'))
METHOD_LABELS = {'ditto': 'Ditto', 'personalized_rfa': 'Alg. 4'}
# The paper's EMNIST-linear numbers stated in Section 5.3 (%); None: only in the plot.
PAPER = {('FedAvg', 0.0): 64.3, ('RFA', 0.0): 62.9, ('RFA', 0.25): 52.8,
         ('FedAvg + Alg. 4', 0.0): 70.1, ('RFA + Alg. 4', 0.0): 69.9,
         ('RFA + Alg. 4', 0.25): 66.4}


def line_values(run: dict) -> dict[str, float]:
  """Figure lines (name → accuracy %) measured by one run."""
  base = dict(AGGREGATORS)[run['aggregator']]
  values = {f'{base} + {METHOD_LABELS[run["method"]]}':
            100 * run['personalized/accuracy_mean']}
  if run['method'] == 'ditto':  # Ditto leaves the global model's training unchanged.
    values[base] = 100 * run['global_per_client/accuracy_mean']
  return values


def summarize(runs: list[dict]) -> dict[str, dict[float, tuple[float, float, float]]]:
  """line → ρ → (mean, min, max) over seeds."""
  values = collections.defaultdict(lambda: collections.defaultdict(list))
  for run in runs:
    for line, value in line_values(run).items():
      values[line][run['rho']].append(value)
  return {line: {rho: (float(np.mean(v)), float(np.min(v)), float(np.max(v)))
                 for rho, v in sorted(by_rho.items())}
          for line, by_rho in values.items()}


def line_order(summary) -> list[str]:
  order = [base for _, base in AGGREGATORS]
  order += [f'{base} + {label}' for label in METHOD_LABELS.values()
            for _, base in AGGREGATORS]
  return [line for line in order if line in summary]


def plot(summary, num_seeds: int, num_clients: int, path: str) -> None:
  styles = {'FedAvg': ('tab:blue', '--'), 'RFA': ('tab:red', '--'),
            'FedAvg + Ditto': ('tab:blue', '-'), 'RFA + Ditto': ('tab:red', '-'),
            'FedAvg + Alg. 4': ('tab:cyan', ':'), 'RFA + Alg. 4': ('tab:orange', ':')}
  fig, ax = plt.subplots(figsize=(6.4, 4.4))
  for line in line_order(summary):
    rhos = sorted(summary[line])
    mean, low, high = (np.array([summary[line][r][i] for r in rhos]) for i in range(3))
    color, style = styles[line]
    ax.plot(rhos, mean, style, color=color, marker='o', label=line)
    ax.fill_between(rhos, low, high, color=color, alpha=0.15)
  ax.set_xlabel('corruption level ρ (data corruption, x → 1 − x)')
  ax.set_ylabel('accuracy % (mean over benign clients,\nown held-out data)')
  ax.set_title(f'Personalization under data corruption, EMNIST-linear\n'
               f'(bundled MNIST, {num_clients} clients; mean and min–max over '
               f'{num_seeds} seeds)', fontsize=10)
  ax.set_xticks(sorted({r for line in summary for r in summary[line]}))
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8, loc='lower left')
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _cell(value: tuple[float, float, float]) -> str:
  return f'{value[0]:.1f} [{value[1]:.1f}, {value[2]:.1f}]'


def markdown(summary, sweep: dict[float, float], chosen: float, command: str,
             minutes: float, num_seeds: int, num_clients: int,
             validation_fraction: float) -> str:
  rhos = sorted({r for line in summary for r in summary[line]})
  header = ['| model | ' + ' | '.join(f'ρ={r:g} ours | ρ={r:g} paper' for r in rhos)
            + ' |', '|---|' + '---:|---:|' * len(rhos)]
  rows = []
  for line in line_order(summary):
    cells = []
    for rho in rhos:
      paper = PAPER.get((line, rho))
      cells += [_cell(summary[line][rho]) if rho in summary[line] else '',
                '' if paper is None else f'{paper:.1f}']
    rows.append(f'| {line} | ' + ' | '.join(cells) + ' |')
  sweep_rows = ['| λ | validation accuracy % |', '|---:|---:|'] + [
      f'| {lam:g}{" (chosen)" if lam == chosen else ""} | {100 * acc:.1f} |'
      for lam, acc in sweep.items()]
  return '\n'.join([
      f'# RFA paper Figure 6 on bundled MNIST ({num_clients} clients)', '',
      f'Command ({minutes:.1f} minutes wall time):', '', f'    {command}', '',
      f'Accuracy %: mean over benign clients of their own held-out accuracy, mean '
      f'[min, max] over {num_seeds} seeds. Data corruption x → 1 − x. Paper: EMNIST '
      'linear, numbers stated in its Section 5.3 (blank: only in its plot). "Alg. 4" '
      'is the paper\'s personalized RFA, the personalization of its Figure 6.', '',
      *header, *rows, '',
      f"Ditto's λ, chosen on a per-client validation split ({validation_fraction:g}"
      ' of each client\'s training data), FedAvg + Ditto, ρ = 0, first seed:', '',
      *sweep_rows, ''])
