"""A sweep's report: the summary over seeds (summary.csv, summary.md), its plots
(paper Figures 2 and 4) and the marked section of a page that shows it
(`tasks.simulation.sweep` lists the files)."""

import csv
import math
import os
from typing import Any, Mapping, Optional

import matplotlib
matplotlib.use('Agg')  # Files only; no display on a server.
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

from tasks.simulation import ledger
from tasks.simulation import metrics_file
from tasks.simulation import sweep

def summarize(spec: sweep.SweepSpec, output_dir: str,
              recorded: Optional[Mapping[str, ledger.Entry]] = None
              ) -> list[dict[str, Any]]:
  """One summary row per (variant, attack, rho), over seeds; `aggregator` is the
  variant's label (the aggregator's name, '+wmβ' with worker momentum β). A run
  that `recorded` holds (run name → ledger entry, see `sweep.recorded_results`) is
  read from there, any other from its directory in `output_dir`."""
  recorded = recorded or {}
  summary = []
  for variant in spec.variants():
    for attack in spec.attacks:
      for rho in spec.rhos:
        finals, diverged, failed, calls = [], 0, 0, []
        for seed in spec.seeds:
          run = spec.run_for_cell(variant, attack, rho, seed)
          if run.name in recorded:
            entry = recorded[run.name]
            finals.append(entry.final_accuracy)
            diverged += entry.diverged
            calls.append(entry.secure_average_calls_per_round)
            continue
          directory = sweep.run_dir(output_dir, run)
          rows = metrics_file.read_rows(directory)
          finals.append(metrics_file.final_accuracy(rows))
          diverged += os.path.exists(os.path.join(directory, sweep.DIVERGED_MARKER))
          failed += os.path.exists(os.path.join(directory, sweep.FAILED_MARKER))
          calls.extend(r['secure_average_calls'] for r in rows)
        values = np.array([v for v in finals if not math.isnan(v)])
        calls = [c for c in calls if not math.isnan(c)]
        summary.append(dict(
            aggregator=variant.label, attack=attack, rho=rho,
            final_accuracy_mean=values.mean() if values.size else math.nan,
            final_accuracy_min=values.min() if values.size else math.nan,
            final_accuracy_max=values.max() if values.size else math.nan,
            num_seeds=int(values.size), num_diverged=diverged,
            secure_average_calls_per_round=float(np.mean(calls)) if calls else math.nan,
            num_failed=failed))
  return summary



def write_summary(summary: list[dict[str, Any]], output_dir: str) -> str:
  """Writes summary.csv and summary.md; returns the markdown table."""
  os.makedirs(output_dir, exist_ok=True)
  with open(os.path.join(output_dir, 'summary.csv'), 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(summary[0]))
    writer.writeheader()
    writer.writerows(summary)
  markdown = markdown_table(summary)
  with open(os.path.join(output_dir, 'summary.md'), 'w') as f:
    f.write(markdown)
  return markdown



def cell_text(row: Optional[Mapping[str, Any]]) -> str:
  """A summary row as a table cell: "mean [min, max]" in %, "(k diverged)" when
  some seeds diverged, "(k failed)" when some failed; "failed" when every seed
  failed, "n/a" for a missing or unfinished cell."""
  failed = row.get('num_failed', 0) if row is not None else 0
  if row is None or math.isnan(row['final_accuracy_mean']):
    return 'failed' if failed else 'n/a'
  text = f'{100 * row["final_accuracy_mean"]:.1f}'
  if row['num_seeds'] > 1:
    text += (f' [{100 * row["final_accuracy_min"]:.1f}, '
             f'{100 * row["final_accuracy_max"]:.1f}]')
  if row['num_diverged']:
    text += f' ({row["num_diverged"]} diverged)'
  if failed:
    text += f' ({failed} failed)'
  return text



def markdown_table(summary: list[dict[str, Any]]) -> str:
  """Rows: aggregators; columns: ρ = 0, then attack × ρ > 0; final test accuracy (%)."""
  aggregators = list(dict.fromkeys(r['aggregator'] for r in summary))
  columns = [('none', 0.0)] if any(r['rho'] == 0 for r in summary) else []
  columns += list(dict.fromkeys((r['attack'], r['rho']) for r in summary if r['rho'] > 0))
  lookup = {}
  for row in summary:
    lookup[(row['aggregator'], 'none' if row['rho'] == 0 else row['attack'],
            row['rho'])] = row
  header = ['aggregator'] + [('clean ρ=0' if rho == 0 else f'{attack} ρ={rho:g}')
                             for attack, rho in columns]
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '|'.join(['---'] + ['---:'] * len(columns)) + '|']
  for aggregator in aggregators:
    cells = [cell_text(lookup[(aggregator, attack, rho)]) for attack, rho in columns]
    lines.append('| ' + ' | '.join([aggregator] + cells) + ' |')
  return '\n'.join(lines) + '\n'



