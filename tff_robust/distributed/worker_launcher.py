"""Starts one TFF `worker_binary` without importing TensorFlow, behind a forwarder that
is the only way to it; says when it listens.

`python -m tff_robust.distributed --port=8000 [--tls_cert=worker.pem --tls_key=worker.key
--tls_client_ca=ca.pem] [--listen_host=HOST]` runs `main` (standard library only: the
package's `__init__` loads its modules lazily, so nothing imports TensorFlow): it

1.  checks its flags. Without the three --tls_* flags the worker accepts connections
    from this machine only (127.0.0.1); a worker on the network must require
    credentials, so a --listen_host other than loopback without them is an error
    (status 2). With them, it listens on every interface (or --listen_host) and accepts
    only TLS clients with a certificate signed by --tls_client_ca for client use (make
    a deployment's files with `python -m tff_robust.distributed.worker_credentials`);
2.  refuses a port that something already listens on (gRPC binds with SO_REUSEPORT, so
    a second worker_binary on a used port would start silently and the kernel would
    split new connections between the two), and binds it itself;
3.  moves into a private network namespace (`tff_robust.distributed.worker_network`: only a
    loopback interface, nothing outside can address it), started by root becomes
    `--user` (default `nobody`; root is refused) for good, and starts the
    worker_binary shipped in the TFF package there (found without importing TFF),
    its output to this process's, the kernel killing it if this process dies. Where
    the kernel allows no such namespace the worker is not started (status 1, saying
    how to allow one);
4.  connects to the binary in the private network until it accepts, checks that every
    socket listening there is the binary's own, starts listening on the public port,
    forwarding each accepted (with TLS: authenticated) connection to the binary, and
    prints one line `listening on HOST:PORT ...` to stdout;
5.  passes SIGINT, SIGTERM (even where they were ignored, as in a script's
    background job) and SIGHUP (unless ignored: nohup) on to the worker and exits
    when it does.

`--listen_unix=PATH` instead of a port: a Unix socket in a directory of this user's
with mode 0700, for a driver's own computations
(`tff_robust.distributed.private_local_execution`): no network reaches it, no other
user opens it.

The other flags go to the worker_binary. `tff_robust.distributed.LocalWorkers` starts
its workers with this command.
"""

# Loaded now: the launcher started by root becomes a user who may not read the
# standard library's directory, and connecting to a host name loads this codec.
import encodings.idna  # pylint: disable=unused-import
import errno
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Optional, Sequence

from tff_robust.distributed import worker_network

DEFAULT_PORT = 10000  # worker_binary's own default for --port.
_PR_SET_PDEATHSIG = 1
_TCP_LISTEN = '0A'
# Flags that could set --port where this launcher does not see it.
INDIRECT_FLAGS = ('flagfile', 'fromenv', 'tryfromenv')
# The launcher's own flags (not passed to the worker_binary).
TLS_FLAGS = ('tls_cert', 'tls_key', 'tls_client_ca')
OWN_FLAGS = TLS_FLAGS + ('listen_host', 'listen_unix', 'user')
# Flags that make the launcher print the binary's help instead of starting a worker.
HELP_FLAGS = ('help', 'helpfull', 'helpshort', 'version')
_NO_CREDENTIALS = (
    'a worker reachable from the network must require credentials: give --tls_cert, '
    '--tls_key and --tls_client_ca (make a deployment\'s files with `python -m '
    'tff_robust.distributed.worker_credentials --out=DIR`), or leave --listen_host out to accept '
    'connections from this machine only (127.0.0.1).')


class WorkerStartError(RuntimeError):
  """A worker could not start listening on `port`."""

  def __init__(self, port: int, message: str):
    super().__init__(message)
    self.port = port


class PortInUseError(WorkerStartError):
  """Another socket listens on `port`."""


def worker_binary_path() -> str:
  """The `worker_binary` inside the installed TFF package (TFF is not imported)."""
  spec = importlib.util.find_spec('tensorflow_federated')
  if spec is None or not spec.origin:
    raise FileNotFoundError('tensorflow_federated is not installed: no worker_binary.')
  path = os.path.join(os.path.dirname(spec.origin), 'data', 'worker_binary')
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f'No TFF worker_binary at {path}: is tensorflow-federated 0.87 installed from '
        'its wheel?')
  return path


