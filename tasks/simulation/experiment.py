"""Runs a `tasks.simulation.loop.Simulation` with metrics output and resumable checkpoints.

Output directory layout (one run):

  config.json       the run's configuration; a restart with a different one is refused
  metrics.csv       one row per finished round (`tff.program.CSVFileReleaseManager`)
  tensorboard/      the same values as TensorBoard scalars
  checkpoints/      `tff.program.FileProgramStateManager`, version v = v finished rounds

Resume semantics (why the order below matters): round r's metrics row is released
*before* the checkpoint of version r + 1 is saved, and both writes are atomic (the
state manager renames a finished directory; the CSV manager rewrites the whole file
through a temporary file, `CSVSaveMode.WRITE`, so a kill never leaves half a row). A
run killed at any moment restarts from the last checkpoint, round `v`, and releasing
round v's row with key v first removes every row with key ≥ v that the killed run may
have written: no round is lost or repeated.

Damaged files (`RunFileError`): a resumed run loads the newest *readable* checkpoint
(the manager keeps the first and the two latest) and moves the unreadable newer ones
to `checkpoints/unreadable_round_<v>`; the rows after the one it resumes from are
rewritten as above. A cut-off last metrics row (a kill in the middle of an append, by
older versions) is dropped: its round is after the last checkpoint and is rerun. Every
other damaged or inconsistent file (no readable checkpoint, a junk config.json, a
damaged row of a checkpointed round, a TensorBoard path that is not a writable
directory) stops the run before it writes anything, with a `RunFileError` naming the
file, the problem and the fix.
"""

import asyncio
import collections
import contextlib
import csv
import dataclasses
import json
import os
import re
import shutil
import sys
from typing import Any, Callable, Mapping, Optional

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tqdm

from tasks.simulation import loop

METRICS_FILE = 'metrics.csv'
CONFIG_FILE = 'config.json'
CHECKPOINTS_DIR = 'checkpoints'
TENSORBOARD_DIR = 'tensorboard'
CHECKPOINT_PREFIX = 'round_'
UNREADABLE_PREFIX = 'unreadable_'
# The first checkpoint (`keep_first`) and the two latest: a damaged latest one leaves
# an older one to resume from.
CHECKPOINTS_KEPT = 3
# What a write killed half-way leaves behind (TFF's `<path>_temp<4 digits>`).
_TEMPORARY = re.compile(r'_temp\d+$')
ROUND_COLUMN = 'round'
# Columns every metrics.csv has, in addition to the simulation's own metrics (see
# `tasks.simulation.loop.Simulation`) and the aggregator's `aggregator/...`.
DOCUMENTED_COLUMNS = (ROUND_COLUMN, 'train_loss', 'secure_average_calls',
                      'cumulative_secure_average_calls', 'test_accuracy', 'test_loss')


class NonFiniteStateError(RuntimeError):
  """A round produced a non-finite model or too few finite client updates to
  aggregate; the finished rounds are kept."""


class ConfigMismatchError(ValueError):
  """The output directory holds a run with a different configuration."""


class RunFileError(RuntimeError):
  """A file of a run's output directory is unreadable or inconsistent.

  The message is one line: the file, what is wrong with it and the fix.

  Attributes:
    path: The file or directory.
    problem: What is wrong with it.
    fix: What the user can do.
  """

  def __init__(self, path: str, problem: str, fix: str):
    self.path = path
    self.problem = problem
    self.fix = fix
    super().__init__(f'{path}: {problem}. {fix}')


def _one_line(error: BaseException, limit: int = 200) -> str:
  """An exception as a short single line (TF's messages span several lines)."""
  text = ' '.join(str(error).split()) or type(error).__name__
  return text if len(text) <= limit else text[:limit - 1] + '…'


def _print_to_stderr(message: str) -> None:
  print(message, file=sys.stderr)


def _run(coroutine):
  return asyncio.run(coroutine)


