r"""Sweeps aggregators × attacks × corruption levels × seeds on one task.

  python -m tasks.sweep --task=emnist --model=linear --data_source=bundled \
      --aggregators=mean,gm,median --attacks=omniscient,data --rhos=0,0.1,0.25 \
      --seeds=0,1 --rounds=30 --clients_per_round=20 --output_dir=runs/sweep

(or the console script `tff_robust_sweep`). Every run is a `tasks.experiment` run in
`<output_dir>/runs/<aggregator>_<attack>_rho<rho>_seed<seed>/` (metrics.csv,
checkpoints): a sweep restarted with the same flags skips finished runs and resumes
an interrupted one. ρ = 0 is run once per aggregator and seed (attack 'none') and
shared by every attack's panel. The task data (client partition) is built once, with
--data_seed; --seeds vary the model initialization, the corrupted set and the client
sampling (RFA paper D.3: "repeated with different random seeds").

Outputs in <output_dir>:
  summary.csv       aggregator, attack, rho, final_accuracy_mean/min/max over seeds,
                    num_seeds, num_diverged, secure_average_calls_per_round
  summary.md        the same as a markdown table (rows: aggregators; columns:
                    attack × rho; cells "mean [min, max]" in %)
  accuracy_vs_rho.png                       one panel per attack (paper Figure 2)
  curves_<attack>_rho<rho>.png              accuracy vs rounds and vs cumulative
                                            secure-average calls, min–max shading
                                            over seeds (paper Figure 4)
A run whose model becomes non-finite is stopped, marked `DIVERGED` in its directory
and reported in `num_diverged`; its final accuracy is its last evaluated one.
"""

import csv
import dataclasses
import math
import os
import sys
from typing import Any, Callable, Mapping, Optional, Sequence

from absl import app
from absl import flags
import matplotlib
matplotlib.use('Agg')  # Files only; no display on a server.
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

import tff_robust  # pylint: disable=unused-import  (stops TFF's worker_binary at exit)
from baselines import registry
from tasks import common_flags
from tasks import corruption
from tasks import experiment
from tasks import simulation

FLAGS = flags.FLAGS
DIVERGED_MARKER = 'DIVERGED'
CLEAN = 'none'


@dataclasses.dataclass(frozen=True)
class Run:
  """One cell of the sweep."""
  aggregator: str
  attack: str
  rho: float
  seed: int

  @property
  def name(self) -> str:
    return f'{self.aggregator}_{self.attack}_rho{self.rho:g}_seed{self.seed}'


@dataclasses.dataclass
class SweepSpec:
  """What to sweep and how every run trains.

  Attributes:
    aggregators: Names of `baselines.registry`.
    attacks: Names of `tasks.corruption.ATTACKS` (not 'none': ρ = 0 is the clean run).
    rhos: Corruption levels in [0, 0.5).
    seeds: Run seeds.
    rounds: Rounds per run.
    eval_period: Evaluate every this many rounds.
    aggregator_args: aggregator name → keyword arguments.
    simulation_kwargs: `FederatedSimulation` keyword arguments shared by all runs
      (clients_per_round, client_learning_rate, server_optimizer, attack_params,
      eval_max_examples), without attack, rho and seed.
  """
  aggregators: Sequence[str]
  attacks: Sequence[str]
  rhos: Sequence[float]
  seeds: Sequence[int]
  rounds: int
  eval_period: int = 1
  aggregator_args: Mapping[str, Mapping[str, Any]] = dataclasses.field(
      default_factory=dict)
  simulation_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def runs(self) -> list[Run]:
    """Every run, ρ = 0 once per aggregator and seed."""
    runs = []
    for aggregator in self.aggregators:
      for seed in self.seeds:
        if 0.0 in self.rhos:
          runs.append(Run(aggregator, CLEAN, 0.0, seed))
        runs.extend(Run(aggregator, attack, rho, seed) for attack in self.attacks
                    for rho in self.rhos if rho > 0)
    return runs

  def run_for_cell(self, aggregator: str, attack: str, rho: float, seed: int) -> Run:
    return Run(aggregator, CLEAN, 0.0, seed) if rho == 0 else Run(
        aggregator, attack, rho, seed)


def run_dir(output_dir: str, run: Run) -> str:
  return os.path.join(output_dir, 'runs', run.name)