def _listening_sockets(port: int) -> Optional[dict[int, int]]:
  """Inode → owner uid of every TCP socket listening on `port` (any address) in this
  network namespace; None where /proc/net/tcp* does not exist (not Linux)."""
  found, readable = {}, False
  for table in ('/proc/net/tcp', '/proc/net/tcp6'):
    try:
      with open(table) as f:
        lines = f.readlines()[1:]
    except OSError:
      continue
    readable = True
    for line in lines:
      fields = line.split()
      if (len(fields) > 9 and fields[3] == _TCP_LISTEN and
          int(fields[1].rsplit(':', 1)[1], 16) == port):
        found[int(fields[9])] = int(fields[7])
  return found if readable else None


def _socket_inodes(pid: int) -> set[int]:
  """Inodes of the sockets process `pid` holds (empty if not readable)."""
  inodes = set()
  try:
    fds = os.listdir(f'/proc/{pid}/fd')
  except OSError:
    return inodes
  for fd in fds:
    try:
      target = os.readlink(f'/proc/{pid}/fd/{fd}')
    except OSError:
      continue
    if target.startswith('socket:['):
      inodes.add(int(target[len('socket:['):-1]))
  return inodes


def _describe_owners(inodes: dict[int, int]) -> str:
  """' (pid 123: worker_binary)' for the processes holding the sockets `inodes`, as far
  as /proc lets this user see them."""
  owners = []
  for entry in os.listdir('/proc') if inodes else []:
    if entry.isdigit() and _socket_inodes(int(entry)) & set(inodes):
      try:
        with open(f'/proc/{entry}/comm') as f:
          owners.append(f'pid {entry}: {f.read().strip()}')
      except OSError:
        owners.append(f'pid {entry}')
  if not owners and inodes:
    owners = [f'a process of uid {uid}' for uid in sorted(set(inodes.values()))]
  return f' ({", ".join(owners)})' if owners else ''


def _in_use_message(port: int, owners: str) -> str:
  return (f'port {port} is already in use{owners}. A second worker_binary there would '
          'start anyway and silently share its connections (gRPC binds with '
          'SO_REUSEPORT). Stop that process or pass another --port.')


def check_port_free(port: int) -> None:
  """Raises `PortInUseError` if a socket listens on `port`, as the worker would.

  Binds the wildcard address (IPv6 dual-stack, else IPv4) with SO_REUSEADDR (so that
  connections still closing do not count) and without SO_REUSEPORT (so that a listening
  worker_binary, which sets it, does), and lets it go at once.
  """
  for family, address in ((socket.AF_INET6, '::'), (socket.AF_INET, '0.0.0.0')):
    try:
      probe = socket.socket(family, socket.SOCK_STREAM)
    except OSError:  # No IPv6 on this machine.
      continue
    with probe:
      probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      if family == socket.AF_INET6:
        probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
      try:
        probe.bind((address, port))
      except OSError as e:
        if e.errno != errno.EADDRINUSE:
          continue  # E.g. no IPv6 address on this machine: try IPv4.
        raise PortInUseError(port, _in_use_message(
            port, _describe_owners(_listening_sockets(port) or {}))) from e
    return


def wait_until_listening(process: subprocess.Popen, port: int,
                         timeout: Optional[float] = None,
                         host: str = '127.0.0.1') -> None:
  """Blocks until the worker_binary `process` accepts connections on `port`.

  Connects to `host:port` until a connection is accepted (no fixed sleep), then checks
  (Linux) that the sockets listening on the port are all `process`'s own.

  Raises:
    PortInUseError: another process listens on the port too.
    WorkerStartError: `process` exited first (a worker_binary that cannot bind exits
      with status 0), or `timeout` seconds (None: no limit) passed.
  """
  deadline = None if timeout is None else time.monotonic() + timeout
  while True:
    status = process.poll()
    if status is not None:
      raise WorkerStartError(port, (
          f'the worker_binary exited with status {status} before listening on port '
          f'{port}; its output says why (a port in use: pass another --port).'))
    try:
      with socket.create_connection((host, port), timeout=1.0):
        pass
    except OSError:
      if deadline is not None and time.monotonic() > deadline:
        raise WorkerStartError(port, f'the worker_binary was not listening on port '
                               f'{port} after {timeout:g} s.') from None
      time.sleep(0.02)
      continue
    listening = _listening_sockets(port)
    if listening is None:
      return  # Not Linux: the connection is all there is to check.
    others = {inode: uid for inode, uid in listening.items()
              if inode not in _socket_inodes(process.pid)}
    if others:
      raise PortInUseError(port, _in_use_message(port, _describe_owners(others)))
    return


