r"""What the workers' forwarder costs: a model-sized value's round trip to a
worker directly, through the forwarder without TLS, and through it with mutual TLS.

  .venv/bin/python -m benchmarks.worker_tls_overhead [--megabytes=25] [--repeats=7]

Runs in a private network namespace of its own (entered before anything else), so the
direct worker_binary, which listens on every interface, is
reachable from this process only. Three workers, each with its own
`DistributedContext`:

  direct  the worker_binary itself, insecure gRPC (what LocalWorkers used to start);
  plain   `LocalWorkers(1)`: the binary in a private network behind the forwarder on
          127.0.0.1 (no TLS);
  tls     `LocalWorkers(1, credentials=...)`: the same with mutual TLS.

Each call sends a float32 vector of --megabytes MB to the worker and returns it (an
identity `tff.tensorflow.computation` run there). The modes are interleaved, in a rotating
order, --repeats times after one warm-up call each. Reported per mode: the median and
minimum wall time of a call, the gRPC payload bytes each way (`traffic()`: identical
in every mode), the bytes on this namespace's loopback per call (/proc/net/dev: what
crosses between the driver and the worker's port, HTTP/2 framing, TLS records and
TCP/IP headers included; the forwarder's side towards the binary is in the binary's
own network and not counted), and the CPU seconds per call of the driver process
(gRPC's TLS included), the forwarder (the launcher process) and the worker_binary, and
their sum (on loopback the kernel's network work is charged to whichever of them
runs it, so only the sum compares). On a busy machine the wall times mostly measure
the load; the CPU seconds and bytes much less.
"""

import os
import sys

if __name__ == '__main__':
  # Before TensorFlow starts threads: a user namespace needs a single thread.
  from tff_robust.distributed import worker_network  # pylint: disable=g-import-not-at-top
  worker_network.enter_private_network()

# pylint: disable=g-import-not-at-top,wrong-import-position
import argparse
import statistics
import subprocess
import tempfile
import time

import numpy as np
import portpicker

from tff_robust import distributed
from tff_robust.distributed import worker_credentials
from tff_robust.distributed import worker_launcher
# pylint: enable=g-import-not-at-top,wrong-import-position


def _loopback_bytes() -> int:
  """Bytes received on this network namespace's loopback so far (= bytes sent)."""
  with open('/proc/net/dev') as f:
    for line in f:
      name, _, counters = line.partition(':')
      if name.strip() == 'lo':
        return int(counters.split()[0])
  raise RuntimeError('no loopback interface in /proc/net/dev')


def _cpu_seconds(pid: int) -> float:
  with open(f'/proc/{pid}/stat', 'rb') as f:
    fields = f.read().rsplit(b')', 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def main(argv) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--megabytes', type=float, default=25.0)
  parser.add_argument('--repeats', type=int, default=7)
  args = parser.parse_args(argv[1:])
  import tensorflow_federated as tff  # After the arguments: an error comes at once.
  size = int(args.megabytes * 2**20 / 4)
  value = np.arange(size, dtype=np.float32)

  @tff.tensorflow.computation(tff.TensorType(np.float32, [size]))
  def identity(x):
    return x

  deployment = tempfile.mkdtemp(prefix='tff_tls_bench_')
  worker_credentials.make(deployment)
  port = portpicker.pick_unused_port()
  direct = worker_launcher.start_worker(
      worker_launcher.worker_binary_path(),
      [f'--port={port}', '--grpc_max_message_length_megabytes=10000'],
      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  plain = distributed.LocalWorkers(1)
  tls = distributed.LocalWorkers(1, credentials=worker_credentials.Credentials.worker(
      deployment))
  contexts, launchers = {}, {}
  try:
    worker_launcher.wait_until_listening(direct, port)
    plain.start()
    tls.start()
    contexts['direct'] = distributed.DistributedContext([f'127.0.0.1:{port}'])
    contexts['plain'] = distributed.DistributedContext(plain.addresses)
    contexts['tls'] = distributed.DistributedContext(tls.addresses,
                                                     credentials=deployment)
    launchers = {'plain': plain.pids[0], 'tls': tls.pids[0]}
    binaries = {'direct': direct.pid, 'plain': plain.binary_pids[0],
                'tls': tls.binary_pids[0]}
    modes = list(contexts)
    times = {m: [] for m in modes}
    wire = {m: 0 for m in modes}
    driver_cpu = {m: 0.0 for m in modes}
    binary_cpu = {m: 0.0 for m in modes}
    cpu = {m: 0.0 for m in launchers}
    traffic = {}
    for mode in modes:  # Warm-up: compiles, connects, caches the executor.
      with tff.framework.get_context_stack().install(contexts[mode]):
        np.testing.assert_array_equal(identity(value), value)
    for repeat in range(args.repeats):
      for mode in modes[repeat % 3:] + modes[:repeat % 3]:
        before_traffic = contexts[mode].traffic()
        pid = launchers.get(mode)
        before_cpu = _cpu_seconds(pid) if pid else 0.0
        before_wire = _loopback_bytes()
        before_driver = time.process_time()
        before_binary = _cpu_seconds(binaries[mode])
        with tff.framework.get_context_stack().install(contexts[mode]):
          start = time.perf_counter()
          result = identity(value)
          times[mode].append(time.perf_counter() - start)
        wire[mode] += _loopback_bytes() - before_wire
        driver_cpu[mode] += time.process_time() - before_driver
        binary_cpu[mode] += _cpu_seconds(binaries[mode]) - before_binary
        if pid:
          cpu[mode] += _cpu_seconds(pid) - before_cpu
        (sent, received), = contexts[mode].traffic().values()
        (sent0, received0), = before_traffic.values()
        traffic[mode] = (sent - sent0, received - received0)
        np.testing.assert_array_equal(result, value)
    with open('/proc/loadavg') as f:
      load = f.read().split()[0]
    print(f'{args.megabytes:g} MB float32 value, round trip to one worker, '
          f'{args.repeats} interleaved repeats, load {load}, {os.cpu_count()} cores')
    print(f'{"mode":8} {"median s":>9} {"min s":>8} {"gRPC sent B":>12} '
          f'{"gRPC recv B":>12} {"loopback B":>12} {"CPU s: driver":>13} '
          f'{"forwarder":>9} {"binary":>7} {"sum":>6}')
    for mode in modes:
      cpu_s = f'{cpu[mode] / args.repeats:.3f}' if mode in cpu else '-'
      total = (driver_cpu[mode] + cpu.get(mode, 0.0) + binary_cpu[mode]) / args.repeats
      print(f'{mode:8} {statistics.median(times[mode]):9.3f} {min(times[mode]):8.3f} '
            f'{traffic[mode][0]:12d} {traffic[mode][1]:12d} '
            f'{wire[mode] // args.repeats:12d} '
            f'{driver_cpu[mode] / args.repeats:13.3f} {cpu_s:>9} '
            f'{binary_cpu[mode] / args.repeats:7.3f} {total:6.3f}')
  finally:
    for context in contexts.values():
      context.close()
    tls.stop()
    plain.stop()
    direct.kill()
    direct.wait()
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
