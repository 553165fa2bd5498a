"""Tasks of your own, by import path: `--task=package.module:function`.

The binaries (`train`, `sweep`, `leaderboard`, `main_job`) take, in place of a
built-in task name, the import path of a function returning a `tasks.builders.Task`
(see its docstring for the protocol, and docs/tasks.md):

  .venv/bin/python -m tasks.binaries.train --task=docs.examples.my_task:build_task \\
      --aggregator=gm --attack=alie --rho=0.2 --rounds=10

*   The module is imported as Python imports it, with the current directory first
    on the path (as `python -m` puts it there; so the console scripts find a module
    of the directory they run in too). `function` may be a dotted attribute path.
*   The function is called with no argument, or with `seed=<the data seed>` if it
    has a parameter `seed` (--seed of `train`, --data_seed of the sweeps). Whatever
    it raises is raised as it is (with its traceback: it is your code).
*   What it returns is checked (`task.check_task`: type, fields, element spec, the
    models on a batch); a `TaskError` names the problem and the fix.
*   The binaries then set the task's local work from their flags (--local_epochs,
    --batch_size, --max_elements; the shuffle buffer stays the task's) and keep
    --num_clients of its training clients (chosen by the data seed; the test data
    stays whole).

`load_task` does all of it from Python. Resolving a path needs no TensorFlow (the
binaries check --task before they import it); loading the task does.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import re
import sys
from typing import Any, Callable, Optional, TYPE_CHECKING

from tasks import catalog

if TYPE_CHECKING:
  from tasks.builders import task as task_lib

TaskError = catalog.TaskError
SEPARATOR = ':'
_DOTTED = re.compile(r'^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$')
EXAMPLE = 'docs.examples.my_task:build_task'


def is_import_path(name: str) -> bool:
  """Whether a --task value is an import path (`module:function`), not a name."""
  return SEPARATOR in name


def stem(path: str) -> str:
  """A file-system friendly name of an import path (`a.b:f` → `a.b.f`), for output
  directories and file names."""
  return path.replace(SEPARATOR, '.')


def resolve(path: str) -> Callable[..., Any]:
  """The function an import path `package.module:function` names.

  Raises:
    TaskError: when the path is malformed, the module is not importable (not found,
      or it raised while importing: the message carries its error), the attribute
      is missing or not callable.
  """
  module_name, _, attribute = path.partition(SEPARATOR)
  if not _DOTTED.match(module_name) or not _DOTTED.match(attribute):
    raise TaskError(
        f'--task={path} is not an import path package.module:function. Fix: name a '
        f'module and a function in it, e.g. --task={EXAMPLE} (a file '
        'docs/examples/my_task.py under the directory you run in).')
  module = _import(path, module_name)
  value: Any = module
  for part in attribute.split('.'):
    if not hasattr(value, part):
      known = sorted(name for name in dir(value) if not name.startswith('_') and
                     callable(getattr(value, name, None)))
      raise TaskError(
          f'--task={path}: {module_name} ({_file(module)}) has no attribute '
          f'{attribute!r}. Fix: name one of its functions'
          + (f' ({", ".join(known[:8])}{", ..." if len(known) > 8 else ""})'
             if known else '') + '.')
    value = getattr(value, part)
  if not callable(value):
    raise TaskError(
        f'--task={path}: {attribute} is {_short(value)}, not a function. Fix: point '
        '--task at a function returning a tasks.builders.Task (a Task itself is not '
        'taken: the binary builds the task with its seed).')
  return value


def _import(path: str, module_name: str):
  cwd = os.getcwd()
  if cwd not in sys.path and '' not in sys.path:
    sys.path.insert(0, cwd)  # As `python -m` does: the console scripts find it too.
  try:
    return importlib.import_module(module_name)
  except ModuleNotFoundError as e:
    if e.name and module_name.startswith(e.name) and (
        module_name == e.name or module_name.startswith(e.name + '.')):
      raise TaskError(
          f'--task={path}: no module {e.name!r} is importable from {cwd} (or the '
          f'installed packages). Fix: run from the directory that holds '
          f'{module_name.replace(".", "/")}.py, or install its package; check the '
          'spelling.') from e
    raise TaskError(f'--task={path}: importing {module_name} failed: it imports '
                    f'{e.name!r}, which is not installed ({e}). Fix: install it in '
                    'this environment.') from e
  except Exception as e:  # pylint: disable=broad-except
    raise TaskError(f'--task={path}: importing {module_name} raised '
                    f'{type(e).__name__}: {" ".join(str(e).split())}. Fix: run '
                    f'`python -c "import {module_name}"` to see the traceback.') from e


def _file(module) -> str:
  return getattr(module, '__file__', None) or 'a namespace package'


def _short(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= 60 else f'a {type(value).__name__}'


def takes_seed(function: Callable[..., Any]) -> bool:
  """Whether `function` has a parameter `seed` (or `**kwargs`)."""
  try:
    parameters = inspect.signature(function).parameters.values()
  except (TypeError, ValueError):
    return False
  return any(p.name == 'seed' and p.kind != p.POSITIONAL_ONLY or
             p.kind == p.VAR_KEYWORD for p in parameters)


def load_task(path: str, *, seed: int = 0,
              client_spec: Optional[task_lib.ClientSpec] = None,
              num_clients: Optional[int] = None) -> task_lib.Task:
  """Builds and checks the task of an import path `package.module:function`.

  Args:
    path: E.g. 'docs.examples.my_task:build_task'.
    seed: The data seed: passed to the function if it has a `seed` parameter, and
      chooses the clients kept by `num_clients`.
    client_spec: Replaces the task's local epochs, batch size and cap (its shuffle
      buffer stays); None keeps the task's.
    num_clients: Keep at most this many training clients (chosen by `seed`);
      the test data stays whole.

  Returns:
    The task, with `provenance` naming the path, the seed and `num_clients`.

  Raises:
    TaskError: a path that names no function, or a function whose value does not
      follow the `Task` protocol (naming the problem and the fix). What the function
      itself raises is raised as it is.
  """
  # pylint: disable=g-import-not-at-top
  from tasks.builders import data_utils
  from tasks.builders import task as task_lib
  function = resolve(path)
  task = function(seed=seed) if takes_seed(function) else function()
  task_lib.check_task(task, f'the value of {path}()')
  if client_spec is not None:
    task = dataclasses.replace(task, client_spec=dataclasses.replace(
        task.client_spec, num_epochs=client_spec.num_epochs,
        batch_size=client_spec.batch_size, max_elements=client_spec.max_elements))
  client_ids = list(task.train_data.client_ids)
  if num_clients is not None and num_clients < len(client_ids):
    task = _with_clients(task, data_utils.sample_client_ids(client_ids, num_clients,
                                                            seed))
  return dataclasses.replace(task, provenance=dict(
      task.provenance, task=path, seed=seed, num_clients=num_clients))


def _with_clients(task: task_lib.Task, client_ids) -> task_lib.Task:
  """`task` with only the training clients `client_ids`."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  train_data = tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
      client_ids, task.train_data.serializable_dataset_fn)
  return dataclasses.replace(task, train_data=train_data, client_weights={
      c: task.client_weights[c] for c in client_ids})
