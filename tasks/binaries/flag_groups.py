"""Flag groups the experiment binaries define (this module is not a binary): the
task, training, attack and output flags, and `RunSettings`, a run's configuration
resolved once from them. The aggregator flags' parsing and checks are in
`tasks.binaries.aggregator_flags`, the sweep binaries' flags in
`tasks.binaries.sweep_flags`.

A binary calls the `define_*` functions it needs at import, with its own defaults
(`define_training_flags(rounds=30)`), so every binary documents its flags in
`--helpfull` and rejects a bad value before any training, naming the flag. Choices
(tasks, aggregators, attacks, client work) come from their registries, never from
lists kept here.

Every flag defined here that changes what a run computes is recorded as part of the
run's identity: `RunSettings.config` for `train`; for a sweep's cells,
`sweep.run_config` of the task and the `SweepSpec` these flags build
(`task_from_flags`, `sweep_flags.sweep_spec_from_flags`). A resumed run must match
it. The flags defined with `part_of_run=False` change no number (progress,
TensorBoard, checkpoint period, where files go).

Importing this module, defining the flags and checking them imports no TensorFlow,
so a binary refuses a bad flag within a second or so; only a check that builds an
aggregator imports it (--aggregator_args other than the binary's default; an
aggregator assuming corrupted clients in
`aggregator_flags.check_clients_per_round`), as does building what a run needs
(`RunSettings.factory`, `task_from_flags`, ...).
"""

from __future__ import annotations

import dataclasses
import logging as std_logging
import math
import os
import sys
from typing import Any, Optional, Sequence

from absl import flags
from absl import logging

from tasks import builders
from tasks import catalog
from tasks import registry
from tasks.binaries import aggregator_flags
from tasks.binaries import named_args
from tasks.builders import user_tasks
from tasks.simulation import attacks

FLAGS = flags.FLAGS
# The flags defined here belong to the binary that asks for them: its --helpshort
# lists them all, without absl's own (which --helpfull adds).
flags.disclaim_key_flags()
# Flags that are part of a run's identity, in definition order (filled by `_define`).
_RUN_FLAGS: list[str] = []
# Run flags a resumed run may change (a finished run is extended by raising rounds).
RESUMABLE_CHANGES = ('rounds', 'eval_period')
# Sources that read files the user must point to.
_SOURCES_NEEDING_DATA_DIR = {
    'tff': ('the directory TFF caches its SQLite files in (downloaded there when '
            'online), e.g. --data_dir=~/.tff_data; or use --data_source=bundled for '
            'the offline data'),
    'leaf': 'the directory of LEAF\'s Sent140 JSON files',
    'csv': 'the directory of the raw Sentiment140 CSV',
}


def define(kind: str, name: str, default: Any, *args, part_of_run: bool = True,
            **kwargs) -> None:
  """flags.DEFINE_<kind>(name, default, *args, **kwargs); floats must be finite (NaN
  and ±inf are refused at parse time, naming the flag)."""
  getattr(flags, f'DEFINE_{kind}')(name, default, *args, **kwargs)
  if kind == 'float':
    flags.register_validator(name, lambda v: v is None or math.isfinite(v),
                             message=f'--{name} must be a finite number.')
  if part_of_run:
    _RUN_FLAGS.append(name)