def parse_port(args: Sequence[str]) -> int:
  """The --port of worker_binary arguments (absl syntax), else its default.

  Raises:
    ValueError: for a port outside 1–65535, or flags that could set it unseen.
  """
  port = str(DEFAULT_PORT)
  args = list(args)
  for i, arg in enumerate(args):
    name, has_value, value = arg.lstrip('-').partition('=')
    if not arg.startswith('-'):
      continue
    if name in INDIRECT_FLAGS:
      raise ValueError(f'{arg}: give --port (and the other flags) on the command line.')
    if name == 'port':
      if not has_value:
        value = args[i + 1] if i + 1 < len(args) else ''
      port = value
  if not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(f'--port={port}: give a port number 1–65535.')
  return int(port)


def split_flags(args: Sequence[str]) -> tuple[dict[str, str], list[str]]:
  """The launcher's own flags (`--name=value` or `--name value`) and the rest, for the
  worker_binary.

  Raises:
    ValueError: for an own flag without a value, or given twice.
  """
  own, rest, args, i = {}, [], list(args), 0
  while i < len(args):
    arg = args[i]
    name, has_value, value = arg.lstrip('-').partition('=')
    if arg.startswith('-') and name in OWN_FLAGS:
      if not has_value:
        if i + 1 >= len(args) or args[i + 1].startswith('-'):
          raise ValueError(f'{arg}: give a value (--{name}=...).')
        value, i = args[i + 1], i + 1
      if not value:
        raise ValueError(f'{arg}: give a value (--{name}=...).')
      if name in own:
        raise ValueError(f'--{name} is given twice.')
      own[name] = value
    else:
      rest.append(arg)
    i += 1
  return own, rest


def check_private_socket_path(path: str) -> None:
  """A --listen_unix path is in a directory of this user's that nobody else may
  enter (mode 0700 or stricter), so that only this user (and root) can connect.

  Raises:
    ValueError: naming the path and what is wrong.
  """
  directory = os.path.dirname(os.path.abspath(path))
  try:
    status = os.stat(directory)
  except OSError as e:
    raise ValueError(f'--listen_unix={path}: {e.strerror} ({directory}).') from None
  if status.st_uid != os.geteuid() or status.st_mode & 0o077:
    raise ValueError(f'--listen_unix={path}: its directory {directory} must be yours '
                     'and closed to everyone else (mode 0700), so that no other user '
                     'reaches the worker.')
  if os.path.lexists(path):
    raise ValueError(f'--listen_unix={path} exists: give a new path.')


def listen_settings(own: dict[str, str]) -> tuple[str, Optional[tuple[str, str, str]]]:
  """(address to listen on, (cert, key, client CA) or None) from the own flags.

  Raises:
    ValueError: some but not all --tls_* flags, or a --listen_host other than
      loopback without them, or --listen_unix with either.
  """
  if 'listen_unix' in own:
    if any(name in own for name in ('listen_host', *TLS_FLAGS)):
      raise ValueError('--listen_unix is for a driver\'s own worker on this machine: '
                       'give it without --listen_host and --tls_*.')
    check_private_socket_path(own['listen_unix'])
    return own['listen_unix'], None
  given = [name for name in TLS_FLAGS if name in own]
  if given and len(given) != len(TLS_FLAGS):
    missing = ', '.join(f'--{n}' for n in TLS_FLAGS if n not in own)
    raise ValueError(f'give all of --tls_cert, --tls_key and --tls_client_ca (missing '
                     f'{missing}): the worker accepts only drivers with a client '
                     'certificate of the deployment.')
  tls = tuple(own[n] for n in TLS_FLAGS) if given else None
  host = own.get('listen_host', '::' if tls else '127.0.0.1')
  if tls is None and not worker_network.is_loopback(host):
    raise ValueError(f'--listen_host={host} without credentials: {_NO_CREDENTIALS}')
  return host, tls


