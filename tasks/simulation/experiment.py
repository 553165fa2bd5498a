"""Runs a `tasks.simulation.loop.Simulation` with metrics output and resumable checkpoints.

Output directory layout (one run):

  owner.lock        held (`fcntl.flock`) by the one process running the run (`run_lock`)
  config.json       the run's configuration; a restart with a different one is refused
  metrics.csv       one row per finished round (`tff.program.CSVFileReleaseManager`)
  tensorboard/      the same values as TensorBoard scalars
  checkpoints/      `tff.program.FileProgramStateManager`, version v = v finished rounds;
                    each carries the run's configuration (`run_identity`)

Identity: config.json can be deleted or edited; the checkpoints cannot be told apart
by their file names. So every checkpoint carries the run's configuration (without
the keys a resumed run may change, such as `rounds`), and a checkpoint of another
configuration is refused (`ConfigMismatchError`) whatever config.json says, before
metrics.csv is compared with it. Checkpoints of older versions carry none: they are
resumed only while config.json, checked against the flags, vouches for them. A run
with no finished round (no metrics row, no checkpoint: it failed or was killed in
round 0) is not a run yet: other flags start it afresh. A run is never shortened:
fewer `rounds` than its checkpoints hold is refused.

Resume semantics (why the order below matters): round r's metrics row is released
*before* the checkpoint of version r + 1 is saved, and both writes are atomic (the
state manager renames a finished directory; the CSV manager rewrites the whole file
through a temporary file, `CSVSaveMode.WRITE`, so a kill never leaves half a row). A
run killed at any moment restarts from the last checkpoint, round `v`, and releasing
round v's row with key v first removes every row with key ≥ v that the killed run may
have written: no round is lost or repeated. The TensorBoard values of steps ≥ v are
removed from the event files too, so every step has one value.

Damaged files (`RunFileError`): a missing metrics.csv beside checkpoints is rebuilt
by rerunning the rounds from round 0 (the same rows and checkpoints). A resumed run
loads the newest *readable* checkpoint
(the manager keeps the first and the two latest) and moves the unreadable newer ones
to `checkpoints/unreadable_round_<v>`; the rows after the one it resumes from are
rewritten as above. A cut-off last metrics row (a kill in the middle of an append, by
older versions) is dropped: its round is after the last checkpoint and is rerun; if
it is the row of the last checkpointed round, the run resumes from the checkpoint
before it and reruns that round, which rebuilds the row (rounds are seeded by their
number). A second row of a round equal to the first (two processes wrote the run) is
dropped. Every other damaged or inconsistent file (no readable checkpoint, a junk
config.json, a damaged or missing row of a checkpointed round, two different rows of
one, a TensorBoard path that is not a writable directory) stops the run before it
writes anything, with a `RunFileError` naming the file, the problem and the fix.
"""

import asyncio
import collections
import contextlib
import csv
import dataclasses
import hashlib
import itertools
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

from tensorflow.core.util import event_pb2

from tasks.simulation import loop
from tasks.simulation import run_lock

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
_CHECKPOINT_NAME = re.compile(r'round_\d+$')
# The key of a checkpoint's run identity (`run_identity`).
_IDENTITY_KEY = 'run_config'
# TensorBoard's event files have this in their name.
_EVENTS_FILE = 'tfevents'
ROUND_COLUMN = 'round'
# Configuration keys a resumed run may change (a finished run is extended by raising
# rounds): every other key is the run's identity, carried by its checkpoints.
RESUMABLE_KEYS = ('rounds', 'eval_period')
# Columns every metrics.csv has, in addition to the simulation's own metrics (see
# `tasks.simulation.loop.Simulation`) and the aggregator's `aggregator/...`.
DOCUMENTED_COLUMNS = (ROUND_COLUMN, 'train_loss', 'secure_average_calls',
                      'cumulative_secure_average_calls', 'test_accuracy', 'test_loss')
# Metrics that stop the run when not finite, as a non-finite model does. Not
# train_accuracy: a model without an accuracy metric reports NaN there.
FINITE_METRICS = ('train_loss', 'test_loss', 'test_accuracy')


class NonFiniteStateError(RuntimeError):
  """A round produced a non-finite model, non-finite losses or accuracy
  (`FINITE_METRICS`), or too few finite client updates to aggregate; the finished
  rounds are kept."""


