"""A run's metrics.csv: its columns, and the check and repair of its rows against the
checkpoint a run resumes from (`tasks.simulation.experiment` describes the contract)."""

import csv
import dataclasses
import itertools
import math
import os
import re
from typing import Any, Callable, Mapping, Optional

import numpy as np

from tasks.simulation import run_errors

METRICS_FILE = 'metrics.csv'
ROUND_COLUMN = 'round'
# Columns every metrics.csv has, in addition to the simulation's own metrics (see
# `tasks.simulation.loop.Simulation`) and the aggregator's `aggregator/...`.
DOCUMENTED_COLUMNS = (ROUND_COLUMN, 'train_loss', 'secure_average_calls',
                      'cumulative_secure_average_calls', 'test_accuracy', 'test_loss')
# Metrics that stop the run when not finite, as a non-finite model does. Not
# train_accuracy: a model without an accuracy metric reports NaN there.
FINITE_METRICS = ('train_loss', 'test_loss', 'test_accuracy')


def has_a_row(path: str) -> bool:
  try:
    with open(path, encoding='utf-8', errors='replace') as f:
      return any(line.strip() for line in itertools.islice(f, 1, None))
  except FileNotFoundError:
    return False
  except OSError:
    return True  # Unreadable: its rows are not known to be absent.


@dataclasses.dataclass(frozen=True)
class CheckedMetrics:
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


def checked(path: str, finished: int) -> CheckedMetrics:
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
    run_errors.RunFileError: when the file is unreadable, has no `round` column, a
      finished round's row is damaged, missing or repeated with other values.
  """
  restore = ('Restore it from a backup, or delete it: the run then rebuilds it by '
             'rerunning its checkpointed rounds from round 0 (the same rows)')
  if not os.path.lexists(path):
    if not finished:
      return CheckedMetrics(path, None)
    # Rounds are seeded by their number: rerun from the initial model, they write
    # the same rows (and checkpoints) again.
    return CheckedMetrics(path, None, (
        f'{path}: missing, while the checkpoints hold rounds 0..{finished - 1}; '
        'rebuilding it by rerunning them from round 0 (the same rows).',), 0)
  try:
    with open(path, encoding='utf-8', newline='') as f:
      lines = f.read().splitlines(keepends=True)
  except (OSError, UnicodeDecodeError) as e:
    raise run_errors.RunFileError(path, f'unreadable ({run_errors.one_line(e)})',
                                  restore) from e
  header = next(csv.reader(lines[:1])) if lines else [ROUND_COLUMN]
  if ROUND_COLUMN not in header:
    raise run_errors.RunFileError(path, f'its header has no {ROUND_COLUMN!r} column',
                                  restore)
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
          raise run_errors.RunFileError(
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
      return CheckedMetrics(path, ''.join(kept), tuple(repairs), finished - 1)
    if unfinished:
      raise run_errors.RunFileError(
          path, f'line {index + 1} {damage}, before the rows of every checkpointed '
          f'round (0..{finished - 1})', restore)
    dropped = f'line {index + 1} {damage}: {lines[index].strip()[:40]!r}'
    if index + 1 < len(lines):
      dropped += f' and the {len(lines) - index - 1} line(s) after it'
    repairs.append(f'{path}: dropped {dropped}, after the rows of every checkpointed '
                   'round (a write cut short by a kill?); those rounds are rerun.')
    return CheckedMetrics(path, ''.join(kept), tuple(repairs))
  if unfinished:
    missing = sorted(unfinished)
    listed = ', '.join(map(str, missing[:10])) + (', …' if len(missing) > 10 else '')
    raise run_errors.RunFileError(
        path, f'has no row for round(s) {listed}, which the checkpoint of round '
        f'{finished - 1} has finished', restore)
  return CheckedMetrics(path, ''.join(kept) if repairs else None, tuple(repairs))


def non_finite(row: Mapping[str, Any]) -> dict[str, Any]:
  """The training and evaluation losses and accuracies of `row` that are not finite
  (a model whose weights are finite yet too large to evaluate, e.g. at float32's
  limit, is as broken as a non-finite one)."""
  return {key: row[key] for key in FINITE_METRICS
          if key in row and not np.isfinite(float(row[key]))}


def repair(metrics: CheckedMetrics, log: Callable[[str], None]) -> None:
  if metrics.text is not None:
    temporary = metrics.path + '.repair'
    with open(temporary, 'w', encoding='utf-8', newline='') as f:
      f.write(metrics.text)
    os.replace(temporary, metrics.path)
  for repair in metrics.repairs:
    log(repair)


def read_rows(directory: str) -> list[dict[str, float]]:
  """The rows of a run's metrics.csv as floats (NaN for empty cells)."""
  path = os.path.join(directory, METRICS_FILE)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [{k: float(v) if v not in ('', None) else math.nan for k, v in row.items()}
            for row in csv.DictReader(f)]


def final_accuracy(rows) -> float:
  """The last evaluated test accuracy of `read_rows`' rows (NaN if none)."""
  evaluated = [r['test_accuracy'] for r in rows
               if not math.isnan(r.get('test_accuracy', math.nan))]
  return evaluated[-1] if evaluated else math.nan


def calls_per_round(rows) -> float:
  """The mean secure-average calls a round of `read_rows`' rows (NaN if none)."""
  calls = [r['secure_average_calls'] for r in rows]
  return float(np.mean(calls)) if calls else math.nan
