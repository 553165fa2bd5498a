"""The flags of the sweep binaries (sweep, main_job, leaderboard, the benchmarks that
sweep): what a sweep compares (--aggregators × --attacks × --rhos × --seeds), its
start and header, and the `tasks.simulation.sweep.SweepSpec` they build."""

from __future__ import annotations

import shlex
import sys
from typing import Callable, Mapping, Optional, Sequence, TYPE_CHECKING

from absl import app
from absl import flags

from tasks import builders
from tasks.binaries import aggregator_flags
from tasks.binaries import flag_groups
from tasks.binaries import named_args
from tasks.simulation import attacks

if TYPE_CHECKING:
  from tasks.simulation import sweep

FLAGS = flags.FLAGS
# As in flag_groups: the flags defined here belong to the binary that asks for them.
flags.disclaim_key_flags()

def validate_rhos_and_seeds() -> None:
  """Checks at parse time that --rhos are numbers in [0, 0.5) and --seeds integers
  ≥ 0 (both lists)."""
  flags.register_validator('rhos', _valid_rhos,
                           message='--rhos must be numbers in [0, 0.5).')
  flags.register_validator('seeds', lambda v: bool(v) and all(
      s.isdecimal() for s in v), message='--seeds must be integers ≥ 0.')


def define_sweep_flags(aggregator_groups: Optional[Mapping[str, str]] = None,
                       **defaults) -> None:
  """What a sweep compares: --aggregators × --attacks × --rhos × --seeds, and where.

  `aggregator_groups` (name → what it stands for) are names --aggregators also takes,
  each standing for a list derived from the factories (so known only once TensorFlow
  is imported): `start_sweep_binary` replaces them.
  """
  groups = dict(aggregator_groups or {})
  get = lambda name, value: defaults.pop(name, value)  # pylint: disable=g-long-lambda
  define = flag_groups.define
  define('list', 'aggregators', get('aggregators', ['mean', 'gm']), 'Aggregators to '
         'compare, ' + aggregator_flags.aggregator_help() + ''.join(
             f' {name}: {meaning}.' for name, meaning in groups.items()))
  define('list', 'attacks', get('attacks', ['omniscient']), 'Corruption models at ρ > '
         '0: a data attack of the task (every task has `data`) or an update attack: ' +
         ', '.join(attacks.UPDATE_ATTACKS))
  define('list', 'rhos', get('rhos', ['0', '0.1', '0.25']), 'Corruption levels in '
         '[0, 0.5).')
  define('list', 'seeds', get('seeds', ['0']), 'Run seeds (the shading is min–max '
         'over them).')
  define('integer', 'data_seed', get('data_seed', 0), 'Seed of the task data (client '
         'partition).')
  define('string', 'output_dir', get('output_dir', 'runs/sweep'), 'Where runs, table '
         'and plots go.', part_of_run=False)
  flag_groups.define_aggregator_args_flag(get('aggregator_args', ()))
  # Attack names first: absl runs a flag's later validators only once it is valid.
  flag_groups.validate_attacks('attacks')
  flag_groups.define_attack_args_flag('attacks')
  flag_groups.check_no_unknown(defaults)
  aggregator_flags.validate_aggregators('aggregators', also=tuple(groups))
  flag_groups.validate_output_paths(directories=['output_dir'])
  flags.register_validator(
      'aggregators', bool, message='--aggregators must name at least one aggregator.')
  flags.register_validator(
      'attacks', lambda v: bool(v) and attacks.NO_ATTACK not in v,
      message='--attacks must be non-empty and not "none" (ρ = 0 is the clean run).')
  validate_rhos_and_seeds()


