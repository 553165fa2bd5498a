"""Sweeps aggregators × attacks × corruption levels × seeds on one task (the library
behind `tasks.binaries.sweep` and `tasks.binaries.main_job`).

Every run is a `tasks.simulation.experiment` run in
`<output_dir>/runs/<aggregator>_<attack>_rho<rho>_seed<seed>/` (metrics.csv,
checkpoints, and once finished its ledger fingerprint, `FINGERPRINT`): a sweep
restarted with the same flags skips finished runs and resumes an interrupted one, and
skips the runs a ledger (`tasks.simulation.ledger`) it is given holds. A run's
identity is its whole configuration (`run_config`); a run is finished only when its
`FINGERPRINT` is its fingerprint, and a directory holding a run of another
identity (interrupted under other flags, or made by another command) is moved aside
to `<run>.other-<digest>` and the run trained from round 0. ρ = 0 is run
once per aggregator and seed (attack 'none') and shared by every attack's panel. The
task data (client partition) is built once, with --data_seed; --seeds vary the model initialization, the corrupted set and the client
sampling (RFA paper D.3: "repeated with different random seeds").

Outputs in <output_dir> (written by `tasks.simulation.sweep_report.write_report`):
  summary.csv       aggregator, attack, rho, final_accuracy_mean/min/max over seeds,
                    num_seeds, num_diverged, secure_average_calls_per_round,
                    num_failed (runs that failed, `FAILED` in their directory)
  summary.md        the same as a markdown table (rows: aggregators; columns:
                    attack × rho; cells "mean [min, max]" in %)
  accuracy_vs_rho.png                       one panel per attack (paper Figure 2)
  curves_<attack>_rho<rho>.png              accuracy vs rounds and vs cumulative
                                            secure-average calls, min–max shading
                                            over seeds (paper Figure 4)
A run whose model becomes non-finite, or whose round leaves too few finite client
updates for an aggregator with a condition on their number (Krum's n > 2f + 2, after
a blown-up model made local training overflow), is stopped, marked `DIVERGED` in its
directory and reported in `num_diverged`; its final accuracy is its last evaluated one,
and the sweep goes on. So does a sweep past a run that fails (e.g. Krum at a ρ that
breaks its n > 2f + 2 for the round's clients, refused before training): the error is
logged and kept in the run's `FAILED` file, the table marks the cell "failed", and a
rerun retries it.
"""

import collections
import dataclasses
import functools
import hashlib
import itertools
import json
import os
import shutil
import sys
from typing import Any, Callable, Mapping, Optional, Sequence


from tasks import registry
from tasks.simulation import attacks
from tasks.simulation import checkpoints
from tasks.simulation import client_work as client_work_lib
from tasks.simulation import experiment
from tasks.simulation import ledger
from tasks.simulation import loop
from tasks.simulation import metrics_file
from tasks.simulation import run_config as run_config_lib
from tasks.simulation import run_errors
from tasks.simulation import run_lock

DIVERGED_MARKER = 'DIVERGED'
# Written by a run that failed (its error message); removed when it is retried.
FAILED_MARKER = 'FAILED'
# Written by a run when it finishes: its ledger fingerprint (`run_fingerprint`).
FINGERPRINT_FILE = 'FINGERPRINT'
# Bumped when a change to the code changes what a run of the same settings computes,
# so that ledger entries of the older code are no longer taken for runs of this one.
FINGERPRINT_VERSION = 1
CLEAN = attacks.NO_ATTACK


@dataclasses.dataclass(frozen=True)
class Variant:
  """A row of the sweep's tables: an aggregator, with or without worker momentum."""
  aggregator: str
  worker_momentum: float = 0.0

  @property
  def label(self) -> str:
    if not self.worker_momentum:
      return self.aggregator
    return f'{self.aggregator} +wm{self.worker_momentum:g}'


@dataclasses.dataclass(frozen=True)
class Run:
  """One cell of the sweep."""
  aggregator: str
  attack: str
  rho: float
  seed: int
  worker_momentum: float = 0.0

  @property
  def name(self) -> str:
    # Without momentum the name is the one runs had before momentum was swept, so
    # their output directories stay resumable.
    momentum = f'_wm{self.worker_momentum:g}' if self.worker_momentum else ''
    return (f'{self.aggregator}{momentum}_{self.attack}_rho{self.rho:g}'
            f'_seed{self.seed}')


