"""Worker addresses and the driver's defaults, without TensorFlow: what a binary
checks of --workers at parse time (`distributed_context` uses the same)."""

from tff_robust.distributed import worker_network

# gRPC's limit is a signed 32-bit length; TFF's own local context uses 2e9 too.
DEFAULT_MAX_MESSAGE_BYTES = 2_000_000_000
# How long a worker may take to accept connections at start.
DEFAULT_CONNECT_TIMEOUT_SECONDS = 30.0
# A worker that cannot be reached, or answers no probe, for this long is reported as
# failed (not retried).
DEFAULT_UNAVAILABLE_TIMEOUT_SECONDS = 10.0
# Every RPC's deadline. It bounds a computation that never ends on a worker that
# still answers; a stopped worker is found by the probes, not by it. An hour is over
# 100 times the longest round measured here (50 ConvNet clients on 2 loaded cores).
DEFAULT_CALL_TIMEOUT_SECONDS = 3600.0


def parse_addresses(addresses) -> list[str]:
  """`'host:port,host:port'` (or a sequence of them) → a validated list.

  Raises:
    ValueError: for an empty list, a malformed address or a repeated one.
  """
  if isinstance(addresses, str):
    addresses = [a.strip() for a in addresses.split(',') if a.strip()]
  addresses = list(addresses)
  if not addresses:
    raise ValueError('Give at least one worker address host:port.')
  for address in addresses:
    host, sep, port = str(address).rpartition(':')
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise ValueError(f'Worker address {address!r} is not host:port.')
  if len(set(addresses)) != len(addresses):
    raise ValueError(f'Worker addresses repeat: {addresses}.')
  return addresses


def _host(address: str) -> str:
  return address.rpartition(':')[0].strip('[]')


def check_credentials_needed(addresses, credentials) -> None:
  """A driver without credentials dials workers on this machine (loopback) only.

  Raises:
    ValueError: naming an address on the network, for `credentials` None.
  """
  if credentials is not None:
    return
  remote = [a for a in parse_addresses(addresses)
            if not worker_network.is_loopback(_host(a))]
  if remote:
    raise ValueError(
        f'Worker {remote[0]} is not on this machine: a worker on the network requires '
        'credentials (mutual TLS). Make a deployment\'s files with `python -m '
        'tff_robust.distributed.worker_credentials --out=DIR`, start each worker with '
        '--tls_cert, --tls_key and --tls_client_ca, and give the driver its files '
        '(credentials=DIR; the binaries\' --worker_credentials=DIR).')
