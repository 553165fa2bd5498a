r"""Round time of RFA with the clients spread over 1, 2 and 4 TFF workers, against one
process; the driver's bytes per round; the cost model measured against.

The paper's EMNIST model on the bundled digits, RFA (`--passes` R),
`--clients_per_round` clients. One round is `tasks.simulation`'s round: local
training, then the aggregation, then the server optimizer. Single process: `loop.Simulation` (TFF's own
local worker). N workers: `DistributedSimulation`, training as one aggregation-free
computation split over the workers, then every RFA pass as one computation split
over them (`tff_robust.distributed.passwise`), each of two ways:

*   `datasets`: the driver sends every client's dataset with every round, and every
    client's update with every aggregation call (`data_on_workers=False`);
*   `ids_resent`: the workers build their clients' datasets by client id from an
    export of the task's data (`tasks.simulation.worker_data`); the driver sends
    ids, and every client's update with every aggregation call
    (`DistributedContext(keep_round_values=False)`);
*   `ids`: ids, and each worker receives its clients' updates once per round and
    keeps them for the round's aggregation calls (`keep_round_values=True`, the
    default).

`--network=netns` (root; `ip`, `tc`) runs the driver and every worker in a network
namespace of its own, each with one link into a bridge (`benchmarks.link_emulation`),
the workers behind the deployment's mutual TLS (`python -m tff_robust.distributed
--tls_*`). The driver's bytes are its interface's counters (everything leaving and
entering it, headers included); `--bandwidth_mbit` limits every link, the driver's
and each worker's, in both directions (`tc tbf`; 0 = no limit), interleaved round by
round. `--network=loopback` uses `LocalWorkers` on 127.0.0.1 and counts serialized
gRPC messages only.

Configurations (and limits) are interleaved round by round (same clients, same load);
the first `--warmup_rounds` are discarded.

The cost model (docs/distributed.md), for N workers on N machines, a driver link of
bandwidth B, R passes:

  T(N, B) = S + C / N + O + (E_N + I_N) / B

C: the single process's training time (the clients' work, divided over machines);
S: the rest of its round (aggregation and server step, undivided: the driver merges
every pass and steps the server model); O: the distributed path's own time, measured
with one worker as its round time minus the single process's (the driver
serializing, the 1 + R sequential calls' round trips, the workers deserializing: not
divided, the calls are sequential); E_N, I_N: the bytes leaving and entering the
driver per round with N workers (measured): all of them cross the driver's one
link, whatever the number of workers. On one machine the N workers share its cores,
so C / N cannot be measured here; the link term is: the check predicts the limited
round from the unlimited one, T(N, B) = T(N, ∞) + (E_N + I_N) / B, next to the
previous model's per-worker link, T(N, ∞) + (E_N + I_N) / (N B).

  sudo .venv/bin/python -m benchmarks.distributed_round_time --network=netns
  .venv/bin/python -m benchmarks.distributed_round_time --network=loopback
"""

import collections
import json
import os
import subprocess
import sys
import tempfile
import time

from absl import flags
import numpy as np

from benchmarks import link_emulation
from tasks import builders
from tasks import registry
from tasks.binaries import exit_status
from tff_robust import distributed
from tff_robust.distributed import runtime

_CLIENTS = flags.DEFINE_integer('clients_per_round', 50, 'Clients per round.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Timed rounds per configuration and limit.')
_WARMUP = flags.DEFINE_integer('warmup_rounds', 1, 'Untimed first rounds.')
_MODEL = flags.DEFINE_enum('model', 'linear', ['cnn', 'linear'], 'EMNIST model.')
_EPOCHS = flags.DEFINE_integer('epochs', 5, 'Local epochs (paper: 5).')
_MAX_ELEMENTS = flags.DEFINE_integer('max_elements', None,
                                     'Cap on examples per client per round.')
_WORKERS = flags.DEFINE_list('workers', ['1', '2', '4'], 'Worker counts to time.')
_PASSES = flags.DEFINE_integer('passes', 3, 'RFA passes R.')
_NETWORK = flags.DEFINE_enum('network', 'netns', ['netns', 'loopback'],
                             'Workers in network namespaces with their own links '
                             '(root), or LocalWorkers on 127.0.0.1.')