class ConfigMismatchError(ValueError):
  """The output directory holds a run with a different configuration.

  The message is one line: the problem, then the fix.

  Attributes:
    problem: What differs (the keys and values, or the rounds).
    fix: What the user can do.
  """

  def __init__(self, problem: str, fix: str):
    self.problem = problem
    self.fix = fix
    super().__init__(f'{problem}. {fix}')


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
                 ignore: tuple[str, ...] = RESUMABLE_KEYS) -> bool:
  """Writes `config` to `output_dir`, or checks it equals the one already there.

  Keys in `ignore` may change between sessions (e.g. a run is extended by raising
  `rounds`). A run that has not finished a round yet (no metrics row, no checkpoint:
  say its data failed to load, or it was killed in round 0) has nothing to protect,
  and takes the new `config`. config.json only reports the configuration: the run's
  identity is the one its checkpoints carry (`run_experiment` checks them), so a
  missing config.json beside finished rounds is not written here but once the
  checkpoint it resumes from is found to be of this configuration.

  Returns:
    Whether config.json now holds `config` (False: missing, left to the checkpoints).

  Raises:
    ConfigMismatchError: naming the keys that differ.
  """
  path = os.path.join(output_dir, CONFIG_FILE)
  config = _canonical(config)
  finished = _has_finished_rounds(output_dir)
  if os.path.exists(path):
    saved = _read_config(path)
    changes = _changes(saved, config, ignore)
    if not changes:
      return True
    if finished:
      raise ConfigMismatchError(
          f'{output_dir} holds a run with a different configuration ({changes})',
          'Use the same flags to resume it, or another --experiment_name / output '
          'directory.')
  elif finished:
    return False
  _write_config(output_dir, config)
  return True


def _canonical(config: Optional[Mapping[str, Any]]) -> dict[str, Any]:
  """`config` as it reads back from JSON (tuples as lists, objects as strings)."""
  return json.loads(json.dumps(dict(config or {}), sort_keys=True, default=str))


def _changes(saved: Mapping[str, Any], config: Mapping[str, Any],
             ignore: tuple[str, ...]) -> str:
  """'key: saved → new, ...' for the keys outside `ignore` that differ; '' if none."""
  keys = sorted(k for k in set(saved) | set(config)
                if k not in ignore and saved.get(k) != config.get(k))
  return ', '.join(f'{k}: {saved.get(k)!r} → {config.get(k)!r}' for k in keys)


def _write_config(output_dir: str, config: Mapping[str, Any]) -> None:
  path = os.path.join(output_dir, CONFIG_FILE)
  os.makedirs(output_dir, exist_ok=True)
  temporary = path + '.tmp'
  with open(temporary, 'w') as f:
    json.dump(config, f, indent=2, sort_keys=True)
  os.replace(temporary, path)


def run_identity(config: Optional[Mapping[str, Any]],
                 ignore: tuple[str, ...] = RESUMABLE_KEYS) -> str:
  """The configuration a checkpoint is saved with and checked against on load: the
  canonical JSON of `config` without the keys a resumed run may change."""
  return json.dumps({k: v for k, v in _canonical(config).items() if k not in ignore},
                    sort_keys=True)


def identity_fingerprint(identity: str) -> str:
  """A short name of a run identity, for messages."""
  return hashlib.sha256(identity.encode('utf-8')).hexdigest()[:12]


def _has_finished_rounds(output_dir: str) -> bool:
  """Whether the run has written a metrics row or a checkpoint: a metrics.csv holding
  only its header (a run that failed or was killed in round 0) has not."""
  checkpoints_dir = os.path.join(output_dir, CHECKPOINTS_DIR)
  return (_has_a_metrics_row(os.path.join(output_dir, METRICS_FILE)) or
          (os.path.isdir(checkpoints_dir) and any(
              _CHECKPOINT_NAME.match(name) for name in os.listdir(checkpoints_dir))))


def _has_a_metrics_row(path: str) -> bool:
  try:
    with open(path, encoding='utf-8', errors='replace') as f:
      return any(line.strip() for line in itertools.islice(f, 1, None))
  except FileNotFoundError:
    return False
  except OSError:
    return True  # Unreadable: its rows are not known to be absent.


def _read_config(path: str) -> dict[str, Any]:
  """The saved configuration, or a RunFileError saying why it cannot be used."""
  fix = (f'It records the flags of the run in {os.path.dirname(path) or "."}: restore '
         'it from a backup, or delete it and rerun with the run\'s flags (its '
         'checkpoints carry its configuration and refuse other flags)')
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


