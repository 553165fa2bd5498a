r"""Per-round wall time of FedAvg with robust aggregators against plain FedAvg.

The paper's EMNIST ConvNet and local work (5 epochs, batch 50) on the bundled MNIST
digits, the same clients and data for
every process in a round. Rounds of the processes are interleaved (A, B, A, B, ...) so
that load from anything else on the machine hits all of them alike; the first rounds
(tracing, worker start) are discarded. Prints median seconds per round and the ratio to
FedAvg (median of the per-round ratios: each ratio compares two processes on the same
clients under the same load), and the worker's peak resident memory.

  .venv/bin/python -m benchmarks.round_time --aggregators=rfa,gma,gamma_mean

Every computation runs on one worker_binary that `tff_robust.distributed.LocalWorkers`
starts, through a context that fails fast: a worker that dies (e.g. killed by the
kernel for memory) ends the run with a `WorkerError` naming it and saying how long it
was unreachable (`tff_robust.distributed.DEFAULT_UNAVAILABLE_TIMEOUT_SECONDS`), where
TFF's default local context would retry it forever.
"""

import collections
import sys
import time

from absl import flags
import numpy as np

from tasks import builders
from tasks.binaries import aggregator_flags
from tasks.binaries import exit_status
from tff_robust import distributed

_CLIENTS = flags.DEFINE_integer('clients_per_round', 50, 'Clients per round.')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Timed rounds per process.')
_WARMUP = flags.DEFINE_integer('warmup_rounds', 1, 'Untimed first rounds.')
_MODEL = flags.DEFINE_enum('model', 'cnn', ['cnn', 'linear'], 'EMNIST model.')
_EPOCHS = flags.DEFINE_integer(
    'epochs', 5, 'Local epochs (paper D.2.3: 5). The bundled clients hold ~40 examples '
    'against ~200 on average in the paper\'s EMNIST (D.1.1): --epochs=25 gives each '
    'client the paper\'s local work (~1,000 examples per round).')
_MAX_ELEMENTS = flags.DEFINE_integer(
    'max_elements', None, 'Cap on examples per client per round.')
_CONCURRENT_CLIENTS = flags.DEFINE_integer(
    'concurrent_clients', 0, 'Clients of one computation the TFF worker runs at a time '
    '(its --max_concurrent_computation_calls; 0: all of them, TFF\'s default). Fewer '
    'lower the worker\'s peak memory somewhat; the values the runtime keeps for a whole '
    'call stay.', lower_bound=0)
_AGGREGATORS = flags.DEFINE_list(
    'aggregators', ['rfa'], 'Processes timed against FedAvg: rfa, one_step_rfa, or '
    'any name known to tasks.registry.aggregator_from_name.')
aggregator_flags.validate_aggregator_names('aggregators', also=('rfa', 'one_step_rfa'))
aggregator_flags.define_byzantine_fraction_flag()


def build_processes(task, names):
  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff
  import tff_robust
  client_optimizer = tff.learning.optimizers.build_sgdm(learning_rate=0.05)
  processes = collections.OrderedDict(fed_avg=tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn, client_optimizer))
  for name in names:
    if name == 'rfa':
      processes[name] = tff_robust.build_robust_federated_aggregation_process(
          task.model_fn, client_optimizer)
    elif name == 'one_step_rfa':
      processes[name] = tff_robust.build_one_step_robust_federated_aggregation_process(
          task.model_fn, client_optimizer)
    else:
      processes[name] = tff_robust.build_process_with_aggregator(
          task.model_fn, client_optimizer, None, aggregator_flags.aggregator_from_flag(name))
  return processes


def main(argv):
  del argv
  from benchmarks import fail_fast  # pylint: disable=g-import-not-at-top
  worker_flags = ([f'--max_concurrent_computation_calls={_CONCURRENT_CLIENTS.value}']
                  if _CONCURRENT_CLIENTS.value else [])
  with fail_fast.fail_fast_worker(worker_flags) as workers:
    print(f'TFF worker: pid {workers.binary_pids} (its log: {workers.log_path(0)})',
          flush=True)
    try:
      _timed_rounds()
      print(f'TFF worker\'s peak resident memory (VmHWM): '
            f'{fail_fast.peak_rss_bytes(workers.binary_pids[0]) / 2**30:.2f} GiB')
    except distributed.WorkerError as e:
      # Killed for memory, the worker leaves no line of its own: the kernel's
      # OOM killer does (`dmesg`), and the worker's peak is the table's limit here.
      sys.exit(f'Stopped: {e} Note: {fail_fast.KILLED_FOR_MEMORY_HINT} '
               f'({workers.log_path(0)}); try fewer --clients_per_round or '
               '--aggregators per run.')


def _timed_rounds():
  task = builders.build_task(
      'emnist', _MODEL.value, source='bundled',
      client_spec=builders.ClientSpec(num_epochs=_EPOCHS.value, batch_size=50,
                                      max_elements=_MAX_ELEMENTS.value))
  processes = build_processes(task, _AGGREGATORS.value)
  states = {name: p.initialize() for name, p in processes.items()}
  seconds = collections.defaultdict(list)
  rng = np.random.default_rng(0)
  for round_num in range(_WARMUP.value + _ROUNDS.value):
    client_ids = rng.choice(task.train_data.client_ids, _CLIENTS.value, replace=False)
    # Datasets are built outside the timed region: both processes get identical data.
    datasets = [task.client_dataset(cid) for cid in client_ids]
    for name, process in processes.items():
      start = time.perf_counter()
      states[name] = process.next(states[name], datasets).state
      if round_num >= _WARMUP.value:
        seconds[name].append(time.perf_counter() - start)

  print(f'EMNIST {_MODEL.value}, {_CLIENTS.value} clients/round, '
        f'{_ROUNDS.value} timed rounds (median seconds per round):')
  for name, times in seconds.items():
    ratios = np.asarray(times) / np.asarray(seconds['fed_avg'])
    print(f'  {name:<20s} {np.median(times):8.3f} s   ratio to fed_avg '
          f'{np.median(ratios):6.3f}   (per-round ratios {np.min(ratios):.3f} to '
          f'{np.max(ratios):.3f})')


if __name__ == '__main__':
  exit_status.run(main)
