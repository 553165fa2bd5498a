"""One machine as a small network: the driver and every worker in a network
namespace of its own, each with one link (a veth pair) into a switch namespace
(a bridge), each link optionally limited by `tc`'s token bucket filter in both
directions. Standard library only; needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN):
it runs `ip` and `tc`.

    driver ns ──d0══ switch ns (bridge) ══w0── worker ns 0
                                        ══w0── worker ns 1 ...

All of the driver's traffic to the workers leaves through its one interface, so its
counters (`Network.driver_bytes`, read inside the driver's namespace) are the bytes
leaving and entering the driver, headers (Ethernet, IP, TCP, TLS, HTTP/2) included.
Workers reach only the switch; the host's own network is not connected.
"""

import os
import subprocess
from typing import Optional, Sequence

_SUBNET = '10.199.{}.{}'


def _run(*command: str, check: bool = True) -> subprocess.CompletedProcess:
  return subprocess.run(command, check=check, capture_output=True, text=True)


class Network:
  """The namespaces `<prefix>-drv`, `<prefix>-sw` and `<prefix>-w<i>`; a context
  manager that deletes them (and so every interface in them) when the block ends.

  Attributes:
    driver: the driver's namespace name (run the driver with `ip netns exec`).
    driver_address: the driver's IPv4 address.
    worker_namespaces: every worker's namespace name.
    worker_addresses: every worker's IPv4 address (its `--listen_host`).
  """

  def __init__(self, num_workers: int, prefix: str = 'tffnet'):
    if num_workers < 1 or num_workers > 200:
      raise ValueError(f'num_workers must be in [1, 200], got {num_workers}.')
    self._prefix = prefix
    self.driver = f'{prefix}-drv'
    self._switch = f'{prefix}-sw'
    self.worker_namespaces = [f'{prefix}-w{i}' for i in range(num_workers)]
    self.driver_address = _SUBNET.format(0, 1)
    self.worker_addresses = [_SUBNET.format(0, 10 + i) for i in range(num_workers)]

  def __enter__(self) -> 'Network':
    try:
      self.create()
    except BaseException:
      self.delete()
      raise
    return self

  def __exit__(self, *exc_info):
    self.delete()

  def _links(self):
    """(namespace, its interface, the switch's end of the link) of every link."""
    yield self.driver, 'd0', 'sd'
    for i, namespace in enumerate(self.worker_namespaces):
      yield namespace, 'w0', f'sw{i}'

  def create(self) -> None:
    for namespace in self._namespaces():
      if os.path.exists(f'/run/netns/{namespace}'):
        raise RuntimeError(f'Network namespace {namespace} exists: another run, or '
                           f'one that did not clean up (`ip netns del {namespace}`).')
    for namespace in self._namespaces():
      _run('ip', 'netns', 'add', namespace)
      _run('ip', '-n', namespace, 'link', 'set', 'lo', 'up')
    _run('ip', '-n', self._switch, 'link', 'add', 'name', 'br0', 'type', 'bridge')
    _run('ip', '-n', self._switch, 'link', 'set', 'br0', 'up')
    addresses = [self.driver_address] + self.worker_addresses
    for (namespace, inner, outer), address in zip(self._links(), addresses):
      _run('ip', '-n', self._switch, 'link', 'add', 'name', outer, 'type', 'veth',
           'peer', 'name', inner, 'netns', namespace)
      _run('ip', '-n', self._switch, 'link', 'set', outer, 'master', 'br0')
      _run('ip', '-n', self._switch, 'link', 'set', outer, 'up')
      _run('ip', '-n', namespace, 'addr', 'add', f'{address}/16', 'dev', inner)
      _run('ip', '-n', namespace, 'link', 'set', inner, 'up')

  def _namespaces(self) -> list[str]:
    return [self.driver, self._switch] + self.worker_namespaces

  def delete(self) -> None:
    for namespace in self._namespaces():
      _run('ip', 'netns', 'del', namespace, check=False)

  def limit(self, mbit: Optional[float], links: Optional[Sequence[int]] = None) -> None:
    """Limits every link (or the `links`: 0 the driver's, i + 1 worker i's) to `mbit`
    Mbit/s in each direction (`tc ... tbf`); None removes the limits."""
    for index, (namespace, inner, outer) in enumerate(self._links()):
      if links is not None and index not in links:
        continue
      for where, device in ((namespace, inner), (self._switch, outer)):
        if mbit is None:
          _run('ip', 'netns', 'exec', where, 'tc', 'qdisc', 'del', 'dev', device,
               'root', check=False)
        else:
          # The bucket holds a few veth segments (GSO makes them up to 64 KB), so
          # the filter shapes rather than drops; the queue holds 200 ms.
          burst = max(int(mbit * 1e6 / 8 / 100), 256 * 1024)
          _run('ip', 'netns', 'exec', where, 'tc', 'qdisc', 'replace', 'dev', device,
               'root', 'tbf', 'rate', f'{mbit}mbit', 'burst', str(burst),
               'latency', '200ms')

  def popen(self, namespace: str, command: Sequence[str], **kwargs) -> subprocess.Popen:
    """Starts `command` in `namespace`."""
    return subprocess.Popen(['ip', 'netns', 'exec', namespace, *command], **kwargs)


def interface_bytes(interface: str = 'd0') -> tuple[int, int]:
  """(bytes sent, bytes received) so far by `interface` of the calling process's
  network namespace."""
  with open('/proc/net/dev') as f:
    for line in f:
      name, sep, fields = line.partition(':')
      if sep and name.strip() == interface:
        values = fields.split()
        return int(values[8]), int(values[0])
  raise ValueError(f'No interface {interface} in this network namespace.')