@dataclasses.dataclass(frozen=True)
class RunSettings:
  """A run's configuration, resolved once from the parsed, checked flags
  (`from_flags`): it builds the run's aggregation factory, task and identity.

  Attributes:
    name: The run's name (`train`'s output subdirectory).
    flags: (flag, value) of the binary's run flags, lists as tuples; a task of your
      own's without those it does not read (--model, --data_source, --data_dir).
  """
  name: str
  flags: tuple[tuple[str, Any], ...]

  @classmethod
  def from_flags(cls, name: str = '') -> RunSettings:
    unread = _BUILT_IN_ONLY if user_task_path() is not None else ()
    values = [(flag, FLAGS[flag].value) for flag in _RUN_FLAGS if flag not in unread]
    return cls(name, tuple((f, tuple(v) if isinstance(v, list) else v) for f, v in values))

  def __getitem__(self, flag: str) -> Any:
    return dict(self.flags)[flag]

  def factory(self):
    """--aggregator's factory with --aggregator_args and --rho
    (`aggregator_flags.build_aggregator`)."""
    return aggregator_flags.build_aggregator(self['aggregator'], self['aggregator_args'],
                                             self['rho'])

  def task(self) -> builders.Task:
    """The run's task, its data partitioned with --seed (`task_from_flags`)."""
    return task_from_flags(self['seed'])

  def config(self) -> dict[str, Any]:
    """What a resumed run must match (`run_config.check_config`): the run flags'
    values and, with --aggregator, its factories' `registry.results_revisions`."""
    config = dict(self.flags)
    return (registry.with_results_revisions(config, self.factory())
            if 'aggregator' in config else config)


# The task flags only the built-in tasks read.
_BUILT_IN_ONLY = ('model', 'data_source', 'data_dir')
# (flag, `ClientSpec` field) of the flags that set every task's local work.
_CLIENT_SPEC_FLAGS = (('local_epochs', 'num_epochs'), ('batch_size', 'batch_size'),
                      ('max_elements', 'max_elements'))


def user_task_path() -> Optional[str]:
  """--task when it is the import path of a task of your own, else None."""
  if 'task' not in FLAGS or not FLAGS['task'].value:
    return None
  return FLAGS.task if builders.is_import_path(FLAGS.task) else None


def task_stem() -> str:
  """The task part of output names: `<task>_<model>` for a built-in task, the import
  path with '.' for ':' for yours (e.g. `docs.examples.my_task.build_task`)."""
  path = user_task_path()
  if path is not None:
    return user_tasks.stem(path)
  return f'{FLAGS.task}_{FLAGS.model}'


def task_title() -> str:
  """The task as a page title says it: `emnist linear (bundled data)`, or the import
  path of yours."""
  path = user_task_path()
  if path is not None:
    return path
  return f'{FLAGS.task} {FLAGS.model} ({FLAGS.data_source} data)'


def define_task_flags(**defaults) -> None:
  """--task, --model, --data_source, --data_dir, --num_clients and the client spec.

  --task is a built-in task's name or the import path `package.module:function` of a
  function returning a `tasks.builders.Task` (`tasks.builders.user_tasks`): the
  module is imported and the function looked up at parse time; it is called, and its
  task checked, when the binary builds the task (`task_from_flags`)."""
  known = builders.known_tasks()
  get = lambda name, value: defaults.pop(name, value)  # pylint: disable=g-long-lambda
  define('string', 'task', get('task', 'emnist'), 'Task: a benchmark task (RFA paper '
         f'D.1), {", ".join(known)}; or a task of your own, the import path '
         'package.module:function of a function returning a tasks.builders.Task, e.g. '
         f'{user_tasks.EXAMPLE} (docs/tasks.md). Yours takes the client spec '
         'flags and --num_clients, not --model, --data_source or --data_dir.')
  define('string', 'model', get('model', 'linear'), 'Model of the task: ' + '; '.join(
      f'{t}: {", ".join(s["models"])}' for t, s in known.items()) + '.')
  define('string', 'data_source', get('data_source', 'bundled'), 'Data source: ' +
          '; '.join(f'{t}: {", ".join(s["sources"])}' for t, s in known.items()) +
          '. `bundled` is real data read offline from installed packages, `synthetic` '
          'is random data for smoke tests.')
  define('string', 'data_dir', get('data_dir', None), 'Directory of the data source '
          'files; required for --data_source in ' + ', '.join(_SOURCES_NEEDING_DATA_DIR)
          + '.')
  define('integer', 'num_clients', get('num_clients', None), 'Keep at most this many '
          'training clients (chosen by the data seed); default all.', lower_bound=1)
  define('integer', 'local_epochs', get('local_epochs', 1), 'Local epochs per round '
          '(paper: EMNIST 5, others 1).', lower_bound=1)
  define('integer', 'batch_size', get('batch_size', 10), 'Local batch size (paper: '
          'EMNIST 50, others 10).', lower_bound=1)
  define('integer', 'max_elements', get('max_elements', None), 'Cap on the examples '
          'a client uses per round, after repeating for the local epochs; default all.',
          lower_bound=1)
  check_no_unknown(defaults)

  @flags.multi_flags_validator(['task', 'model', 'data_source', 'data_dir'],
                               message='invalid --task/--model/--data_source/--data_dir')
  def _check_task(values):
    task = values['task']
    if builders.is_import_path(task):
      try:
        user_tasks.resolve(task)
      except builders.TaskError as e:
        raise flags.ValidationError(str(e)) from e
      given = [name for name in _BUILT_IN_ONLY if FLAGS[name].present]
      if given:
        raise flags.ValidationError(
            f'{", ".join("--" + name for name in given)}: not read with '
            f'--task={task}, a task of your own (its function builds its model and '
            'data); drop them.')
      return True
    if task not in known:
      raise flags.ValidationError(
          f'--task={task} is not a built-in task ({", ".join(known)}) nor an import '
          'path package.module:function of a task of your own (e.g. '
          f'--task={user_tasks.EXAMPLE}; docs/tasks.md).')
    spec = known[task]
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
    if source not in _SOURCES_NEEDING_DATA_DIR and values['data_dir']:
      raise flags.ValidationError(
          f'--data_dir is not read with --data_source={source}; drop it, or pick a '
          f'source that reads it: {", ".join(_SOURCES_NEEDING_DATA_DIR)}.')
    return True


