r"""Per-call time and peak memory of every registry aggregator against the mean.

One aggregation of `--clients` updates of `--parameters` float32, on one or both of
two paths (`--paths`):

  worker      the deployable path: `tff.templates.AggregationProcess.next` on one
              local TFF worker (C++ runtime), the client updates generated
              inside the TFF worker from per-client seeds (as in training, where they
              are computed there), so what is measured is the aggregation's, not the
              cost of shipping gigabytes from Python.
  simulation  the simulation's path (`tasks.simulation.loop`): the updates are numpy
              arrays in Python, as the attacks leave them, and the round aggregates
              them the way the loop does: a gathering baseline runs its server step
              in this process (`tasks.simulation.gathered`), any other aggregator's
              process runs here too (`tasks.simulation.in_process`: TFF's compiled
              form evaluated on the held updates, with the runtime's results).
  simulation_tff  the simulation's path before `tasks.simulation.in_process`: a
              non-gathering aggregator's process receives the held updates through
              TFF's worker.

Every aggregator runs in its own Python subprocess (a clean peak), which
starts its own `worker_binary` (`benchmarks.fail_fast`: where TFF's default context
would restart a worker killed for memory and rerun the call without end, the row
says `failed` and why, the other rows go on, and the run exits with status 1). Peak
memory is VmHWM (peak resident set) of the Python process and of its worker_binary
child, read after the timed calls and before the
worker is stopped; on the simulation path the table's peak is their sum (the
updates' own 4·n·p bytes in Python included, as the simulation holds them anyway; each
call gets a fresh round of them, made before its timer starts, which a gathering
baseline consumes as the loop lets it). Time is the median over `--calls` timed calls,
after one untimed call (tracing). Prints each aggregator's time and peaks, and the
ratios to the mean's (time/mean, worker peak/mean). `generate only` is the cost of
making the client updates: on the worker path inside every call (a computation that
only generates them), on the simulation path in Python (its time is ~0, its peak
what holding one round of updates costs).

  .venv/bin/python -m benchmarks.aggregator_memory_time --clients=50 \
      --parameters=6400000 --aggregators=median,multi_krum

Every aggregator (the default `--aggregators`: the registry's and the leaderboard's
wrapped ones) in one run, the table also written as markdown:

  .venv/bin/python -m benchmarks.aggregator_memory_time --calls=1 \
      --output=results/aggregator_memory_time.md

One aggregator, as JSON (what the parent runs, and tests/baselines/test_gather_memory.py):

  .venv/bin/python -m benchmarks.aggregator_memory_time --one=median --parameters=1000000
"""

import datetime
import json
import os
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags
import numpy as np

from tasks import registry
from tasks.binaries import aggregator_flags
from tasks.binaries import exit_status
from tasks.binaries import sweep_flags
from tasks.simulation import leaderboard

_CLIENTS = flags.DEFINE_integer('clients', 50, 'Clients per aggregation.')
_PARAMETERS = flags.DEFINE_integer('parameters', 6_400_000, 'float32 per update.')
_CALLS = flags.DEFINE_integer(
    'calls', 2, 'Timed calls per aggregator (0, with --one only: the peak of one call).',
    lower_bound=0)


def default_aggregators() -> list[str]:
  """Every registry aggregator, then the leaderboard's wrapped ones (their cost is
  the wrapper's plus the inner aggregator's on a smaller matrix)."""
  return list(registry.known_aggregators()) + [
      name for name in leaderboard.default_aggregators() if '+' in name]


_ALL = 'all'
_AGGREGATORS = flags.DEFINE_list(
    'aggregators', [_ALL], 'Registry names (wrapper+name too) measured against the '
    f'mean; {_ALL}: every aggregator and the leaderboard\'s wrapped ones.')
_OUTPUT = flags.DEFINE_string(
    'output', None, 'Also write the table as markdown here (e.g. '
    'results/aggregator_memory_time.md), rewritten after every row.')
