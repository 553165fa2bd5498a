r"""A task of your own: synthetic client data and a small Keras model (docs/tasks.md).

From the repository root, as every binary runs:

  .venv/bin/python -m tasks.binaries.train --task=docs.examples.my_task:build_task \
      --aggregator=gm --attack=alie --rho=0.2 --rounds=10 --clients_per_round=6

Your own module works the same way: put it under the directory you run in (or
install its package) and pass `--task=your_package.your_module:your_function`.
"""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import builders

NUM_CLIENTS = 12
NUM_FEATURES = 8
NUM_CLASSES = 3


def keras_model() -> tf.keras.Model:
  """Features → 16 ReLU units → class logits (no softmax: the loss takes logits)."""
  inputs = tf.keras.Input(shape=(NUM_FEATURES,))
  hidden = tf.keras.layers.Dense(16, activation='relu')(inputs)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(NUM_CLASSES)(hidden))


def _examples(rng: np.random.Generator, centres: np.ndarray, count: int,
              favourite: int = -1) -> tuple[np.ndarray, np.ndarray]:
  """`count` points around the class centres; mostly of class `favourite` if ≥ 0 (a
  client's label skew, as federated data usually has)."""
  weights = np.ones(NUM_CLASSES)
  if favourite >= 0:
    weights[favourite] = 8.0
  labels = rng.choice(NUM_CLASSES, size=count, p=weights / weights.sum())
  features = centres[labels] + rng.normal(size=(count, NUM_FEATURES))
  return features.astype(np.float32), labels.astype(np.int32)


def flip_labels(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """A data attack: a corrupted client trains on labels shifted by one class."""
  return dataset.map(lambda x, y: (x, (y + 1) % NUM_CLASSES))


def build_task(seed: int = 0) -> builders.Task:
  """The task: 12 clients of 20–60 examples each, a held-out test set of 300.

  The binaries call it with the data seed (--seed of `train`, --data_seed of the
  sweeps) because it has a `seed` parameter; a function without one is called with
  no argument.
  """
  rng = np.random.default_rng(seed)
  centres = rng.normal(scale=1.5, size=(NUM_CLASSES, NUM_FEATURES))
  clients = {f'client_{i:02d}': _examples(rng, centres, int(rng.integers(20, 61)),
                                          favourite=i % NUM_CLASSES)
             for i in range(NUM_CLIENTS)}
  test_features, test_labels = _examples(rng, centres, 300)
  return builders.Task.from_keras(
      name='my_task',
      keras_model_fn=keras_model,
      # Unbatched (x, y) pairs per client; any tff.simulation.datasets.ClientData.
      train_data=tff.simulation.datasets.TestClientData(clients),
      # One test set (a ClientData of the same elements works too).
      test_data=tf.data.Dataset.from_tensor_slices((test_features, test_labels)),
      data_attacks={'label_flip': flip_labels})
