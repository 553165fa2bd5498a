"""A run's checkpoints (`tff.program.FileProgramStateManager`, version v = v finished
rounds): what each holds, the run identity it carries, loading the newest readable
one, and setting aside the unreadable and superseded ones."""

import asyncio
import collections
import dataclasses
import os
import re
import shutil
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks.simulation import metrics_file
from tasks.simulation import run_errors

CHECKPOINTS_DIR = 'checkpoints'
CHECKPOINT_PREFIX = 'round_'
UNREADABLE_PREFIX = 'unreadable_'
# The first checkpoint (`keep_first`) and the two latest: a damaged latest one leaves
# an older one to resume from.
CHECKPOINTS_KEPT = 3
_CHECKPOINT_NAME = re.compile(r'round_\d+$')
# The key of a checkpoint's run identity (`run_config.run_identity`).
_IDENTITY_KEY = 'run_config'


def manager(checkpoints_dir: str) -> tff.program.FileProgramStateManager:
  """The run's state manager: versions `round_<v>`, `CHECKPOINTS_KEPT` of them kept."""
  return tff.program.FileProgramStateManager(
      checkpoints_dir, prefix=CHECKPOINT_PREFIX, keep_total=CHECKPOINTS_KEPT)


def contents(state, cumulative_calls: int,
             identity: Optional[str]) -> collections.OrderedDict:
  """What a checkpoint holds; `identity` (`run_config.run_identity`) None only in the
  template of a checkpoint written before checkpoints carried their run's
  configuration."""
  checkpoint = collections.OrderedDict(
      simulation=state, cumulative_secure_average_calls=np.int64(cumulative_calls))
  if identity is not None:
    checkpoint[_IDENTITY_KEY] = identity
  return checkpoint


def templates(initial_state, identity: str) -> tuple[collections.OrderedDict, ...]:
  """The structures a checkpoint of this run loads into: (with `identity`, without)."""
  return (contents(initial_state, 0, identity), contents(initial_state, 0, None))


def save(state_manager, checkpoints_dir: str, state, cumulative_calls: int,
         identity: str, version: int) -> None:
  """Saves checkpoint `version` of the run `identity`, with its identity file beside."""
  asyncio.run(state_manager.save(contents(state, cumulative_calls, identity), version))
  _write_identity_beside(checkpoints_dir, version, identity)


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
    restored = _restore(templates[0],
                        asyncio.run(state_manager.load(version, templates[0])))
  except Exception as error:  # pylint: disable=broad-except
    try:  # An older checkpoint, without the identity?
      restored = _restore(templates[1],
                          asyncio.run(state_manager.load(version, templates[1])))
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


def _write_identity_beside(checkpoints_dir: str, version: int, identity: str) -> None:
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


def any_saved(checkpoints_dir: str) -> bool:
  """Whether `checkpoints_dir` holds a checkpoint (readable or not)."""
  return os.path.isdir(checkpoints_dir) and any(
      _CHECKPOINT_NAME.match(name) for name in os.listdir(checkpoints_dir))


def finished_rounds(output_dir: str) -> int:
  """Rounds a (possibly interrupted) run in `output_dir` has checkpointed."""
  checkpoints_dir = os.path.join(output_dir, CHECKPOINTS_DIR)
  if not os.path.isdir(checkpoints_dir):
    return 0  # Asking must not create the directory, as the manager would.
  manager = tff.program.FileProgramStateManager(checkpoints_dir,
                                                prefix=CHECKPOINT_PREFIX)
  versions = asyncio.run(manager.get_versions())
  return max(versions) if versions else 0


@dataclasses.dataclass(frozen=True)
class Resumption:
  """Where a run resumes: the checkpoint loaded and the damaged newer ones."""
  checkpoint: Any
  version: int  # = finished rounds; 0 when the run starts afresh.
  unreadable: tuple[tuple[int, str], ...]  # (version, why), newest first.
  identity: Optional[str] = None  # The run identity the checkpoint carries.