def check_config(output_dir: str, config: Mapping[str, Any],
                 ignore: tuple[str, ...] = ('rounds', 'eval_period')) -> None:
  """Writes `config` to `output_dir`, or checks it equals the one already there.

  Keys in `ignore` may change between sessions (e.g. a run is extended by raising
  `rounds`). A run that has not finished a round yet (no metrics, no checkpoint: say
  its data failed to load) has nothing to protect, and takes the new `config`; so
  does one still in its first round in another process, which is not guarded
  against (two runs in one directory are not supported anyway).

  Raises:
    ConfigMismatchError: naming the keys that differ.
  """
  path = os.path.join(output_dir, CONFIG_FILE)
  config = json.loads(json.dumps(dict(config), sort_keys=True, default=str))
  if os.path.exists(path):
    saved = _read_config(path)
    keys = sorted(k for k in set(saved) | set(config)
                  if k not in ignore and saved.get(k) != config.get(k))
    if not keys:
      return
    if _has_finished_rounds(output_dir):
      changes = ', '.join(f'{k}: {saved.get(k)!r} → {config.get(k)!r}' for k in keys)
      raise ConfigMismatchError(
          f'{output_dir} holds a run with a different configuration ({changes}). Use '
          'the same flags to resume it, or another --experiment_name / output '
          'directory.')
  os.makedirs(output_dir, exist_ok=True)
  temporary = path + '.tmp'
  with open(temporary, 'w') as f:
    json.dump(config, f, indent=2, sort_keys=True)
  os.replace(temporary, path)


def _has_finished_rounds(output_dir: str) -> bool:
  """Whether the run has written a metrics row or a checkpoint (of any version, even
  one being written)."""
  checkpoints_dir = os.path.join(output_dir, CHECKPOINTS_DIR)
  return (os.path.exists(os.path.join(output_dir, METRICS_FILE)) or
          (os.path.isdir(checkpoints_dir) and bool(os.listdir(checkpoints_dir))))


def _read_config(path: str) -> dict[str, Any]:
  """The saved configuration, or a RunFileError saying why it cannot be used."""
  fix = (f'It records the flags of the run in {os.path.dirname(path) or "."}: restore '
         'it, or delete it to adopt the current flags (only if they are the run\'s)')
  try:
    with open(path, encoding='utf-8') as f:
      saved = json.load(f)
  except json.JSONDecodeError as e:
    raise RunFileError(path, f'not valid JSON ({e})', fix) from e
  except (OSError, UnicodeDecodeError) as e:
    raise RunFileError(path, f'unreadable ({_one_line(e)})', fix) from e
  if not isinstance(saved, dict):
    raise RunFileError(path, f'holds a JSON {type(saved).__name__}, not an object', fix)
  return saved


def _checkpoint(state, cumulative_calls: int) -> collections.OrderedDict:
  return collections.OrderedDict(simulation=state,
                                 cumulative_secure_average_calls=np.int64(
                                     cumulative_calls))


def _restore(template, loaded):
  """Packs the loaded leaves into the (container-preserving) template structure."""
  leaves = tf.nest.flatten(loaded)
  expected = len(tf.nest.flatten(template))
  if len(leaves) != expected:
    raise ValueError(f'The checkpoint holds {len(leaves)} values, the simulation '
                     f'expects {expected}: was it written by another configuration?')
  return tf.nest.pack_sequence_as(template, [np.asarray(v) for v in leaves])


def finished_rounds(output_dir: str) -> int:
  """Rounds a (possibly interrupted) run in `output_dir` has checkpointed."""
  checkpoints_dir = os.path.join(output_dir, CHECKPOINTS_DIR)
  if not os.path.isdir(checkpoints_dir):
    return 0  # Asking must not create the directory, as the manager would.
  manager = tff.program.FileProgramStateManager(checkpoints_dir,
                                                prefix=CHECKPOINT_PREFIX)
  versions = _run(manager.get_versions())
  return max(versions) if versions else 0


@dataclasses.dataclass(frozen=True)
class _Resumption:
  """Where a run resumes: the checkpoint loaded and the damaged newer ones."""
  checkpoint: Any
  version: int  # = finished rounds; 0 when the run starts afresh.
  unreadable: tuple[tuple[int, str], ...]  # (version, why), newest first.


