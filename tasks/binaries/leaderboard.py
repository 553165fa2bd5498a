r"""The robustness leaderboard: every aggregator × every attack, ranked by worst case.

  python -m tasks.binaries.leaderboard --model=linear   # → runs/leaderboard/emnist_linear
  python -m tasks.binaries.leaderboard --model=small_cnn   # ConvNet, 0.2M parameters

A sweep (`tasks.simulation.sweep`) of every aggregator, plain and behind the bucketing,
NNM and ARC pre-aggregation wrappers, each with and without worker momentum (β = 0.9),
under every update attack and label flipping at ρ ∈ {0.1, 0.25}, 3 seeds, on bundled
MNIST. Written to the output directory, next to the sweep's own tables and plots:

  leaderboard.md    rank, aggregator, clean accuracy and, per ρ, the accuracy under
                    the attack that hurt it most (named), best worst case first; the
                    rows without worker momentum (β = 0)
  heatmap.png       final accuracy of those rows under every (attack, ρ)
  leaderboard_momentum.md, heatmap_momentum.png
                    the same of every row, when some --worker_momenta is > 0

and, with --results_dir, there:

  leaderboard_<task>_<model>.md, .png
                    leaderboard.md and heatmap.png: the leaderboard section of
                    docs/results.md shows this table for --readme_model
  leaderboard_<task>_<model>_momentum.md, .png
                    leaderboard_momentum.md and heatmap_momentum.png
  leaderboard_<task>_<model>_runs.csv
                    the ledger (`tasks.simulation.ledger`): every finished run's
                    final accuracy under a fingerprint of its whole configuration

A slice narrowed by --aggregators, --attacks, --rhos, --seeds or --worker_momenta adds
its runs to the ledger and writes its pages into --output_dir only: the committed
pages and the docs/results.md table (the default --results_dir and --readme) are written by the
full grid alone, so a slice cannot replace them by its own rows.

Finished runs are skipped, so an interrupted leaderboard resumes (a run checkpoints
every --checkpoint_period = 10 rounds), and so are the runs in the ledger, which is
committed with the table: the grid is trained in slices, over sessions and machines,
and the page counts the runs of every slice whose ledger it has. Narrow a slice with
the sweep flags (e.g. `--seeds=0 --aggregators=gm,median,bucketing+gm`); slices run
side by side share the ledger (each run enters it as it finishes). A finished run's
checkpoints are then deleted (--keep_checkpoints keeps them): with worker momentum they
hold every sampled client's momentum, ~200 MB a small-CNN run, 150 GB a seed.

The flags are checked, and the first line printed, before TensorFlow is imported:
--aggregators' default, `grid`, stands for the default grid
(`tasks.simulation.leaderboard.default_aggregators`), derived from the factories.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from typing import Any, Sequence, TYPE_CHECKING

from absl import flags

from tasks import builders
from tasks.binaries import exit_status
from tasks.binaries import flag_groups
from tasks.binaries import parallel_runs
from tasks.binaries import sweep_flags
from tasks.simulation import attacks
from tasks.simulation import leaderboard
from tasks.simulation import ledger

if TYPE_CHECKING:
  from tasks.simulation import sweep

FLAGS = flags.FLAGS
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

flag_groups.define_task_flags(task='emnist', model='linear', data_source='bundled',
                              local_epochs=1, batch_size=10)
flag_groups.define_training_flags(sweep=True, rounds=30, clients_per_round=10,
                                  client_learning_rate=0.1, eval_period=10,
                                  checkpoint_period=10, tensorboard=False,
                                  worker_momenta=['0', '0.9'])
_GRID = 'grid'
sweep_flags.define_sweep_flags(
    aggregators=[_GRID], attacks=leaderboard.DEFAULT_ATTACKS,
    rhos=['0', '0.1', '0.25'], seeds=['0', '1', '2'], output_dir='',
    aggregator_groups={_GRID: 'the default grid, every aggregator plain and behind '
                              'each wrapper that takes it but those '
                              'tasks.simulation.leaderboard leaves out'})
parallel_runs.define_flags()
flags.DEFINE_string('results_dir', os.path.join(_REPO, 'results'), 'Where to also '
                    'write leaderboard_<task>_<model>[_momentum].md and .png; empty to '
                    'skip.')
flags.DEFINE_string('readme', flag_groups.repository_readme('docs/results.md'),
                    'Page whose leaderboard section gets the table of --readme_model '
                    '(default the repository\'s docs/results.md); empty to skip.')
flags.DEFINE_string('readme_model', 'linear', 'The model whose table that page shows.')
flags.DEFINE_bool('keep_checkpoints', False, 'Keep a finished run\'s checkpoints '
                  '(needed only to extend its rounds; a worker-momentum run of the small '
                  'CNN keeps ~200 MB, every sampled client\'s momentum). By default they '
                  'are deleted once its result is in the ledger.')
flags.DEFINE_string('ledger', '', 'The ledger of finished runs; default '
                    '<results_dir>/leaderboard_<task>_<model>_runs.csv, or '
                    '<output_dir>/ledger.csv with an empty --results_dir.')
flag_groups.validate_output_paths(directories=['results_dir'], files=['ledger'],
                                  existing_files=['readme'])


@flags.multi_flags_validator(['task', 'readme_model'], message='invalid --readme_model')
def _check_readme_model(values):
  if builders.is_import_path(values['task']):
    return True  # A task of your own never writes the README (`_targets_left_alone`).
  models = builders.known_tasks()[values['task']]['models']
  if values['readme_model'] not in models:
    raise flags.ValidationError(
        f'--readme_model={values["readme_model"]} is not a model of '
        f'--task={values["task"]}; choices: {", ".join(models)}.')
  return True


# Flags that only say where files go: left out of the page's command line.
_PATH_FLAGS = ('--output_dir', '--results_dir', '--readme=', '--ledger',
               '--checkpoint_period', '--progress', '--noprogress', '--keep_checkpoints',
               '--nokeep_checkpoints')


def _output_dir() -> str:
  return FLAGS.output_dir or os.path.join('runs', 'leaderboard',
                                          flag_groups.task_stem())


def _ledger_path(output_dir: str) -> str:
  """--ledger, or the ledger beside the pages: a task of your own keeps its ledger
  in --output_dir unless --results_dir is yours too (a slice of a built-in task adds
  its runs to the committed ledger)."""
  if FLAGS.ledger:
    return FLAGS.ledger
  if not FLAGS.results_dir or (flag_groups.user_task_path() and
                               'results_dir' in _committed_targets()):
    return os.path.join(output_dir, 'ledger.csv')
  return os.path.join(FLAGS.results_dir,
                      f'leaderboard_{flag_groups.task_stem()}_runs.csv')


def _attacks_of(task) -> list[str]:
  """The default attacks of a task of your own: the grid's update attacks and every
  data attack of the task (the default --attacks name EMNIST's)."""
  return [name for name in leaderboard.DEFAULT_ATTACKS
          if name in attacks.UPDATE_ATTACKS] + list(task.data_attacks)


def _task_name() -> str:
  """`emnist linear`, or the import path of a task of your own."""
  if flag_groups.user_task_path():
    return FLAGS.task
  return f'{FLAGS.task} {FLAGS.model}'


def _page(table: str, spec: sweep.SweepSpec, done: int, trained: int,
          seconds: float, ledger_path: str) -> str:
  protocol = (
      f'{_task_name()}' + ('' if flag_groups.user_task_path() else
                           f' on {FLAGS.data_source} data') + f', {spec.rounds} rounds, '
      f'{FLAGS.clients_per_round} clients/round, client learning rate '
      f'{FLAGS.client_learning_rate:g}, worker momentum β ∈ '
      f'{{{", ".join(f"{b:g}" for b in spec.worker_momenta)}}} ("+wmβ"), seeds '
      f'{",".join(str(s) for s in spec.seeds)}; attacks {", ".join(spec.attacks)} at ρ ∈ '
      f'{{{", ".join(f"{r:g}" for r in spec.rhos if r > 0)}}}. Final test accuracy (%), '
      'mean over seeds [min, max] (with several); "worst case" is the attack of lowest '
      'mean, with that attack.')
  command = sweep_flags.quoted_command('tasks.binaries.leaderboard', _PATH_FLAGS)
  runs = len(spec.runs())
  return (f'<!-- Generated by `{command}`: {done} of its {runs} runs are finished, '
          f'{trained} of them by this invocation in {seconds / 60:.0f} minutes, the '
          f'others by earlier slices (ledger: {os.path.basename(ledger_path)}); '
          'do not edit. -->\n\n' + protocol + '\n\n' + table)


def _pages(spec: sweep.SweepSpec) -> list[tuple[sweep.SweepSpec, str]]:
  """(the runs of a page, its name suffix): the rows without worker momentum, and all
  rows when some β > 0, so one command writes both pages."""
  pages = []
  if 0.0 in spec.worker_momenta:
    pages.append((dataclasses.replace(spec, worker_momenta=[0.0]), ''))
  if any(beta > 0 for beta in spec.worker_momenta):
    pages.append((spec, '_momentum'))
  return pages


def main(argv):
  start = time.time()
  task, spec = sweep_flags.start_sweep_binary(
      argv, attacks_of_task=_attacks_of,
      aggregator_groups={_GRID: leaderboard.default_aggregators})
  from tasks.simulation import sweep  # pylint: disable=g-import-not-at-top,redefined-outer-name
  from tasks.simulation import sweep_report  # pylint: disable=g-import-not-at-top
  output_dir = _output_dir()
  ledger_path = _ledger_path(output_dir)
  page_specs = _pages(spec)
  by_copies = [0] * len(page_specs)
  if parallel_runs.starts_copies():

    def pending():
      recorded = ledger.read(ledger_path)
      return [len(sweep.pending_runs(task, s, output_dir, recorded))
              for s, _ in page_specs]

    before = pending()
    parallel_runs.train_in_copies('tasks.binaries.leaderboard')
    by_copies = [b - a for b, a in zip(before, pending())]
  pages, trained = [], 0
  # Plain rows first: their page is done first.
  for (page_spec, suffix), page_by_copies in zip(page_specs, by_copies):
    trained += sweep.run_sweep(task, page_spec, output_dir, progress=FLAGS.progress,
                               checkpoint_period=FLAGS.checkpoint_period,
                               recorded=ledger.read(ledger_path),
                               ledger_path=ledger_path,
                               keep_checkpoints=FLAGS.keep_checkpoints,
                               shard=parallel_runs.shard())
    pages.append((page_spec, suffix, trained + page_by_copies))
  if parallel_runs.is_copy():
    return
  # Runs that other slices finished in the same output directory.
  entries = ledger.merge(ledger_path, sweep.finished_entries(task, spec, output_dir))
  left_alone = _targets_left_alone()
  for page_spec, suffix, page_trained in pages:
    summary = _write_page(task, page_spec, suffix, entries, page_trained,
                          time.time() - start, output_dir, ledger_path,
                          left_alone=left_alone)
  sweep_report.write_summary(summary, output_dir)  # The last page's runs are all of `spec`.


# The flags that narrow the grid to a slice.
_GRID_FLAGS = ('aggregators', 'attacks', 'rhos', 'seeds', 'worker_momenta')


def _narrowed_flags() -> list[str]:
  return [name for name in _GRID_FLAGS if FLAGS[name].value != FLAGS[name].default]


def _committed_targets() -> list[str]:
  """The flags among --results_dir and --readme that point at the repository's own
  files (their defaults)."""
  return [name for name in ('results_dir', 'readme')
          if FLAGS[name].value and os.path.abspath(FLAGS[name].value) ==
          os.path.abspath(FLAGS[name].default)]


def _targets_left_alone() -> list[str]:
  """The committed targets ('results_dir', 'readme') this run must not write: all of
  them for a slice narrowed by the grid flags, which must not replace the committed
  full pages and the --readme table by its own rows (its runs go to the ledger, its pages
  to --output_dir only; said once), and for a task of your own, whose pages and
  ledger are not the repository's (they go to --output_dir, or to a --results_dir
  and --ledger you give)."""
  narrowed, committed = _narrowed_flags(), _committed_targets()
  if committed and flag_groups.user_task_path():
    print(f'--task={FLAGS.task} is a task of your own: its pages and ledger go to '
          f'{_output_dir()}, not to the repository\'s '
          f'{", ".join("--" + n for n in committed)}.', file=sys.stderr)
    return committed
  if not (narrowed and committed):
    return []
  print(f'A slice ({", ".join("--" + n for n in narrowed)}) does not rewrite the '
        f'committed pages ({", ".join("--" + n for n in committed)}): its pages are '
        'in --output_dir, its runs in the ledger; the full grid (no grid flag) '
        'writes the committed pages.', file=sys.stderr)
  return committed


def _write_page(task, spec: sweep.SweepSpec, suffix: str, entries, trained: int,
                seconds: float, output_dir: str, ledger_path: str,
                left_alone: Sequence[str] = ()) -> list[dict[str, Any]]:
  """leaderboard<suffix>.md and heatmap<suffix>.png of `spec`'s runs in `output_dir`,
  copied to --results_dir; the --readme page gets the table without momentum. Returns the
  summary of those runs."""
  from tasks.simulation import sweep  # pylint: disable=g-import-not-at-top,redefined-outer-name
  from tasks.simulation import sweep_report  # pylint: disable=g-import-not-at-top
  recorded = sweep.recorded_results(task, spec, entries)
  summary = sweep_report.summarize(spec, output_dir, recorded)
  rows = leaderboard.worst_cases(summary)
  page = _page(leaderboard.markdown_table(rows), spec, len(recorded), trained, seconds,
               ledger_path)
  os.makedirs(output_dir, exist_ok=True)  # Not made by a sweep that trained nothing.
  heatmap = os.path.join(output_dir, f'heatmap{suffix}.png')
  leaderboard.plot_heatmap(summary, rows, heatmap,
                           f'{_task_name()}: final accuracy (%)')
  with open(os.path.join(output_dir, f'leaderboard{suffix}.md'), 'w') as f:
    f.write(page)
  results_dir = '' if 'results_dir' in left_alone else FLAGS.results_dir
  readme = '' if 'readme' in left_alone else FLAGS.readme
  if results_dir:
    os.makedirs(results_dir, exist_ok=True)
    stem = os.path.join(results_dir,
                        f'leaderboard_{flag_groups.task_stem()}{suffix}')
    with open(stem + '.md', 'w') as f:
      f.write(page)
    shutil.copyfile(heatmap, stem + '.png')
  if (not suffix and readme and not flag_groups.user_task_path() and
      FLAGS.model == FLAGS.readme_model and
      not sweep_report.update_marked_section(readme, page, leaderboard.README_BEGIN,
                                      leaderboard.README_END)):
    print(f'{readme} has no {leaderboard.README_BEGIN} ... '
          f'{leaderboard.README_END} section; not updated.', file=sys.stderr)
  print(page)
  return summary


if __name__ == '__main__':
  exit_status.run(main, header=lambda: sweep_flags.print_sweep_header(_output_dir()))