_BANDWIDTHS = flags.DEFINE_list('bandwidth_mbit', ['0', '50'],
                                'Link limits to interleave, Mbit/s (0: none); netns.')
_PROJECT = flags.DEFINE_list('project_gbit', ['1', '10'],
                             'Driver link bandwidths of the projection, Gbit/s.')
_PATHS = flags.DEFINE_list('paths', ['datasets', 'ids_resent', 'ids'],
                           'How workers get client data (the driver sends the '
                           'datasets, or they read them by client id) and the '
                           'updates (with every call, or once per round).')
_SETUP = flags.DEFINE_string('driver_setup', None, 'Internal: the netns driver\'s '
                             'workers (JSON), set by the parent process.')

_PREFIX = 'tffbench'
_PORT = 8000


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


def _counts():
  return [int(n) for n in _WORKERS.value]


def _bandwidths():
  return [float(b) or None for b in _BANDWIDTHS.value]


def main(argv):
  del argv
  if _NETWORK.value == 'loopback':
    with runtime.worker_binaries_stopped():
      pools = {n: distributed.LocalWorkers(n) for n in _counts()}
      try:
        for pool in pools.values():
          pool.start()
        _drive({n: pool.addresses for n, pool in pools.items()}, None, None)
      finally:
        for pool in pools.values():
          pool.stop()
  elif _SETUP.value is None:
    _run_network()
  else:
    setup = json.loads(_SETUP.value)
    network = link_emulation.Network(setup['num_workers'], prefix=_PREFIX)
    with runtime.worker_binaries_stopped():
      _drive({int(n): a for n, a in setup['addresses'].items()},
             setup['credentials'], network)


def _run_network() -> None:
  """Parent: the namespaces, credentials and workers; the driver as a child in its
  namespace."""
  counts = _counts()
  total = sum(counts)
  work = tempfile.mkdtemp(prefix='tff_netns_bench_')
  credentials = os.path.join(work, 'creds')
  subprocess.run([sys.executable, '-m', 'tff_robust.distributed.worker_credentials',
                  f'--out={credentials}'], check=True, stdout=subprocess.DEVNULL)
  workers = []
  with link_emulation.Network(total, prefix=_PREFIX) as network:
    try:
      for namespace, address in zip(network.worker_namespaces,
                                    network.worker_addresses):
        log = os.path.join(work, f'{namespace}.log')
        with open(log, 'wb') as f:
          workers.append((network.popen(namespace, [
              sys.executable, '-m', 'tff_robust.distributed', f'--port={_PORT}',
              f'--listen_host={address}', '--grpc_max_message_length_megabytes=10000',
              f'--tls_cert={credentials}/worker.pem',
              f'--tls_key={credentials}/worker.key',
              f'--tls_client_ca={credentials}/ca.pem'],
              stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT), log))
      for process, log in workers:
        _wait_for_line(process, log, 'listening')
      addresses, start = {}, 0
      for n in counts:
        chosen = network.worker_addresses[start:start + n]
        addresses[n] = [f'{a}:{_PORT}' for a in chosen]
        start += n
      setup = json.dumps({'num_workers': total, 'addresses': addresses,
                          'credentials': credentials})
      child = network.popen(network.driver, [
          sys.executable, '-m', 'benchmarks.distributed_round_time', *sys.argv[1:],
          f'--driver_setup={setup}'])
      status = child.wait()
      if status:
        raise RuntimeError(f'The driver exited with status {status}; worker logs in '
                           f'{work}.')
    finally:
      for process, _ in workers:
        if process.poll() is None:
          process.send_signal(2)
      for process, _ in workers:
        try:
          process.wait(10)
        except subprocess.TimeoutExpired:
          process.kill()
          process.wait()


