"""The `Task` bundle every experiment runs on: model, client data, weights, data attacks.

Modelled on `tff.simulation.baselines.BaselineTask` / `ClientSpec`, but it keeps the
*raw* (unbatched) client examples, because the corruption harness poisons raw examples
before the usual shuffle / repeat / batch preprocessing.
"""

import dataclasses
from typing import Any, Callable, Mapping, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


@dataclasses.dataclass(frozen=True)
class ClientSpec:
  """How a client iterates over its local data in one round.

  Attributes:
    num_epochs: Passes over the local dataset per round.
    batch_size: Local minibatch size.
    max_elements: Cap on the examples a client uses per round, taken after repeating
      for `num_epochs` (as in `tff.simulation.baselines.ClientSpec`); `None` = all.
    shuffle_buffer_size: Shuffle buffer; 1 disables shuffling.
  """
  num_epochs: int = 1
  batch_size: int = 10
  max_elements: Optional[int] = None
  shuffle_buffer_size: int = 1000

  def __post_init__(self):
    for name in ('num_epochs', 'batch_size', 'shuffle_buffer_size'):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f'ClientSpec.{name} must be a positive integer, got {value!r}.')
    if self.max_elements is not None and (
        not isinstance(self.max_elements, (int, np.integer)) or self.max_elements <= 0):
      raise ValueError('ClientSpec.max_elements must be None or a positive integer, '
                       f'got {self.max_elements!r}.')


@dataclasses.dataclass
class Task:
  """A federated benchmark: model, per-client train/test data and its corruption.

  Attributes:
    name: E.g. `'emnist_linear'`.
    keras_model_fn: Builds a fresh, uncompiled Keras model (logits output).
    model_fn: Builds the `tff.learning.models.VariableModel` (loss +
      `SparseCategoricalAccuracy`), as TFF's learning builders expect.
    loss_fn: Builds the loss (sparse categorical cross-entropy on logits).
    train_data: Raw (unbatched) training examples per client; elements are `(x, y)`.
    test_data: Each client's held-out examples, same element format.
    client_weights: α_i = number of training examples of client i, for every id of
      `train_data`.
    client_spec: Local epochs, batch size, cap and shuffle buffer.
    data_attacks: The task's data poisonings by attack name, each a function of raw
      element datasets; every task has 'data', the paper's (RFA paper D.2.1). The
      simulation offers them next to the update attacks of
      `tasks.simulation.attacks`.
    provenance: How `tasks.builders.build_task` made the data (source, client cap,
      seed, source options; not the directory, which differs between machines), so
      a results ledger can tell runs on other data apart.
  """
  name: str
  keras_model_fn: Callable[[], tf.keras.Model]
  model_fn: Callable[[], tff.learning.models.VariableModel]
  loss_fn: Callable[[], tf.keras.losses.Loss]
  train_data: tff.simulation.datasets.ClientData
  test_data: tff.simulation.datasets.ClientData
  client_weights: dict[str, float]
  client_spec: ClientSpec
  data_attacks: Mapping[str, Callable[[tf.data.Dataset], tf.data.Dataset]]
  provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def preprocess(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Shuffles, repeats `num_epochs` times, caps at `max_elements` and batches."""
    spec = self.client_spec
    if spec.shuffle_buffer_size > 1:
      # Unseeded on purpose: a client sees a fresh order (and, with max_elements, a
      # fresh subset) every round. tf.random.set_seed makes whole runs reproducible.
      dataset = dataset.shuffle(spec.shuffle_buffer_size)
    dataset = dataset.repeat(spec.num_epochs)
    if spec.max_elements is not None:
      dataset = dataset.take(spec.max_elements)
    return dataset.batch(spec.batch_size)

  def client_dataset(self, client_id: str,
                     data_attack: Optional[str] = None) -> tf.data.Dataset:
    """The preprocessed training data of one client, first poisoned by the data
    attack of that name if one is given."""
    dataset = self.train_data.create_tf_dataset_for_client(client_id)
    if data_attack is not None:
      if data_attack not in self.data_attacks:
        raise ValueError(f'Task {self.name} has no data attack {data_attack!r}; it has '
                         f'{", ".join(self.data_attacks)}.')
      dataset = self.data_attacks[data_attack](dataset)
    return self.preprocess(dataset)

  def centralized_test_dataset(self, batch_size: int = 500,
                               max_examples: Optional[int] = None) -> tf.data.Dataset:
    """All clients' clean test examples, batched (the first `max_examples` if given)."""
    dataset = self.test_data.create_tf_dataset_from_all_clients()
    if max_examples is not None:
      dataset = dataset.take(max_examples)
    return dataset.batch(batch_size)

  @property
  def element_spec(self):
    """The element spec of batched client datasets (TFF's `input_spec`)."""
    return self.preprocess(self.train_data.create_tf_dataset_for_client(
        self.train_data.client_ids[0])).element_spec
