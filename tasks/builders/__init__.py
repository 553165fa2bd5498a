"""Task builders: data sources, models and the tasks' data attacks (RFA paper App. D).

`build_task('emnist', 'linear', source='bundled')` returns a `tasks.builders.Task`.
`known_tasks()` lists the valid (task, model, source, data attack) names for binaries.

A task of your own is a `Task` too (its docstring is the protocol; docs/tasks.md):
`Task.from_keras(name, keras_model_fn, train_data, test_data)` builds one from a Keras
model constructor and `tff.simulation.datasets.ClientData`, `check_task` checks one,
and `load_task('package.module:function')` builds one by import path, as the
binaries' `--task=package.module:function` does (`user_tasks`).

Importing the package imports no TensorFlow: `known_tasks`, `is_import_path` and
`TaskError` are what the binaries' flags need; every other name loads its module on
first use.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
from typing import Optional, TYPE_CHECKING

from tasks import catalog
from tasks.builders.user_tasks import is_import_path
from tasks.builders.user_tasks import load_task

if TYPE_CHECKING:
  from tasks.builders.task import ClientSpec
  from tasks.builders.task import Task

TaskError = catalog.TaskError
_FROM_TASK = ('check_task', 'ClientSpec', 'Task')


def __getattr__(name):
  if name in _FROM_TASK:
    return getattr(importlib.import_module(f'{__name__}.task'), name)
  if not name.startswith('_') and importlib.util.find_spec(f'{__name__}.{name}'):
    return importlib.import_module(f'{__name__}.{name}')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def known_tasks() -> dict[str, dict[str, tuple[str, ...]]]:
  """task name → {'models': (...), 'sources': (...), 'data_attacks': (...)}."""
  return {name: dict(spec) for name, spec in catalog.TASKS.items()}


def build_task(task: str, model: str, source: str = 'synthetic',
               data_dir: Optional[str] = None,
               client_spec: Optional[ClientSpec] = None,
               num_clients: Optional[int] = None, seed: int = 0,
               **source_kwargs) -> Task:
  """Builds a benchmark task.

  Args:
    task: 'emnist', 'shakespeare' or 'sent140'.
    model: emnist: 'linear' | 'cnn' | 'small_cnn'; shakespeare: 'lstm'; sent140: 'linear'.
    source: 'tff' (emnist, shakespeare), 'leaf' | 'csv' (sent140), 'bundled',
      'synthetic'. See each task module's docstring.
    data_dir: Directory of the source's files ('tff': TFF's cache_dir).
    client_spec: Local epochs / batch size / cap; default: the paper's (D.2.3).
    num_clients: Keep at most this many train clients, chosen by `seed`.
    seed: Seeds client sampling, partitions and train/test splits.
    **source_kwargs: Source options, e.g. `only_digits` (emnist tff), `min_examples`
      (shakespeare, sent140), `glove_path`, `csv_path` (sent140).

  Raises:
    ValueError: for an unknown task, model or source (listing the known ones).
  """
  # pylint: disable=g-import-not-at-top
  from tasks.builders import emnist
  from tasks.builders import sent140
  from tasks.builders import shakespeare
  modules = {'emnist': emnist, 'shakespeare': shakespeare, 'sent140': sent140}
  if task not in modules:
    raise ValueError(f'Unknown task {task!r}; known: {", ".join(modules)}.')
  module = modules[task]
  if model not in module.MODELS:
    raise ValueError(f'Unknown model {model!r} for task {task!r}; known: '
                     f'{", ".join(module.MODELS)}.')
  if source not in module.SOURCES:
    raise ValueError(f'Unknown source {source!r} for task {task!r}; known: '
                     f'{", ".join(module.SOURCES)}.')
  built = module.build(model, source=source, data_dir=data_dir,
                       client_spec=client_spec, num_clients=num_clients, seed=seed,
                       **source_kwargs)
  # Files by name only: the same data lies in other directories on other machines.
  options = {name: os.path.basename(value) if name.endswith('_path') and value else value
             for name, value in source_kwargs.items()}
  return dataclasses.replace(built, provenance=dict(
      source=source, num_clients=num_clients, seed=seed, **options))