def _checkpoint(state, cumulative_calls: int,
                identity: Optional[str]) -> collections.OrderedDict:
  """What a checkpoint holds; `identity` (`run_identity`) None only in the template of
  a checkpoint written before checkpoints carried their run's configuration."""
  checkpoint = collections.OrderedDict(
      simulation=state, cumulative_secure_average_calls=np.int64(cumulative_calls))
  if identity is not None:
    checkpoint[_IDENTITY_KEY] = identity
  return checkpoint


def _restore(template, loaded):
  """Packs the loaded leaves into the (container-preserving) template structure."""
  leaves = tf.nest.flatten(loaded)
  expected = len(tf.nest.flatten(template))
  if len(leaves) != expected:
    raise ValueError(f'The checkpoint holds {len(leaves)} values, the simulation '
                     f'expects {expected}: was it written by another configuration?')
  return tf.nest.pack_sequence_as(template, [np.asarray(v) for v in leaves])


def _load(state_manager, version: int, templates) -> tuple[Any, Optional[str]]:
  """The checkpoint of `version` and the run identity it carries (None if written
  before checkpoints carried one). `templates`: (with an identity, without)."""
  try:
    restored = _restore(templates[0], _run(state_manager.load(version, templates[0])))
  except Exception as error:  # pylint: disable=broad-except
    try:  # An older checkpoint, without the identity?
      restored = _restore(templates[1], _run(state_manager.load(version,
                                                                templates[1])))
    except Exception:  # pylint: disable=broad-except
      raise error  # pylint: disable=raise-missing-from
    return restored, None
  identity = restored.pop(_IDENTITY_KEY)
  identity = identity.item() if isinstance(identity, np.ndarray) else identity
  return restored, (identity.decode('utf-8') if isinstance(identity, bytes)
                    else str(identity))


# Inside each checkpoint's directory: the run identity, readable without loading the
# SavedModel (whose graph runs on load), so another configuration's checkpoint is
# refused before it is loaded, and named as such even when its structure differs.
_IDENTITY_FILE = 'run_identity.json'


def _identity_path(checkpoints_dir: str, version: int) -> str:
  return os.path.join(checkpoints_dir, f'{CHECKPOINT_PREFIX}{version}', _IDENTITY_FILE)


def _write_identity_beside(checkpoints_dir: str, version: int,
                           identity: Optional[str]) -> None:
  if identity is None:
    return
  path = _identity_path(checkpoints_dir, version)
  with open(path + '.tmp', 'w', encoding='utf-8') as f:
    f.write(identity)
  os.replace(path + '.tmp', path)


def _identity_beside(checkpoints_dir: str, version: int) -> Optional[str]:
  """The identity file of a checkpoint, None if it has none (or is unreadable)."""
  try:
    with open(_identity_path(checkpoints_dir, version), encoding='utf-8') as f:
      return f.read()
  except (OSError, UnicodeDecodeError):
    return None


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
  identity: Optional[str] = None  # The run identity the checkpoint carries.


def _newest_readable_checkpoint(state_manager, checkpoints_dir: str, templates,
                                at_most: Optional[int] = None) -> _Resumption:
  """Loads the newest checkpoint (of version ≤ `at_most`, if given) that reads back
  into `templates`' structure (`_load`).

  Raises:
    RunFileError: if there are such checkpoints and none of them is readable.
  """
  versions = sorted(_run(state_manager.get_versions()) or [], reverse=True)
  if at_most is not None:
    versions = [v for v in versions if v <= at_most]
  unreadable = []
  expected_identity = templates[0].get(_IDENTITY_KEY)
  for version in versions:
    beside = _identity_beside(checkpoints_dir, version)
    if beside is not None and expected_identity is not None and (
        beside != expected_identity):
      # Another configuration's checkpoint: refused by `_check_identity`, unloaded.
      return _Resumption(templates[1], version, tuple(unreadable), beside)
    try:
      checkpoint, identity = _load(state_manager, version, templates)
      return _Resumption(checkpoint, version, tuple(unreadable), identity)
    # A damaged SavedModel surfaces as TF's OpError, FileNotFoundError, ValueError
    # ("0 MetaGraphs"), IndexError ("Read less bytes"), ...: every failure to read one
    # means the same to the run.
    except Exception as e:  # pylint: disable=broad-except
      unreadable.append((version, _one_line(e)))
  if unreadable:
    names = ', '.join(f'{CHECKPOINT_PREFIX}{v} ({why})' for v, why in unreadable)
    raise RunFileError(
        checkpoints_dir, f'no checkpoint reads back with these flags: {names}',
        'If the run was started with other flags, resume it with those (config.json '
        f'records them). Only if its checkpoints are damaged, delete {checkpoints_dir} '
        f'and {METRICS_FILE} next to it to rerun from round 0 (or restore a checkpoint '
        'from a backup)')
  return _Resumption(templates[1], 0, ())