@dataclasses.dataclass(frozen=True)
class SweepSpec:
  """What to sweep and how every run trains.

  Attributes:
    aggregators: Names of `tasks.registry`.
    attacks: Attack names (not 'none': ρ = 0 is the clean run).
    rhos: Corruption levels in [0, 0.5).
    seeds: Run seeds.
    worker_momenta: Worker momentum β of the client work (Karimireddy et al. 2021);
      every aggregator runs with each (0: clients send plain updates).
    client_work: Name of `tasks.simulation.client_work.CLIENT_WORKS`.
    client_work_args: Its keyword arguments (e.g. `ditto_lambda`).
    rounds: Rounds per run.
    eval_period: Evaluate every this many rounds.
    aggregator_args: aggregator name → keyword arguments.
    attack_args: attack name → its constructor's keyword arguments.
    simulation_kwargs: `tasks.simulation.loop.Simulation` keyword arguments shared by
      all runs (clients_per_round, client_learning_rate, server_optimizer,
      eval_max_examples), without attack, attack_params, rho and seed.
  """
  aggregators: Sequence[str]
  attacks: Sequence[str]
  rhos: Sequence[float]
  seeds: Sequence[int]
  rounds: int
  eval_period: int = 1
  worker_momenta: Sequence[float] = (0.0,)
  client_work: str = 'fedavg'
  client_work_args: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  aggregator_args: Mapping[str, Mapping[str, Any]] = dataclasses.field(
      default_factory=dict)
  attack_args: Mapping[str, Mapping[str, Any]] = dataclasses.field(
      default_factory=dict)
  simulation_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def variants(self) -> list[Variant]:
    """The table rows: every aggregator with every worker momentum."""
    return [Variant(aggregator, momentum) for aggregator in self.aggregators
            for momentum in self.worker_momenta]

  def runs(self) -> list[Run]:
    """Every run, ρ = 0 once per variant and seed."""
    runs = []
    for variant in self.variants():
      for seed in self.seeds:
        runs.extend(self.run_for_cell(variant, attack, rho, seed)
                    for attack, rho in self.cells())
    return runs

  def cells(self) -> list[tuple[str, float]]:
    """The (attack, ρ) columns, the clean run (ρ = 0) first when swept."""
    clean = [(CLEAN, 0.0)] if 0.0 in self.rhos else []
    return clean + [(attack, rho) for attack in self.attacks
                    for rho in self.rhos if rho > 0]

  def run_for_cell(self, variant: Variant, attack: str, rho: float,
                   seed: int) -> Run:
    return Run(variant.aggregator, CLEAN if rho == 0 else attack, rho, seed,
               variant.worker_momentum)


def run_dir(output_dir: str, run: Run) -> str:
  return os.path.join(output_dir, 'runs', run.name)


def run_sweep(task, spec: SweepSpec, output_dir: str, progress: bool = True,
              checkpoint_period: int = 1,
              log: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
              recorded: Optional[Mapping[ledger.Key, ledger.Entry]] = None,
              ledger_path: Optional[str] = None, keep_checkpoints: bool = True,
              shard: tuple[int, int] = (0, 1)) -> int:
  """Runs (or resumes) every run of `spec` on `task`, sequentially, in-process;
  returns how many runs it trained. With `shard=(i, n)`, only runs i, i + n, i + 2n,
  ... of `spec.runs()` (from 0): n processes side by side, one per shard, share the
  grid's runs among them. Finished runs are skipped, and so are the runs
  `recorded` (a ledger, `tasks.simulation.ledger`) holds with this task's and spec's
  fingerprint. Each run checkpoints every `checkpoint_period` rounds
  (`experiment.run_experiment`). A run that finishes (or diverges) writes its
  fingerprint into its directory (`FINGERPRINT_FILE`) and, with `ledger_path`, its
  entry into that ledger at once, so a killed sweep keeps every finished run. Without
  `keep_checkpoints` it then deletes its checkpoints (a worker-momentum run keeps
  every sampled client's momentum in them); its metrics.csv, config.json and
  fingerprint stay, and are what mark it finished. A run another process owns (a
  slice side by side training the same cell, `run_lock`) is skipped with a line."""
  shard_index, num_shards = shard
  if not 0 <= shard_index < num_shards:
    raise ValueError(f'shard must be (i, n) with 0 ≤ i < n, got {shard}.')
  runs = spec.runs()
  recorded = recorded or {}
  trained = 0
  for index, run in enumerate(runs, start=1):
    if (index - 1) % num_shards != shard_index:
      continue
    directory = run_dir(output_dir, run)
    label = f'[{index}/{len(runs)}] {run.name}'
    fingerprint = run_fingerprint(task, spec, run)
    skipped = _why_skipped(directory, run, fingerprint, recorded)
    if skipped:
      log(f'{label}: {skipped}, skipped.')
      continue
    try:
      with run_lock.owned(directory):
        # Asked again as the owner: another sweep may have finished it meanwhile.
        skipped = _why_skipped(directory, run, fingerprint, recorded,
                               owner=True)
        if skipped:
          log(f'{label}: {skipped}, skipped.')
          continue
        trained += 1
        _run_cell(task, spec, run, directory, label, fingerprint, progress=progress,
                  checkpoint_period=checkpoint_period, log=log,
                  ledger_path=ledger_path, keep_checkpoints=keep_checkpoints)
    except run_lock.RunLockedError as e:
      # Another sweep or leaderboard slice is training this cell: leave it to it.
      owner = f'process {e.owner}' if e.owner else 'another process'
      log(f'{label}: run by {owner} now, skipped.')
  return trained


