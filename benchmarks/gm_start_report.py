"""The table and choice of the GM start study (`benchmarks.gm_start_study`): flag free,
so tests import it without the study's absl flags."""

import math

from tasks.simulation import sweep_report


def study_table(summaries: dict, clean_margin: float, incumbent: str = '',
                worst_case_margin: float = 0.0) -> tuple[str, str]:
  """(markdown table, decision) from {start: sweep summary rows}; the `incumbent`
  start (the current default) is kept unless another beats its worst case by more
  than `worst_case_margin` points."""
  any_rows = next(iter(summaries.values()))
  attacked = list(dict.fromkeys((r['attack'], r['rho']) for r in any_rows
                                if r['rho'] > 0))
  has_clean = any(r['rho'] == 0 for r in any_rows)
  header = ['initial_point'] + (['clean ρ=0'] if has_clean else []) + [
      f'{attack} ρ={rho:g}' for attack, rho in attacked] + ['worst case']
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '|'.join(['---'] + ['---:'] * (len(header) - 1)) + '|']
  clean, worst = {}, {}
  for start, rows in summaries.items():
    by_cell = {('none', 0.0) if r['rho'] == 0 else (r['attack'], r['rho']): r
               for r in rows}
    cells = [sweep_report.cell_text(by_cell.get(('none', 0.0)))] if has_clean else []
    cells += [sweep_report.cell_text(by_cell.get(cell)) for cell in attacked]
    means = [by_cell[c]['final_accuracy_mean'] for c in attacked if c in by_cell]
    worst[start] = 100 * min(means) if means else math.nan
    clean[start] = (100 * by_cell[('none', 0.0)]['final_accuracy_mean']
                    if has_clean else math.nan)
    lines.append('| ' + ' | '.join([start] + cells + [f'{worst[start]:.1f}']) + ' |')
  table = '\n'.join(lines) + '\n'
  return table, _decision(clean, worst, clean_margin, incumbent, worst_case_margin)


def _decision(clean: dict, worst: dict, clean_margin: float, incumbent: str,
              worst_case_margin: float) -> str:
  finite_clean = [v for v in clean.values() if not math.isnan(v)]
  best_clean = max(finite_clean) if finite_clean else math.nan
  eligible = [s for s in worst if math.isnan(best_clean) or
              clean[s] >= best_clean - clean_margin]
  eligible = [s for s in eligible if not math.isnan(worst[s])]
  if not eligible:
    return 'No start has a worst case (no attacked runs finished).'
  best = max(eligible, key=lambda s: worst[s])
  # A default changes only on a difference larger than the seeds' noise.
  keeps = (incumbent in eligible and best != incumbent
           and worst[best] - worst[incumbent] <= worst_case_margin)
  chosen = incumbent if keeps else best
  kept = (f', kept: {best!r} is not better by more than {worst_case_margin:g} points'
          if keeps else '')
  return (f'Best worst case among starts within {clean_margin:g} points of the best '
          f'clean accuracy ({best_clean:.1f}): {chosen!r} ({worst[chosen]:.1f}; '
          + ', '.join(f'{s} {worst[s]:.1f}' for s in worst) + f'){kept}.')
