"""Assembles a `Task` from a model constructor and train/test client data."""

import dataclasses
from typing import Callable, Mapping, Optional

import tensorflow as tf

from tasks.builders import data_utils
from tasks.builders import models
from tasks.builders import task as task_lib


def make_task(name: str, keras_model_fn: Callable[[], tf.keras.Model],
              train_data: data_utils.ArrayClientData,
              test_data: data_utils.ArrayClientData,
              data_attacks: Mapping[str, Callable[[tf.data.Dataset],
                                                  tf.data.Dataset]],
              client_spec: Optional[task_lib.ClientSpec],
              num_clients: Optional[int], seed: int) -> task_lib.Task:
  """Caps the clients at `num_clients` (by `seed`) and wires up `model_fn`;
  `data_attacks` are the task's data poisonings by name."""
  client_ids = data_utils.sample_client_ids(train_data.client_ids, num_clients, seed)
  if not client_ids:
    raise ValueError(f'Task {name} has no client left after filtering.')
  train_data = train_data.subset(client_ids)
  test_ids = [c for c in client_ids if c in set(test_data.client_ids)]
  test_data = test_data.subset(test_ids)
  model_fn = task_lib.tff_model_fn(keras_model_fn, train_data.element_type_structure,
                                   models.loss_fn)
  return task_lib.Task(
      name=name, keras_model_fn=keras_model_fn, model_fn=model_fn,
      loss_fn=models.loss_fn, train_data=train_data, test_data=test_data,
      client_weights={c: float(train_data.num_examples(c)) for c in client_ids},
      client_spec=client_spec or task_lib.ClientSpec(),
      data_attacks=dict(data_attacks))


def validation_task(task: task_lib.Task, validation_fraction: float,
                    seed: int) -> task_lib.Task:
  """`task` with a per-client validation split carved out of its TRAINING data.

  Every client's training examples are split at random (by `seed`): the validation
  part becomes the returned task's `test_data` and the rest its `train_data` (α_i
  recomputed), so hyperparameters tuned on it never see the real held-out test data.
  A client keeps at least one training example; one with a single example has no
  validation data.
  """
  if not 0.0 < validation_fraction < 1.0:
    raise ValueError(f'validation_fraction must be in (0, 1), got {validation_fraction!r}.')
  train, validation = data_utils.split_clients(
      {c: task.train_data.arrays(c) for c in task.train_data.client_ids},
      1.0 - validation_fraction, seed)
  element_spec = task.train_data.element_type_structure
  return dataclasses.replace(
      task, train_data=data_utils.from_client_arrays(train, element_spec),
      test_data=data_utils.from_client_arrays(
          {c: xy for c, xy in validation.items() if len(xy[1])}, element_spec),
      client_weights={c: float(len(xy[1])) for c, xy in train.items()})
