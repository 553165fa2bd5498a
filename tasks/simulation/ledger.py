"""The ledger of finished runs: what a results table needs of each run, in a small CSV.

A sweep's run directories hold checkpoints (about a megabyte per linear run) and stay
on the machine that trained them. The leaderboard's full grid is 4,536 runs, more
than one session or one machine trains. The ledger keeps, per finished run, only what
its tables read (final test accuracy, whether it diverged, secure-average calls per
round), keyed by the run's name and a fingerprint of everything that decides its
result, so it can be committed beside the table: a later session, or another machine,
trains only the runs the ledger lacks, and slices run anywhere add up to one table.

An entry whose fingerprint differs from the current run's (another number of rounds,
learning rate, data partition, ...) is kept in the file but never used for that run.
"""

import csv
import dataclasses
import fcntl
import hashlib
import json
import math
import os
from typing import Any, Mapping

FIELDS = ('run', 'fingerprint', 'final_accuracy', 'diverged',
          'secure_average_calls_per_round')
Key = tuple[str, str]  # (run name, fingerprint)


@dataclasses.dataclass(frozen=True)
class Entry:
  """One finished run's result.

  Attributes:
    final_accuracy: Its last evaluated clean test accuracy (a diverged run's last
      finite one; NaN if it never evaluated).
    diverged: Its model became non-finite and it was stopped.
    secure_average_calls_per_round: Mean over its rounds.
  """
  final_accuracy: float
  diverged: bool
  secure_average_calls_per_round: float


class LedgerError(ValueError):
  """The ledger file is unreadable; the message names the file, the line and the fix."""


def fingerprint(config: Mapping[str, Any]) -> str:
  """A short digest of a run's whole configuration (any JSON-able mapping; other
  values by their `str`), independent of key order."""
  text = json.dumps(dict(config), sort_keys=True, default=str)
  return hashlib.sha256(text.encode('utf-8')).hexdigest()[:16]


def read(path: str) -> dict[Key, Entry]:
  """The entries of the ledger at `path`; empty when there is no file yet.

  Raises:
    LedgerError: an undecodable file, a wrong header, a malformed row (naming its
      line) or a git conflict left in it.
  """
  if not os.path.exists(path):
    return {}
  try:
    with open(path, newline='', encoding='utf-8') as f:
      return _entries(path, f.read().splitlines())
  except (UnicodeDecodeError, csv.Error) as e:
    raise LedgerError(f'{path}: unreadable ({e}). {_fix(path)}') from e


def _fix(path: str) -> str:
  return (f'Restore it (e.g. `git checkout -- {path}`) or move it away: its runs are '
          'then trained again.')


def _entries(path: str, lines: list[str]) -> dict[Key, Entry]:
  for number, line in enumerate(lines, start=1):
    if line.startswith(('<<<<<<<', '=======', '>>>>>>>')):
      raise LedgerError(
          f'{path}: line {number} is a git conflict marker. Keep the rows of both '
          'sides (each run once) and delete the markers: rows of other runs never '
          'conflict, `.gitattributes` merges this file by union.')
  reader = csv.DictReader(lines)
  if tuple(reader.fieldnames or ()) != FIELDS:
    raise LedgerError(f'{path}: line 1 is not the ledger header '
                      f'{",".join(FIELDS)}. {_fix(path)}')
  entries = {}
  for row in reader:
    try:
      if None in row or None in row.values():
        raise ValueError(f'{len(FIELDS)} columns expected')
      if not row['run'] or not row['fingerprint']:
        raise ValueError('empty run name or fingerprint')
      entry = Entry(final_accuracy=_accuracy(row['final_accuracy']),
                    diverged=_boolean(row['diverged']),
                    secure_average_calls_per_round=_calls(
                        row['secure_average_calls_per_round']))
    except ValueError as e:
      raise LedgerError(f'{path}: line {reader.line_num} is malformed ({e}). '
                        f'{_fix(path)}') from e
    entries[(row['run'], row['fingerprint'])] = entry
  return entries


def _accuracy(text: str) -> float:
  """A final accuracy: in [0, 1], or NaN for a run that never evaluated."""
  value = float(text)
  if not (math.isnan(value) or 0.0 <= value <= 1.0):
    raise ValueError(f'final_accuracy must be in [0, 1] or nan, got {text!r}')
  return value


def _calls(text: str) -> float:
  """Secure-average calls per round: finite and ≥ 0, or NaN for a run of no row."""
  value = float(text)
  if not (math.isnan(value) or 0.0 <= value < math.inf):
    raise ValueError('secure_average_calls_per_round must be a finite number ≥ 0 or '
                     f'nan, got {text!r}')
  return value


def _boolean(text: str) -> bool:
  if text not in ('0', '1'):
    raise ValueError(f'diverged must be 0 or 1, got {text!r}')
  return text == '1'


def write(path: str, entries: Mapping[Key, Entry]) -> None:
  """Writes `entries` to `path` (sorted by run name, so a diff shows the new runs),
  through a temporary file: a kill leaves the previous ledger whole."""
  directory = os.path.dirname(path)
  if directory:
    os.makedirs(directory, exist_ok=True)
  temporary = f'{path}.tmp{os.getpid()}'
  with open(temporary, 'w', newline='', encoding='utf-8') as f:
    writer = csv.writer(f, lineterminator='\n')
    writer.writerow(FIELDS)
    for (run, digest), entry in sorted(entries.items()):
      writer.writerow([run, digest, _number(entry.final_accuracy),
                       int(entry.diverged), _number(entry.secure_average_calls_per_round)])
  os.replace(temporary, path)


def _number(value: float) -> str:
  return 'nan' if math.isnan(value) else repr(float(value))


def merge(path: str, new: Mapping[Key, Entry]) -> dict[Key, Entry]:
  """Adds `new` to the ledger at `path` and returns the whole ledger. The file is
  re-read under an exclusive lock, so entries that slices running side by side write
  at the same time all stay."""
  directory = os.path.dirname(path)
  if directory:
    os.makedirs(directory, exist_ok=True)
  with open(path + '.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    entries = read(path)
    entries.update(new)
    write(path, entries)
  return entries