def define_training_flags(sweep: bool = False, **defaults) -> None:
  """Rounds, clients per round, client work, learning rates, evaluation and output.

  A sweep (`sweep=True`) takes a list of worker momenta, --worker_momenta, instead of
  one --worker_momentum.
  """
  get = lambda name, value: defaults.pop(name, value)  # pylint: disable=g-long-lambda
  define('integer', 'rounds', get('rounds', 20), 'Federated rounds.', lower_bound=1)
  define('integer', 'clients_per_round', get('clients_per_round', 10), 'Clients '
          'sampled uniformly without replacement each round (paper: EMNIST 100, '
          'others 50).', lower_bound=1)
  define('enum', 'client_work', get('client_work', 'fedavg'),
          list(catalog.CLIENT_WORKS), 'What a selected client computes: '
          'fedavg (local SGD on the global model), ditto (plus a personal model with a '
          'proximal term), personalized_rfa (RFA paper Algorithm 4).')
  define('float', 'ditto_lambda', get('ditto_lambda', 0.1), 'Ditto: λ of the '
          'proximal term.', lower_bound=0.0)
  define('integer', 'personal_steps', get('personal_steps', 5), 'Ditto and '
          'personalized RFA: local steps on the personal parameters per round.',
          lower_bound=1)
  define('float', 'personal_learning_rate', get('personal_learning_rate', 0.05),
          'Ditto and personalized RFA: learning rate of the personal parameters.',
          lower_bound=1e-12)
  momentum_help = ('worker momentum (Karimireddy et al. 2021): each client sends '
                   'm ← β·m + (1 − β)·Δ instead of Δ; 0 sends Δ.')
  if sweep:
    define('list', 'worker_momenta', get('worker_momenta', ['0']), 'Values β in '
           '[0, 1) of ' + momentum_help + ' Every aggregator runs with each.')
    flags.register_validator('worker_momenta', _valid_momenta,
                             message='--worker_momenta must be numbers in [0, 1).')
  else:
    define('float', 'worker_momentum', get('worker_momentum', 0.0), 'β in [0, 1) of '
           + momentum_help, lower_bound=0.0, upper_bound=0.999999)
  define('float', 'client_learning_rate', get('client_learning_rate', 0.1), 'Initial '
          'client learning rate γ0 of the schedule γ_t = γ0·C^⌊t/t0⌋ (paper D.2.3).',
          lower_bound=1e-12)
  define('float', 'client_lr_decay', get('client_lr_decay', 1.0), 'Decay factor C of '
          'the client learning rate schedule; 1 keeps it constant.', lower_bound=1e-12)
  define('integer', 'client_lr_decay_period', get('client_lr_decay_period', 1000),
          'Period t0 (rounds) of the client learning rate schedule.', lower_bound=1)
  define('float', 'server_learning_rate', get('server_learning_rate', 1.0), 'Server '
          'SGD learning rate applied to the aggregate (1 = FedAvg).', lower_bound=1e-12)
  define('float', 'server_momentum', get('server_momentum', 0.0), 'Server SGD '
          'momentum in [0, 1); 0: none.', lower_bound=0.0, upper_bound=0.999999)
  define('integer', 'eval_period', get('eval_period', 1), 'Evaluate on the clean test '
          'data every this many rounds (and after the last round).', lower_bound=1)
  define('integer', 'checkpoint_period', get('checkpoint_period', 1), 'Checkpoint '
          'every this many rounds (and after the last): an interrupted run reruns '
          'the rounds after its newest checkpoint, with the same results.',
          lower_bound=1, part_of_run=False)
  define('integer', 'eval_max_examples', get('eval_max_examples', None), 'Evaluate on '
          'at most this many test examples; default all.', lower_bound=1)
  define('bool', 'progress', get('progress', True), 'Show a progress bar.',
          part_of_run=False)
  define('bool', 'tensorboard', get('tensorboard', True), 'Also write TensorBoard '
          'summaries.', part_of_run=False)
  check_no_unknown(defaults)


