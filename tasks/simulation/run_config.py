"""A run's configuration: config.json, the run identity its checkpoints carry, and the
checks that refuse to resume a run under other settings or shortened."""

import hashlib
import json
import os
from typing import Any, Mapping, Optional

from tasks.simulation import checkpoints
from tasks.simulation import metrics_file
from tasks.simulation import run_errors

CONFIG_FILE = 'config.json'
# Configuration keys a resumed run may change (a finished run is extended by raising
# rounds): every other key is the run's identity, carried by its checkpoints.
RESUMABLE_KEYS = ('rounds', 'eval_period')


def check_config(output_dir: str, config: Mapping[str, Any],
                 ignore: tuple[str, ...] = RESUMABLE_KEYS) -> bool:
  """Writes `config` to `output_dir`, or checks it equals the one already there.

  Keys in `ignore` may change between sessions (e.g. a run is extended by raising
  `rounds`). A run that has not finished a round yet (no metrics row, no checkpoint:
  say its data failed to load, or it was killed in round 0) has nothing to protect,
  and takes the new `config`. config.json only reports the configuration: the run's
  identity is the one its checkpoints carry (`experiment.run_experiment` checks
  them), so a missing config.json beside finished rounds is not written here but
  once the checkpoint it resumes from is found to be of this configuration.

  Returns:
    Whether config.json now holds `config` (False: missing, left to the checkpoints).

  Raises:
    run_errors.ConfigMismatchError: naming the keys that differ.
  """
  path = os.path.join(output_dir, CONFIG_FILE)
  config = canonical(config)
  finished = _has_finished_rounds(output_dir)
  if os.path.exists(path):
    saved = _read_config(path)
    changes = describe_changes(saved, config, ignore)
    if not changes:
      return True
    if finished:
      raise run_errors.ConfigMismatchError(
          f'{output_dir} holds a run with a different configuration ({changes})',
          'Use the same flags to resume it, or another --experiment_name / output '
          'directory.')
  elif finished:
    return False
  write_config(output_dir, config)
  return True


def canonical(config: Optional[Mapping[str, Any]]) -> dict[str, Any]:
  """`config` as it reads back from JSON (tuples as lists, objects as strings)."""
  return json.loads(json.dumps(dict(config or {}), sort_keys=True, default=str))


def describe_changes(saved: Mapping[str, Any], config: Mapping[str, Any],
             ignore: tuple[str, ...]) -> str:
  """'key: saved → new, ...' for the keys outside `ignore` that differ; '' if none."""
  keys = sorted(k for k in set(saved) | set(config)
                if k not in ignore and saved.get(k) != config.get(k))
  return ', '.join(f'{k}: {saved.get(k)!r} → {config.get(k)!r}' for k in keys)


def write_config(output_dir: str, config: Mapping[str, Any]) -> None:
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
  return json.dumps({k: v for k, v in canonical(config).items() if k not in ignore},
                    sort_keys=True)


def identity_fingerprint(identity: str) -> str:
  """A short name of a run identity, for messages."""
  return hashlib.sha256(identity.encode('utf-8')).hexdigest()[:12]


def _has_finished_rounds(output_dir: str) -> bool:
  """Whether the run has written a metrics row or a checkpoint: a metrics.csv holding
  only its header (a run that failed or was killed in round 0) has not."""
  return (metrics_file.has_a_row(os.path.join(output_dir, metrics_file.METRICS_FILE))
          or checkpoints.any_saved(os.path.join(output_dir,
                                                checkpoints.CHECKPOINTS_DIR)))


def _read_config(path: str) -> dict[str, Any]:
  """The saved configuration, or a `run_errors.RunFileError` saying why it cannot be
  used."""
  fix = (f'It records the flags of the run in {os.path.dirname(path) or "."}: restore '
         'it from a backup, or delete it and rerun with the run\'s flags (its '
         'checkpoints carry its configuration and refuse other flags)')
  try:
    with open(path, encoding='utf-8') as f:
      saved = json.load(f)
  except json.JSONDecodeError as e:
    raise run_errors.RunFileError(path, f'not valid JSON ({e})', fix) from e
  except (OSError, UnicodeDecodeError) as e:
    raise run_errors.RunFileError(path, f'unreadable ({run_errors.one_line(e)})',
                                  fix) from e
  if not isinstance(saved, dict):
    raise run_errors.RunFileError(
        path, f'holds a JSON {type(saved).__name__}, not an object', fix)
  return saved


def check_identity(checkpoints_dir: str, resumption: checkpoints.Resumption,
                   identity: str, config_recorded: bool) -> None:
  """Refuses to resume a checkpoint of another configuration than this run's.

  Raises:
    run_errors.ConfigMismatchError: the checkpoint carries another configuration.
    run_errors.RunFileError: it carries none (an older version wrote it) and
      config.json, which then is the run's only record of its flags, is missing.
  """
  if not resumption.version:
    return
  path = os.path.join(checkpoints_dir,
                      f'{checkpoints.CHECKPOINT_PREFIX}{resumption.version}')
  if resumption.identity is None:
    if config_recorded:
      return  # config.json, checked against the flags, vouches for it.
    raise run_errors.RunFileError(
        path, 'carries no configuration (an older version wrote it) and config.json, '
        'which recorded its flags, is missing',
        'Restore config.json from a backup, or use another --experiment_name / output '
        'directory')
  if resumption.identity == identity:
    return
  try:
    changes = describe_changes(json.loads(resumption.identity), json.loads(identity),
                               ()) + '; '
  except json.JSONDecodeError:
    changes = ''
  raise run_errors.ConfigMismatchError(
      f'{path} is a checkpoint of a run with a different configuration ({changes}'
      f'fingerprint {identity_fingerprint(resumption.identity)}, these flags '
      f'{identity_fingerprint(identity)}): it is not resumed',
      f'Use that run\'s flags to resume it; if it does not belong to this run, move '
      f'{path} out of {checkpoints_dir} (this run\'s own checkpoints stay); or use '
      'another --experiment_name / output directory.')


def check_not_shortened(output_dir: str, finished: int, rounds: int) -> None:
  """Refuses `rounds` below the rounds the run's checkpoints hold: its later rounds
  are kept, not dropped, and "finished `rounds` rounds" would misreport them.

  Raises:
    run_errors.ConfigMismatchError: naming both numbers and the fix.
  """
  if finished > rounds:
    raise run_errors.ConfigMismatchError(
        f'{output_dir} holds a run of {finished} finished rounds, more than '
        f'--rounds={rounds}: a run is not shortened (its rounds are kept)',
        f'Pass --rounds={finished} (or more, to extend it), or another '
        '--experiment_name / output directory for a shorter run.')
