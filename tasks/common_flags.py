"""absl flags shared by the experiment binaries (`tasks.train`, `tasks.sweep`).

Each `define_*` function defines a group of flags and their validators, so every
binary documents them in `--helpfull` and rejects a bad value before any training,
with a message naming the flag. `task_from_flags`, `simulation_kwargs_from_flags`
turn the parsed values into a `tasks.task.Task` and `FederatedSimulation` arguments.
"""

import ast
from typing import Any, Optional, Sequence

from absl import flags
from absl import logging
import tensorflow as tf
import tensorflow_federated as tff

import tasks
from baselines import registry
from tasks import corruption
from tasks import simulation

FLAGS = flags.FLAGS
# Sources that read files the user must point to.
_SOURCES_NEEDING_DATA_DIR = {
    'tff': ('the directory TFF caches its SQLite files in (downloaded there when '
            'online), e.g. --data_dir=~/.tff_data; or use --data_source=bundled for '
            'the offline data'),
    'leaf': 'the directory of LEAF\'s Sent140 JSON files',
    'csv': 'the directory of the raw Sentiment140 CSV',
}


_DEFINED_GROUPS = set()


def _first_definition(group: str) -> bool:
  """True the first time `group` is defined: `tasks.train` and `tasks.sweep` share
  these flags and may both be imported in one process (e.g. a test session)."""
  if group in _DEFINED_GROUPS:
    return False
  _DEFINED_GROUPS.add(group)
  return True


def define_task_flags() -> None:
  """--task, --model, --data_source, --data_dir, --num_clients and client spec."""
  if not _first_definition('task'):
    return
  known = tasks.known_tasks()
  flags.DEFINE_enum('task', 'emnist', list(known), 'Benchmark task (RFA paper D.1).')
  models = sorted({m for spec in known.values() for m in spec['models']})
  sources = sorted({s for spec in known.values() for s in spec['sources']})
  flags.DEFINE_string('model', 'linear', 'Model of the task: ' + '; '.join(
      f'{t}: {", ".join(s["models"])}' for t, s in known.items()) + '.')
  flags.DEFINE_string('data_source', 'bundled', 'Data source: ' + '; '.join(
      f'{t}: {", ".join(s["sources"])}' for t, s in known.items()) +
                      '. `bundled` is real data read offline from installed packages, '
                      '`synthetic` is random data for smoke tests.')
  flags.DEFINE_string('data_dir', None, 'Directory of the data source files; required '
                      'for --data_source in ' + ', '.join(_SOURCES_NEEDING_DATA_DIR) + '.')
  flags.DEFINE_integer('num_clients', None, 'Keep at most this many training clients '
                       '(chosen by --seed); default all.', lower_bound=1)
  flags.DEFINE_integer('local_epochs', 1, 'Local epochs per round (paper: EMNIST 5, '
                       'others 1).', lower_bound=1)
  flags.DEFINE_integer('batch_size', 10, 'Local batch size (paper: EMNIST 50, others '
                       '10).', lower_bound=1)
  flags.DEFINE_integer('max_elements', None, 'Cap on the examples a client uses per '
                       'round, after repeating for the local epochs; default all.',
                       lower_bound=1)
  del models, sources

  @flags.multi_flags_validator(['task', 'model', 'data_source', 'data_dir'],
                               message='invalid --task/--model/--data_source/--data_dir')
  def _check_task(values):
    spec = known[values['task']]
    if values['model'] not in spec['models']:
      raise flags.ValidationError(
          f'--model={values["model"]} is not a model of --task={values["task"]}; '
          f'choices: {", ".join(spec["models"])}.')
    if values['data_source'] not in spec['sources']:
      raise flags.ValidationError(
          f'--data_source={values["data_source"]} is not a source of '
          f'--task={values["task"]}; choices: {", ".join(spec["sources"])}.')
    source = values['data_source']
    if source in _SOURCES_NEEDING_DATA_DIR and not values['data_dir']:
      raise flags.ValidationError(
          f'--data_dir is required with --data_source={source}: '
          f'{_SOURCES_NEEDING_DATA_DIR[source]}.')
    return True


def define_training_flags() -> None:
  """Rounds, clients per round, learning-rate schedule, evaluation and output."""
  if not _first_definition('training'):
    return
  flags.DEFINE_integer('rounds', 20, 'Federated rounds (outer iterations).',
                       lower_bound=1)
  flags.DEFINE_integer('clients_per_round', 10, 'Clients sampled uniformly without '
                       'replacement each round (paper: EMNIST 100, others 50).',
                       lower_bound=1)
  flags.DEFINE_float('client_learning_rate', 0.1, 'Initial client learning rate γ0 of '
                     'the schedule γ_t = γ0·C^⌊t/t0⌋ (paper D.2.3).')
  flags.DEFINE_float('client_lr_decay', 1.0, 'Decay factor C of the client learning '
                     'rate schedule; 1 keeps it constant.')
  flags.DEFINE_integer('client_lr_decay_period', 1000, 'Period t0 (rounds) of the '
                       'client learning rate schedule.', lower_bound=1)
  flags.DEFINE_float('server_learning_rate', 1.0, 'Server SGD learning rate applied '
                     'to the aggregate (1 = FedAvg).')
  flags.DEFINE_float('server_momentum', 0.0, 'Server SGD momentum.', lower_bound=0.0)
  flags.DEFINE_integer('eval_period', 1, 'Evaluate on the clean test data every this '
                       'many rounds (and after the last round).', lower_bound=1)
  flags.DEFINE_integer('eval_max_examples', None, 'Evaluate on at most this many test '
                       'examples; default all.', lower_bound=1)
  flags.DEFINE_string('root_output_dir', 'runs', 'Root of the output directories.')
  flags.DEFINE_bool('progress', True, 'Show a progress bar.')
  flags.DEFINE_bool('tensorboard', True, 'Also write TensorBoard summaries.')
  for name in ('client_learning_rate', 'server_learning_rate'):
    flags.register_validator(name, lambda v: v > 0,
                             message=f'--{name} must be > 0.')
  flags.register_validator('client_lr_decay', lambda v: v > 0,
                           message='--client_lr_decay must be > 0.')


