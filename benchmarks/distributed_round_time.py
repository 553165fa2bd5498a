r"""Round time of RFA with the clients spread over 1, 2 and 4 local TFF workers, against
one process, and the bytes that cross to and from every worker per round.

The paper's EMNIST ConvNet on the bundled digits, RFA (3 passes), `--clients_per_round`
clients. One round is `tasks.simulation` 's round: local training, then the
aggregation, then the server optimizer. Single process: `loop.Simulation` (TFF's own
local worker). N workers: `DistributedSimulation` on N `LocalWorkers` (127.0.0.1):
training as one aggregation-free computation split over the workers, then every RFA
pass as one computation split over them (`tff_robust.distributed.passwise`).

Configurations are interleaved round by round (same clients, same load); the first
round of each is discarded. Bytes are counted on the wire (serialized gRPC requests
and responses of every worker), per timed round.

On one machine the workers share its cores, so this measures overhead, not speed-up;
the last table projects the round time with one worker per machine from the measured
parts (see the printout).

  .venv/bin/python -m benchmarks.distributed_round_time --workers=1,2,4
"""

import collections
import time

from absl import flags
import numpy as np

from tasks import builders
from tasks import registry
from tasks.binaries import exit_status
from tasks.simulation import client_work as client_work_lib
from tasks.simulation import distributed as distributed_simulation
from tasks.simulation import loop
from tff_robust import distributed
from tff_robust.distributed import runtime

_CLIENTS = flags.DEFINE_integer('clients_per_round', 50, 'Clients per round.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Timed rounds per configuration.')
_WARMUP = flags.DEFINE_integer('warmup_rounds', 1, 'Untimed first rounds.')
_MODEL = flags.DEFINE_enum('model', 'cnn', ['cnn', 'linear'], 'EMNIST model.')
_EPOCHS = flags.DEFINE_integer('epochs', 5, 'Local epochs (paper: 5).')
_MAX_ELEMENTS = flags.DEFINE_integer('max_elements', None,
                                     'Cap on examples per client per round.')
_WORKERS = flags.DEFINE_list('workers', ['1', '2', '4'], 'Worker counts to time.')
_PASSES = flags.DEFINE_integer('passes', 3, 'RFA passes R.')
_BANDWIDTHS = flags.DEFINE_list('bandwidth_gbit', ['1', '10'],
                                'Network bandwidths of the projection, Gbit/s.')


class _TimedClientWork:
  """Times the training part of a round."""

  def __init__(self, inner):
    self._inner, self.seconds = inner, []

  def initial_state(self):
    return self._inner.initial_state()

  def train(self, *args, **kwargs):
    start = time.perf_counter()
    try:
      return self._inner.train(*args, **kwargs)
    finally:
      self.seconds.append(time.perf_counter() - start)

  def evaluate(self, *args, **kwargs):
    return self._inner.evaluate(*args, **kwargs)


