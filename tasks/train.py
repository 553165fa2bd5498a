r"""Trains one task with one aggregator under one corruption model.

  python -m tasks.train --task=emnist --model=linear --data_source=bundled \
      --aggregator=gm --attack=omniscient --rho=0.25 --rounds=30 \
      --clients_per_round=20 --client_learning_rate=0.05

(or the console script `tff_robust_train`). `--helpfull` documents every flag.

Output, in `--root_output_dir/--experiment_name` (default name built from the task,
aggregator, attack, rho and seed): `metrics.csv` with one row per round, the columns

  round, train_loss, train_accuracy, num_examples, num_clients, num_corrupted_clients,
  client_learning_rate, secure_average_calls (this round),
  cumulative_secure_average_calls, test_accuracy, test_loss (on evaluation rounds:
  round 0, every --eval_period rounds and the last; empty otherwise),
  server_optimizer/update_non_finite, aggregator/<measurement>... (e.g. for gm:
  aggregator/objective/0..R-1, aggregator/num_secure_average_calls,
  aggregator/max_effective_weight, aggregator/num_nonfinite_clients)

(personalized runs add their own evaluation columns), the same values in
`tensorboard/`, the run's `config.json` and `checkpoints/`. Killed at any moment and
restarted with the same flags, a run resumes after its last finished round; a larger
--rounds extends a finished run. A round that leaves a non-finite model stops the run
with exit status 2, keeping every finished round.
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging

import tff_robust  # pylint: disable=unused-import  (stops TFF's worker_binary at exit)
from baselines import registry
from tasks import common_flags
from tasks import data_utils
from tasks import experiment

FLAGS = flags.FLAGS
PERSONALIZATION_METHODS = ('none', 'ditto', 'personalized_rfa')

common_flags.define_task_flags()
common_flags.define_training_flags()
common_flags.define_attack_flags(single=True)
flags.DEFINE_enum('aggregator', 'gm', list(registry.known_aggregators()),
                  'Aggregator of the client updates (baselines.registry): mean is '
                  'FedAvg, gm is RFA (smoothed Weiszfeld geometric median), one_step_gm '
                  'one-step RFA, gamma_mean, gma (gradient masked averaging), median, '
                  'trimmed_mean, krum, multi_krum, norm_clipping, centered_clipping.')
common_flags.define_aggregator_args_flag()
flags.DEFINE_integer('seed', 0, 'Seeds the model initialization, the corrupted set, '
                     'client sampling and the data partition.')
flags.DEFINE_string('experiment_name', None, 'Output subdirectory; default '
                    '<task>_<model>_<aggregator>_<attack>_rho<rho>_seed<seed>.')
flags.DEFINE_enum('personalization', 'none', list(PERSONALIZATION_METHODS),
                  'Personalization (issue 6): ditto (personal models with a proximal '
                  'term to the global model), personalized_rfa (RFA paper Algorithm 4).')
flags.DEFINE_float('ditto_lambda', 0.1, 'Ditto: λ of the proximal term.',
                   lower_bound=0.0)
flags.DEFINE_integer('personal_steps', 5, 'Personalization: local steps on the personal '
                     'parameters per round.', lower_bound=1)
flags.DEFINE_float('personal_learning_rate', 0.05, 'Personalization: learning rate of '
                   'the personal parameters.')
flags.register_validator('personal_learning_rate', lambda v: v > 0,
                         message='--personal_learning_rate must be > 0.')


@flags.multi_flags_validator(['aggregator', 'aggregator_args'],
                             message='invalid --aggregator_args')
def _check_aggregator(values):
  # Building a factory is cheap (no TFF tracing) and catches every bad argument now.
  try:
    common_flags.build_aggregator(values['aggregator'], values['aggregator_args'])
  except ValueError as e:
    raise flags.ValidationError(str(e)) from e
  return True


@flags.multi_flags_validator(['personalization', 'client_lr_decay', 'server_momentum'],
                             message='unsupported with --personalization')
def _check_personalization(values):
  if values['personalization'] != 'none' and (values['client_lr_decay'] != 1.0 or
                                              values['server_momentum'] != 0.0):
    raise flags.ValidationError(
        f'--personalization={values["personalization"]} uses a constant client '
        'learning rate and plain server SGD: leave --client_lr_decay=1 and '
        '--server_momentum=0.')
  return True


_RUN_FLAGS = (common_flags.TASK_FLAGS + common_flags.TRAINING_FLAGS + (
    'attack', 'rho', 'alie_z', 'ipm_epsilon', 'aggregator', 'aggregator_args', 'seed',
    'personalization', 'ditto_lambda', 'personal_steps', 'personal_learning_rate'))


def experiment_name() -> str:
  """--experiment_name, or a name built from the run's main flags."""
  if FLAGS.experiment_name:
    return FLAGS.experiment_name
  name = (f'{FLAGS.task}_{FLAGS.model}_{FLAGS.aggregator}_{FLAGS.attack}'
          f'_rho{FLAGS.rho:g}_seed{FLAGS.seed}')
  if FLAGS.personalization != 'none':
    name += f'_{FLAGS.personalization}'
  return name


