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
import dataclasses
import os
import re
import shutil
import sys
from typing import Any, Callable, Mapping, Optional

from absl import logging
import tensorflow as tf
import tensorflow_federated as tff
import tqdm

from tasks.simulation import checkpoints
from tasks.simulation import loop
from tasks.simulation import metrics_file
from tasks.simulation import run_config
from tasks.simulation import run_errors
from tasks.simulation import run_lock
from tasks.simulation import tensorboard_files

# What a write killed half-way leaves behind (TFF's `<path>_temp<4 digits>`).
_TEMPORARY = re.compile(r'_temp\d+$')


def _print_to_stderr(message: str) -> None:
  print(message, file=sys.stderr)


def _run(coroutine):
  return asyncio.run(coroutine)


@contextlib.contextmanager
def _written(path: str, round_num: int):
  """Turns a failed write of round `round_num`'s outputs (disk full, a file system
  gone read-only) into a `run_errors.RunFileError`: every earlier round stays
  checkpointed."""
  try:
    yield
  except (OSError, tf.errors.OpError) as e:
    path = getattr(e, 'filename', None) or path
    reason = getattr(e, 'strerror', None) or getattr(e, 'message', None) or str(e)
    raise run_errors.RunFileError(
        path, f'could not be written in round {round_num} ({reason.splitlines()[0]})',
        'Free disk space or make it writable, then rerun the same command: it '
        f'resumes at round {round_num}, every earlier one is checkpointed') from e


def _remove_leftovers(directory: str, log: Callable[[str], None]) -> None:
  """Removes the temporary files of writes that a kill cut short."""
  if not os.path.isdir(directory):
    return
  for name in sorted(os.listdir(directory)):
    if _TEMPORARY.search(name):
      path = os.path.join(directory, name)
      shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
      log(f'Removed {path}, the unfinished write of a killed session.')


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

  Everything is read and checked before anything changes: a `run_errors.RunFileError`
  or a `run_errors.ConfigMismatchError` leaves the files as found.
  """
  config_recorded = True if config is None else run_config.check_config(
      output_dir, config, resumable)
  identity = run_config.run_identity(config, resumable)
  checkpoints_dir = os.path.join(output_dir, checkpoints.CHECKPOINTS_DIR)
  tensorboard_dir = os.path.join(output_dir, tensorboard_files.TENSORBOARD_DIR)
  if tensorboard:
    tensorboard_files.check_dir(tensorboard_dir)
  if os.path.lexists(checkpoints_dir) and not os.path.isdir(checkpoints_dir):
    raise run_errors.RunFileError(checkpoints_dir, 'is a file, not a directory',
                       'Move it away; the run keeps its checkpoints there')
  state_manager = checkpoints.manager(checkpoints_dir)
  templates = checkpoints.templates(simulation.initial_state(), identity)
  resumption = checkpoints.newest_readable(state_manager, checkpoints_dir, templates)
  # Before metrics.csv is compared with it: another configuration's checkpoint says
  # nothing about this run's rows.
  run_config.check_identity(checkpoints_dir, resumption, identity, config_recorded)
  run_config.check_not_shortened(output_dir, resumption.version, rounds)
  metrics = metrics_file.checked(os.path.join(output_dir, metrics_file.METRICS_FILE),
                                  resumption.version)
  if metrics.rerun_from is not None:
    earlier = checkpoints.newest_readable(state_manager, checkpoints_dir, templates,
                                          at_most=metrics.rerun_from)
    resumption = dataclasses.replace(
        earlier, unreadable=resumption.unreadable + earlier.unreadable)
    run_config.check_identity(checkpoints_dir, resumption, identity, config_recorded)

  if not config_recorded:
    run_config.write_config(output_dir, run_config.canonical(config))
  checkpoints.set_aside(checkpoints_dir, resumption, log)
  metrics_file.repair(metrics, log)
  checkpoints.remove_superseded(state_manager, checkpoints_dir, resumption, log)
  _remove_leftovers(checkpoints_dir, log)
  _remove_leftovers(output_dir, log)
  if os.path.isdir(tensorboard_dir):
    tensorboard_files.purge(tensorboard_dir, resumption.version, log)
  if resumption.version:
    logging.info('Resuming %s after round %d.', output_dir, resumption.version - 1)
  return _Resumed(resumption.checkpoint['simulation'],
                  int(resumption.checkpoint['cumulative_secure_average_calls']),
                  resumption.version, identity, state_manager)


def run_experiment(simulation: loop.Simulation, output_dir: str,
                   rounds: int, eval_period: int = 1, *,
                   config: Optional[Mapping[str, Any]] = None,
                   resumable_changes: tuple[str, ...] = run_config.RESUMABLE_KEYS,
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
  carries the run's configuration (`run_config.run_identity`). Other rows leave the test
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
    run_errors.NonFiniteStateError: when a round leaves a non-finite model or a
      non-finite value of `metrics_file.FINITE_METRICS` (its metrics row is written,
      its state is not checkpointed: the finished rounds stay resumable), or
      when too few of its clients train to a finite update for the aggregator (no
      row: `loop.NonFiniteUpdatesError`).
    run_lock.RunLockedError: when another process owns `output_dir`.
    run_errors.ConfigMismatchError: when `output_dir` holds a run with another `config`
      (config.json's or its checkpoint's), or more finished rounds than `rounds`.
    run_errors.RunFileError: when a file of `output_dir` is unreadable or
      inconsistent and the run cannot resume around it (see the module docstring);
      nothing is written.
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
  checkpoints_dir = os.path.join(output_dir, checkpoints.CHECKPOINTS_DIR)
  tensorboard_dir = os.path.join(output_dir, tensorboard_files.TENSORBOARD_DIR)
  metrics_path = os.path.join(output_dir, metrics_file.METRICS_FILE)
  releasers = {metrics_path: tff.program.CSVFileReleaseManager(
      metrics_path, save_mode=tff.program.CSVSaveMode.WRITE,
      key_fieldname=metrics_file.ROUND_COLUMN)}
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
        raise run_errors.NonFiniteStateError(
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
      non_finite = metrics_file.non_finite(row)
      if not finite or non_finite:
        what = 'a non-finite model' if not finite else (
            'a model whose ' + ', '.join(f'{k}={v}' for k, v in non_finite.items())
            + ' is not finite')
        raise run_errors.NonFiniteStateError(
            f'Round {round_num} produced {what} (train_loss={row["train_loss"]}); '
            f'stopped. Rounds 0..{round_num - 1} are checkpointed in {output_dir} and '
            f'the metrics of round {round_num} are in {metrics_file.METRICS_FILE} for '
            'diagnosis. '
            'Lower the client learning rate or choose a robust aggregator.')
      if (round_num + 1) % checkpoint_period == 0 or round_num == rounds - 1:
        with _written(checkpoints_dir, round_num):
          checkpoints.save(resumed.state_manager, checkpoints_dir, state, cumulative,
                           resumed.identity, round_num + 1)
        on_checkpoint(round_num + 1)
      bar.update(1)
  finally:
    bar.close()