def _newest_readable_checkpoint(state_manager, checkpoints_dir: str,
                                template) -> _Resumption:
  """Loads the newest checkpoint that reads back into `template`'s structure.

  Raises:
    RunFileError: if there are checkpoints and none of them is readable.
  """
  versions = sorted(_run(state_manager.get_versions()) or [], reverse=True)
  unreadable = []
  for version in versions:
    try:
      loaded = _run(state_manager.load(version, template))
      return _Resumption(_restore(template, loaded), version, tuple(unreadable))
    # A damaged SavedModel surfaces as TF's OpError, FileNotFoundError, ValueError
    # ("0 MetaGraphs"), IndexError ("Read less bytes"), ...: every failure to read one
    # means the same to the run.
    except Exception as e:  # pylint: disable=broad-except
      unreadable.append((version, _one_line(e)))
  if unreadable:
    names = ', '.join(f'{CHECKPOINT_PREFIX}{v} ({why})' for v, why in unreadable)
    raise RunFileError(
        checkpoints_dir, f'no checkpoint is readable: {names}',
        f'Delete {checkpoints_dir} and {METRICS_FILE} next to it to rerun from round 0 '
        '(or restore a checkpoint from a backup)')
  return _Resumption(template, 0, ())


@dataclasses.dataclass(frozen=True)
class _MetricsFile:
  """A metrics.csv checked against the checkpoint a run resumes from."""
  path: str
  text: Optional[str]  # The repaired contents to write, if the file needs repair.
  dropped: str  # What the repair drops, for the log.


def _checked_metrics(path: str, finished: int) -> _MetricsFile:
  """Checks that `path` has an intact row for each of the `finished` rounds.

  Rows are released in round order and before their round's checkpoint, so once the
  rows read cover every finished round, the rest belong to rounds that are rerun: a
  damaged row there (typically a last row without its line end, cut off by a kill in
  the middle of an append) is dropped with everything after it.

  Raises:
    RunFileError: when the file is unreadable, has no `round` column, or a finished
      round's row is damaged or missing.
  """
  restore = (f'Restore it from a backup, or delete the run\'s directory '
             f'{os.path.dirname(path) or "."} to rerun it from round 0')
  if not os.path.lexists(path):
    return _MetricsFile(path, None, '')
  try:
    with open(path, encoding='utf-8', newline='') as f:
      lines = f.read().splitlines(keepends=True)
  except (OSError, UnicodeDecodeError) as e:
    raise RunFileError(path, f'unreadable ({_one_line(e)})', restore) from e
  if not lines:
    header = [ROUND_COLUMN]
  else:
    header = next(csv.reader(lines[:1]))
  if ROUND_COLUMN not in header:
    raise RunFileError(path, f'its header has no {ROUND_COLUMN!r} column', restore)
  round_index = header.index(ROUND_COLUMN)
  unfinished = set(range(finished))
  for index in range(1, len(lines)):
    row = next(csv.reader(lines[index:index + 1]), [])
    if not lines[index].endswith(('\n', '\r')):
      damage = 'is cut off'
    elif len(row) != len(header):
      damage = f'has {len(row)} of the {len(header)} columns'
    elif not re.fullmatch(r'\d+', row[round_index]):
      damage = f'has round {row[round_index]!r}'
    else:
      unfinished.discard(int(row[round_index]))
      continue
    if unfinished:
      raise RunFileError(path, f'line {index + 1} {damage}, before the rows of every '
                         f'checkpointed round (0..{finished - 1})', restore)
    dropped = f'line {index + 1} {damage}: {lines[index].strip()[:40]!r}'
    if index + 1 < len(lines):
      dropped += f' and the {len(lines) - index - 1} line(s) after it'
    return _MetricsFile(path, ''.join(lines[:index]), dropped)
  if unfinished:
    missing = sorted(unfinished)
    listed = ', '.join(map(str, missing[:10])) + (', …' if len(missing) > 10 else '')
    raise RunFileError(
        path, f'has no row for round(s) {listed}, which the checkpoint of round '
        f'{finished - 1} has finished', restore)
  return _MetricsFile(path, None, '')


@contextlib.contextmanager
def _written(path: str, round_num: int):
  """Turns a failed write of round `round_num`'s outputs (disk full, a file system
  gone read-only) into a RunFileError: every earlier round stays checkpointed."""
  try:
    yield
  except (OSError, tf.errors.OpError) as e:
    path = getattr(e, 'filename', None) or path
    reason = getattr(e, 'strerror', None) or getattr(e, 'message', None) or str(e)
    raise RunFileError(
        path, f'could not be written in round {round_num} ({reason.splitlines()[0]})',
        'Free disk space or make it writable, then rerun the same command: it '
        f'resumes at round {round_num}, every earlier one is checkpointed') from e