def expand_aggregator_groups(
    groups: Mapping[str, Callable[[], Sequence[str]]],
    names_flag: str = 'aggregators') -> None:
  """Replaces every group name in --`names_flag`, and in its default (so a list equal
  to the default still is the default), by the names `groups[name]()` returns (a
  list derived from the factories: TensorFlow is imported by then)."""
  def expand(names):
    return [n for name in names for n in (groups[name]() if name in groups else [name])]
  flag = FLAGS[names_flag]
  value = expand(flag.value)
  FLAGS.set_default(names_flag, expand(flag.default))
  flag.value = value


def _valid_rhos(values) -> bool:
  return flag_groups.numbers_in(values, 0.0, 0.5)


def start_sweep_binary(
    argv: Sequence[str],
    attacks_of_task: Optional[Callable[[builders.Task], Sequence[str]]] = None,
    aggregator_groups: Optional[Mapping[str, Callable[[], Sequence[str]]]] = None,
) -> tuple[builders.Task, sweep.SweepSpec]:
  """The opening of every sweep binary: refuses positional arguments, quiets the
  logs, replaces the `aggregator_groups` names in --aggregators
  (`define_sweep_flags`), and returns the task (partitioned with --data_seed) and the
  sweep of the flags. For a task of your own without --attacks on the command line,
  `attacks_of_task(task)`, when given, replaces the binary's default attacks (which
  name a built-in task's data attacks)."""
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  flag_groups.quiet_logs()
  expand_aggregator_groups(aggregator_groups or {})
  task = flag_groups.task_from_flags(FLAGS.data_seed)
  if (attacks_of_task is not None and flag_groups.user_task_path() is not None and
      not FLAGS['attacks'].present):
    FLAGS.attacks = list(attacks_of_task(task))
  flag_groups.check_attacks(task, 'attacks')
  return task, sweep_spec_from_flags()


def print_sweep_header(output_dir: Optional[str] = None) -> None:
  """A sweep binary's first line (`exit_status.run`'s `header`): the task, the grid
  of the flags and where the runs go (default --output_dir)."""
  print(f'{flag_groups.task_title()}: --aggregators={",".join(FLAGS.aggregators)} × '
        f'--attacks={",".join(FLAGS.attacks)} × --rhos={",".join(FLAGS.rhos)} × '
        f'--seeds={",".join(FLAGS.seeds)}, {FLAGS.rounds} rounds; output in '
        f'{output_dir or FLAGS.output_dir}', file=sys.stderr, flush=True)


def quoted_command(module: str, local_flags: Sequence[str]) -> str:
  """This run's command line as `python -m <module> ...`, shell-quoted, without the
  flags that start with one of `local_flags` (output paths, progress bars: they do not
  change the results a page reports)."""
  return shlex.join(['python', '-m', module] + [
      arg for arg in sys.argv[1:] if not arg.startswith(tuple(local_flags))])


def sweep_spec_from_flags() -> sweep.SweepSpec:
  """The `tasks.simulation.sweep.SweepSpec` of the sweep flags."""
  from tasks.simulation import sweep  # pylint: disable=g-import-not-at-top,redefined-outer-name
  return sweep.SweepSpec(
      aggregators=FLAGS.aggregators, attacks=FLAGS.attacks,
      rhos=sorted({float(r) for r in FLAGS.rhos}),
      seeds=[int(s) for s in FLAGS.seeds], rounds=FLAGS.rounds,
      eval_period=FLAGS.eval_period,
      worker_momenta=sorted({float(b) for b in FLAGS.worker_momenta}),
      client_work=FLAGS.client_work, client_work_args=(
          {} if FLAGS.client_work == 'fedavg'
          else flag_groups.client_work_args_from_flags()),
      aggregator_args={
          name: aggregator_flags.aggregator_kwargs(name, FLAGS.aggregator_args)
          for name in FLAGS.aggregators},
      attack_args={name: named_args.parse(FLAGS.attack_args, name,
                                          attacks.UPDATE_ATTACKS)
                   for name in FLAGS.attacks if name in attacks.UPDATE_ATTACKS},
      simulation_kwargs=flag_groups.simulation_kwargs_from_flags())