def _wait_for_line(process, log: str, word: str) -> None:
  """Waits until the worker writes `word` to its log (it does once it listens)."""
  while True:
    with open(log, errors='replace') as f:
      if word in f.read():
        return
    if process.poll() is not None:
      with open(log, errors='replace') as f:
        raise RuntimeError(f'A worker exited ({process.returncode}): {f.read()}')
    time.sleep(0.1)


def _drive(addresses, credentials, network) -> None:
  """The driver: every configuration, interleaved, then the tables."""
  # pylint: disable=g-import-not-at-top
  from tasks.simulation import client_work as client_work_lib
  from tasks.simulation import loop
  from tasks.simulation import on_workers
  from tasks.simulation import worker_data
  task = builders.build_task(
      'emnist', _MODEL.value, source='bundled',
      client_spec=builders.ClientSpec(num_epochs=_EPOCHS.value, batch_size=50,
                                      max_elements=_MAX_ELEMENTS.value))
  factory = registry.aggregator_from_name('gm', num_communication_passes=_PASSES.value)
  kwargs = dict(clients_per_round=_CLIENTS.value,
                client_learning_rate=loop.StepSchedule(0.05), seed=0)
  counts = _counts()
  bandwidths = _bandwidths() if network is not None else [None]
  # Per worker count, a context that keeps the round's updates on the workers and
  # one that resends them with every call (the same workers).
  contexts = {(n, keep): distributed.DistributedContext(
      addresses[n], credentials=credentials, keep_round_values=keep)
              for n in counts for keep in (True, False)}
  try:
    simulations = collections.OrderedDict()
    timers = {}
    timers['single'] = _TimedClientWork(client_work_lib.fedavg_client_work(task))
    simulations['single'] = loop.Simulation(task, factory, timers['single'], **kwargs)
    # One export, read by every worker (they share this machine's files).
    client_data = worker_data.ClientDataDirectory(task)
    for n in counts:
      for path in _PATHS.value:
        context = contexts[n, path == 'ids']
        work = on_workers.MergeableFedAvgClientWork(
            task, context, client_data if path != 'datasets' else None)
        timers[n, path] = _TimedClientWork(work)
        simulations[n, path] = on_workers.DistributedSimulation(
            task, factory, timers[n, path], context=context, **kwargs)
    states = {k: s.initial_state() for k, s in simulations.items()}
    rows = collections.defaultdict(list)
    for round_index in range(_WARMUP.value + _ROUNDS.value):
      for b_index, mbit in enumerate(bandwidths):
        if network is not None:
          network.limit(mbit)
        round_num = round_index * len(bandwidths) + b_index
        for key, simulation in simulations.items():
          if key == 'single' and b_index:
            continue  # No network.
          context = contexts[key[0], key[1] == 'ids'] if key != 'single' else None
          grpc_before = context.traffic() if context else {}
          link_before = link_emulation.interface_bytes() if network else (0, 0)
          start = time.perf_counter()
          states[key], _ = simulation.run_round(states[key], round_num)
          elapsed = time.perf_counter() - start
          link_after = link_emulation.interface_bytes() if network else (0, 0)
          print(f'round {round_num} {key} limit {mbit}: {elapsed:.2f} s, driver out '
                f'{(link_after[0] - link_before[0]) / 1e6:.2f} MB', file=sys.stderr,
                flush=True)
          if round_index < _WARMUP.value:
            continue
          grpc_after = context.traffic() if context else {}
          rows[key, mbit].append(dict(
              seconds=elapsed, train=timers[key].seconds[-1],
              egress=link_after[0] - link_before[0],
              ingress=link_after[1] - link_before[1],
              grpc_sent=sum(grpc_after[a][0] - grpc_before[a][0] for a in grpc_after),
              grpc_received=sum(grpc_after[a][1] - grpc_before[a][1]
                                for a in grpc_after)))
    if network is not None:
      network.limit(None)
  finally:
    for context in contexts.values():
      context.close()
  params = sum(int(np.prod(np.shape(w)))
               for w in states['single']['model']['trainable'])
  _report(rows, counts, bandwidths, params, network is not None)


