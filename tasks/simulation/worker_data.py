"""A task's training clients where the workers are: a directory of per-client files
and the TFF computation that builds a client's dataset from it by client id.

TFF's way to keep client data off the driver in a distributed simulation is
`ClientData.dataset_computation`, a computation from a client id to its dataset,
mapped over the clients in front of the round
(`tff.simulation.compose_dataset_computation_with_computation`): the driver then
sends ids, and every worker reads its clients' data itself. TFF's worker_binary runs
TensorFlow graphs only (no Python), so the data must be readable by graph ops:

*   `ClientDataDirectory.export(client_ids)` writes each client's raw examples, one
    file per leaf of the `(x, y)` structure (`tf.io.serialize_tensor` of the stacked
    examples), named by the client id in web-safe base64, plus `DATASET_ID`, a
    random token naming this export. Clients already there are kept (an export grows
    as rounds sample new clients).
*   `ClientDataDirectory.dataset_computation` maps `(client_id, data_attack, seed,
    seed2)` to the client's training dataset: the files read with `tf.io.read_file`,
    the task's data attack of that index applied (0: none), then `Task.preprocess`
    with the given shuffle seeds. It checks the directory's `DATASET_ID` first, so a
    worker whose copy belongs to another export fails instead of training on it.

Per client, the driver sends a string and three scalars instead of the dataset; the
shuffle seeds are the ones the driver's own `Task.client_dataset` drew
(`tasks.builders.task.shuffle_seeds`), so a round trains on the batches the
single-process round trains on.

On one machine the workers read the driver's directory. With workers on other
machines, the directory must be at the same path on every one of them (a shared
file system, or a copy of a complete export: `export(task.train_data.client_ids)`).
"""

import base64
import json
import os
import shutil
import tempfile
import uuid
import weakref
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks.builders import data_utils
from tasks.builders import task as task_lib
from tff_robust.distributed import worker_network

_TOKEN_FILE = 'DATASET_ID'
_MANIFEST_FILE = 'manifest.json'


def file_key(client_id: str) -> str:
  """A client id as a file name: web-safe base64 without padding (as
  `tf.io.encode_base64(id, pad=False)`)."""
  return base64.urlsafe_b64encode(client_id.encode('utf-8')).decode('ascii').rstrip('=')


def _raw_spec(task: task_lib.Task):
  client_data = task.train_data
  spec = getattr(client_data, 'element_type_structure', None)
  if spec is None:
    first = client_data.client_ids[0]
    spec = client_data.create_tf_dataset_for_client(first).element_spec
  return spec


