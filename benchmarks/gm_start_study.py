r"""Which start should RFA's geometric median use? Real training runs, per start point.

Trains the main job's task (EMNIST-linear on the bundled MNIST digits, 100 clients,
30 rounds, 10 clients per round, 1 local epoch, batch 10, client learning rate 0.1;
`tasks.binaries.main_job`) with the geometric median (`gm`, 3 passes, its other
defaults) from each `--starts` entry:

  * mean:     the paper's Algorithm 2 (pass 1 is the weighted mean);
  * zero:     pass 1 is a Weiszfeld step from the zero update (one-step RFA);
  * previous: pass 1 is a Weiszfeld step from the previous round's aggregate, carried
              in the aggregator state (warm start; zero in the first round).

under each `--attacks` entry at each `--rhos` level and the clean run (ρ = 0), for
every `--seeds` entry, and prints the final clean test accuracy (%) as
"mean [min, max]" over seeds, each start's worst case over the attacked cells, and the
choice: the start with the best worst case among those whose clean accuracy is within
`--clean_margin` points of the best clean one, unless it beats the current default's
worst case by no more than `--worst_case_margin` points (then the default stays).

  .venv/bin/python -m benchmarks.gm_start_study --seeds=0,1,2 --rhos=0,0.25

Every run is a sweep run (`tasks.simulation.sweep`) in `<output_dir>/<start>/`: a
restarted study skips finished runs. It takes the sweep binary's flags. The page goes
to `<output_dir>/study.md` and, with `--results_markdown`, to a file to commit (the
README's table is `results/gm_start_study.md` and `results/gm_start_study_rho0.1.md`).
"""

import dataclasses
import os
import sys
import time

from absl import flags

from benchmarks import gm_start_report
from tasks.binaries import exit_status
from tasks.binaries import flag_groups
from tasks.binaries import sweep_flags
from tasks.simulation import sweep
from tasks.simulation import sweep_report
from tff_robust.aggregators import geometric_median
from tff_robust.distributed import runtime

FLAGS = flags.FLAGS

flag_groups.define_task_flags(task='emnist', model='linear', data_source='bundled',
                              local_epochs=1, batch_size=10)
flag_groups.define_training_flags(sweep=True, rounds=30, clients_per_round=10,
                                  client_learning_rate=0.1, eval_period=5,
                                  tensorboard=False)
sweep_flags.define_sweep_flags(aggregators=['gm'], attacks=[
                                   'omniscient', 'alie', 'ipm', 'zero_update',
                                   'tiny_update', 'far_update'],
                               rhos=['0', '0.25'], seeds=['0', '1', '2'],
                               output_dir='runs/gm_start_study')
_STARTS = flags.DEFINE_list('starts', list(geometric_median.INITIAL_POINTS),
                            "The geometric median's initial_point values to compare.")
_CLEAN_MARGIN = flags.DEFINE_float(
    'clean_margin', 0.5, 'Points of clean accuracy a start may lose to the best clean '
    'start and still be chosen.')
_WORST_CASE_MARGIN = flags.DEFINE_float(
    'worst_case_margin', 0.5, 'Points of worst case by which another start must beat '
    "the current default (GeometricMedianFactory's initial_point) to be chosen.")
flags.DEFINE_string('results_markdown', '', 'Also write the page here (e.g. '
                    'results/gm_start_study.md), headed by the command that made it.')
flag_groups.validate_output_paths(files=['results_markdown'])
# Where the runs go and how progress shows do not change the page.
_LOCAL_FLAGS = ('--output_dir', '--results_markdown', '--progress', '--noprogress',
                '--checkpoint_period')
flags.register_validator(
    'starts', lambda v: bool(v) and set(v) <= set(geometric_median.INITIAL_POINTS),
    message=f'--starts must be a subset of {geometric_median.INITIAL_POINTS}.')
flags.register_validator('aggregators', lambda v: v == ['gm'],
                         message='The study compares starts of --aggregators=gm only.')
flags.register_validator('worker_momenta', lambda v: len(v) == 1,
                         message='One --worker_momenta value per study (one table row '
                         'per start).')


def spec_for_start(start: str) -> sweep.SweepSpec:
  spec = sweep_flags.sweep_spec_from_flags()
  return dataclasses.replace(spec, aggregator_args={'gm': dict(
      spec.aggregator_args.get('gm', {}), initial_point=start)})


def main(argv):
  started = time.time()
  task, _ = sweep_flags.start_sweep_binary(argv)
  summaries = {}
  with runtime.worker_binaries_stopped():
    for start in _STARTS.value:
      spec = spec_for_start(start)
      directory = os.path.join(FLAGS.output_dir, start)
      sweep.run_sweep(task, spec, directory, progress=FLAGS.progress)
      summaries[start] = sweep_report.summarize(spec, directory)
      sweep_report.write_summary(summaries[start], directory)
  table, decision = gm_start_report.study_table(
      summaries, _CLEAN_MARGIN.value, incumbent=geometric_median.DEFAULT_INITIAL_POINT,
      worst_case_margin=_WORST_CASE_MARGIN.value)
  seeds = ','.join(FLAGS.seeds)
  task = (FLAGS.task if flag_groups.user_task_path() else
          f'{FLAGS.task}-{FLAGS.model} ({FLAGS.data_source})')
  page = (f'GM (3 passes) by initial_point: {task}, {FLAGS.rounds} rounds, '
          f'{FLAGS.clients_per_round} '
          f'clients/round, seeds {seeds}. Final clean test accuracy (%), mean '
          f'[min, max] over seeds; worst case: the lowest mean over attacked cells.\n\n'
          + table + '\n' + decision + '\n')
  with open(os.path.join(FLAGS.output_dir, 'study.md'), 'w') as f:
    f.write(page)
  if FLAGS.results_markdown:
    command = sweep_flags.quoted_command('benchmarks.gm_start_study', _LOCAL_FLAGS)
    os.makedirs(os.path.dirname(FLAGS.results_markdown) or '.', exist_ok=True)
    with open(FLAGS.results_markdown, 'w') as f:
      f.write(f'<!-- Written by `{command}`; rerun it to update. -->\n\n{page}')
  print(page)
  print(f'Study finished in {(time.time() - started) / 60:.1f} minutes; runs in '
        f'{FLAGS.output_dir}.', file=sys.stderr)


if __name__ == '__main__':
  exit_status.run(main)