def _check_identity(checkpoints_dir: str, resumption: _Resumption, identity: str,
                    config_recorded: bool) -> None:
  """Refuses to resume a checkpoint of another configuration than this run's.

  Raises:
    ConfigMismatchError: the checkpoint carries another configuration.
    RunFileError: it carries none (an older version wrote it) and config.json, which
      then is the run's only record of its flags, is missing.
  """
  if not resumption.version:
    return
  path = os.path.join(checkpoints_dir, f'{CHECKPOINT_PREFIX}{resumption.version}')
  if resumption.identity is None:
    if config_recorded:
      return  # config.json, checked against the flags, vouches for it.
    raise RunFileError(
        path, 'carries no configuration (an older version wrote it) and config.json, '
        'which recorded its flags, is missing',
        'Restore config.json from a backup, or use another --experiment_name / output '
        'directory')
  if resumption.identity == identity:
    return
  try:
    changes = _changes(json.loads(resumption.identity), json.loads(identity), ()) + '; '
  except json.JSONDecodeError:
    changes = ''
  raise ConfigMismatchError(
      f'{path} is a checkpoint of a run with a different configuration ({changes}'
      f'fingerprint {identity_fingerprint(resumption.identity)}, these flags '
      f'{identity_fingerprint(identity)}): it is not resumed',
      f'Use that run\'s flags to resume it; if it does not belong to this run, move '
      f'{path} out of {checkpoints_dir} (this run\'s own checkpoints stay); or use '
      'another --experiment_name / output directory.')


def _check_not_shortened(output_dir: str, finished: int, rounds: int) -> None:
  """Refuses `rounds` below the rounds the run's checkpoints hold: its later rounds
  are kept, not dropped, and "finished `rounds` rounds" would misreport them.

  Raises:
    ConfigMismatchError: naming both numbers and the fix.
  """
  if finished > rounds:
    raise ConfigMismatchError(
        f'{output_dir} holds a run of {finished} finished rounds, more than '
        f'--rounds={rounds}: a run is not shortened (its rounds are kept)',
        f'Pass --rounds={finished} (or more, to extend it), or another '
        '--experiment_name / output directory for a shorter run.')


@dataclasses.dataclass(frozen=True)
class _MetricsFile:
  """A metrics.csv checked against the checkpoint a run resumes from."""
  path: str
  text: Optional[str]  # The repaired contents to write, if the file needs repair.
  repairs: tuple[str, ...] = ()  # What the repair does, for the log.
  # Set when the row of the last checkpointed round is cut off: the run resumes from
  # a checkpoint of at most this version, rerunning (so rebuilding) that row.
  rerun_from: Optional[int] = None


def _row_damage(line: str, header: list[str], round_index: int) -> Optional[str]:
  """What is wrong with a metrics row, or None."""
  row = next(csv.reader([line]), [])
  if not line.endswith(('\n', '\r')):
    return 'is cut off'
  if len(row) != len(header):
    return f'has {len(row)} of the {len(header)} columns'
  if not re.fullmatch(r'\d+', row[round_index]):
    return f'has round {row[round_index]!r}'
  return None