def plot_accuracy_vs_rho(summary, spec: sweep.SweepSpec, path: str,
                         title: str = '') -> None:
  """Final accuracy vs ρ, one panel per attack, min–max error band over seeds."""
  fig, axes = plt.subplots(1, len(spec.attacks), figsize=(5 * len(spec.attacks), 4),
                           squeeze=False, sharey=True)
  for ax, attack in zip(axes[0], spec.attacks):
    for variant in spec.variants():
      rows = sorted((r for r in summary if r['aggregator'] == variant.label and
                     r['attack'] == attack), key=lambda r: r['rho'])
      rhos = [r['rho'] for r in rows]
      mean = [r['final_accuracy_mean'] for r in rows]
      line, = ax.plot(rhos, mean, marker='o', label=variant.label)
      ax.fill_between(rhos, [r['final_accuracy_min'] for r in rows],
                      [r['final_accuracy_max'] for r in rows], alpha=0.2,
                      color=line.get_color())
    ax.set_title(f'{attack} corruption')
    ax.set_xlabel('corruption level ρ')
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel('final test accuracy')
  axes[0][-1].legend(fontsize='small')
  if title:
    fig.suptitle(f'{title}: mean and min–max over seeds {_seed_list(spec)}')
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)



def _curves(output_dir, spec, variant, attack, rho, x_column):
  """x values and the per-seed accuracy curves on the evaluated rounds."""
  curves = []
  for seed in spec.seeds:
    directory = sweep.run_dir(output_dir, spec.run_for_cell(variant, attack, rho, seed))
    rows = [r for r in metrics_file.read_rows(directory)
            if not math.isnan(r['test_accuracy'])]
    curves.append(([r[x_column] for r in rows], [r['test_accuracy'] for r in rows]))
  return curves



def plot_curves(output_dir: str, spec: sweep.SweepSpec, attack: str, rho: float,
                path: str, title: str = '') -> None:
  """Accuracy vs rounds and vs cumulative secure-average calls (paper Figure 4)."""
  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  for ax, (x_column, label) in zip(axes, [
      ('round', 'rounds'),
      ('cumulative_secure_average_calls', 'calls to the secure average oracle')]):
    for variant in spec.variants():
      curves = [c for c in _curves(output_dir, spec, variant, attack, rho, x_column)
                if c[0]]
      if not curves:
        continue
      length = min(len(c[0]) for c in curves)  # Diverged seeds stop early.
      x = np.array(curves[0][0][:length])
      y = np.array([c[1][:length] for c in curves])
      line, = ax.plot(x, y.mean(axis=0), label=variant.label)
      ax.fill_between(x, y.min(axis=0), y.max(axis=0), alpha=0.2,
                      color=line.get_color())
    ax.set_xlabel(label)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel('test accuracy')
  axes[1].legend(fontsize='small')
  setting = 'no corruption' if rho == 0 else f'{attack} corruption, ρ = {rho:g}'
  fig.suptitle(f'{title}: {setting}' if title else setting)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)



def _seed_list(spec: sweep.SweepSpec) -> str:
  return ','.join(str(seed) for seed in spec.seeds)



def write_report(spec: sweep.SweepSpec, output_dir: str, title: str = '') -> str:
  """Summary table (csv, md) and plots (titled `title`, e.g. the task, when given);
  returns the markdown table."""
  summary = summarize(spec, output_dir)
  markdown = write_summary(summary, output_dir)
  plot_accuracy_vs_rho(summary, spec, os.path.join(output_dir, 'accuracy_vs_rho.png'),
                       title)
  for attack, rho in spec.cells():
    plot_curves(output_dir, spec, attack if rho else spec.attacks[0], rho,
                os.path.join(output_dir, f'curves_{attack}_rho{rho:g}.png'), title)
  return markdown



def report_files(spec: sweep.SweepSpec) -> list[str]:
  """The names of the files `write_report` writes in the output directory."""
  return (['summary.csv', 'summary.md', 'accuracy_vs_rho.png'] +
          [f'curves_{attack}_rho{rho:g}.png' for attack, rho in spec.cells()])


README_BEGIN = '<!-- main_job:begin -->'
README_END = '<!-- main_job:end -->'



def update_marked_section(path: str, page: str, begin: str = README_BEGIN,
                          end: str = README_END) -> bool:
  """Replaces the text of file `path` between the markers `begin` and `end` by
  `page`; False (file untouched) when the markers are missing."""
  with open(path, encoding='utf-8') as f:
    text = f.read()
  start, stop = text.find(begin), text.find(end)
  if start < 0 or stop < start:
    return False
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text[:start + len(begin)] + '\n' + page.rstrip() + '\n' + text[stop:])
  return True
