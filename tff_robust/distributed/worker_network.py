"""The network side of a worker: a private network for the worker_binary, and the
forwarder that is the only way in (standard library only: no TensorFlow, no grpc).

TFF's worker_binary listens on every interface with insecure gRPC credentials and has
no flag for an address, TLS or authentication. `tff_robust.distributed.worker_launcher` therefore

1.  binds the worker's public port itself (in the machine's network);
2.  moves itself into a new user and network namespace (`enter_private_network`): a
    network with only a loopback interface, which nothing outside can address;
3.  starts the worker_binary there (it inherits the namespace), listening on that
    private loopback;
4.  forwards every connection accepted on the public port to the binary
    (`Forwarder`): with TLS credentials, only after a TLS handshake in which the client
    presented a certificate of the deployment's CA for client use (mutual TLS);
    without them, the public port is bound to 127.0.0.1 only.

Sockets belong to the namespace they were created in, so the listening socket made in
step 1 keeps accepting from the machine's network while every socket the launcher
creates afterwards, and every socket of the worker_binary, lives in the private one.
Started by root, the launcher makes the network namespace as root and then becomes an
unprivileged user (`--user`, default `nobody`) before it starts the binary: neither
it nor the binary has the machine's capabilities or root's rights on its files (a
user namespace alone would leave the binary uid 0 on the machine, the owner of
root's files). Started by another user, the binary runs as that user, without
capabilities.
"""

import asyncio
import ctypes
import errno
import fcntl
import ipaddress
import os
import pwd
import socket
import ssl
import struct
import sys
import threading
from typing import Callable, Optional

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
# A forwarded connection's read size and stream buffer limit.
_CHUNK_BYTES = 1 << 20
# A client that has not finished its TLS handshake by then is dropped. Generous (the
# machine may be busy); it only bounds what an idle unauthenticated client holds.
HANDSHAKE_TIMEOUT_SECONDS = 60.0
# StreamWriter.start_tls (Python 3.11+): the handshake in the handler, which logs the
# refusals.
_UPGRADES_STREAMS = hasattr(asyncio.StreamWriter, 'start_tls')


class IsolationError(OSError):
  """The worker_binary could not be put in a private network namespace."""


def is_loopback(host: str) -> bool:
  """Whether `host` (an address or `localhost`) is this machine's loopback."""
  if host == 'localhost':
    return True
  try:
    return ipaddress.ip_address(host.strip('[]')).is_loopback
  except ValueError:
    return False


def _unshare(flags: int) -> int:
  """unshare(2); 0 or the errno."""
  if hasattr(os, 'unshare'):  # Python 3.12+.
    try:
      os.unshare(flags)  # pylint: disable=no-member
      return 0
    except OSError as e:
      return e.errno
  libc = ctypes.CDLL(None, use_errno=True)
  return 0 if libc.unshare(ctypes.c_int(flags)) == 0 else ctypes.get_errno()


def _loopback_up() -> None:
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    request = struct.pack('16sh', b'lo', 0)
    flags = struct.unpack('16sh', fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, request))[1]
    fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack('16sh', b'lo', flags | _IFF_UP))


def network_namespace(pid: Optional[int] = None) -> str:
  """The network namespace of process `pid` (default: this one), e.g.
  'net:[4026531840]'."""
  return os.readlink(f'/proc/{"self" if pid is None else pid}/ns/net')


# The uid and gid that root (outside) becomes inside: not root, so that what this
# process starts keeps no capabilities, even in the new user namespace.
_UNPRIVILEGED_ID = 65534
# Whom a worker started by root runs as, unless --user says otherwise.
DEFAULT_USER = 'nobody'
_PR_SET_PDEATHSIG = 1
_PR_GET_PDEATHSIG = 2
_PR_SET_NO_NEW_PRIVS = 38