def _checked_metrics(path: str, finished: int) -> _MetricsFile:
  """Checks that `path` has one intact row for each of the `finished` rounds.

  Rows are released in round order and before their round's checkpoint, so once the
  rows read cover every finished round, the rest belong to rounds that are rerun: a
  damaged row there (typically a last row without its line end, cut off by a kill in
  the middle of an append) is dropped with everything after it. A cut-off last row of
  the last checkpointed round is rebuilt: the run resumes from the checkpoint before
  it (`rerun_from`; rounds are seeded by their number, so the rerun writes the same
  row). A second row of a round (two processes wrote the run, before run directories
  were locked) is dropped if equal to the first.

  Raises:
    RunFileError: when the file is unreadable, has no `round` column, a finished
      round's row is damaged, missing or repeated with other values.
  """
  restore = ('Restore it from a backup, or delete it: the run then rebuilds it by '
             'rerunning its checkpointed rounds from round 0 (the same rows)')
  if not os.path.lexists(path):
    if not finished:
      return _MetricsFile(path, None)
    # Rounds are seeded by their number: rerun from the initial model, they write
    # the same rows (and checkpoints) again.
    return _MetricsFile(path, None, (
        f'{path}: missing, while the checkpoints hold rounds 0..{finished - 1}; '
        'rebuilding it by rerunning them from round 0 (the same rows).',), 0)
  try:
    with open(path, encoding='utf-8', newline='') as f:
      lines = f.read().splitlines(keepends=True)
  except (OSError, UnicodeDecodeError) as e:
    raise RunFileError(path, f'unreadable ({_one_line(e)})', restore) from e
  header = next(csv.reader(lines[:1])) if lines else [ROUND_COLUMN]
  if ROUND_COLUMN not in header:
    raise RunFileError(path, f'its header has no {ROUND_COLUMN!r} column', restore)
  round_index = header.index(ROUND_COLUMN)
  unfinished = set(range(finished))
  kept, first_lines, repairs = lines[:1], {}, []
  for index in range(1, len(lines)):
    damage = _row_damage(lines[index], header, round_index)
    if damage is None:
      round_num = int(next(csv.reader(lines[index:index + 1]))[round_index])
      if round_num in first_lines:
        first = first_lines[round_num]
        if round_num < finished and lines[first - 1] != lines[index]:
          raise RunFileError(
              path, f'line {index + 1} repeats round {round_num} of line {first} with '
              'other values (two processes wrote this run?)', restore)
        repairs.append(f'{path}: dropped line {index + 1}, a second row of round '
                       f'{round_num} (line {first}).')
      else:
        first_lines[round_num] = index + 1
        unfinished.discard(round_num)
        kept.append(lines[index])
      continue
    if unfinished == {finished - 1} and index == len(lines) - 1:
      repairs.append(
          f'{path}: line {index + 1} {damage}: the row of round {finished - 1}, '
          'which is checkpointed; rebuilding it by rerunning that round from the '
          'checkpoint before it.')
      return _MetricsFile(path, ''.join(kept), tuple(repairs), finished - 1)
    if unfinished:
      raise RunFileError(path, f'line {index + 1} {damage}, before the rows of every '
                         f'checkpointed round (0..{finished - 1})', restore)
    dropped = f'line {index + 1} {damage}: {lines[index].strip()[:40]!r}'
    if index + 1 < len(lines):
      dropped += f' and the {len(lines) - index - 1} line(s) after it'
    repairs.append(f'{path}: dropped {dropped}, after the rows of every checkpointed '
                   'round (a write cut short by a kill?); those rounds are rerun.')
    return _MetricsFile(path, ''.join(kept), tuple(repairs))
  if unfinished:
    missing = sorted(unfinished)
    listed = ', '.join(map(str, missing[:10])) + (', …' if len(missing) > 10 else '')
    raise RunFileError(
        path, f'has no row for round(s) {listed}, which the checkpoint of round '
        f'{finished - 1} has finished', restore)
  return _MetricsFile(path, ''.join(kept) if repairs else None, tuple(repairs))


def _non_finite_metrics(row: Mapping[str, Any]) -> dict[str, Any]:
  """The training and evaluation losses and accuracies of `row` that are not finite
  (a model whose weights are finite yet too large to evaluate, e.g. at float32's
  limit, is as broken as a non-finite one)."""
  return {key: row[key] for key in FINITE_METRICS
          if key in row and not np.isfinite(float(row[key]))}


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
  if metrics.text is not None:
    temporary = metrics.path + '.repair'
    with open(temporary, 'w', encoding='utf-8', newline='') as f:
      f.write(metrics.text)
    os.replace(temporary, metrics.path)
  for repair in metrics.repairs:
    log(repair)