def build_simulation(task):
  """The `FederatedSimulation` (or personalized one) the flags describe."""
  aggregator = common_flags.build_aggregator(FLAGS.aggregator, FLAGS.aggregator_args)
  kwargs = common_flags.simulation_kwargs_from_flags(FLAGS.attack, FLAGS.rho,
                                                     FLAGS.seed)
  if FLAGS.personalization == 'none':
    from tasks import simulation  # pylint: disable=g-import-not-at-top
    return simulation.FederatedSimulation(task, aggregator, **kwargs)
  # Imported lazily: personalization (issue 6) is only needed when asked for. Its
  # simulation takes a constant client rate and plain server SGD (see the validator).
  from tasks import personalization  # pylint: disable=g-import-not-at-top
  return personalization.PersonalizedSimulation(
      task, FLAGS.personalization, aggregator,
      clients_per_round=FLAGS.clients_per_round,
      client_learning_rate=FLAGS.client_learning_rate,
      server_learning_rate=FLAGS.server_learning_rate,
      ditto_lambda=FLAGS.ditto_lambda, personal_steps=FLAGS.personal_steps,
      personal_learning_rate=FLAGS.personal_learning_rate, attack=FLAGS.attack,
      rho=FLAGS.rho, seed=FLAGS.seed, attack_params=kwargs['attack_params'],
      max_test_examples=FLAGS.eval_max_examples)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  common_flags.quiet_logs()
  output_dir = os.path.join(FLAGS.root_output_dir, experiment_name())
  try:
    experiment.check_config(output_dir, common_flags.run_config(_RUN_FLAGS))
  except experiment.ConfigMismatchError as e:
    logging.error('%s', e)
    print(f'ERROR: {e}', file=sys.stderr)
    sys.exit(1)
  try:
    task = common_flags.task_from_flags(FLAGS.seed)
  except (data_utils.MissingDataError, data_utils.MalformedDataError) as e:
    print(f'ERROR: --data_source={FLAGS.data_source}: {e}', file=sys.stderr)
    sys.exit(1)
  simulation = build_simulation(task)
  print(f'{experiment_name()}: {len(task.train_data.client_ids)} clients, '
        f'{len(getattr(simulation, "corrupted_clients", ()))} corrupted; '
        f'output in {output_dir}', file=sys.stderr)
  try:
    experiment.run_experiment(simulation, output_dir, FLAGS.rounds, FLAGS.eval_period,
                              progress=FLAGS.progress, tensorboard=FLAGS.tensorboard,
                              description=experiment_name())
  except experiment.NonFiniteStateError as e:
    print(f'ERROR: {e}', file=sys.stderr)
    sys.exit(2)
  print(f'Finished {FLAGS.rounds} rounds; metrics in '
        f'{os.path.join(output_dir, experiment.METRICS_FILE)}', file=sys.stderr)


def run():
  """Console-script entry point (`tff_robust_train`)."""
  app.run(main)


if __name__ == '__main__':
  run()