def _die_with_parent():
  # Runs in the child before exec: the kernel kills the worker when the process that
  # started it dies, even by SIGKILL.
  try:
    import ctypes  # pylint: disable=g-import-not-at-top
    ctypes.CDLL('libc.so.6', use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except OSError:
    pass


def _default_signals_and_die_with_parent():
  # Runs in the child before exec. A program started in a script's background has
  # SIGINT ignored, and an ignored signal stays ignored across exec: the launcher
  # passes SIGINT and SIGTERM on, so the binary must not ignore them.
  for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, signal.SIG_DFL)
  _die_with_parent()


def start_worker(binary: str, args: Sequence[str], **popen_kwargs) -> subprocess.Popen:
  """Starts `binary` with `args`, killed by the kernel if this process dies."""
  return subprocess.Popen([binary, *args], preexec_fn=_die_with_parent, close_fds=True,
                          **popen_kwargs)


# The pid of the process that started this launcher (`start_launcher`), which the
# launcher must not outlive.
DIE_WITH_ENV = 'TFF_ROBUST_LAUNCHER_DIES_WITH'


def start_launcher(args: Sequence[str], **popen_kwargs) -> subprocess.Popen:
  """Starts this launcher (`python -m tff_robust.distributed.worker_launcher`) with
  `args`, killed by the kernel if this process dies, as `start_worker` would.

  The launcher asks for that itself, first thing (`DIE_WITH_ENV`): a `preexec_fn`
  makes Python fork the driver instead of vfork it, and a fork while other threads
  call into gRPC (TFF's contexts) prints a gRPC "skipping fork() handlers" line in the
  driver per worker.
  """
  env = dict(popen_kwargs.pop('env', None) or os.environ)
  env[DIE_WITH_ENV] = str(os.getpid())
  return subprocess.Popen(
      [sys.executable, '-m', 'tff_robust.distributed.worker_launcher', *args],
      close_fds=True, env=env, **popen_kwargs)


def _die_with_starter() -> None:
  """For a launcher from `start_launcher`: the kernel kills it when its starter dies,
  and it exits at once if the starter died already."""
  starter = os.environ.pop(DIE_WITH_ENV, None)
  if starter is None:
    return
  _die_with_parent()
  if os.getppid() != int(starter):  # Gone before the signal was set.
    os.kill(os.getpid(), signal.SIGKILL)


def _start_binary(binary_fd: int, binary: str, args: Sequence[str]) -> subprocess.Popen:
  """The worker_binary, executed through `binary_fd` (opened before this process
  became an unprivileged user, who may not reach its path), in `/`."""
  return subprocess.Popen([binary, *args], executable=f'/proc/self/fd/{binary_fd}',
                          pass_fds=(binary_fd,), cwd='/',
                          preexec_fn=_default_signals_and_die_with_parent)


def _error(message: str) -> None:
  print(f'tff_robust worker: ERROR: {message}', file=sys.stderr, flush=True)


def _shown(host: str, port: int) -> str:
  return f'[{host}]:{port}' if ':' in host else f'{host}:{port}'


def _listening_line(host: str, port: int, tls, binary_pid: int) -> str:
  if tls is None:
    return (f'listening on {_shown(host, port)} (this machine only: no TLS '
            f'credentials), worker_binary pid {binary_pid}; drivers on this machine '
            f'reach it at {_shown(host, port)}')
  scope = 'all interfaces' if host in ('::', '0.0.0.0') else 'one address'
  where = socket.gethostname() if host in ('::', '0.0.0.0') else host
  return (f'listening on {_shown(host, port)} ({scope}; TLS, drivers need a client '
          f'certificate signed by {tls[2]}), worker_binary pid {binary_pid}; drivers '
          f'reach it at {_shown(where, port)} with the deployment\'s credentials')