aggregator_flags.define_byzantine_fraction_flag()
_ONE = flags.DEFINE_string(
    'one', None, 'Measure this one aggregator (or "generate_only") in this process and '
    'print one JSON line.')
WORKER, SIMULATION, SIMULATION_TFF = 'worker', 'simulation', 'simulation_tff'
_PATHS = flags.DEFINE_list(
    'paths', [WORKER], f'"{WORKER}" (updates made in the TFF worker, the process '
    f'as deployed) and/or "{SIMULATION}" (updates held in Python, aggregated as the '
    f'simulation loop does) and/or "{SIMULATION_TFF}" (the same, the process called '
    'through TFF\'s worker as the loop did before); with --one, the first.')

GENERATE_ONLY = 'generate_only'
aggregator_flags.validate_aggregator_names('aggregators', also=(_ALL,))
aggregator_flags.validate_aggregator_names('one', also=(GENERATE_ONLY,))
flags.register_multi_flags_validator(
    ['calls', 'one'], lambda values: values['calls'] > 0 or values['one'] is not None,
    message='--calls=0 times nothing, and the table divides by the mean\'s time: pass '
    '--calls=1 or more (0 is for --one, a peak without timing).')


def client_computations(num_parameters):
  """Seed → a client update (uniform in [-1, 1)); seed → its weight (1 + seed mod 3).

  Two computations: selecting the update out of a (update, weight) struct at CLIENTS
  would copy every update once more.
  """
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  import tensorflow_federated as tff

  @tff.tensorflow.computation(np.int32)
  def make_update(seed):
    return tf.random.stateless_uniform(
        [num_parameters], seed=tf.stack([seed, 0]), minval=-1.0, maxval=1.0)

  @tff.tensorflow.computation(np.int32)
  def make_weight(seed):
    return tf.cast(1 + seed % 3, tf.float32)

  return make_update, make_weight


def aggregation_from_seeds(process, num_parameters):
  """(state, seeds@CLIENTS) → `process.next` on the updates generated from the seeds."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  make_update, make_weight = client_computations(num_parameters)

  @tff.federated_computation(process.next.type_signature.parameter[0],
                             tff.FederatedType(np.int32, tff.CLIENTS))
  def next_from_seeds(state, seeds):
    return process.next(state, tff.federated_map(make_update, seeds),
                        tff.federated_map(make_weight, seeds))

  return next_from_seeds


def generation_only(num_parameters):
  """seeds@CLIENTS → the largest first coordinate: the updates are made, not
  aggregated."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  make_update, _ = client_computations(num_parameters)

  @tff.tensorflow.computation(make_update.type_signature.result)
  def first_coordinate(update):
    return update[0]

  @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
  def generate(seeds):
    updates = tff.federated_map(make_update, seeds)
    return tff.federated_max(tff.federated_map(first_coordinate, updates))

  return generate


def python_updates(num_clients, num_parameters):
  """The simulation's form of the updates: one list of float32 arrays per client
  (uniform in [-1, 1), per-client seeds) and one weight (1 + seed mod 3) each."""
  updates = [[np.random.default_rng(seed).uniform(-1, 1, num_parameters)
              .astype(np.float32)] for seed in range(num_clients)]
  return updates, [np.float32(1 + seed % 3) for seed in range(num_clients)]


