r"""Trains one task with one aggregator under one corruption model.

  python -m tasks.binaries.train --task=emnist --model=linear --data_source=bundled \
      --aggregator=gm --attack=omniscient --rho=0.25 --rounds=30 \
      --clients_per_round=20 --client_learning_rate=0.05
  python -m tasks.binaries.train --task=docs.examples.my_task:build_task \
      --aggregator=gm --attack=alie --rho=0.2 --rounds=10   # a task of your own

(or the console script `tff_robust_train` in the repository's environment).
`--helpshort` documents every flag (`--helpfull` adds absl's own);
`--client_work=ditto|personalized_rfa` trains personal models too.

Output, in `--root_output_dir/--experiment_name` (default name built from the task,
aggregator, attack, rho and seed; a task of your own is named by its import path
with `.` for `:`): `metrics.csv` with one row per round, the columns

  round, train_loss, train_accuracy, num_examples, num_clients, num_corrupted_clients,
  client_learning_rate, secure_average_calls (this round),
  cumulative_secure_average_calls, test_accuracy, test_loss (on evaluation rounds:
  round 0, every --eval_period rounds and the last; empty otherwise),
  server_optimizer/update_non_finite, aggregator/<measurement>... (e.g. for gm:
  aggregator/objective/0..R-1, aggregator/num_secure_average_calls,
  aggregator/max_effective_weight, aggregator/num_nonfinite_clients)

(personalized client work adds its evaluation columns), the same values in
`tensorboard/`, the run's `config.json` and `checkpoints/` (each carrying the run's
configuration: other flags are refused even without config.json). One process owns
the directory (`owner.lock`): a second one exits with status 2, naming the owner's
pid. Killed at any moment and restarted with the same flags, a run resumes after
its last finished round; a larger --rounds extends a finished run (a smaller one is
refused: a run is never shortened); a deleted metrics.csv is rebuilt by rerunning
the checkpointed rounds; a damaged latest checkpoint is skipped for the newest
readable one (`tasks.simulation.experiment`). A round that leaves a non-finite model
(or whose losses or test accuracy are not finite) stops the run with exit status 2,
keeping every finished round, as does a damaged or inconsistent file of the run or of the data (one stderr line naming the file and the
fix). With --workers=host:port,... each round's clients train and aggregate on TFF
worker_binary processes (README, "Several workers and machines"); a worker failing
mid-round stops the run with exit status 3, naming the worker and the round, and a
rerun resumes there; a worker that stops answering (SIGSTOP, a frozen machine) too.
The driver of a --workers run listens on no network: its own computations run on a
worker_binary behind a Unix socket only its user can open
(`tff_robust.distributed.private_local_execution`). Exit statuses:
`tasks.binaries.exit_status`. Killed even by SIGKILL, the binary leaves no
worker_binary of its own behind. The flags are checked, and the run's first line
printed, before TensorFlow is imported.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING

from absl import app
from absl import flags
from absl import logging

from tasks.binaries import aggregator_flags
from tasks.binaries import exit_status
from tasks.binaries import flag_groups
from tasks.binaries import named_args
from tasks.simulation import attacks
from tasks.simulation import run_lock
from tff_robust import distributed

if TYPE_CHECKING:
  from tasks.simulation import loop

FLAGS = flags.FLAGS

flag_groups.define_task_flags()
flag_groups.define_training_flags()
flags.DEFINE_string('root_output_dir', 'runs', 'Root of the output directories.')
flag_groups.validate_output_paths(directories=['root_output_dir'])
flags.DEFINE_string('experiment_name', None, 'Output subdirectory; default '
                    '<task>_<model>_<aggregator>_<attack>_rho<rho>_seed<seed> '
                    '(<module>.<function>_<aggregator>_... for --task=module:function); '
                    'a relative path inside --root_output_dir.')


def _check_experiment_name(name) -> bool:
  """The run directory stays inside --root_output_dir: refused at parse time."""
  if not name:
    return True  # The default name.
  parts = os.path.normpath(name).split(os.sep)
  if not name.strip() or os.path.isabs(name) or parts[0] in (os.curdir, os.pardir):
    raise flags.ValidationError(
        f'--experiment_name={name!r} is not a directory inside --root_output_dir (it '
        'must be a relative path that does not climb out with ".."); pass a name such '
        'as --experiment_name=my_run, and --root_output_dir for where it goes.')
  return True


flags.register_validator('experiment_name', _check_experiment_name)
flag_groups.define('string', 'aggregator', 'gm', 'Aggregator of the client updates, '
                   + aggregator_flags.aggregator_help())
flag_groups.define_aggregator_args_flag()
aggregator_flags.validate_aggregators('aggregator')
flag_groups.define('string', 'attack', attacks.NO_ATTACK, 'Corruption model: none, '
                    'a data attack of the task (every task has `data`, RFA paper D.2.1) '
                    'or an update attack: ' + ', '.join(attacks.UPDATE_ATTACKS) + '.')
flag_groups.define('float', 'rho', 0.0, 'Corruption level ρ in [0, 0.5): the '
                    'corrupted clients\' share of the total weight.')
flags.register_validator('rho', lambda v: 0.0 <= v < 0.5,
                         message='--rho must be in [0, 0.5).')
flag_groups.validate_attacks('attack')
flag_groups.define_attack_args_flag('attack')
flag_groups.define('integer', 'seed', 0, 'Seeds the model initialization, the '
                    'corrupted set, client sampling and the data partition.',
                    lower_bound=0)
# Not part of the run's identity: a run may resume on other workers, or on none.
flags.DEFINE_list('workers', [], 'host:port of TFF worker_binary processes to spread '
                  'each round\'s clients over (training and every secure average); '
                  'empty: run in this process. Start one with `python -m '
                  'tff_robust.distributed --port=N` (README, "Several workers and '
                  'machines"); workers on other machines need --worker_credentials.')
flags.DEFINE_string('worker_credentials', None, 'Directory of the driver\'s TLS '
                    'credentials for --workers (ca.pem, driver.pem, driver.key, made by '
                    '`python -m tff_robust.distributed.worker_credentials --out=DIR`): mutual TLS '
                    'with workers started with that deployment\'s --tls_* files. '
                    'Without it every worker must be on this machine (127.0.0.1).')
flags.DEFINE_string('worker_data_dir', None, 'With --workers: a directory, at the '
                    'same path on every worker, of the task\'s training clients '
                    '(tasks.simulation.worker_data; the driver exports the clients it '
                    'samples into it, or reuses a complete export of the same task): '
                    'workers read their clients\' data there and the driver sends '
                    'client ids. Default: a temporary export when every worker is on '
                    'this machine, else the driver sends the datasets.')
flags.DEFINE_float('worker_connect_timeout',
                   distributed.DEFAULT_CONNECT_TIMEOUT_SECONDS, 'Seconds to wait at '
                   'start for each of --workers to accept connections before exiting '
                   'with an error naming it.')
flags.DEFINE_float('worker_unavailable_timeout',
                   distributed.DEFAULT_UNAVAILABLE_TIMEOUT_SECONDS, 'Seconds a worker '
                   'of --workers may be unreachable, or answer no probe (stopped), '
                   'during a round before the round fails (exit status 3, naming the '
                   'worker); if it comes back sooner, its share of the round is rerun. '
                   'A stopped worker is named within this plus 5 s.')
flags.DEFINE_float('worker_call_timeout', distributed.DEFAULT_CALL_TIMEOUT_SECONDS,
                   'Deadline in seconds of every call to a worker of --workers: longer '
                   'than any one computation takes there (a stopped worker is found '
                   'by probes within --worker_unavailable_timeout + 5 s, not by this).')


def _check_workers(addresses) -> bool:
  """A malformed --workers is refused at parse time, not after the data load."""
  if addresses:
    try:
      distributed.parse_addresses(addresses)
    except ValueError as e:
      raise flags.ValidationError(
          f'{e} Pass --workers=host:port,host:port (distinct addresses).') from e
  return True


flags.register_validator('workers', _check_workers)


@flags.multi_flags_validator(['workers', 'worker_credentials'])
def _check_worker_credentials(values) -> bool:
  """Workers off this machine need credentials, and the credentials must be readable:
  refused at parse time."""
  if not values['workers']:
    return True
  try:
    distributed.check_credentials_needed(
        values['workers'], distributed.as_driver_credentials(
            values['worker_credentials']))
  except ValueError as e:
    raise flags.ValidationError(str(e)) from e
  return True
for _name in ('worker_connect_timeout', 'worker_unavailable_timeout',
              'worker_call_timeout'):
  flags.register_validator(_name, lambda v: 0 < v < float('inf'),
                           message=f'--{_name} must be a finite number of seconds > 0.')



def run_settings() -> flag_groups.RunSettings:
  """The run of the parsed flags, named --experiment_name or after its main flags."""
  name = FLAGS.experiment_name or (
      f'{flag_groups.task_stem()}_{FLAGS.aggregator}_{FLAGS.attack}_rho{FLAGS.rho:g}'
      f'_seed{FLAGS.seed}' + ('' if FLAGS.client_work == 'fedavg' else
                              f'_{FLAGS.client_work}'))
  return flag_groups.RunSettings.from_flags(name)


def build_simulation(settings: flag_groups.RunSettings, task,
                     context=None) -> loop.Simulation:
  """The simulation of `settings` (on the workers of `context`, if given)."""
  from tasks.simulation import on_workers  # pylint: disable=g-import-not-at-top
  return on_workers.build_simulation(
      task, settings.factory(), flag_groups.client_work_from_flags(task),
      context=context, attack=settings['attack'],
      attack_params=named_args.parse(
          settings['attack_args'], settings['attack'], attacks.UPDATE_ATTACKS),
      rho=settings['rho'], seed=settings['seed'],
      **({'client_data_dir': FLAGS.worker_data_dir} if context is not None else {}),
      **flag_groups.simulation_kwargs_from_flags())


def _output_dir(settings: flag_groups.RunSettings) -> str:
  return os.path.join(FLAGS.root_output_dir, settings.name)


def print_header(settings: flag_groups.RunSettings) -> None:
  """The run's first line, printed before TensorFlow is imported."""
  print(f'{settings.name}: {settings["rounds"]} rounds of {flag_groups.task_title()}; '
        f'output in {_output_dir(settings)}', file=sys.stderr, flush=True)