def define_attack_flags(single: bool = True) -> None:
  """--attack/--rho (one run) and the attacks' parameters."""
  if single and _first_definition('single_attack'):
    flags.DEFINE_enum('attack', 'none', list(corruption.ATTACKS),
                      'Corruption model (RFA paper D.2.1 and beyond): ' +
                      ', '.join(f'{k} ({v})' for k, v in corruption.ATTACKS.items()) + '.')
    flags.DEFINE_float('rho', 0.0, 'Corruption level ρ in [0, 0.5): the corrupted '
                       'clients\' share of the total weight.')
    flags.register_validator('rho', lambda v: 0.0 <= v < 0.5,
                             message='--rho must be in [0, 0.5).')
  if not _first_definition('attack_params'):
    return
  flags.DEFINE_float('alie_z', corruption.DEFAULT_ALIE_Z, 'z of the ALIE attack '
                     '(mean − z·std).')
  flags.DEFINE_float('ipm_epsilon', corruption.DEFAULT_IPM_EPSILON, 'ε of the IPM '
                     'attack (−ε × honest mean).')


def define_aggregator_args_flag() -> None:
  if not _first_definition('aggregator_args'):
    return
  flags.DEFINE_list(
      'aggregator_args', [],
      'Hyperparameters of the aggregator(s), passed as keyword arguments to '
      'baselines.registry.aggregator_from_name: comma-separated key=value (values '
      'are Python literals, e.g. num_communication_passes=3,nu=1e-6). In a sweep, '
      'prefix with the aggregator name to target one, e.g. gm:num_communication_passes=5.')


def parse_aggregator_args(entries: Sequence[str], aggregator: str) -> dict[str, Any]:
  """The keyword arguments of `aggregator` in --aggregator_args entries.

  Raises:
    ValueError: for an entry that is not `[name:]key=value`.
  """
  kwargs = {}
  for entry in entries:
    head, sep, text = entry.partition('=')
    target, _, key = head.rpartition(':')
    if target and target not in registry.known_aggregators():
      raise ValueError(f'--aggregator_args entry {entry!r} targets unknown aggregator '
                       f'{target!r}; known: {", ".join(registry.known_aggregators())}.')
    if not sep or not key.isidentifier():
      raise ValueError(f'--aggregator_args entry {entry!r} is not [name:]key=value.')
    if target and target != aggregator:
      continue
    try:
      kwargs[key] = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      kwargs[key] = text  # A bare string, e.g. covariance=diagonal.
  return kwargs


def build_aggregator(name: str, entries: Sequence[str]):
  """`aggregator_from_name(name, **args)`, errors naming --aggregator_args."""
  kwargs = parse_aggregator_args(entries, name)
  try:
    return registry.aggregator_from_name(name, **kwargs)
  except (TypeError, ValueError) as e:
    raise ValueError(f'--aggregator_args={",".join(entries)} is invalid for '
                     f'--aggregator={name}: {e}') from e


def task_from_flags(seed: int) -> tasks.Task:
  """The task of --task/--model/--data_source with the client spec flags."""
  client_spec = tasks.ClientSpec(num_epochs=FLAGS.local_epochs,
                                 batch_size=FLAGS.batch_size,
                                 max_elements=FLAGS.max_elements)
  return tasks.build_task(FLAGS.task, FLAGS.model, source=FLAGS.data_source,
                          data_dir=FLAGS.data_dir, client_spec=client_spec,
                          num_clients=FLAGS.num_clients, seed=seed)


def simulation_kwargs_from_flags(attack: str, rho: float, seed: int,
                                 eval_max_examples: Optional[int] = None) -> dict:
  """Keyword arguments of `FederatedSimulation` (besides task and aggregator)."""
  attack_params = {}
  if attack == 'alie':
    attack_params['z'] = FLAGS.alie_z
  elif attack == 'ipm':
    attack_params['epsilon'] = FLAGS.ipm_epsilon
  return dict(
      attack=attack, rho=rho, clients_per_round=FLAGS.clients_per_round,
      client_learning_rate=simulation.StepSchedule(
          FLAGS.client_learning_rate, FLAGS.client_lr_decay,
          FLAGS.client_lr_decay_period),
      server_optimizer=tff.learning.optimizers.build_sgdm(
          learning_rate=FLAGS.server_learning_rate,
          momentum=FLAGS.server_momentum or None),
      seed=seed, attack_params=attack_params,
      eval_max_examples=eval_max_examples or FLAGS.eval_max_examples)


def run_config(names: Sequence[str]) -> dict[str, Any]:
  """The values of flags `names`, the configuration a resumed run must match."""
  return {name: FLAGS[name].value for name in names}


TASK_FLAGS = ('task', 'model', 'data_source', 'data_dir', 'num_clients',
              'local_epochs', 'batch_size', 'max_elements')
TRAINING_FLAGS = ('rounds', 'clients_per_round', 'client_learning_rate',
                  'client_lr_decay', 'client_lr_decay_period', 'server_learning_rate',
                  'server_momentum', 'eval_period', 'eval_max_examples')


def quiet_logs() -> None:
  """Keeps TensorFlow's per-checkpoint INFO lines out of the way unless -v is given."""
  if not FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
    tf.get_logger().setLevel('ERROR')