def newest_readable(state_manager, checkpoints_dir: str, templates,
                                at_most: Optional[int] = None) -> Resumption:
  """Loads the newest checkpoint (of version ≤ `at_most`, if given) that reads back
  into `templates`' structure (`_load`).

  Raises:
    run_errors.RunFileError: if there are such checkpoints and none of them is readable.
  """
  versions = sorted(asyncio.run(state_manager.get_versions()) or [], reverse=True)
  if at_most is not None:
    versions = [v for v in versions if v <= at_most]
  unreadable = []
  expected_identity = templates[0].get(_IDENTITY_KEY)
  for version in versions:
    beside = _identity_beside(checkpoints_dir, version)
    if beside is not None and expected_identity is not None and (
        beside != expected_identity):
      # Another configuration's checkpoint: refused by `run_config.check_identity`,
      # unloaded.
      return Resumption(templates[1], version, tuple(unreadable), beside)
    try:
      checkpoint, identity = _load(state_manager, version, templates)
      return Resumption(checkpoint, version, tuple(unreadable), identity)
    # A damaged SavedModel surfaces as TF's OpError, FileNotFoundError, ValueError
    # ("0 MetaGraphs"), IndexError ("Read less bytes"), ...: every failure to read one
    # means the same to the run.
    except Exception as e:  # pylint: disable=broad-except
      unreadable.append((version, run_errors.one_line(e)))
  if unreadable:
    names = ', '.join(f'{CHECKPOINT_PREFIX}{v} ({why})' for v, why in unreadable)
    raise run_errors.RunFileError(
        checkpoints_dir, f'no checkpoint reads back with these flags: {names}',
        'If the run was started with other flags, resume it with those (config.json '
        f'records them). Only if its checkpoints are damaged, delete {checkpoints_dir} '
        f'and {metrics_file.METRICS_FILE} next to it to rerun from round 0 (or restore '
        'a checkpoint from a backup)')
  return Resumption(templates[1], 0, ())


def set_aside(checkpoints_dir: str, resumption: Resumption,
               log: Callable[[str], None]) -> None:
  """Moves the unreadable checkpoints newer than the one loaded out of the way (the
  state manager refuses to save over them), keeping them for inspection."""
  for version, why in resumption.unreadable:
    name = f'{CHECKPOINT_PREFIX}{version}'
    target = os.path.join(checkpoints_dir, UNREADABLE_PREFIX + name)
    if os.path.lexists(target):
      shutil.rmtree(target)
    os.rename(os.path.join(checkpoints_dir, name), target)
    log(f'Checkpoint {os.path.join(checkpoints_dir, name)} is unreadable ({why}); '
        f'moved it to {target}.')
  if resumption.unreadable:
    resumed = (f'{CHECKPOINT_PREFIX}{resumption.version}, after round '
               f'{resumption.version - 1}' if resumption.version else 'round 0 (no '
               'other checkpoint)')
    log(f'Resuming from {resumed}; the metrics rows from round {resumption.version} '
        'on are rewritten.')


def remove_superseded(state_manager, checkpoints_dir: str, resumption: Resumption,
                       log: Callable[[str], None]) -> None:
  """Removes the readable checkpoints newer than the one resumed from (when a row
  before them is rebuilt): the rerun saves them again, the same, and the state
  manager refuses to save over a version."""
  unreadable = {version for version, _ in resumption.unreadable}
  for version in asyncio.run(state_manager.get_versions()) or []:
    if version > resumption.version and version not in unreadable:
      shutil.rmtree(os.path.join(checkpoints_dir, f'{CHECKPOINT_PREFIX}{version}'))
      log(f'Removed {CHECKPOINT_PREFIX}{version}, which the rerun from '
          f'{CHECKPOINT_PREFIX}{resumption.version} writes again.')