def _map_ids(uid: int, gid: int) -> None:
  """Maps this process's user and group to themselves in its new user namespace (root
  to an unprivileged id): a user namespace can be made inside it only by a mapped user
  (a worker started in a test's own namespace), and the programs it starts get no
  capabilities (their user is not root there)."""
  inner_uid = uid or _UNPRIVILEGED_ID
  inner_gid = gid or _UNPRIVILEGED_ID
  try:
    with open('/proc/self/setgroups', 'w') as f:
      f.write('deny')
  except OSError:
    pass  # Kernels before 3.19.
  with open('/proc/self/uid_map', 'w') as f:
    f.write(f'{inner_uid} {uid} 1')
  with open('/proc/self/gid_map', 'w') as f:
    f.write(f'{inner_gid} {gid} 1')


def unprivileged_ids(user: Optional[str] = None) -> tuple[int, int]:
  """(uid, gid) of `user` (a name or a number; default `nobody`, else 65534).

  Raises:
    ValueError: for an unknown name, or root.
  """
  if user is None:
    try:
      entry = pwd.getpwnam(DEFAULT_USER)
      return entry.pw_uid, entry.pw_gid
    except KeyError:
      return _UNPRIVILEGED_ID, _UNPRIVILEGED_ID
  try:
    entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    ids = entry.pw_uid, entry.pw_gid
  except KeyError:
    if not user.isdigit():
      raise ValueError(f'--user={user}: no such user on this machine.') from None
    ids = int(user), int(user)
  if ids[0] == 0:
    raise ValueError(f'--user={user} is root: the worker_binary runs whatever '
                     'TensorFlow its driver sends, so it runs as a user without rights '
                     f'on this machine\'s files (default {DEFAULT_USER}).')
  return ids


def _prctl(option: int, value: int) -> int:
  return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _drop_to(uid: int, gid: int) -> None:
  """Becomes `uid`/`gid` for good (no supplementary groups, no capabilities: a
  change from root to another uid clears them) and keeps the parent-death signal,
  which the kernel clears on a change of uid."""
  death_signal = ctypes.c_int(0)
  ctypes.CDLL(None, use_errno=True).prctl(_PR_GET_PDEATHSIG,
                                          ctypes.byref(death_signal), 0, 0, 0)
  parent = os.getppid()
  os.setgroups([])
  os.setresgid(gid, gid, gid)
  os.setresuid(uid, uid, uid)
  if death_signal.value:
    _prctl(_PR_SET_PDEATHSIG, death_signal.value)
    if os.getppid() != parent:  # The parent died before the signal was set again.
      os.kill(os.getpid(), death_signal.value)


def enter_private_network(run_as: Optional[tuple[int, int]] = None) -> None:
  """Moves this process into a new network namespace with only a loopback interface
  (up): a new user namespace too where the kernel allows one (needed without root).

  With `run_as` (uid, gid; root only), this process then becomes that user: what it
  starts has neither the machine's capabilities nor root's rights on its files. No
  program started afterwards gains privileges (no_new_privs: set-user-ID files do
  not apply).

  Must run while this process has a single thread (a user namespace requires it).

  Raises:
    IsolationError: the kernel refused both (e.g. user namespaces disabled, a
      container's seccomp profile).
  """
  if threading.active_count() > 1:
    raise IsolationError(errno.EINVAL, 'enter_private_network needs a single thread.')
  if run_as is not None:
    error = _unshare(_CLONE_NEWNET)
    if error:
      raise IsolationError(error, (
          'cannot put the worker_binary in a private network namespace: unshare('
          f'CLONE_NEWNET) failed as root ({os.strerror(error)}). The worker_binary '
          'has no way to listen on one address or to check its callers, so it is not '
          'started without one. In a container, allow unshare (a seccomp profile).'))
    _loopback_up()
    _drop_to(*run_as)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    return
  uid, gid = os.geteuid(), os.getegid()
  error = _unshare(_CLONE_NEWUSER | _CLONE_NEWNET)
  if not error:
    _map_ids(uid, gid)
  else:
    # Root where user namespaces are disabled: a network namespace alone.
    error_net_only = _unshare(_CLONE_NEWNET)
    if error_net_only:
      raise IsolationError(error, (
          'cannot put the worker_binary in a private network namespace: unshare('
          f'CLONE_NEWUSER|CLONE_NEWNET) failed ({os.strerror(error)}) and unshare('
          f'CLONE_NEWNET) failed ({os.strerror(error_net_only)}). The worker_binary '
          'has no way to listen on one address or to check its callers, so it is not '
          'started without one. Allow unprivileged user namespaces (sysctl '
          'kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0; in a '
          'container, a seccomp profile that allows unshare) or start the worker as '
          'root.'))
  _loopback_up()
  _prctl(_PR_SET_NO_NEW_PRIVS, 1)