def measure_one(name, num_clients, num_parameters, num_calls, path, *, worker_pids):
  """Time and peak memory of `name`'s aggregation in this process and the TFF
  workers `worker_pids()` names."""
  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff
  from benchmarks import fail_fast
  from tasks.simulation import rounds
  seeds = list(range(num_clients))
  # Each call's inputs, made before its timer starts: on the simulation path a fresh
  # round of updates, which a gathering baseline's in-process step consumes.
  inputs = ((lambda: seeds) if path == WORKER else
            (lambda: python_updates(num_clients, num_parameters)))
  if name == GENERATE_ONLY:
    computation = generation_only(num_parameters)
    call = computation if path == WORKER else lambda _: None
  else:
    factory = aggregator_flags.aggregator_from_flag(name)
    vector_type = tff.TensorType(np.float32, [num_parameters])
    # The simulation's updates are lists of the model's variables.
    value_type = vector_type if path == WORKER else tff.types.to_type([vector_type])
    process = factory.create(value_type, tff.TensorType(np.float32))
    state = process.initialize()
    if path == WORKER:
      computation = aggregation_from_seeds(process, num_parameters)
      call = lambda client_seeds: computation(state, client_seeds)
    else:
      aggregate = (process.next if path == SIMULATION_TFF else
                   rounds.aggregate_function(process, in_process=True, weighted=True,
                                             factory=factory, value_type=value_type))
      call = lambda updates_and_weights: aggregate(state, *updates_and_weights)
  call(inputs())  # The measured aggregation when num_calls is 0; else untimed (tracing).
  seconds = []
  for _ in range(num_calls):
    arguments = inputs()
    start = time.perf_counter()
    call(arguments)
    seconds.append(time.perf_counter() - start)
    del arguments
  workers = worker_pids()
  return dict(
      name=name, path=path, clients=num_clients, parameters=num_parameters,
      seconds=statistics.median(seconds) if seconds else None,
      python_peak_bytes=fail_fast.peak_rss_bytes(os.getpid()),
      worker_peak_bytes=sum(fail_fast.peak_rss_bytes(pid) for pid in workers),
      worker_pids=workers)


def _measure_and_print_one(path):
  """Prints the JSON line of `measure_one`, or one with an `error` (and exits with
  status 1) when the worker died, e.g. killed for memory: TFF's own context would
  restart it and rerun the call without end."""
  # pylint: disable=g-import-not-at-top
  from benchmarks import fail_fast
  from tff_robust import distributed
  with fail_fast.fail_fast_worker() as workers:
    try:
      result = measure_one(_ONE.value, _CLIENTS.value, _PARAMETERS.value, _CALLS.value,
                           path, worker_pids=lambda: workers.binary_pids)
    except distributed.WorkerError as e:
      print(json.dumps(dict(name=_ONE.value, path=path,
                            error=f'{e} ({fail_fast.KILLED_FOR_MEMORY_HINT})')))
      sys.exit(1)
  print(json.dumps(result))


def run_in_subprocess(name, path, size_flags):
  """`measure_one` of `name` on `path` in a fresh Python, with `size_flags` (the
  run's --clients, --parameters, ...; `_size_flags()`)."""
  command = [sys.executable, '-m', 'benchmarks.aggregator_memory_time', f'--one={name}',
             f'--paths={path}', *size_flags]
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  lines = done.stdout.strip().splitlines()
  if done.returncode == 0:
    return json.loads(lines[-1])
  # The table keeps the row and says why (e.g. its worker killed for memory), so one
  # aggregator that cannot run at this size does not lose the others' rows.
  try:
    return dict(json.loads(lines[-1]), failed=True)
  except (IndexError, json.JSONDecodeError):
    return dict(name=name, path=path, failed=True,
                error=f'exit status {done.returncode}; the end of its stderr: '
                f'{done.stderr[-500:]}')


def _size_flags():
  return [f'--clients={_CLIENTS.value}', f'--parameters={_PARAMETERS.value}',
          f'--calls={_CALLS.value}',
          f'--byzantine_fraction={flags.FLAGS.byzantine_fraction}']


def _gib(num_bytes):
  return num_bytes / 2**30


def _peak(result):
  """The path's peak: the worker's where the updates are made there; on the
  simulation path Python's and the worker's, which hold copies at the same time."""
  if result['path'] == WORKER:
    return result['worker_peak_bytes']
  return result['worker_peak_bytes'] + result['python_peak_bytes']