def _why_skipped(directory: str, run: Run, fingerprint: str,
                 recorded: Mapping[ledger.Key, ledger.Entry],
                 owner: bool = False) -> Optional[str]:
  """Why the run needs no training ('finished', ...), or None; as the directory's
  `owner`, a run finished under another configuration is set aside."""
  stored = _stored_fingerprint(directory)
  # A directory finished under another configuration (an older revision of its
  # aggregator) is not this run's result, diverged or not.
  if stored is not None and stored != fingerprint:
    if (run.name, fingerprint) in recorded:
      return 'in the ledger'
    if owner:
      _set_aside(directory, f'stale-{stored}')
    return None
  if stored == fingerprint:
    if os.path.exists(os.path.join(directory, DIVERGED_MARKER)):
      return 'diverged in an earlier session'
    return 'finished'
  if (run.name, fingerprint) in recorded:
    return 'in the ledger'
  # No fingerprint: an interrupted run, one killed before its fingerprint was
  # written, or one this sweep did not make. Its owner resumes it, and the identity
  # check of `experiment.run_experiment` (config.json and every checkpoint) tells
  # them apart: all rounds done, it writes the fingerprint; another configuration's
  # is set aside (`_train_run`).
  return None


def _set_aside(directory: str, suffix: str) -> str:
  """Moves the files of a run of another configuration to `<directory>.<suffix>`
  (kept, not deleted), so that this configuration trains from round 0 in its place,
  and returns that path. The lock file stays: the directory remains this process's."""
  stale = f'{directory}.{suffix}'
  for number in itertools.count(2):
    if not os.path.lexists(stale):
      break
    stale = f'{directory}.{suffix}-{number}'  # Set aside before: both are kept.
  os.makedirs(stale)
  for name in os.listdir(directory):
    if name != run_lock.LOCK_FILE:
      os.replace(os.path.join(directory, name), os.path.join(stale, name))
  return stale


def _run_cell(task, spec: SweepSpec, run: Run, directory: str, label: str,
              fingerprint: str, *, progress: bool, checkpoint_period: int,
              log: Callable[[str], None], ledger_path: Optional[str],
              keep_checkpoints: bool) -> None:
  """Trains one run and records it (fingerprint, ledger entry), or marks it failed."""
  _clear_failure(directory)
  try:
    _train_run(task, spec, run, directory, label, progress=progress,
               checkpoint_period=checkpoint_period, log=log)
  except Exception as e:  # pylint: disable=broad-except
    # One cell's failure (e.g. Krum's n > 2f + 2 broken by its ρ) must not cost the
    # other cells their runs: it is marked, reported in the summary, and retried
    # when the sweep is rerun.
    _mark_failed(directory, label, e, log)
    return
  with open(os.path.join(directory, FINGERPRINT_FILE), 'w') as f:
    f.write(fingerprint + '\n')
  if ledger_path:
    ledger.merge(ledger_path, {(run.name, fingerprint): _entry(directory)})
  checkpoints_dir = os.path.join(directory, checkpoints.CHECKPOINTS_DIR)
  if not keep_checkpoints and os.path.isdir(checkpoints_dir):
    shutil.rmtree(checkpoints_dir)