def run_sweep(task, spec: SweepSpec, output_dir: str, progress: bool = True,
              log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> None:
  """Runs (or resumes) every run of `spec` on `task`, sequentially, in-process."""
  runs = spec.runs()
  for index, run in enumerate(runs, start=1):
    directory = run_dir(output_dir, run)
    label = f'[{index}/{len(runs)}] {run.name}'
    if os.path.exists(os.path.join(directory, DIVERGED_MARKER)):
      log(f'{label}: diverged in an earlier session, skipped.')
      continue
    if experiment.finished_rounds(directory) >= spec.rounds:
      log(f'{label}: finished, skipped.')
      continue
    factory = registry.aggregator_from_name(
        run.aggregator, **spec.aggregator_args.get(run.aggregator, {}))
    sim = simulation.FederatedSimulation(task, factory, attack=run.attack, rho=run.rho,
                                         seed=run.seed, **spec.simulation_kwargs)
    config = dict(run=run.name, task=task.name,
                  aggregator_args=spec.aggregator_args.get(run.aggregator, {}),
                  **{k: v for k, v in spec.simulation_kwargs.items()
                     if k != 'server_optimizer'})
    try:
      experiment.run_experiment(sim, directory, spec.rounds, spec.eval_period,
                                config=config, progress=progress, tensorboard=False,
                                description=label)
    except experiment.NonFiniteStateError as e:
      log(f'{label}: {e}')
      with open(os.path.join(directory, DIVERGED_MARKER), 'w') as f:
        f.write(str(e) + '\n')


def read_metrics(directory: str) -> list[dict[str, float]]:
  """The rows of a run's metrics.csv as floats (NaN for empty cells)."""
  path = os.path.join(directory, experiment.METRICS_FILE)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [{k: float(v) if v not in ('', None) else math.nan for k, v in row.items()}
            for row in csv.DictReader(f)]


def _final_accuracy(rows) -> float:
  evaluated = [r['test_accuracy'] for r in rows
               if not math.isnan(r.get('test_accuracy', math.nan))]
  return evaluated[-1] if evaluated else math.nan


def summarize(spec: SweepSpec, output_dir: str) -> list[dict[str, Any]]:
  """One summary row per (aggregator, attack, rho), over seeds."""
  summary = []
  for aggregator in spec.aggregators:
    for attack in spec.attacks:
      for rho in spec.rhos:
        finals, diverged, calls = [], 0, []
        for seed in spec.seeds:
          run = spec.run_for_cell(aggregator, attack, rho, seed)
          directory = run_dir(output_dir, run)
          rows = read_metrics(directory)
          finals.append(_final_accuracy(rows))
          diverged += os.path.exists(os.path.join(directory, DIVERGED_MARKER))
          calls.extend(r['secure_average_calls'] for r in rows)
        values = np.array([v for v in finals if not math.isnan(v)])
        summary.append(dict(
            aggregator=aggregator, attack=attack, rho=rho,
            final_accuracy_mean=values.mean() if values.size else math.nan,
            final_accuracy_min=values.min() if values.size else math.nan,
            final_accuracy_max=values.max() if values.size else math.nan,
            num_seeds=int(values.size), num_diverged=diverged,
            secure_average_calls_per_round=float(np.mean(calls)) if calls else math.nan))
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


def _cell(row) -> str:
  if math.isnan(row['final_accuracy_mean']):
    return 'n/a'
  text = f'{100 * row["final_accuracy_mean"]:.1f}'
  if row['num_seeds'] > 1:
    text += (f' [{100 * row["final_accuracy_min"]:.1f}, '
             f'{100 * row["final_accuracy_max"]:.1f}]')
  if row['num_diverged']:
    text += f' ({row["num_diverged"]} diverged)'
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
    cells = [_cell(lookup[(aggregator, attack, rho)]) for attack, rho in columns]
    lines.append('| ' + ' | '.join([aggregator] + cells) + ' |')
  return '\n'.join(lines) + '\n'


def plot_accuracy_vs_rho(summary, spec: SweepSpec, path: str) -> None:
  """Final accuracy vs ρ, one panel per attack, min–max error band over seeds."""
  fig, axes = plt.subplots(1, len(spec.attacks), figsize=(5 * len(spec.attacks), 4),
                           squeeze=False, sharey=True)
  for ax, attack in zip(axes[0], spec.attacks):
    for aggregator in spec.aggregators:
      rows = sorted((r for r in summary if r['aggregator'] == aggregator and
                     r['attack'] == attack), key=lambda r: r['rho'])
      rhos = [r['rho'] for r in rows]
      mean = [r['final_accuracy_mean'] for r in rows]
      line, = ax.plot(rhos, mean, marker='o', label=aggregator)
      ax.fill_between(rhos, [r['final_accuracy_min'] for r in rows],
                      [r['final_accuracy_max'] for r in rows], alpha=0.2,
                      color=line.get_color())
    ax.set_title(f'{attack} corruption')
    ax.set_xlabel('corruption level ρ')
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel('final test accuracy')
  axes[0][-1].legend(fontsize='small')
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _curves(output_dir, spec, aggregator, attack, rho, x_column):
  """x values and the per-seed accuracy curves on the evaluated rounds."""
  curves = []
  for seed in spec.seeds:
    rows = [r for r in read_metrics(run_dir(output_dir, spec.run_for_cell(
        aggregator, attack, rho, seed))) if not math.isnan(r['test_accuracy'])]
    curves.append(([r[x_column] for r in rows], [r['test_accuracy'] for r in rows]))
  return curves


def plot_curves(output_dir: str, spec: SweepSpec, attack: str, rho: float,
                path: str) -> None:
  """Accuracy vs rounds and vs cumulative secure-average calls (paper Figure 4)."""
  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  for ax, (x_column, label) in zip(axes, [
      ('round', 'rounds'),
      ('cumulative_secure_average_calls', 'calls to the secure average oracle')]):
    for aggregator in spec.aggregators:
      curves = [c for c in _curves(output_dir, spec, aggregator, attack, rho, x_column)
                if c[0]]
      if not curves:
        continue
      length = min(len(c[0]) for c in curves)  # Diverged seeds stop early.
      x = np.array(curves[0][0][:length])
      y = np.array([c[1][:length] for c in curves])
      line, = ax.plot(x, y.mean(axis=0), label=aggregator)
      ax.fill_between(x, y.min(axis=0), y.max(axis=0), alpha=0.2,
                      color=line.get_color())
    ax.set_xlabel(label)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel('test accuracy')
  axes[1].legend(fontsize='small')
  fig.suptitle('no corruption' if rho == 0 else f'{attack} corruption, ρ = {rho:g}')
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def write_report(spec: SweepSpec, output_dir: str) -> str:
  """Summary table (csv, md) and plots; returns the markdown table."""
  summary = summarize(spec, output_dir)
  markdown = write_summary(summary, output_dir)
  plot_accuracy_vs_rho(summary, spec, os.path.join(output_dir, 'accuracy_vs_rho.png'))
  cells = [(CLEAN, 0.0)] if 0.0 in spec.rhos else []
  cells += [(a, r) for a in spec.attacks for r in spec.rhos if r > 0]
  for attack, rho in cells:
    plot_curves(output_dir, spec, attack if rho else spec.attacks[0], rho,
                os.path.join(output_dir, f'curves_{attack}_rho{rho:g}.png'))
  return markdown


# ---- The binary. ---------------------------------------------------------------------

def _define_flags() -> None:
  common_flags.define_task_flags()
  common_flags.define_training_flags()
  common_flags.define_attack_flags(single=False)
  common_flags.define_aggregator_args_flag()
  flags.DEFINE_list('aggregators', ['mean', 'gm'], 'Aggregators to compare '
                    '(baselines.registry): ' + ', '.join(registry.known_aggregators()))
  flags.DEFINE_list('attacks', ['omniscient'], 'Corruption models (ρ > 0): ' +
                    ', '.join(a for a in corruption.ATTACKS if a != CLEAN))
  flags.DEFINE_list('rhos', ['0', '0.1', '0.25'], 'Corruption levels in [0, 0.5).')
  flags.DEFINE_list('seeds', ['0'], 'Run seeds (the shading is min–max over them).')
  flags.DEFINE_integer('data_seed', 0, 'Seed of the task data (client partition).')
  flags.DEFINE_string('output_dir', 'runs/sweep', 'Where runs, table and plots go.')

  flags.register_validator(
      'aggregators', lambda v: bool(v) and set(v) <= set(registry.known_aggregators()),
      message='--aggregators must name known aggregators: ' +
      ', '.join(registry.known_aggregators()))
  flags.register_validator(
      'attacks', lambda v: bool(v) and set(v) <= set(corruption.ATTACKS) - {CLEAN},
      message='--attacks must name known attacks: ' +
      ', '.join(a for a in corruption.ATTACKS if a != CLEAN))
  flags.register_validator('rhos', _valid_rhos,
                           message='--rhos must be numbers in [0, 0.5).')
  flags.register_validator('seeds', lambda v: bool(v) and all(
      s.lstrip('-').isdigit() for s in v), message='--seeds must be integers.')

  @flags.multi_flags_validator(['aggregators', 'aggregator_args'],
                               message='invalid --aggregator_args')
  def _check_args(values):
    try:
      for name in values['aggregators'] or []:
        common_flags.build_aggregator(name, values['aggregator_args'])
    except ValueError as e:
      raise flags.ValidationError(str(e)) from e
    return True


def _valid_rhos(values) -> bool:
  try:
    return bool(values) and all(0.0 <= float(v) < 0.5 for v in values)
  except ValueError:
    return False


def spec_from_flags() -> SweepSpec:
  kwargs = common_flags.simulation_kwargs_from_flags('none', 0.0, 0)
  for name in ('attack', 'rho', 'seed'):
    kwargs.pop(name)
  return SweepSpec(
      aggregators=FLAGS.aggregators, attacks=FLAGS.attacks,
      rhos=sorted({float(r) for r in FLAGS.rhos}),
      seeds=[int(s) for s in FLAGS.seeds], rounds=FLAGS.rounds,
      eval_period=FLAGS.eval_period,
      aggregator_args={name: common_flags.parse_aggregator_args(
          FLAGS.aggregator_args, name) for name in FLAGS.aggregators},
      simulation_kwargs=kwargs)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  common_flags.quiet_logs()
  spec = spec_from_flags()
  task = common_flags.task_from_flags(FLAGS.data_seed)
  run_sweep(task, spec, FLAGS.output_dir, progress=FLAGS.progress)
  print(write_report(spec, FLAGS.output_dir))


def run():
  """Console-script entry point (`tff_robust_sweep`)."""
  app.run(main)


_define_flags()

if __name__ == '__main__':
  run()