def server_ssl_context(cert: str, key: str, client_ca: str) -> ssl.SSLContext:
  """A TLS server context that requires a client certificate signed by `client_ca`
  for client use (OpenSSL's default purpose check on the server side), TLS ≥ 1.2,
  and offers HTTP/2 (gRPC's clients require ALPN h2).

  Raises:
    ValueError: naming a file that cannot be read or is not what it should be.
  """
  context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
  context.minimum_version = ssl.TLSVersion.TLSv1_2
  context.verify_mode = ssl.CERT_REQUIRED
  try:
    context.load_cert_chain(cert, key)
  except (OSError, ssl.SSLError) as e:
    raise ValueError(f'--tls_cert={cert} --tls_key={key}: cannot load them ({e}).'
                     ) from None
  try:
    context.load_verify_locations(cafile=client_ca)
  except (OSError, ssl.SSLError) as e:
    raise ValueError(f'--tls_client_ca={client_ca}: cannot load it ({e}).') from None
  context.set_alpn_protocols(['h2'])
  return context


def _log(message: str) -> None:
  print(f'tff_robust worker: {message}', file=sys.stderr, flush=True)


def _peer(writer) -> str:
  peer = writer.get_extra_info('peername')
  if isinstance(peer, tuple) and len(peer) >= 2:
    return f'{peer[0]}:{peer[1]}'
  return str(peer)


def _subject(certificate) -> str:
  for rdn in (certificate or {}).get('subject', ()):
    for key, value in rdn:
      if key == 'commonName':
        return value
  return '?'


