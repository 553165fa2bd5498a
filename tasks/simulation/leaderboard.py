"""The robustness leaderboard: every aggregator's worst case over attacks.

A leaderboard is a sweep (`tasks.simulation.sweep`) read differently: for each row
(an aggregator, with or without pre-aggregation wrappers and worker momentum) it keeps
the clean accuracy and, per corruption level ρ, the accuracy under the attack that hurt
it most. Rows are ranked by that worst case at the largest ρ, as ByzFL's benchmark
ranks its aggregators. The heatmap shows every (attack, ρ) cell.

The grid's names are known without TensorFlow but for `default_aggregators()`, which
builds the factories to see what each wrapper takes (`registry.wrappable`; so does
reading `DEFAULT_AGGREGATORS`, its value).
"""

import math
from typing import Any, Sequence

import numpy as np

from tasks import catalog
from tasks import registry
from tasks.simulation import attacks

# The README section the leaderboard binary rewrites.
README_BEGIN = '<!-- leaderboard:begin -->'
README_END = '<!-- leaderboard:end -->'

# The default grid is derived from the registries, never listed: every aggregator of
# `tasks.registry`, plain and then behind each wrapper (in `registry.WRAPPERS` order)
# in front of every aggregator it takes (`registry.wrappable`: bucketing and NNM the
# gathering baselines, 'gm' there as 'gathered_gm'; ARC any), and every update attack
# (`attacks.UPDATE_ATTACKS` order), then the data attacks of the leaderboard's task;
# all but the names below, each left out for the reason given. A name left out plain
# is left out behind every wrapper too. A newly registered aggregator, wrapper or
# attack is in the grid unless it is added here.
_ARC_ROWS = ('ARC, which wraps any aggregator, is shown in front of one aggregator of '
             'each kind only (the mean, the GM, the median and Krum), to bound the grid')
_TRUST_ROWS = ('the trust region, which wraps any aggregator, bounds the breakdown of '
               'the GM and one-step RFA only (rounds with a corrupted majority), to '
               'bound the grid')
EXCLUDED_AGGREGATORS = {
    'gathered_gm': "computes what 'gm' does, with the updates gathered at the server; "
                   "it is the grid's 'gm' behind bucketing and NNM",
    'gamma_mean_diagonal': "the γ-mean with a diagonal covariance, a variant of "
                           "'gamma_mean', which has the grid's γ-mean row",
    'arc+one_step_gm': _ARC_ROWS,
    'arc+gamma_mean': _ARC_ROWS,
    'arc+gma': _ARC_ROWS,
    'arc+trimmed_mean': _ARC_ROWS,
    'arc+multi_krum': _ARC_ROWS,
    'arc+norm_clipping': _ARC_ROWS,
    'arc+centered_clipping': _ARC_ROWS,
    'arc+secure_centered_clipping': _ARC_ROWS,
    **{f'trust+{name}': _TRUST_ROWS for name in (
        'mean', 'gamma_mean', 'gma', 'median', 'trimmed_mean', 'krum', 'multi_krum',
        'norm_clipping', 'centered_clipping', 'secure_centered_clipping')},
}
_NON_FINITE = ('a client fault, not an attack: the filter in front of every '
               'aggregator drops such clients whatever the aggregator')
_WEIGHT_ATTACKS = ('a weight attack (a corrupted client reports its weight): measured '
                   'against the weight cap in benchmarks/weight_attacks.py, beside '
                   'the update-only grid')
EXCLUDED_ATTACKS = {
    'nan': _NON_FINITE,
    'inf': _NON_FINITE,
    'data': "EMNIST's negative images (the RFA paper's data corruption); the grid's "
            'data attack is label flipping',
    'weight_inflation': _WEIGHT_ATTACKS,
    'adaptive_weight': _WEIGHT_ATTACKS,
}
# The data attacks of the task in the default grid (the binary's default --task).
TASK_DATA_ATTACKS = dict.fromkeys(catalog.TASKS['emnist']['data_attacks'])


def candidate_aggregators() -> list[str]:
  """Every aggregator name of the registry, plain and behind each wrapper in front of
  every aggregator it takes, in the grid's order (before `EXCLUDED_AGGREGATORS`)."""
  return list(registry.known_aggregators()) + [
      f'{wrapper}{registry.SEPARATOR}{name}' for wrapper in registry.known_wrappers()
      for name in registry.wrappable(wrapper)]


def default_aggregators() -> list[str]:
  """`candidate_aggregators()` but `EXCLUDED_AGGREGATORS` (a name excluded plain is
  excluded behind every wrapper too)."""
  return [name for name in candidate_aggregators()
          if name not in EXCLUDED_AGGREGATORS
          and registry.split_name(name)[1] not in EXCLUDED_AGGREGATORS]


def candidate_attacks() -> list[str]:
  """Every update attack, then the data attacks of `TASK_DATA_ATTACKS`."""
  return [*attacks.UPDATE_ATTACKS, *TASK_DATA_ATTACKS]


def default_attacks() -> list[str]:
  """`candidate_attacks()` but `EXCLUDED_ATTACKS`."""
  return [name for name in candidate_attacks() if name not in EXCLUDED_ATTACKS]


DEFAULT_ATTACKS = default_attacks()


def __getattr__(name):
  if name == 'DEFAULT_AGGREGATORS':
    return default_aggregators()
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def worst_cases(summary: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """One row per aggregator label of a sweep summary (`sweep_report.summarize`).

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
  several seeds each accuracy is "mean [min, max]" over them (`sweep_report.cell_text`)."""
  from tasks.simulation import sweep_report  # pylint: disable=g-import-not-at-top
  rhos = [key[len('worst_rho'):] for key in rows[0] if key.startswith('worst_rho')]
  header = ['rank', 'aggregator', 'clean'] + [f'worst case ρ={rho}' for rho in rhos]
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '|'.join(['---:', '---'] + ['---:'] * (len(header) - 2)) + '|']
  for rank, row in enumerate(rows, start=1):
    cells = [str(rank), row['aggregator'], sweep_report.cell_text(row['clean_cell'])]
    cells += [f'{sweep_report.cell_text(row[f"worst_cell_rho{rho}"])} '
              f'({row[f"worst_attack_rho{rho}"]})' for rho in rhos]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n'


def plot_heatmap(summary: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]],
                 path: str, title: str) -> None:
  """Final accuracy (%) of every aggregator (rows, in leaderboard order) under every
  attack and ρ (columns, the clean run first)."""
  # pylint: disable=g-import-not-at-top
  import matplotlib
  matplotlib.use('Agg')  # Files only; no display on a server.
  import matplotlib.pyplot as plt
  from tasks.simulation import sweep
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