def validate_attacks(attacks_flag: str) -> None:
  """Checks at parse time that --`attacks_flag` (one name or a list) names attacks of
  --task: 'none', the task's data attacks or an update attack."""

  @flags.multi_flags_validator(['task', attacks_flag], message=f'invalid --{attacks_flag}')
  def _check(values):
    names = values[attacks_flag]
    names = [names] if isinstance(names, str) else names or []
    if builders.is_import_path(values['task']):
      return True  # Its data attacks are known once it is built (`check_attacks`).
    known = attacks.known_attacks(
        builders.known_tasks().get(values['task'], {}).get('data_attacks', ()))
    unknown = [n for n in names if n not in known]
    if unknown:
      raise flags.ValidationError(
          f'--{attacks_flag}: {", ".join(unknown)} unknown for --task={values["task"]}; '
          f'known: {", ".join(known)}.')
    return True


def define_attack_args_flag(attacks_flag: str) -> None:
  """--attack_args, checked at parse time against the attack(s) of --`attacks_flag`."""
  define('list', 'attack_args', [], 'Constructor arguments of the update attack(s): '
         'comma-separated key=value (Python literals), e.g. z=1.5 for alie; prefix with '
         'the attack name to target one, e.g. alie:z=1.5,ipm:epsilon=0.5. See '
         '`tasks.simulation.attacks` for each attack\'s parameters.')

  @flags.multi_flags_validator([attacks_flag, 'attack_args'],
                               message='invalid --attack_args')
  def _check_attack_args(values):
    names = values[attacks_flag]
    entries = values['attack_args']
    if isinstance(names, str):
      # One run's entries for an attack it does not run are a mistake; a sweep's
      # slice may keep the whole grid's (each run takes its own attack's).
      _check_entries_are_for(attacks_flag, names, entries)
    names = [names] if isinstance(names, str) else list(names or [])
    for name in names:
      if name not in attacks.UPDATE_ATTACKS:
        continue  # 'none' and data attacks take no parameters.
      try:
        attacks.build_update_attack(name, **named_args.parse(
            entries, name, attacks.UPDATE_ATTACKS))
      except (TypeError, ValueError) as e:
        raise flags.ValidationError(f'--attack_args: {e}') from e
    return True


