r"""Sweeps aggregators × attacks × corruption levels × seeds on one task.

  python -m tasks.binaries.sweep --task=emnist --model=linear --data_source=bundled \
      --aggregators=mean,gm,median --attacks=omniscient,data --rhos=0,0.1,0.25 \
      --seeds=0,1 --rounds=30 --clients_per_round=20 --output_dir=runs/sweep

(or the console script `tff_robust_sweep` in the repository's environment). What is
written, and how a restarted sweep resumes, is described in `tasks.simulation.sweep`.
"""


from absl import app
from absl import flags

from tasks.binaries import flag_groups
from tasks.simulation import sweep
from tff_robust import runtime

FLAGS = flags.FLAGS

flag_groups.define_task_flags()
flag_groups.define_training_flags(sweep=True)
flag_groups.define_sweep_flags()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  flag_groups.quiet_logs()
  task = flag_groups.task_from_flags(FLAGS.data_seed)
  spec = flag_groups.sweep_spec_from_flags()
  with runtime.worker_binaries_stopped():
    sweep.run_sweep(task, spec, FLAGS.output_dir, progress=FLAGS.progress)
  print(sweep.write_report(spec, FLAGS.output_dir))


def run():
  """Console-script entry point (`tff_robust_sweep`)."""
  app.run(main)


if __name__ == '__main__':
  run()
