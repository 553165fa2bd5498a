"""Execution on TFF workers: the distributed context, workers and their security.

  passwise            `PasswiseFactory`: any factory one computation per pass (the
                      mergeable context runs one aggregation per computation);
                      `register_equivalent`: a computation's pass-by-pass form,
                      which `DistributedContext` runs in its place
  distributed_context `DistributedContext`, `distributed_execution`: TFF's mergeable
                      execution with each call's clients split over the workers
  worker_connection   one worker's channel: `make_channel`, `wait_until_ready`, the
                      fail-fast stub, `WorkerError`
  resident_values     `ResidentValue`: a round's per-client values kept on the workers
  local_workers       `LocalWorkers` (workers on this machine), `private_local_execution`
                      (a driver's own computations, reachable by nobody else)
  worker_launcher     `python -m tff_robust.distributed --port=N`: one worker_binary,
                      started without TensorFlow
  worker_network      the worker's private network namespace and its TLS forwarder
  worker_credentials  the deployment's certificates (`--out=DIR`)
  worker_addresses    worker addresses and the driver's default timeouts (no
                      TensorFlow: the binaries check --workers with them)
  runtime             `worker_binaries_stopped()`: no worker_binary outlives a program
  worker_guardian     the watcher that stops a dead program's worker_binaries

Importing the package imports nothing: a worker (`python -m tff_robust.distributed`)
starts without TensorFlow (13-50 s, ~600 MB); every name loads its module on first use.
"""

import importlib
import importlib.util

# Name → the module it loads: the names a binary checks its flags with come from
# modules that import no TensorFlow.
_NAMES = {
    'DistributedContext': 'distributed_context',
    'distributed_execution': 'distributed_context',
    **dict.fromkeys(('WorkerError', 'make_channel', 'wait_until_ready'),
                    'worker_connection'),
    'ResidentValue': 'resident_values',
    'LocalWorkers': 'local_workers',
    'private_local_execution': 'local_workers',
    **dict.fromkeys(('DEFAULT_CALL_TIMEOUT_SECONDS', 'DEFAULT_CONNECT_TIMEOUT_SECONDS',
                     'DEFAULT_MAX_MESSAGE_BYTES', 'DEFAULT_UNAVAILABLE_TIMEOUT_SECONDS',
                     'check_credentials_needed', 'parse_addresses'), 'worker_addresses'),
    'Credentials': 'worker_credentials',
    'as_driver_credentials': 'worker_credentials',
    'worker_binary_path': 'worker_launcher',
}
__all__ = sorted(_NAMES)


def __getattr__(name):
  if name in _NAMES:
    value = getattr(importlib.import_module(f'{__name__}.{_NAMES[name]}'), name)
    globals()[name] = value
    return value
  if not name.startswith('_') and importlib.util.find_spec(f'{__name__}.{name}'):
    return importlib.import_module(f'{__name__}.{name}')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return sorted(set(globals()) | set(__all__))