def _check_entries_are_for(attack_flag: str, attack: str,
                           entries: Sequence[str]) -> None:
  if entries and attack not in attacks.UPDATE_ATTACKS:
    raise flags.ValidationError(
        f'--attack_args: --{attack_flag}={attack} takes no parameters (only update '
        'attacks do); drop --attack_args.')
  for entry in entries:
    target, _, _ = named_args.split_entry(entry)
    if target and target != attack and target in attacks.UPDATE_ATTACKS:
      raise flags.ValidationError(
          f'--attack_args: {entry} is for {target}, which --{attack_flag}={attack} '
          'does not run; drop it.')


def define_aggregator_args_flag(default: Sequence[str] = ()) -> None:
  define('list', 'aggregator_args', list(default), 'Hyperparameters of the aggregator(s), '
          'passed as keyword arguments to tasks.registry.aggregator_from_name: '
          'comma-separated key=value (Python literals, e.g. '
          'num_communication_passes=3,nu=1e-6). Prefix with an aggregator or wrapper '
          'name to target one, e.g. gm:num_communication_passes=5,bucketing:bucket_size=3'
          '; wrappers take only targeted entries.')


def task_from_flags(seed: int) -> builders.Task:
  """The task of --task/--model/--data_source with the client spec flags; a task of
  your own (--task=module:function) built by its function with data seed `seed`
  (`tasks.builders.load_task`), --num_clients and the client spec flags applied.

  Raises:
    tasks.builders.TaskError: the function's value does not follow the `Task`
      protocol (the message names the problem and the fix).
  """
  client_spec = builders.ClientSpec(num_epochs=FLAGS.local_epochs,
                                    batch_size=FLAGS.batch_size,
                                    max_elements=FLAGS.max_elements)
  path = user_task_path()
  if path is not None:
    task = builders.load_task(path, seed=seed, num_clients=FLAGS.num_clients)
    own = task.client_spec
    replaced = [f'{field}={getattr(own, field)} by --{flag}={getattr(client_spec, field)}'
                for flag, field in _CLIENT_SPEC_FLAGS
                if getattr(own, field) != getattr(client_spec, field)]
    if replaced:
      print(f'--task={path}: its client spec is set from the flags: '
            f'{", ".join(replaced)}.', file=sys.stderr)
    return dataclasses.replace(task, client_spec=dataclasses.replace(
        own, num_epochs=client_spec.num_epochs, batch_size=client_spec.batch_size,
        max_elements=client_spec.max_elements))
  return builders.build_task(FLAGS.task, FLAGS.model, source=FLAGS.data_source,
                             data_dir=FLAGS.data_dir, client_spec=client_spec,
                             num_clients=FLAGS.num_clients, seed=seed)


def check_attacks(task: builders.Task, attacks_flag: str) -> None:
  """Checks --`attacks_flag` (one name or a list) against the attacks of `task`
  (for a task of your own, whose data attacks are only known once it is built; the
  built-in tasks' are checked at parse time, `validate_attacks`).

  Raises:
    tasks.builders.TaskError: naming the unknown attacks and the known ones.
  """
  names = FLAGS[attacks_flag].value
  names = [names] if isinstance(names, str) else list(names or [])
  known = attacks.known_attacks(tuple(task.data_attacks))
  unknown = [n for n in names if n not in known]
  if unknown:
    raise builders.TaskError(
        f'--{attacks_flag}: {", ".join(unknown)} unknown for --task={FLAGS.task}; '
        f'known: {", ".join(known)} (its data attacks are its Task.data_attacks).')


def client_work_args_from_flags() -> dict[str, Any]:
  """The personalized client works' arguments (FedAvg ignores them)."""
  return dict(ditto_lambda=FLAGS.ditto_lambda, personal_steps=FLAGS.personal_steps,
              personal_learning_rate=FLAGS.personal_learning_rate)