def check_settings(settings=None) -> None:
  """Refuses, before any data is loaded, flags that cannot train together."""
  aggregator_flags.check_clients_per_round(settings or run_settings())


def main(argv, settings=None):
  """Trains the run of `settings` (default: of the flags)."""
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  settings = settings or run_settings()
  flag_groups.quiet_logs()
  output_dir, config = _output_dir(settings), settings.config()
  # pylint: disable=g-import-not-at-top
  from tasks.simulation import experiment
  from tasks.simulation import metrics_file
  from tasks.simulation import on_workers
  from tasks.simulation import run_config
  from tasks.simulation import run_errors
  with contextlib.ExitStack() as stack:
    # One process per run directory, from before its config.json is checked.
    stack.enter_context(run_lock.owned(output_dir))
    run_config.check_config(output_dir, config, ignore=flag_groups.RESUMABLE_CHANGES)
    if FLAGS.workers:
      # The driver's own computations (the server's): on a worker nothing else can
      # reach, not TFF's local worker_binary on every interface.
      driver = stack.enter_context(distributed.private_local_execution())
    task = settings.task()
    flag_groups.check_attacks(task, 'attack')
    context = None
    if FLAGS.workers:
      try:
        context = distributed.DistributedContext(
            FLAGS.workers, credentials=FLAGS.worker_credentials,
            connect_timeout=FLAGS.worker_connect_timeout,
            unavailable_timeout=FLAGS.worker_unavailable_timeout,
            call_timeout=FLAGS.worker_call_timeout,
            # The workers' partial sums merged here, not on the first worker.
            merge_context=driver.async_context)
      except (ValueError, distributed.WorkerError) as e:
        exit_status.exit_with(f'--workers: {e}', exit_status.FLAGS_OR_OTHER_RUN)
      stack.callback(context.close)
    simulation = build_simulation(settings, task, context)
    num_clients = len(task.train_data.client_ids)
    print(f'{settings.name}: {num_clients} clients, '
          f'{len(simulation.corrupted_clients)} corrupted', file=sys.stderr)
    if settings['clients_per_round'] > num_clients:
      print(f'--clients_per_round={settings["clients_per_round"]} is more than the '
            f'task\'s {num_clients} clients: all of them train every round.',
            file=sys.stderr)
    if settings['attack'] != attacks.NO_ATTACK and not settings['rho']:
      print(f'--attack={settings["attack"]} with --rho=0 corrupts no client: a clean '
            'run.', file=sys.stderr)
    try:
      experiment.run_experiment(simulation, output_dir, settings['rounds'],
                                settings['eval_period'], config=config,
                                resumable_changes=flag_groups.RESUMABLE_CHANGES,
                                progress=FLAGS.progress,
                                tensorboard=FLAGS.tensorboard,
                                description=settings.name,
                                checkpoint_period=FLAGS.checkpoint_period,
                                on_checkpoint=exit_status.rounds_checkpointed)
    except run_errors.NonFiniteStateError as e:
      exit_status.exit_with(e, exit_status.NON_FINITE)
    except on_workers.WorkerRoundError as e:
      exit_status.exit_with(e, exit_status.WORKER_FAILED)
  print(f'Finished {settings["rounds"]} rounds; metrics in '
        f'{os.path.join(output_dir, metrics_file.METRICS_FILE)}', file=sys.stderr)


def run():
  """Console-script entry point (`tff_robust_train`)."""
  exit_status.run(main, check_flags=check_settings, header=print_header,
                  settings=run_settings)


if __name__ == '__main__':
  run()