def _train_run(task, spec: SweepSpec, run: Run, directory: str, label: str, *,
               progress: bool, checkpoint_period: int,
               log: Callable[[str], None]) -> None:
  """Trains (or resumes) one run; a run that diverges is marked `DIVERGED_MARKER`.

  Raises:
    ValueError: before any training, when the run's aggregator cannot aggregate a
      round of the sweep's clients (Krum's n > 2f + 2 with f = ⌊ρ·n⌋).
  """
  factory = _aggregator_factory(run.aggregator, run.rho,
                                spec.aggregator_args.get(run.aggregator, {}))
  registry.check_num_clients(factory, min(
      spec.simulation_kwargs.get('clients_per_round', 10),
      len(task.train_data.client_ids)))
  work = client_work_lib.client_work_from_name(
      spec.client_work, task, worker_momentum=run.worker_momentum,
      **spec.client_work_args)
  sim = loop.Simulation(task, factory, work, attack=run.attack,
                        attack_params=spec.attack_args.get(run.attack, {}),
                        rho=run.rho, seed=run.seed, **spec.simulation_kwargs)
  train = functools.partial(
      experiment.run_experiment, sim, directory, spec.rounds, spec.eval_period,
      config=run_config(task, spec, run), progress=progress, tensorboard=False,
      description=label, checkpoint_period=checkpoint_period)
  try:
    try:
      train()
    except run_errors.ConfigMismatchError as e:
      # Not this cell's run (other settings, or more rounds than the sweep's): kept
      # beside it, and the cell trained from round 0.
      stale = _set_aside(directory, f'other-{_fingerprint_of_files(directory)}')
      log(f'{label}: {e.problem}. Moved it to {stale}; training this cell afresh.')
      train()
  except run_errors.NonFiniteStateError as e:
    log(f'{label}: {e}')
    with open(os.path.join(directory, DIVERGED_MARKER), 'w') as f:
      f.write(str(e) + '\n')


# The factories of a sweep's recent runs (their identities and simulations), by
# aggregator, the ρ it depends on and its arguments: one object per configuration, so
# the simulation creates and compiles its processes once for every run sharing it
# (`rounds.Round`). Bounded: a grid's runs of one aggregator come together
# (`SweepSpec.runs`), and each factory keeps its processes and traced functions alive.
_FACTORIES: collections.OrderedDict = collections.OrderedDict()
_MAX_FACTORIES = 16


def _aggregator_factory(name: str, rho: float, args: Mapping[str, Any]):
  build = functools.partial(registry.aggregator_from_name, name,
                            assumed_byzantine_fraction=rho, **args)
  try:
    key = (name, rho if registry.takes_assumed_byzantine_fraction(name) else None,
           json.dumps(args, sort_keys=True))
  except TypeError:  # Arguments JSON cannot spell exactly: built for this run only.
    return build()
  if key not in _FACTORIES:
    _FACTORIES[key] = build()
  _FACTORIES.move_to_end(key)
  if len(_FACTORIES) > _MAX_FACTORIES:
    _FACTORIES.popitem(last=False)
  return _FACTORIES[key]


def _mark_failed(directory: str, label: str, error: Exception,
                 log: Callable[[str], None]) -> None:
  message = ' '.join(str(error).split()) or type(error).__name__
  log(f'{label}: failed: {message}')
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, FAILED_MARKER), 'w') as f:
    f.write(message + '\n')


def _clear_failure(directory: str) -> None:
  """Removes the markers of an attempt that did not finish: a rerun writes them again
  if it fails or diverges again (a DIVERGED without a fingerprint is a session killed
  before it wrote one)."""
  for marker in (FAILED_MARKER, DIVERGED_MARKER):
    path = os.path.join(directory, marker)
    if os.path.exists(path):
      os.remove(path)


def pending_runs(task, spec: SweepSpec, output_dir: str,
                 recorded: Optional[Mapping[ledger.Key, ledger.Entry]] = None
                 ) -> list[Run]:
  """The runs of `spec` that `run_sweep` would train (not finished, not in
  `recorded`)."""
  return [run for run in spec.runs() if not _why_skipped(
      run_dir(output_dir, run), run, run_fingerprint(task, spec, run),
      recorded or {})]


def failed_runs(spec: SweepSpec, output_dir: str) -> list[Run]:
  """The runs of `spec` whose last attempt failed (`FAILED_MARKER`)."""
  return [run for run in spec.runs() if os.path.exists(
      os.path.join(run_dir(output_dir, run), FAILED_MARKER))]