def _remove_superseded(state_manager, checkpoints_dir: str, resumption: _Resumption,
                       log: Callable[[str], None]) -> None:
  """Removes the readable checkpoints newer than the one resumed from (when a row
  before them is rebuilt): the rerun saves them again, the same, and the state
  manager refuses to save over a version."""
  unreadable = {version for version, _ in resumption.unreadable}
  for version in _run(state_manager.get_versions()) or []:
    if version > resumption.version and version not in unreadable:
      shutil.rmtree(os.path.join(checkpoints_dir, f'{CHECKPOINT_PREFIX}{version}'))
      log(f'Removed {CHECKPOINT_PREFIX}{version}, which the rerun from '
          f'{CHECKPOINT_PREFIX}{resumption.version} writes again.')


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


def _purge_tensorboard(directory: str, start: int, log: Callable[[str], None]) -> None:
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


@dataclasses.dataclass(frozen=True)
class _Resumed:
  """A run ready to go on: the state after `start` rounds, how to save it."""
  state: Any
  cumulative_calls: int
  start: int
  identity: str
  state_manager: Any


def _resume(simulation: loop.Simulation, output_dir: str, rounds: int,
            config: Optional[Mapping[str, Any]], resumable: tuple[str, ...],
            tensorboard: bool, log: Callable[[str], None]) -> _Resumed:
  """Checks `output_dir`'s files, then repairs what a kill (or an older version) left.

  Everything is read and checked before anything changes: a RunFileError or a
  ConfigMismatchError leaves the files as found.
  """
  config_recorded = True if config is None else check_config(output_dir, config,
                                                              resumable)
  identity = run_identity(config, resumable)
  checkpoints_dir = os.path.join(output_dir, CHECKPOINTS_DIR)
  tensorboard_dir = os.path.join(output_dir, TENSORBOARD_DIR)
  if tensorboard:
    _check_tensorboard_dir(tensorboard_dir)
  if os.path.lexists(checkpoints_dir) and not os.path.isdir(checkpoints_dir):
    raise RunFileError(checkpoints_dir, 'is a file, not a directory',
                       'Move it away; the run keeps its checkpoints there')
  state_manager = tff.program.FileProgramStateManager(
      checkpoints_dir, prefix=CHECKPOINT_PREFIX, keep_total=CHECKPOINTS_KEPT)
  initial = simulation.initial_state()
  templates = (_checkpoint(initial, 0, identity), _checkpoint(initial, 0, None))
  resumption = _newest_readable_checkpoint(state_manager, checkpoints_dir, templates)
  # Before metrics.csv is compared with it: another configuration's checkpoint says
  # nothing about this run's rows.
  _check_identity(checkpoints_dir, resumption, identity, config_recorded)
  _check_not_shortened(output_dir, resumption.version, rounds)
  metrics_file = _checked_metrics(os.path.join(output_dir, METRICS_FILE),
                                  resumption.version)
  if metrics_file.rerun_from is not None:
    earlier = _newest_readable_checkpoint(state_manager, checkpoints_dir, templates,
                                          at_most=metrics_file.rerun_from)
    resumption = dataclasses.replace(
        earlier, unreadable=resumption.unreadable + earlier.unreadable)
    _check_identity(checkpoints_dir, resumption, identity, config_recorded)

  if not config_recorded:
    _write_config(output_dir, _canonical(config))
  _set_aside(checkpoints_dir, resumption, log)
  _repair(metrics_file, log)
  _remove_superseded(state_manager, checkpoints_dir, resumption, log)
  _remove_leftovers(checkpoints_dir, log)
  _remove_leftovers(output_dir, log)
  if os.path.isdir(tensorboard_dir):
    _purge_tensorboard(tensorboard_dir, resumption.version, log)
  if resumption.version:
    logging.info('Resuming %s after round %d.', output_dir, resumption.version - 1)
  return _Resumed(resumption.checkpoint['simulation'],
                  int(resumption.checkpoint['cumulative_secure_average_calls']),
                  resumption.version, identity, state_manager)