def _check_tensorboard_dir(path: str) -> None:
  """Raises a RunFileError if `path` cannot hold TensorBoard event files."""
  fix = (f'Move it away (the run writes TensorBoard summaries there), or pass '
         '--notensorboard')
  if os.path.lexists(path) and not os.path.isdir(path):
    raise RunFileError(path, 'is a file, not a directory', fix)
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise RunFileError(path, f'cannot be created ({_one_line(e)})', fix) from e
  if not os.access(path, os.W_OK | os.X_OK):
    raise RunFileError(path, 'is not writable', fix)


def _remove_leftovers(directory: str, log: Callable[[str], None]) -> None:
  """Removes the temporary files of writes that a kill cut short."""
  if not os.path.isdir(directory):
    return
  for name in sorted(os.listdir(directory)):
    if _TEMPORARY.search(name):
      path = os.path.join(directory, name)
      shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
      log(f'Removed {path}, the unfinished write of a killed session.')


def _set_aside(checkpoints_dir: str, resumption: _Resumption,
               log: Callable[[str], None]) -> None:
  """Moves the unreadable checkpoints newer than the one loaded out of the way (the
  state manager refuses to save over them), keeping them for inspection."""
  for version, why in resumption.unreadable:
    name = f'{CHECKPOINT_PREFIX}{version}'
    target = os.path.join(checkpoints_dir, UNREADABLE_PREFIX + name)
    if os.path.lexists(target):
      shutil.rmtree(target)
    os.rename(os.path.join(checkpoints_dir, name), target)
    log(f'Checkpoint {os.path.join(checkpoints_dir, name)} is unreadable ({why}); moved '
        f'it to {target}.')
  if resumption.unreadable:
    resumed = (f'{CHECKPOINT_PREFIX}{resumption.version}, after round '
               f'{resumption.version - 1}' if resumption.version else 'round 0 (no '
               'other checkpoint)')
    log(f'Resuming from {resumed}; the metrics rows from round {resumption.version} '
        'on are rewritten.')


def _repair(metrics: _MetricsFile, log: Callable[[str], None]) -> None:
  if metrics.text is None:
    return
  temporary = metrics.path + '.repair'
  with open(temporary, 'w', encoding='utf-8', newline='') as f:
    f.write(metrics.text)
  os.replace(temporary, metrics.path)
  log(f'{metrics.path}: dropped {metrics.dropped}, after the rows of every checkpointed '
      'round (a write cut short by a kill?); those rounds are rerun.')