def main(argv):
  del argv
  task = builders.build_task(
      'emnist', _MODEL.value, source='bundled',
      client_spec=builders.ClientSpec(num_epochs=_EPOCHS.value, batch_size=50,
                                      max_elements=_MAX_ELEMENTS.value))
  factory = registry.aggregator_from_name('gm', num_communication_passes=_PASSES.value)
  kwargs = dict(clients_per_round=_CLIENTS.value, client_learning_rate=loop.StepSchedule(
      0.05), seed=0)
  counts = [int(n) for n in _WORKERS.value]
  with runtime.worker_binaries_stopped():
    pools = {n: distributed.LocalWorkers(n) for n in counts}
    contexts = {}
    try:
      for n, pool in pools.items():
        pool.start()
        contexts[n] = distributed.DistributedContext(pool.addresses)
      simulations = collections.OrderedDict()
      timers = {}
      timers['single'] = _TimedClientWork(client_work_lib.fedavg_client_work(task))
      simulations['single'] = loop.Simulation(task, factory, timers['single'], **kwargs)
      for n in counts:
        timers[n] = _TimedClientWork(
            distributed_simulation.MergeableFedAvgClientWork(task, contexts[n]))
        simulations[n] = distributed_simulation.DistributedSimulation(
            task, factory, timers[n], context=contexts[n], **kwargs)
      states = {k: s.initial_state() for k, s in simulations.items()}
      seconds = collections.defaultdict(list)
      traffic = collections.defaultdict(list)
      for round_num in range(_WARMUP.value + _ROUNDS.value):
        for key, simulation in simulations.items():
          before = contexts[key].traffic() if key in contexts else None
          start = time.perf_counter()
          states[key], _ = simulation.run_round(states[key], round_num)
          elapsed = time.perf_counter() - start
          if round_num < _WARMUP.value:
            continue
          seconds[key].append(elapsed)
          if before is not None:
            after = contexts[key].traffic()
            traffic[key].append({a: (after[a][0] - before[a][0],
                                     after[a][1] - before[a][1]) for a in after})
    finally:
      for context in contexts.values():
        context.close()
      for pool in pools.values():
        pool.stop()

  timed = slice(_WARMUP.value, None)
  params = sum(int(np.prod(np.shape(w))) for w in states['single']['model']['trainable'])
  print(f'EMNIST {_MODEL.value} ({params:,} parameters, {4 * params / 1e6:.1f} MB), RFA '
        f'R={_PASSES.value}, {_CLIENTS.value} clients/round, {_EPOCHS.value} epoch(s), '
        f'max_elements={_MAX_ELEMENTS.value}, {_ROUNDS.value} timed rounds, '
        f'{len(counts)} worker configurations interleaved:')
  single = np.asarray(seconds['single'])
  single_train = np.asarray(timers['single'].seconds[timed])
  print(f'  single process  {np.median(single):8.2f} s/round (training '
        f'{np.median(single_train):.2f} s, aggregation + server '
        f'{np.median(single - single_train):.2f} s)')
  rows = {}
  for n in counts:
    times = np.asarray(seconds[n])
    train = np.asarray(timers[n].seconds[timed])
    per_worker = [np.mean([r[a][0] + r[a][1] for r in traffic[n]])
                  for a in contexts[n].addresses]
    sent = np.mean([sum(v[0] for v in r.values()) for r in traffic[n]])
    received = np.mean([sum(v[1] for v in r.values()) for r in traffic[n]])
    rows[n] = (times, train, per_worker)
    print(f'  {n} worker(s)     {np.median(times):8.2f} s/round  ratio '
          f'{np.median(times / single):5.2f}  (training {np.median(train):.2f} s, '
          f'aggregation + server {np.median(times - train):.2f} s); bytes per round '
          f'per worker {np.mean(per_worker) / 1e6:,.0f} MB (all workers: sent '
          f'{sent / 1e6:,.0f} MB, received {received / 1e6:,.0f} MB)')

  # Projection, one worker per machine: the work the single process does on clients
  # (training, and the client side of every pass) divides over N machines; the
  # serialization overhead measured with one local worker (its time above the single
  # process) is paid per worker in parallel; transfer adds bytes per worker over the
  # link. Server-side time (merging, server optimizer) is not divided.
  one = min(counts)
  overhead = max(np.median(rows[one][0]) - np.median(single), 0.0)
  print('Projected s/round with one worker per machine (model: single-process time '
        '/ N + measured per-worker overhead + per-worker bytes / bandwidth):')
  for n in counts:
    per_worker_bytes = np.mean(rows[n][2])
    cells = []
    for gbit in _BANDWIDTHS.value:
      transfer = per_worker_bytes * 8 / (float(gbit) * 1e9)
      projected = np.median(single) / n + overhead * one / n + transfer
      cells.append(f'{gbit} Gbit/s: {projected:7.2f} s (speed-up '
                   f'{np.median(single) / projected:4.2f}×)')
    print(f'  N={n}: ' + '; '.join(cells))


if __name__ == '__main__':
  exit_status.run(main)
