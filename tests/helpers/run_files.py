"""Damage done to a run's files, as a disk, a kill or a user might: the cases of the
experiment runner's and the binaries' tests. Each function returns the damaged path;
`tensorboard_steps` reads what a run wrote."""

import collections
import os
import shutil

import tensorflow as tf

from tasks.simulation import checkpoints
from tasks.simulation import metrics_file
from tasks.simulation import run_config
from tasks.simulation import tensorboard_files


def tensorboard_steps(directory):
  """tag → the steps of its values in the run's event files, in file order."""
  steps = collections.defaultdict(list)
  tensorboard = os.path.join(directory, tensorboard_files.TENSORBOARD_DIR)
  for name in sorted(os.listdir(tensorboard)):
    for event in tf.compat.v1.train.summary_iterator(os.path.join(tensorboard, name)):
      for value in event.summary.value:
        steps[value.tag].append(event.step)
  return steps


def checkpoint(directory, version):
  return os.path.join(directory, checkpoints.CHECKPOINTS_DIR, f'round_{version}')


def garble_variables(checkpoint):
  path = os.path.join(checkpoint, 'variables', 'variables.data-00000-of-00001')
  with open(path, 'rb') as f:
    data = bytearray(f.read())
  for i in range(0, len(data), 7):
    data[i] ^= 0xFF
  with open(path, 'wb') as f:
    f.write(data)


def remove_variables(checkpoint):
  shutil.rmtree(os.path.join(checkpoint, 'variables'))


def empty_saved_model(checkpoint):
  open(os.path.join(checkpoint, 'saved_model.pb'), 'w').close()


CHECKPOINT_DAMAGE = (('garbled_variables', garble_variables, 'checksum'),
                     ('variables_removed', remove_variables, 'TensorSliceReader'),
                     ('empty_saved_model', empty_saved_model, 'MetaGraphs'))


def replace_line(path, number, text):
  """Replaces line `number` (1-based) of `path` by `text` (no line end if the last)."""
  with open(path, newline='') as f:
    lines = f.read().splitlines(keepends=True)
  lines[number - 1] = text
  with open(path, 'w', newline='') as f:
    f.write(''.join(lines))


def truncate_row_of_round_1(directory):
  path = os.path.join(directory, metrics_file.METRICS_FILE)
  with open(path, newline='') as f:
    line = f.read().splitlines(keepends=True)[2]
  replace_line(path, 3, line[:len(line) // 2] + '\r\n')
  return path


def drop_row_of_round_1(directory):
  path = os.path.join(directory, metrics_file.METRICS_FILE)
  replace_line(path, 3, '')
  return path


def repeat_row_of_round_0(directory, changed=False):
  """Inserts a second row of round 0 after the first (two processes wrote the run),
  with another train loss if `changed`."""
  path = os.path.join(directory, metrics_file.METRICS_FILE)
  with open(path, newline='') as f:
    lines = f.read().splitlines(keepends=True)
  line = lines[1].replace(',', ',9', 1) if changed else lines[1]
  replace_line(path, 2, lines[1] + line)
  return path


def cut_off_last_row(directory, line_end=''):
  """Cuts the last row of metrics.csv in half (a kill mid-write, by older versions),
  ending it with `line_end`."""
  path = os.path.join(directory, metrics_file.METRICS_FILE)
  with open(path, newline='') as f:
    lines = f.read().splitlines(keepends=True)
  replace_line(path, len(lines), lines[-1][:len(lines[-1]) // 2] + line_end)
  return path


def garble_header(directory):
  path = os.path.join(directory, metrics_file.METRICS_FILE)
  replace_line(path, 1, 'x\x00y,z\r\n')
  return path


def junk_config(directory):
  path = os.path.join(directory, run_config.CONFIG_FILE)
  with open(path, 'w') as f:
    f.write('{"run": "te')
  return path


def tensorboard_file(directory):
  path = os.path.join(directory, tensorboard_files.TENSORBOARD_DIR)
  shutil.rmtree(path, ignore_errors=True)
  open(path, 'w').close()
  return path


def every_checkpoint_garbled(directory):
  for version in (1, 2, 3):
    garble_variables(checkpoint(directory, version))
  return os.path.join(directory, checkpoints.CHECKPOINTS_DIR)


BAD_FILES = (
    ('every_checkpoint_unreadable', every_checkpoint_garbled,
     'no checkpoint reads back with these flags: round_3 .*round_2 .*round_1'),
    ('truncated_row_of_a_finished_round', truncate_row_of_round_1,
     'line 3 has .* columns'),
    ('missing_row_of_a_finished_round', drop_row_of_round_1, 'no row for round.* 1'),
    ('repeated_row_with_other_values', lambda d: repeat_row_of_round_0(d, True),
     'line 3 repeats round 0 of line 2 with other values'),
    ('garbled_header', garble_header, "no 'round' column"),
    ('junk_config', junk_config, 'not valid JSON'),
    ('tensorboard_is_a_file', tensorboard_file, 'not a directory'),
)