def run_experiment(simulation: loop.Simulation, output_dir: str,
                   rounds: int, eval_period: int = 1, *,
                   config: Optional[Mapping[str, Any]] = None,
                   progress: bool = True, tensorboard: bool = True,
                   description: str = '', checkpoint_period: int = 1,
                   log: Callable[[str], None] = _print_to_stderr) -> int:
  """Runs rounds [finished, rounds) of `simulation`, resuming from `output_dir`.

  Every round writes a metrics row (key `round`) with the simulation's metrics,
  `cumulative_secure_average_calls` and, on evaluation rounds (round 0, every
  `eval_period`-th round and the last round), `test_accuracy` and `test_loss`; then,
  every `checkpoint_period` rounds and after the last one, a checkpoint. Other rows
  leave the test columns empty.

  Args:
    simulation: A `tasks.simulation.loop.Simulation`.
    output_dir: The run's directory (created).
    rounds: Total rounds of the run (rounds already finished are not rerun).
    eval_period: Evaluate every this many rounds.
    config: The run's configuration, checked against a previous session's.
    progress: Show a tqdm progress bar with the latest accuracy.
    tensorboard: Also write TensorBoard summaries.
    description: Progress bar label.
    checkpoint_period: Checkpoint after every this many rounds (and the last): the
      checkpoints of a short linear-model run are a fifth of its time, which a sweep
      of thousands of runs feels. An interrupted run reruns the rounds after its
      newest checkpoint (at most `checkpoint_period` − 1), with the same results
      (rounds are seeded by their number) and their metrics rows rewritten.
    log: Receives the lines saying how damaged files were dealt with (a fallback to
      an older checkpoint, a dropped cut-off row); default: printed to stderr.

  Returns:
    The number of finished rounds (= `rounds`).

  Raises:
    NonFiniteStateError: when a round leaves a non-finite model (its metrics row is
      written, its state is not checkpointed: the finished rounds stay resumable), or
      when too few of its clients train to a finite update for the aggregator (no
      row: `loop.NonFiniteUpdatesError`).
    ConfigMismatchError: when `output_dir` holds a run with another `config`.
    RunFileError: when a file of `output_dir` is unreadable or inconsistent and the
      run cannot resume around it (see the module docstring); nothing is written.
  """
  if min(rounds, eval_period, checkpoint_period) < 1:
    raise ValueError('rounds, eval_period and checkpoint_period must be ≥ 1, got '
                     f'{rounds}, {eval_period}, {checkpoint_period}.')
  os.makedirs(output_dir, exist_ok=True)
  if config is not None:
    check_config(output_dir, config)
  checkpoints_dir = os.path.join(output_dir, CHECKPOINTS_DIR)
  tensorboard_dir = os.path.join(output_dir, TENSORBOARD_DIR)
  metrics_path = os.path.join(output_dir, METRICS_FILE)
  if tensorboard:
    _check_tensorboard_dir(tensorboard_dir)
  if os.path.lexists(checkpoints_dir) and not os.path.isdir(checkpoints_dir):
    raise RunFileError(checkpoints_dir, 'is a file, not a directory',
                       'Move it away; the run keeps its checkpoints there')
  state_manager = tff.program.FileProgramStateManager(
      checkpoints_dir, prefix=CHECKPOINT_PREFIX, keep_total=CHECKPOINTS_KEPT)

  # Read everything before changing anything: a RunFileError leaves the files as found.
  template = _checkpoint(simulation.initial_state(), 0)
  resumption = _newest_readable_checkpoint(state_manager, checkpoints_dir, template)
  metrics_file = _checked_metrics(metrics_path, resumption.version)
  _set_aside(checkpoints_dir, resumption, log)
  _repair(metrics_file, log)
  _remove_leftovers(checkpoints_dir, log)
  _remove_leftovers(output_dir, log)

  releasers = {metrics_path: tff.program.CSVFileReleaseManager(
      metrics_path, save_mode=tff.program.CSVSaveMode.WRITE,
      key_fieldname=ROUND_COLUMN)}
  if tensorboard:
    releasers[tensorboard_dir] = tff.program.TensorBoardReleaseManager(tensorboard_dir)
  start = resumption.version
  if start:
    logging.info('Resuming %s after round %d.', output_dir, start - 1)
  state = resumption.checkpoint['simulation']
  cumulative = int(resumption.checkpoint['cumulative_secure_average_calls'])

  bar = tqdm.tqdm(total=rounds, initial=min(start, rounds), desc=description,
                  disable=not progress, dynamic_ncols=True)
  try:
    for round_num in range(start, rounds):
      try:
        state, metrics = simulation.run_round(state, round_num)
      except loop.NonFiniteUpdatesError as e:
        raise NonFiniteStateError(
            f'{e} Stopped; the rounds before it up to the newest checkpoint are kept in '
            f'{output_dir}.') from e
      cumulative += int(metrics['secure_average_calls'])
      row = collections.OrderedDict(metrics)
      row['cumulative_secure_average_calls'] = cumulative
      finite = loop.all_finite(state)
      if finite and (round_num % eval_period == 0 or round_num == rounds - 1):
        row.update(simulation.evaluate(state))
        bar.set_postfix(acc=f'{row["test_accuracy"]:.3f}',
                        loss=f'{row["train_loss"]:.3f}')
      for path, releaser in releasers.items():
        with _written(path, round_num):
          _run(releaser.release(row, key=round_num))
      if not finite:
        raise NonFiniteStateError(
            f'Round {round_num} produced a non-finite model (train_loss='
            f'{row["train_loss"]}); stopped. Rounds 0..{round_num - 1} are checkpointed '
            f'in {output_dir} and the metrics of round {round_num} are in '
            f'{METRICS_FILE} for diagnosis. Lower the client learning rate or choose a '
            'robust aggregator.')
      if (round_num + 1) % checkpoint_period == 0 or round_num == rounds - 1:
        with _written(checkpoints_dir, round_num):
          _run(state_manager.save(_checkpoint(state, cumulative), round_num + 1))
      bar.update(1)
  finally:
    bar.close()
  return rounds