class Forwarder:
  """Forwards each connection accepted on `listener` to `127.0.0.1:inner_port` in this
  process's (private) network; with `ssl_context`, only connections whose TLS
  handshake succeeded (the context decides who may connect).

  Runs an asyncio loop in a daemon thread (`start`). Each refused handshake is logged
  (one line to stderr, with the peer's address and the reason), and so is each
  accepted client certificate; connections closed before sending anything (port
  checks) are not.
  """

  def __init__(self, listener: socket.socket, inner_port: int,
               ssl_context: Optional[ssl.SSLContext] = None,
               on_failure: Optional[Callable[[BaseException], None]] = None):
    """`on_failure(error)` runs (in the forwarder's thread) if forwarding stops by an
    error after `start`."""
    self._listener = listener
    self._on_failure = on_failure
    self._inner_port = inner_port
    self._ssl = ssl_context
    self._loop = asyncio.new_event_loop()
    self._thread = threading.Thread(target=self._run, name='forwarder', daemon=True)
    self._ready = threading.Event()
    self._error: Optional[BaseException] = None
    self.accepted = 0
    self.refused = 0

  def start(self) -> None:
    """Starts forwarding; the listener accepts from then on."""
    self._thread.start()
    self._ready.wait()
    if self._error is not None:
      raise self._error

  def _run(self) -> None:
    asyncio.set_event_loop(self._loop)
    try:
      tls = {}
      if self._ssl is not None and not _UPGRADES_STREAMS:
        # Before Python 3.11 the server does the handshake (refusals are not logged).
        tls = dict(ssl=self._ssl, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_SECONDS)
      server = self._loop.run_until_complete(asyncio.start_server(
          self._handle, sock=self._listener, limit=_CHUNK_BYTES, **tls))
    except BaseException as e:  # pylint: disable=broad-except
      self._error = e
      self._ready.set()
      return
    self._ready.set()
    try:
      self._loop.run_until_complete(server.serve_forever())
    except asyncio.CancelledError:
      pass  # stop().
    except BaseException as e:  # pylint: disable=broad-except
      _log(f'the forwarder stopped: {e!r}.')
      if self._on_failure is not None:
        self._on_failure(e)
    finally:
      server.close()

  async def _handle(self, reader, writer) -> None:
    peer = _peer(writer)
    inner_writer = None
    try:
      if self._ssl is not None and _UPGRADES_STREAMS:
        try:
          await writer.start_tls(self._ssl,
                                 ssl_handshake_timeout=HANDSHAKE_TIMEOUT_SECONDS)
        except (ssl.SSLError, OSError, asyncio.TimeoutError, EOFError) as e:
          self.refused += 1
          # Closed by the client before or during the handshake (e.g. a check that
          # the port is open): nothing to report.
          if not isinstance(e, (ConnectionError, EOFError)):
            reason = getattr(e, 'reason', None) or str(e) or type(e).__name__
            _log(f'refused a connection from {peer}: TLS handshake failed ({reason}).')
          return
      if self._ssl is not None:
        certificate = writer.get_extra_info('peercert')
        _log(f'accepted a driver from {peer} (certificate {_subject(certificate)!r}).')
      self.accepted += 1
      try:
        inner_reader, inner_writer = await asyncio.open_connection(
            '127.0.0.1', self._inner_port, limit=_CHUNK_BYTES)
      except OSError as e:
        _log(f'cannot reach the worker_binary for {peer}: {e}.')
        return
      await asyncio.gather(self._pump(reader, inner_writer),
                           self._pump(inner_reader, writer))
    finally:
      for w in (writer, inner_writer):
        if w is not None:
          w.close()

  @staticmethod
  async def _pump(reader, writer) -> None:
    """Copies until either side ends; then closes `writer` (which ends the other
    direction's read too, through the other side's reaction)."""
    try:
      while True:
        data = await reader.read(_CHUNK_BYTES)
        if not data:
          break
        writer.write(data)
        await writer.drain()
    except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
      pass
    finally:
      writer.close()

  def stop(self) -> None:
    """Stops accepting and forwarding (the loop's thread ends)."""
    if self._thread.is_alive():
      self._loop.call_soon_threadsafe(self._cancel_all)
      self._thread.join()

  def _cancel_all(self) -> None:
    for task in asyncio.all_tasks(self._loop):
      task.cancel()


def bind_listener(host: str, port: int) -> socket.socket:
  """A TCP socket bound (not yet listening) to `host:port`; `::` means every
  interface, IPv6 and IPv4 (IPv4 alone where the machine has no IPv6).

  SO_REUSEADDR (connections still closing do not block a restart) but not
  SO_REUSEPORT, so a port that any other socket listens on fails with EADDRINUSE.
  """
  candidates = []
  if host in ('::', ''):
    candidates = [(socket.AF_INET6, '::'), (socket.AF_INET, '0.0.0.0')]
  elif host == '0.0.0.0':
    candidates = [(socket.AF_INET, '0.0.0.0')]
  else:
    try:
      infos = socket.getaddrinfo(host.strip('[]'), port, type=socket.SOCK_STREAM,
                                 flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
      infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    candidates = [(family, address[0]) for family, _, _, _, address in infos]
  last_error = None
  for family, address in candidates:
    try:
      listener = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:  # No IPv6 on this machine.
      last_error = e
      continue
    try:
      listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      if family == socket.AF_INET6 and address == '::':
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
      listener.bind((address, port))
      return listener
    except OSError as e:
      listener.close()
      if e.errno == errno.EADDRINUSE:
        raise
      last_error = e
  raise last_error or OSError(errno.EADDRNOTAVAIL, f'cannot bind {host}:{port}')


def bind_unix_listener(path: str) -> socket.socket:
  """A Unix stream socket bound (not yet listening) at `path`: reachable from this
  machine's file system only, by whoever may enter its directory."""
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  try:
    listener.bind(path)
  except OSError:
    listener.close()
    raise
  return listener