def _unix_listening_line(path: str, binary_pid: int) -> str:
  return (f'listening on unix:{path} (this user only: no network), worker_binary pid '
          f'{binary_pid}, uid {os.geteuid()}')


def _run_as(user: Optional[str]) -> Optional[tuple[int, int]]:
  """(uid, gid) the launcher becomes, started by root (`--user`, default nobody);
  None for another user, who stays who they are.

  Raises:
    ValueError: --user as another user than root, or naming root.
  """
  if os.geteuid() != 0:
    if user is not None:
      raise ValueError(f'--user={user}: only a worker started by root changes its '
                       'user (it then runs as --user, default '
                       f'{worker_network.DEFAULT_USER}).')
    return None
  return worker_network.unprivileged_ids(user)


def main(argv: Sequence[str]) -> int:
  """Runs one worker in the foreground (module docstring); returns the exit status."""
  _die_with_starter()
  args = list(argv[1:])
  try:
    binary = worker_binary_path()
  except FileNotFoundError as e:
    _error(str(e))
    return 1
  if any(a.lstrip('-').split('=')[0] in HELP_FLAGS for a in args if a.startswith('-')):
    os.execv(binary, [binary, *args])  # Its own help; nothing listens.
  try:
    own, args = split_flags(args)
    host, tls = listen_settings(own)
    unix = 'listen_unix' in own
    run_as = _run_as(own.get('user'))
    port = parse_port(args)
    ssl_context = (worker_network.server_ssl_context(*tls) if tls is not None
                   else None)
  except ValueError as e:
    _error(str(e))
    return 2
  try:
    if unix:  # --port is the binary's in the private network only.
      listener = worker_network.bind_unix_listener(host)
    else:
      check_port_free(port)
      listener = worker_network.bind_listener(host, port)
  except PortInUseError as e:
    _error(str(e))
    return 1
  except OSError as e:
    if e.errno == errno.EADDRINUSE:
      _error(_in_use_message(port, _describe_owners(_listening_sockets(port) or {})))
    else:
      _error(f'cannot listen on {_shown(host, port)}: {e.strerror or e}.')
    return 1
  if not unix:
    host = listener.getsockname()[0]  # E.g. 0.0.0.0 for :: without IPv6.
  binary_fd = os.open(binary, os.O_RDONLY)
  try:
    worker_network.enter_private_network(run_as)
  except worker_network.IsolationError as e:
    _error(e.strerror)
    return 1
  process = _start_binary(binary_fd, binary, args)
  os.close(binary_fd)
  forwarded = []

  def forward(signum, frame):
    del frame
    forwarded.append(signum)
    try:
      process.send_signal(signum)
    except ProcessLookupError:
      pass

  # SIGINT and SIGTERM are passed on even where they were ignored (a script's
  # background job ignores SIGINT): someone sent them on purpose. SIGHUP ignored
  # (nohup) stays so.
  for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    if signum != signal.SIGHUP or signal.getsignal(signum) != signal.SIG_IGN:
      signal.signal(signum, forward)
  try:
    # In the private network: the binary on its loopback.
    wait_until_listening(process, port)
    listener.listen(128)
    worker_network.Forwarder(listener, port, ssl_context,
                             on_failure=lambda error: process.kill()).start()
  except WorkerStartError as e:
    if process.poll() is None:
      process.kill()
    process.wait()
    if forwarded:  # Stopped while starting.
      return 128 + forwarded[0]
    _error(str(e))
    return 1
  print(_unix_listening_line(host, process.pid) if unix else
        _listening_line(host, port, tls, process.pid), flush=True)
  status = process.wait()
  if status < 0:
    if -status not in forwarded:
      _error(f'the worker_binary on port {port} was killed by signal {-status}.')
    return 128 - status
  if not forwarded:
    _error(f'the worker_binary on port {port} exited with status {status}.')
  return status or (0 if forwarded else 1)


if __name__ == '__main__':
  sys.exit(main(sys.argv))