def client_work_from_flags(task: builders.Task):
  """The --client_work variant for `task`, with --worker_momentum."""
  from tasks.simulation import client_work as client_work_lib  # pylint: disable=g-import-not-at-top
  return client_work_lib.client_work_from_name(
      FLAGS.client_work, task, worker_momentum=FLAGS.worker_momentum,
      **client_work_args_from_flags())


def simulation_kwargs_from_flags(eval_max_examples: Optional[int] = None) -> dict:
  """Keyword arguments of `tasks.simulation.loop.Simulation` shared by every run of a
  binary (not the task, aggregator, client work, attack, rho or seed)."""
  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff
  from tasks.simulation import loop
  return dict(
      clients_per_round=FLAGS.clients_per_round,
      client_learning_rate=loop.StepSchedule(
          FLAGS.client_learning_rate, FLAGS.client_lr_decay,
          FLAGS.client_lr_decay_period),
      server_optimizer=tff.learning.optimizers.build_sgdm(
          learning_rate=FLAGS.server_learning_rate,
          momentum=FLAGS.server_momentum or None),
      eval_max_examples=eval_max_examples or FLAGS.eval_max_examples)


def quiet_logs() -> None:
  """Keeps TensorFlow's per-checkpoint INFO lines out of the way unless -v is given."""
  if not FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
    # `tf.get_logger()`, before TensorFlow is imported (which leaves its level).
    std_logging.getLogger('tensorflow').setLevel(std_logging.ERROR)


def _directory_problem(path: str) -> Optional[str]:
  """Why `os.makedirs(path)` and writing into it would fail, or None: an ancestor
  that is a file, or a nearest existing directory that is not writable. The path is
  taken literally, as the binary will (no `~` expansion, `..` not folded)."""
  while not os.path.isdir(path):
    if os.path.lexists(path):
      return f'{path} is a file, not a directory'
    parent = os.path.dirname(path.rstrip(os.sep)) or os.curdir
    if parent == path:
      return None
    path = parent
  if not os.access(path, os.W_OK | os.X_OK):
    return f'{path} is not writable'
  return None


def repository_readme(page: str = 'README.md') -> str:
  """A page of the repository (default its README.md) that a binary updates; '' when
  the binary runs from an installed package, which has none."""
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))), page)
  return path if os.path.isfile(path) else ''


def validate_output_paths(directories: Sequence[str] = (), files: Sequence[str] = (),
                          existing_files: Sequence[str] = (),
                          flag_values: flags.FlagValues = FLAGS) -> None:
  """Checks at parse time that the binary can write where its path flags point, so a
  typo stops it before training rather than after (an empty value skips the output):
  --`directories` must be directories or creatable as such, --`files` creatable files
  (not directories), and --`existing_files` files that exist (they are edited)."""
  def register(name, problem_of):
    def check(value):
      problem = value and problem_of(value)
      if problem:
        raise flags.ValidationError(f'--{name}={value}: {problem}; pass another path.')
      return True
    flags.register_validator(name, check, flag_values=flag_values)

  def file_problem(value):
    if os.path.isdir(value):
      return 'is a directory, not a file'
    if os.path.exists(value) and not os.access(value, os.W_OK):
      return 'is not writable'
    return _directory_problem(os.path.dirname(value) or os.curdir)

  def existing_file_problem(value):
    if not os.path.isfile(value):
      return 'no such file'
    return file_problem(value)

  for name in directories:
    register(name, _directory_problem)
  for name in files:
    register(name, file_problem)
  for name in existing_files:
    register(name, existing_file_problem)


def check_no_unknown(defaults) -> None:
  if defaults:
    raise TypeError(f'No such flags in this group: {sorted(defaults)}.')


def numbers_in(values: Sequence[str], low: float, high: float) -> bool:
  """Whether a list flag's `values` are a non-empty list of numbers in [low, high)."""
  try:
    return bool(values) and all(low <= float(v) < high for v in values)
  except ValueError:
    return False


def _valid_momenta(values) -> bool:
  return numbers_in(values, 0.0, 1.0)
