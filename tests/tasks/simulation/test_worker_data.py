"""tasks.simulation.worker_data: a client's dataset built from the export by client id
(as a worker builds it) equals the driver's `Task.client_dataset`, batch for batch."""

import base64
import collections
import gc
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import builders
from tasks.builders import task as task_lib
from tasks.simulation import worker_data


@pytest.fixture(scope='module')
def task():
  # Shuffled, two epochs, capped: the seeds and the cap both matter.
  return builders.build_task('emnist', 'linear', source='synthetic', num_clients=4,
                             client_spec=builders.ClientSpec(2, 3, max_elements=11))


def _key(client_data, client_id, attack, seeds):
  return collections.OrderedDict(
      client_id=client_id, data_attack=np.int32(client_data.data_attack_index(attack)),
      seed=np.int64(seeds[0]), seed2=np.int64(seeds[1]))


def _as_worker_sees_it(client_data):
  """Computations returning what a worker's client trains on: every batch's labels
  and pixel sums, in order, given the dataset (serialized by the driver, as the
  single process and `data_on_workers=False` send it) or given its key."""
  batch_type = client_data.dataset_computation.type_signature.result

  @tff.tensorflow.computation(batch_type)
  def contents(dataset):
    def add(sums_and_labels, batch):
      sums, labels = sums_and_labels
      x, y = batch
      return (tf.concat([sums, tf.reduce_sum(tf.reshape(x, [tf.shape(x)[0], -1]),
                                             axis=1)], 0),
              tf.concat([labels, tf.cast(y, tf.int64)], 0))
    return dataset.reduce((tf.zeros([0]), tf.zeros([0], tf.int64)), add)

  @tff.federated_computation(tff.FederatedType(batch_type, tff.CLIENTS))
  def sent(datasets):
    return tff.federated_map(contents, datasets)

  @tff.federated_computation(tff.FederatedType(
      client_data.dataset_computation.type_signature.parameter, tff.CLIENTS))
  def by_id(keys):
    return tff.federated_map(
        contents, tff.federated_map(client_data.dataset_computation, keys))

  return sent, by_id


@pytest.mark.parametrize('attack', [None, 'data', 'label_flip'])
def test_the_dataset_by_id_is_the_drivers_dataset(task, tmp_path, attack):
  client_data = worker_data.ClientDataDirectory(task, str(tmp_path / 'clients'))
  client_ids = task.train_data.client_ids[1:3]
  client_data.export(client_ids)
  tf.random.set_seed(7)
  datasets = [task.client_dataset(c, attack) for c in client_ids]
  keys = [_key(client_data, c, attack, task_lib.shuffle_seeds(d))
          for c, d in zip(client_ids, datasets)]
  sent, by_id = _as_worker_sees_it(client_data)

  expected, got = sent(datasets), by_id(keys)

  assert len(got) == len(expected) == 2
  for (got_sums, got_labels), (sums, labels) in zip(got, expected):
    assert len(labels) == 11  # The cap.
    np.testing.assert_array_equal(got_labels, labels)
    np.testing.assert_array_equal(got_sums, sums)


def test_other_seeds_shuffle_otherwise(task, tmp_path):
  client_data = worker_data.ClientDataDirectory(task, str(tmp_path / 'clients'))
  client_id = task.train_data.client_ids[0]
  client_data.export([client_id])
  _, by_id = _as_worker_sees_it(client_data)
  (_, first), (_, second) = by_id([_key(client_data, client_id, None, (1, 2)),
                                   _key(client_data, client_id, None, (1, 3))])
  assert list(first) != list(second)


def test_file_names_are_tensorflows_web_safe_base64():
  for client_id in ['f0000_14', 'a/b c', 'é', '']:
    expected = tf.io.encode_base64(client_id, pad=False).numpy().decode('ascii')
    assert worker_data.file_key(client_id) == expected
    padded = expected + '=' * (-len(expected) % 4)
    assert base64.urlsafe_b64decode(padded).decode('utf-8') == client_id


def test_a_worker_with_another_export_fails(task, tmp_path):
  directory = str(tmp_path / 'clients')
  client_data = worker_data.ClientDataDirectory(task, directory)
  client_id = task.train_data.client_ids[1]
  client_data.export([client_id])
  with open(os.path.join(directory, 'DATASET_ID'), 'w') as f:
    f.write('another export')
  with pytest.raises(Exception,
                     match='not the export of the client data the driver made'):
    client_data.dataset_computation(_key(client_data, client_id, None, (1, 2)))


def test_reopening_keeps_the_export_and_refuses_another_task(task, tmp_path):
  directory = str(tmp_path / 'clients')
  first = worker_data.ClientDataDirectory(task, directory)
  first.export(task.train_data.client_ids[:1])
  again = worker_data.ClientDataDirectory(task, directory)
  assert again.token == first.token
  other = builders.build_task('emnist', 'linear', source='synthetic', num_clients=3)
  with pytest.raises(ValueError, match='another task'):
    worker_data.ClientDataDirectory(other, directory)
  stray = tmp_path / 'stray'
  stray.mkdir()
  (stray / 'file').write_text('x')
  with pytest.raises(ValueError, match='not empty'):
    worker_data.ClientDataDirectory(task, str(stray))


def test_a_temporary_export_goes_with_its_object_and_a_named_one_stays(task, tmp_path):
  temporary = worker_data.ClientDataDirectory(task)
  named = worker_data.ClientDataDirectory(task, str(tmp_path / 'clients'))
  for client_data in (temporary, named):
    client_data.export(task.train_data.client_ids[:1])
  paths = temporary.directory, named.directory
  del temporary, named
  gc.collect()
  assert not os.path.exists(paths[0])
  assert os.listdir(paths[1])


def test_shuffle_seeds_are_the_ones_tf_drew(task):
  tf.random.set_seed(3)
  seeds = task_lib.shuffle_seeds(task.client_dataset(task.train_data.client_ids[0]))
  tf.random.set_seed(3)
  dataset = tf.data.Dataset.range(3).shuffle(10)
  assert seeds == task_lib.shuffle_seeds(dataset)
  assert seeds[0] == 3
  assert task_lib.shuffle_seeds(tf.data.Dataset.range(3)) is None
