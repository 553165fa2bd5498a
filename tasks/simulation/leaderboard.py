"""The robustness leaderboard: every aggregator's worst case over attacks.

A leaderboard is a sweep (`tasks.simulation.sweep`) read differently: for each row
(an aggregator, with or without pre-aggregation wrappers and worker momentum) it keeps
the clean accuracy and, per corruption level ρ, the accuracy under the attack that hurt
it most. Rows are ranked by that worst case at the largest ρ, as ByzFL's benchmark
ranks its aggregators. The heatmap shows every (attack, ρ) cell.
"""

import math
from typing import Any, Sequence

import matplotlib
matplotlib.use('Agg')  # Files only; no display on a server.
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

from tasks.simulation import attacks
from tasks.simulation import sweep

# The README section the leaderboard binary rewrites.
README_BEGIN = '<!-- leaderboard:begin -->'
README_END = '<!-- leaderboard:end -->'

# Every aggregator of the registry ('gathered_gm' computes what 'gm' does); bucketing
# and NNM in front of the gathering baselines (the only ones they wrap: both transform
# the gathered updates; 'gm' there is the registry's gathering 'gathered_gm'); ARC,
# which wraps any factory, in front of the mean, GM, median and Krum.
_BASES = ['mean', 'gm', 'one_step_gm', 'gamma_mean', 'gma', 'median', 'trimmed_mean',
          'krum', 'multi_krum', 'norm_clipping', 'centered_clipping',
          'secure_centered_clipping']
_GATHERING = ['median', 'trimmed_mean', 'krum', 'multi_krum', 'centered_clipping', 'gm']
_CLIPPED = ['mean', 'gm', 'median', 'krum']
DEFAULT_AGGREGATORS = (_BASES + [f'bucketing+{name}' for name in _GATHERING] +
                       [f'nnm+{name}' for name in _GATHERING] +
                       [f'arc+{name}' for name in _CLIPPED])
# Every update attack but the non-finite ones (the filter in front of every
# aggregator drops those clients whatever the aggregator), and the label flip.
DEFAULT_ATTACKS = [name for name in attacks.UPDATE_ATTACKS
                   if name not in ('nan', 'inf')] + ['label_flip']


def worst_cases(summary: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """One row per aggregator label of a sweep summary (`sweep.summarize`).

  Each row has `aggregator`, `clean` (final accuracy at ρ = 0, NaN when not swept)
  and, per ρ > 0, `worst_rho<ρ>` (the lowest mean final accuracy over attacks; NaN
  if any attack's cell is missing) and `worst_attack_rho<ρ>`; `clean_cell` and
  `worst_cell_rho<ρ>` are those cells' summary rows (seed range, divergences), None
  when unknown. Sorted by the worst case at the largest ρ, best first.
  """
  rhos = sorted({row['rho'] for row in summary if row['rho'] > 0})
  rows = []
  for label in dict.fromkeys(row['aggregator'] for row in summary):
    cells = [row for row in summary if row['aggregator'] == label]
    clean = [row for row in cells if row['rho'] == 0]
    entry = dict(aggregator=label,
                 clean=clean[0]['final_accuracy_mean'] if clean else math.nan,
                 clean_cell=clean[0] if clean else None)
    for rho in rhos:
      by_attack = {row['attack']: row for row in cells if row['rho'] == rho}
      attack = min(by_attack,
                   key=lambda a: _nan_last(by_attack[a]['final_accuracy_mean']))
      missing = any(math.isnan(row['final_accuracy_mean'])
                    for row in by_attack.values())
      entry[f'worst_rho{rho:g}'] = (
          math.nan if missing else by_attack[attack]['final_accuracy_mean'])
      entry[f'worst_attack_rho{rho:g}'] = attack
      entry[f'worst_cell_rho{rho:g}'] = None if missing else by_attack[attack]
    rows.append(entry)
  if rhos:
    key = f'worst_rho{rhos[-1]:g}'
    rows.sort(key=lambda r: _nan_last(-r[key]))
  return rows


def _nan_last(value: float) -> float:
  """Sort key placing NaN (a missing or diverged cell) after every number."""
  return math.inf if math.isnan(value) else value


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
  """The worst-case table: aggregator, clean, worst accuracy (attack) per ρ; with
  several seeds each accuracy is "mean [min, max]" over them (`sweep.cell_text`)."""
  rhos = [key[len('worst_rho'):] for key in rows[0] if key.startswith('worst_rho')]
  header = ['rank', 'aggregator', 'clean'] + [f'worst case ρ={rho}' for rho in rhos]
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '|'.join(['---:', '---'] + ['---:'] * (len(header) - 2)) + '|']
  for rank, row in enumerate(rows, start=1):
    cells = [str(rank), row['aggregator'], sweep.cell_text(row['clean_cell'])]
    cells += [f'{sweep.cell_text(row[f"worst_cell_rho{rho}"])} '
              f'({row[f"worst_attack_rho{rho}"]})' for rho in rhos]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n'


def plot_heatmap(summary: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]],
                 path: str, title: str) -> None:
  """Final accuracy (%) of every aggregator (rows, in leaderboard order) under every
  attack and ρ (columns, the clean run first)."""
  columns = [('none', 0.0)] if any(r['rho'] == 0 for r in summary) else []
  columns += list(dict.fromkeys((r['attack'], r['rho']) for r in summary
                                if r['rho'] > 0))
  lookup = {(r['aggregator'], sweep.CLEAN if r['rho'] == 0 else r['attack'], r['rho']):
            r['final_accuracy_mean'] for r in summary}
  labels = [row['aggregator'] for row in rows]
  values = np.array([[100 * lookup.get((label, attack, rho), math.nan)
                      for attack, rho in columns] for label in labels])
  fig, ax = plt.subplots(figsize=(1.0 + 0.62 * len(columns), 1.2 + 0.32 * len(labels)))
  image = ax.imshow(np.ma.masked_invalid(values), cmap='RdYlGn', vmin=0, vmax=100,
                    aspect='auto')
  for (i, j), value in np.ndenumerate(values):
    ax.text(j, i, 'n/a' if math.isnan(value) else f'{value:.0f}', ha='center',
            va='center', fontsize=7)
  ax.set_xticks(range(len(columns)))
  ax.set_xticklabels(['clean' if rho == 0 else f'{attack} {rho:g}'
                      for attack, rho in columns], rotation=60, ha='right', fontsize=8)
  ax.set_yticks(range(len(labels)))
  ax.set_yticklabels(labels, fontsize=8)
  ax.set_xlabel('attack and corruption level ρ')
  ax.set_title(title, fontsize=10)
  fig.colorbar(image, ax=ax, label='final test accuracy (%)', shrink=0.8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