class ClientDataDirectory:
  """A task's training clients as files a TFF worker reads by client id.

  Attributes:
    directory: where the files are (the same path on every worker).
    data_attacks: the data attack names, in the order of their indices (1, 2, ...;
      0 is no attack).
  """

  def __init__(self, task: task_lib.Task, directory: Optional[str] = None):
    """Opens (or starts) the export of `task`'s training clients in `directory`.

    Args:
      task: a `tasks.builders.Task`.
      directory: an empty or missing directory, or one this class exported the same
        task into (its manifest must match); default a new temporary directory,
        deleted with this object (or at exit): an export only its run reads.

    Raises:
      ValueError: if `directory` holds an export of another task.
    """
    self._task = task
    # Group of the files: whom a worker started by root runs as (its data only).
    self._workers_gid = None
    if directory is None:
      directory = tempfile.mkdtemp(prefix='tff_client_data_')
      # Every run on workers would otherwise leave a copy of its clients in /tmp.
      weakref.finalize(self, shutil.rmtree, directory, ignore_errors=True)
      if os.geteuid() == 0:
        self._workers_gid = worker_network.unprivileged_ids()[1]
        os.chown(directory, -1, self._workers_gid)
        os.chmod(directory, 0o750)
    self.directory = os.path.abspath(directory)
    self.data_attacks = sorted(task.data_attacks)
    self._spec = _raw_spec(task)
    os.makedirs(self.directory, exist_ok=True)
    manifest = collections_manifest(task, self._spec)
    manifest_path = os.path.join(self.directory, _MANIFEST_FILE)
    token_path = os.path.join(self.directory, _TOKEN_FILE)
    if os.path.exists(manifest_path):
      with open(manifest_path) as f:
        found = json.load(f)
      if found != manifest:
        raise ValueError(f'{self.directory} holds the clients of another task or data '
                         f'({found}); expected {manifest}. Use an empty directory.')
      with open(token_path) as f:
        self.token = f.read()
    else:
      if os.listdir(self.directory):
        raise ValueError(f'{self.directory} is not empty and holds no client export.')
      self.token = uuid.uuid4().hex
      self._write(token_path, self.token.encode('ascii'))
      self._write(manifest_path, json.dumps(manifest, sort_keys=True).encode('utf-8'))
    self._exported = set()
    self._computation = None

  def _paths(self, client_id: str) -> list[str]:
    key = file_key(client_id)
    return [os.path.join(self.directory, f'{key}.{i}')
            for i in range(len(tf.nest.flatten(self._spec)))]

  def export(self, client_ids: Sequence[str]) -> None:
    """Writes the clients of `client_ids` not exported yet."""
    for client_id in client_ids:
      # Exported: by this object, or before (every leaf's file complete, `_write`).
      if file_key(client_id) in self._exported or all(
          os.path.exists(path) for path in self._paths(client_id)):
        self._exported.add(file_key(client_id))
        continue
      examples = data_utils.batch_all(
          self._task.train_data.create_tf_dataset_for_client(client_id))
      leaves = tf.nest.flatten(self._spec)
      arrays = (tf.nest.flatten(examples) if examples is not None else
                [np.zeros([0, *s.shape], s.dtype.as_numpy_dtype) for s in leaves])
      for path, array, spec in zip(self._paths(client_id), arrays, leaves):
        self._write(path, tf.io.serialize_tensor(
            tf.convert_to_tensor(array, spec.dtype)).numpy())
      self._exported.add(file_key(client_id))

  def _write(self, path: str, content: bytes) -> None:
    _write(path, content, self._workers_gid)

  def data_attack_index(self, name: Optional[str]) -> int:
    """0 for no attack, else 1 + the attack's position in `data_attacks`."""
    return 0 if name is None else 1 + self.data_attacks.index(name)

  @property
  def dataset_computation(self) -> tff.Computation:
    """`(client_id, data_attack, seed, seed2) → the client's preprocessed dataset`,
    reading this directory on whichever worker runs it."""
    if self._computation is None:
      self._computation = self._build_computation()
    return self._computation

  def _build_computation(self) -> tff.Computation:
    task, spec, directory, token = self._task, self._spec, self.directory, self.token
    attacks = [task.data_attacks[name] for name in self.data_attacks]
    leaves = tf.nest.flatten(spec)

    @tff.tensorflow.computation(
        tff.StructType([('client_id', np.str_), ('data_attack', np.int32),
                        ('seed', np.int64), ('seed2', np.int64)]))
    def client_dataset(key):
      stored = tf.io.read_file(tf.strings.join([directory, _TOKEN_FILE], '/'))
      check = tf.debugging.assert_equal(
          stored, token, message=f'{directory} on this worker is not the export '
          'of the client data the driver made (DATASET_ID differs)')
      with tf.control_dependencies([check]):
        stem = tf.strings.join(
            [directory, tf.io.encode_base64(key.client_id, pad=False)], '/')
      tensors = []
      for i, leaf in enumerate(leaves):
        content = tf.io.read_file(tf.strings.join([stem, str(i)], '.'))
        tensor = tf.io.parse_tensor(content, leaf.dtype)
        tensors.append(tf.ensure_shape(tensor, [None, *leaf.shape]))
      raw = tf.data.Dataset.from_tensor_slices(tf.nest.pack_sequence_as(spec, tensors))
      if attacks:
        choice = tf.data.Dataset.from_tensors(tf.cast(key.data_attack, tf.int64))
        raw = tf.data.Dataset.choose_from_datasets(
            [raw] + [attack(raw) for attack in attacks], choice.repeat())
      return task.preprocess(raw, (key.seed, key.seed2))

    return client_dataset


def collections_manifest(task: task_lib.Task, spec) -> dict:
  """What an export must match to be reused: the task, its data and element spec."""
  provenance = json.loads(json.dumps(dict(task.provenance), default=str))
  return {'task': task.name, 'provenance': provenance,
          'num_clients': len(task.train_data.client_ids),
          'element_spec': [[s.dtype.name, s.shape.as_list()]
                           for s in tf.nest.flatten(spec)]}


def _write(path: str, content: bytes, gid: Optional[int] = None) -> None:
  # Complete files only: a worker never reads one half written.
  partial = f'{path}.partial'
  with open(partial, 'wb') as f:
    if gid is not None:  # Readable by the workers' group, whatever the umask.
      os.fchown(f.fileno(), -1, gid)
      os.fchmod(f.fileno(), 0o640)
    f.write(content)
  os.replace(partial, path)
