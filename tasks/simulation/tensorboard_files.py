"""A run's TensorBoard directory: its check, and the purge of the steps a resumed run
writes again."""

import os
from typing import Callable

import tensorflow as tf

from tensorflow.core.util import event_pb2

from tasks.simulation import run_errors

TENSORBOARD_DIR = 'tensorboard'
# TensorBoard's event files have this in their name.
_EVENTS_FILE = 'tfevents'


def check_dir(path: str) -> None:
  """Raises a run_errors.RunFileError if `path` cannot hold TensorBoard event files."""
  fix = ('Move it away (the run writes TensorBoard summaries there), or pass '
         '--notensorboard')
  if os.path.lexists(path) and not os.path.isdir(path):
    raise run_errors.RunFileError(path, 'is a file, not a directory', fix)
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise run_errors.RunFileError(
        path, f'cannot be created ({run_errors.one_line(e)})', fix) from e
  if not os.access(path, os.W_OK | os.X_OK):
    raise run_errors.RunFileError(path, 'is not writable', fix)


def _event_records(path: str) -> tuple[list[bytes], bool]:
  """The records of a TensorBoard event file, and whether it was read to its end (a
  kill may cut the last record off)."""
  records = []
  try:
    for record in tf.data.TFRecordDataset(path):
      records.append(record.numpy())
  except tf.errors.DataLossError:
    return records, False
  return records, True


def purge(directory: str, start: int, log: Callable[[str], None]) -> None:
  """Keeps in `directory`'s event files one value per (tag, step) and none of the
  steps from `start` on, which the resumed run writes again: TensorBoard would
  otherwise show two values at every rerun step. Files are only rewritten when they
  hold such values; the first one is replaced atomically and the others removed, so
  an interrupted purge is completed by the next resume."""
  names = sorted(n for n in os.listdir(directory) if _EVENTS_FILE in n)
  kept, seen, changed = [], set(), False
  for name in names:
    records, complete = _event_records(os.path.join(directory, name))
    changed |= not complete
    for record in records:
      event = event_pb2.Event.FromString(record)
      if not event.HasField('summary'):
        if not kept:  # The file's version header, once.
          kept.append(record)
        continue
      keys = {(value.tag, event.step) for value in event.summary.value}
      if event.step >= start or keys <= seen:
        changed = True
        continue
      seen |= keys
      kept.append(record)
  if not changed:
    return
  paths = [os.path.join(directory, name) for name in names]
  if seen:
    temporary = os.path.join(directory, 'purge.tmp')
    with tf.io.TFRecordWriter(temporary) as writer:
      for record in kept:
        writer.write(record)
    os.replace(temporary, paths[0])
    paths = paths[1:]
  for path in paths:
    os.remove(path)
  log(f'{directory}: dropped the TensorBoard values of rounds {start} on (rerun now) '
      'and repeated ones.')