def run_config(task, spec: SweepSpec, run: Run) -> dict[str, Any]:
  """The run's identity, its config.json: everything that decides what its rounds
  compute, which a restarted run must match (`experiment.run_experiment` checks it
  against config.json and binds it to every checkpoint) and a finished run is
  recognized by. It holds the run (its name: aggregator, worker momentum, attack, ρ,
  seed), the task, the aggregator's and attack's arguments, the client work, the
  simulation's settings (clients per round, the client learning-rate schedule,
  evaluation size), the server optimizer, the local work (epochs, batch size, cap),
  how the data was built (`Task.provenance`: source, client cap, data seed), the
  partition (every client id with its example count), and the revisions of the
  factories whose results changed (a checkpoint of an older revision is not
  resumed, nor its ledger entry used). Not in it: the rounds and the evaluation
  period, which a resumed run may change (they are in the fingerprint), and what only
  says where files go or how progress shows."""
  config = dict(run=run.name, task=task.name,
                aggregator_args=spec.aggregator_args.get(run.aggregator, {}),
                attack_args=spec.attack_args.get(run.attack, {}),
                **_client_work_config(spec),
                **{k: v for k, v in spec.simulation_kwargs.items()
                   if k != 'server_optimizer'},
                server_optimizer=_describe(spec.simulation_kwargs.get('server_optimizer')),
                client_spec=dataclasses.asdict(task.client_spec),
                data=dict(task.provenance), partition=_partition_digest(task))
  return registry.with_results_revisions(config, _aggregator_factory(
      run.aggregator, run.rho, spec.aggregator_args.get(run.aggregator, {})))


def run_fingerprint(task, spec: SweepSpec, run: Run) -> str:
  """The run's ledger fingerprint: its identity (`run_config`), the number of rounds
  and the evaluation period (a diverged run's final accuracy is its last evaluation)
  and `FINGERPRINT_VERSION` (the keys fingerprints have always held, so committed
  ledgers keep their entries)."""
  return ledger.fingerprint(dict(
      run_config(task, spec, run), rounds=spec.rounds, eval_period=spec.eval_period,
      version=FINGERPRINT_VERSION))


def _partition_digest(task) -> str:
  # Cached on the task's id (one digest per task, not per run of a sweep).
  if id(task) not in _PARTITIONS:
    _PARTITIONS[id(task)] = (task, hashlib.sha256(json.dumps(sorted(
        task.client_weights.items())).encode('utf-8')).hexdigest())
  return _PARTITIONS[id(task)][1]


_PARTITIONS: dict[int, tuple[Any, str]] = {}


def _describe(optimizer) -> Optional[dict[str, Any]]:
  """A TFF optimizer by its class and hyperparameters (its `str` has an address)."""
  if optimizer is None:
    return None
  return dict(type=type(optimizer).__qualname__, **vars(optimizer))


def finished_entries(task, spec: SweepSpec,
                     output_dir: str) -> dict[ledger.Key, ledger.Entry]:
  """Ledger entries of the runs of `spec` finished (or diverged) in `output_dir` with
  this task's and spec's settings: those whose `FINGERPRINT_FILE` is the run's
  fingerprint (a run finished with other settings, or before fingerprints, is not
  taken for one of these)."""
  entries = {}
  for run in spec.runs():
    directory = run_dir(output_dir, run)
    fingerprint = run_fingerprint(task, spec, run)
    if _stored_fingerprint(directory) == fingerprint:
      entries[(run.name, fingerprint)] = _entry(directory)
  return entries


def _fingerprint_of_files(directory: str) -> str:
  """A short digest of a run directory's config.json (or 'unknown'), naming where
  a run of another configuration is set aside."""
  try:
    with open(os.path.join(directory, run_config_lib.CONFIG_FILE), 'rb') as f:
      return hashlib.sha256(f.read()).hexdigest()[:12]
  except OSError:
    return 'unknown'


def _stored_fingerprint(directory: str) -> Optional[str]:
  path = os.path.join(directory, FINGERPRINT_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return f.read().strip()


def _entry(directory: str) -> ledger.Entry:
  rows = metrics_file.read_rows(directory)
  return ledger.Entry(
      final_accuracy=metrics_file.final_accuracy(rows),
      diverged=os.path.exists(os.path.join(directory, DIVERGED_MARKER)),
      secure_average_calls_per_round=metrics_file.calls_per_round(rows))


def recorded_results(task, spec: SweepSpec,
                     entries: Mapping[ledger.Key, ledger.Entry]
                     ) -> dict[str, ledger.Entry]:
  """The entries of a ledger that are runs of `spec` on `task`, by run name."""
  found = {}
  for run in spec.runs():
    entry = entries.get((run.name, run_fingerprint(task, spec, run)))
    if entry is not None:
      found[run.name] = entry
  return found


def _client_work_config(spec: SweepSpec) -> dict[str, Any]:
  """The client work's part of a run's config.json; empty for plain FedAvg, so runs
  from before the client work was configurable stay resumable (β is in the name)."""
  if spec.client_work == 'fedavg':
    return {}
  return dict(client_work=spec.client_work, client_work_args=dict(spec.client_work_args))