def run_experiment(simulation: loop.Simulation, output_dir: str,
                   rounds: int, eval_period: int = 1, *,
                   config: Optional[Mapping[str, Any]] = None,
                   resumable_changes: tuple[str, ...] = RESUMABLE_KEYS,
                   progress: bool = True, tensorboard: bool = True,
                   description: str = '', checkpoint_period: int = 1,
                   log: Callable[[str], None] = _print_to_stderr,
                   on_checkpoint: Callable[[int], None] = lambda finished: None
                   ) -> int:
  """Runs rounds [finished, rounds) of `simulation`, resuming from `output_dir`.

  Every round writes a metrics row (key `round`) with the simulation's metrics,
  `cumulative_secure_average_calls` and, on evaluation rounds (round 0, every
  `eval_period`-th round and the last round), `test_accuracy` and `test_loss`; then,
  every `checkpoint_period` rounds and after the last one, a checkpoint, which
  carries the run's configuration (`run_identity`). Other rows leave the test
  columns empty. The process owns `output_dir` while it runs (`run_lock`).

  Args:
    simulation: A `tasks.simulation.loop.Simulation`.
    output_dir: The run's directory (created).
    rounds: Total rounds of the run (rounds already finished are not rerun).
    eval_period: Evaluate every this many rounds.
    config: The run's configuration: checked against a previous session's
      config.json and against the checkpoint resumed from.
    resumable_changes: Keys of `config` a resumed run may change.
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
    on_checkpoint: Called with the number of rounds the checkpoints hold (where a
      rerun would resume): once the run has resumed (0 for a new run), then after
      every checkpoint is written.

  Returns:
    The number of finished rounds (= `rounds`).

  Raises:
    NonFiniteStateError: when a round leaves a non-finite model or a non-finite
      value of `FINITE_METRICS` (its metrics row is written, its state is not
      checkpointed: the finished rounds stay resumable), or
      when too few of its clients train to a finite update for the aggregator (no
      row: `loop.NonFiniteUpdatesError`).
    run_lock.RunLockedError: when another process owns `output_dir`.
    ConfigMismatchError: when `output_dir` holds a run with another `config`
      (config.json's or its checkpoint's), or more finished rounds than `rounds`.
    RunFileError: when a file of `output_dir` is unreadable or inconsistent and the
      run cannot resume around it (see the module docstring); nothing is written.
  """
  if min(rounds, eval_period, checkpoint_period) < 1:
    raise ValueError('rounds, eval_period and checkpoint_period must be ≥ 1, got '
                     f'{rounds}, {eval_period}, {checkpoint_period}.')
  with run_lock.owned(output_dir):
    resumed = _resume(simulation, output_dir, rounds, config, resumable_changes,
                      tensorboard, log)
    on_checkpoint(resumed.start)
    _train(simulation, output_dir, resumed, rounds, eval_period, progress,
           tensorboard, description, checkpoint_period, on_checkpoint)
  return rounds


def _train(simulation: loop.Simulation, output_dir: str, resumed: _Resumed,
           rounds: int, eval_period: int, progress: bool, tensorboard: bool,
           description: str, checkpoint_period: int,
           on_checkpoint: Callable[[int], None]) -> None:
  """Rounds [resumed.start, rounds): a metrics row each, a checkpoint every
  `checkpoint_period` rounds and after the last (reported to `on_checkpoint`)."""
  checkpoints_dir = os.path.join(output_dir, CHECKPOINTS_DIR)
  tensorboard_dir = os.path.join(output_dir, TENSORBOARD_DIR)
  metrics_path = os.path.join(output_dir, METRICS_FILE)
  releasers = {metrics_path: tff.program.CSVFileReleaseManager(
      metrics_path, save_mode=tff.program.CSVSaveMode.WRITE,
      key_fieldname=ROUND_COLUMN)}
  if tensorboard:
    releasers[tensorboard_dir] = tff.program.TensorBoardReleaseManager(tensorboard_dir)
  start, state, cumulative = resumed.start, resumed.state, resumed.cumulative_calls

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
      non_finite = _non_finite_metrics(row)
      if not finite or non_finite:
        what = 'a non-finite model' if not finite else (
            'a model whose ' + ', '.join(f'{k}={v}' for k, v in non_finite.items())
            + ' is not finite')
        raise NonFiniteStateError(
            f'Round {round_num} produced {what} (train_loss={row["train_loss"]}); '
            f'stopped. Rounds 0..{round_num - 1} are checkpointed in {output_dir} and '
            f'the metrics of round {round_num} are in {METRICS_FILE} for diagnosis. '
            'Lower the client learning rate or choose a robust aggregator.')
      if (round_num + 1) % checkpoint_period == 0 or round_num == rounds - 1:
        with _written(checkpoints_dir, round_num):
          _run(resumed.state_manager.save(
              _checkpoint(state, cumulative, resumed.identity), round_num + 1))
          _write_identity_beside(checkpoints_dir, round_num + 1, resumed.identity)
        on_checkpoint(round_num + 1)
      bar.update(1)
  finally:
    bar.close()
