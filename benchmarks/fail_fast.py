"""One local TFF worker whose death stops the benchmark instead of hanging it.

TFF's default local context restarts a worker_binary that died (e.g. killed by the
kernel for memory) and reruns the call on it, forever if the call is what kills it.
A benchmark measuring a large aggregation or round runs its computations here
instead: a worker that dies raises `tff_robust.distributed.WorkerError` after
`DEFAULT_UNAVAILABLE_TIMEOUT_SECONDS`, naming it.
"""

import contextlib

import tensorflow_federated as tff

from tff_robust import distributed
from tff_robust import runtime
from tff_robust.distributed import worker_connection

# A worker killed for memory writes no line of its own: the kernel's OOM killer does.
KILLED_FOR_MEMORY_HINT = ('a worker killed for memory (the kernel\'s OOM killer, see '
                          '`dmesg`) writes nothing in its log')


def peak_rss_bytes(pid) -> int:
  """VmHWM (peak resident set size) of process `pid`."""
  with open(f'/proc/{pid}/status') as f:
    for line in f:
      if line.startswith('VmHWM:'):
        return int(line.split()[1]) * 1024  # kB: KiB.
  raise RuntimeError(f'No VmHWM for process {pid}.')


@contextlib.contextmanager
def fail_fast_worker(worker_flags=()):
  """Runs the block's TFF computations on one local worker (its worker_binary started
  with `worker_flags`); yields its `distributed.LocalWorkers` (`binary_pids`,
  `log_path(0)`)."""
  with runtime.worker_binaries_stopped():
    with distributed.LocalWorkers(1, worker_flags=worker_flags) as workers:
      # One worker's fail-fast channel (the one `DistributedContext` holds per
      # worker), in a plain synchronous context: the robust processes are not
      # mergeable, and one worker needs no merging.
      worker = worker_connection.WorkerContext(
          workers.addresses[0], distributed.DEFAULT_MAX_MESSAGE_BYTES,
          distributed.DEFAULT_CONNECT_TIMEOUT_SECONDS,
          distributed.DEFAULT_UNAVAILABLE_TIMEOUT_SECONDS, None)
      context = worker.sync_context()
      try:
        with tff.framework.get_context_stack().install(context):
          yield workers
      finally:
        worker.close()