def main(argv):
  del argv
  paths = _PATHS.value
  unknown = sorted(set(paths) - {WORKER, SIMULATION, SIMULATION_TFF})
  if unknown or not paths:
    raise app.UsageError(f'--paths takes {WORKER}, {SIMULATION} or {SIMULATION_TFF}, '
                         f'got '
                         f'{",".join(paths) or "nothing"}.')
  if _ONE.value:
    _measure_and_print_one(paths[0])
    return
  sweep_flags.expand_aggregator_groups({_ALL: default_aggregators})
  names = ['mean'] + [n for n in _AGGREGATORS.value if n != 'mean']
  print(f'{_heading()}; peak: the worker\'s (worker path), Python + worker '
        '(simulation path):')
  print(f'  {"aggregator":<28s} {"path":<10s} {"s/call":>8s} {"time/mean":>9s} '
        f'{"peak":>9s} {"peak/mean":>9s} {"python peak":>11s}')
  results = {}
  for name in [GENERATE_ONLY] + names:
    for path in paths:
      result = results[name, path] = run_in_subprocess(name, path, _size_flags())
      row = _row(result, results.get(('mean', path)))
      print(f'  {row[0]:<28s} {row[1]:<10s} {row[2]:>8s} {row[3]:>9s} {row[4]:>9s} '
            f'{row[5]:>9s} {row[6]:>11s}', flush=True)
      if result.get('failed'):
        print(f'    {result["error"]}', flush=True)
      if _OUTPUT.value:
        _write_markdown(_OUTPUT.value, results, _heading(), ' '.join(
            ['python -m benchmarks.aggregator_memory_time', *sys.argv[1:]]))
  failed = [f'{name} ({path})' for (name, path), result in results.items()
            if result.get('failed')]
  if failed:
    sys.exit(f'Failed (their rows say why): {", ".join(failed)}.')


def _heading():
  return (f'{_CLIENTS.value} clients x {_PARAMETERS.value:,} float32 '
          f'({_gib(4 * _CLIENTS.value * _PARAMETERS.value):.2f} GiB of updates), '
          f'median of {_CALLS.value} timed call(s) after one untimed, each aggregator '
          'in its own process')


def _row(result, mean):
  """The table's cells of `result`, with its ratios to `mean` (on the same path;
  empty while there is no mean yet: the update generation's printed row, measured
  first; the markdown, rewritten after the mean, has them)."""
  if result.get('failed'):
    return (result['name'], result['path'], 'failed (below)', '', '', '', '')
  ratios = ((f'{result["seconds"] / mean["seconds"]:.2f}',
             f'{_peak(result) / _peak(mean):.2f}')
            if mean and not mean.get('failed') else ('', ''))
  return (result['name'], result['path'], f'{result["seconds"]:.2f}', ratios[0],
          f'{_gib(_peak(result)):.2f} G', ratios[1],
          f'{_gib(result["python_peak_bytes"]):.2f} G')


def _write_markdown(file_path, results, heading, command):
  """The table so far (a run that stops keeps its finished rows), headed by the
  command that wrote it."""
  lines = [
      f'<!-- Written by `{command}` on '
      f'{datetime.date.today().isoformat()}; rerun it to update. -->', '',
      f'{heading}. Peak = VmHWM of the TFF worker_binary (worker path) or of '
      'Python + worker (simulation path); ratios to the mean on the same path, in '
      'this run. GB = GiB.', '',
      '| aggregator | path | s/call | time / mean | peak | peak / mean | Python peak |',
      '|---|---|---:|---:|---:|---:|---:|']
  for (name, path), result in results.items():
    cells = _row(result, results.get(('mean', path)))
    lines.append(f'| `{cells[0]}` | ' + ' | '.join(cells[1:]) + ' |')
  failures = [result for result in results.values() if result.get('failed')]
  if failures:
    lines.append('')
  for result in failures:
    lines.append(f'Failed: `{result["name"]}` on the {result["path"]} path: '
                 f'{result["error"]}')
  directory = os.path.dirname(file_path)
  if directory:
    os.makedirs(directory, exist_ok=True)
  with open(file_path, 'w', encoding='utf-8') as f:
    f.write('\n'.join(lines) + '\n')


if __name__ == '__main__':
  exit_status.run(main)