def _median(rows, field):
  return float(np.median([r[field] for r in rows]))


def _mean(rows, field):
  return float(np.mean([r[field] for r in rows]))


def _report(rows, counts, bandwidths, params, on_links: bool) -> None:
  print(f'EMNIST {_MODEL.value} ({params:,} parameters, {4 * params / 1e6:.2f} MB), '
        f'RFA R={_PASSES.value}, {_CLIENTS.value} clients/round, {_EPOCHS.value} '
        f'epoch(s), max_elements={_MAX_ELEMENTS.value}, {_ROUNDS.value} timed rounds '
        f'per configuration and limit, interleaved; network: {_NETWORK.value}.')
  single = rows['single', None]
  t_single, c_single = _median(single, 'seconds'), _median(single, 'train')
  print(f'  single process: {t_single:.2f} s/round (training C = {c_single:.2f} s, '
        f'aggregation + server S = {t_single - c_single:.2f} s)')
  byte_source = 'driver interface' if on_links else 'serialized gRPC messages'
  print(f'Measured (bytes per round: {byte_source}):')
  print('  N  data        link        s/round  ratio  training   driver out MB  in MB'
        '   gRPC out MB  in MB')
  for n in counts:
    for path in _PATHS.value:
      for mbit in bandwidths:
        r = rows[(n, path), mbit]
        out = _mean(r, 'egress' if on_links else 'grpc_sent') / 1e6
        into = _mean(r, 'ingress' if on_links else 'grpc_received') / 1e6
        link = f'{mbit:g} Mbit/s' if mbit else 'unlimited'
        print(f'  {n}  {path:10s}  {link:10s}  {_median(r, "seconds"):7.2f}  '
              f'{_median(r, "seconds") / t_single:5.2f}  {_median(r, "train"):8.2f}  '
              f'{out:13.2f}  {into:6.2f}  {_mean(r, "grpc_sent") / 1e6:11.2f}  '
              f'{_mean(r, "grpc_received") / 1e6:6.2f}')
  limited = [b for b in bandwidths if b]
  if on_links and limited:
    print('Link term, measured against predicted from the unlimited round '
          '(driver link: T(N,∞) + (E+I)/B; per-worker links, the previous model: '
          'T(N,∞) + (E+I)/(N·B)):')
    for n in counts:
      for path in _PATHS.value:
        free = rows[(n, path), None]
        for mbit in limited:
          r = rows[(n, path), mbit]
          link_seconds = (_mean(r, 'egress') + _mean(r, 'ingress')) * 8 / (mbit * 1e6)
          measured = _median(r, 'seconds')
          driver = _median(free, 'seconds') + link_seconds
          per_worker = _median(free, 'seconds') + link_seconds / n
          print(f'  N={n} {path:10s} {mbit:g} Mbit/s: measured {measured:6.2f} s; '
                f'driver link {driver:6.2f} s ({driver / measured:4.2f}×); per-worker '
                f'links {per_worker:6.2f} s ({per_worker / measured:4.2f}×)')
  one = min(counts)
  print('Projected s/round, one worker per machine: S + C/N + O + (E_N + I_N)/B '
        f'(O measured with {one} worker, unlimited link):')
  for path in _PATHS.value:
    overhead = max(_median(rows[(one, path), None], 'seconds') - t_single, 0.0)
    for n in counts:
      r = rows[(n, path), None]
      link_bytes = (_mean(r, 'egress' if on_links else 'grpc_sent') +
                    _mean(r, 'ingress' if on_links else 'grpc_received'))
      cells = []
      for gbit in _PROJECT.value:
        projected = (t_single - c_single) + c_single / n + overhead + (
            link_bytes * 8 / (float(gbit) * 1e9))
        cells.append(f'{gbit} Gbit/s {projected:6.2f} s ({t_single / projected:4.2f}×)')
      print(f'  {path:10s} N={n} (O = {overhead:.2f} s, E+I = {link_bytes / 1e6:.1f} '
            'MB): ' + '; '.join(cells))


if __name__ == '__main__':
  exit_status.run(main)
