"""`python -m tff_robust.distributed --port=N` (tff_robust.distributed.worker_launcher): starts the
worker_binary without TensorFlow and says when it listens; a port already in use, or a
binary that cannot listen, ends it with a non-zero status naming the port. LocalWorkers
uses the same checks."""

import os
import select
import signal
import socket
import subprocess
import sys
import time

import portpicker
import pytest

from tests.helpers import processes
from tff_robust import distributed
from tff_robust.distributed import worker_launcher

# Starts subprocesses (binaries, benchmarks or worker processes): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

_REPO = processes.REPOSITORY
# Generous: a subprocess that hangs fails the test instead of the session; nothing
# here waits a fixed time for something to happen.
_HANG = 300
_HEAVY_MODULES = ('tensorflow', 'tensorflow_federated', 'keras', 'jax', 'numpy', 'grpc')


def _worker_command(port, *python_flags):
  return [sys.executable, *python_flags, '-m', 'tff_robust.distributed', f'--port={port}']


class _Worker:
  """`python -m tff_robust.distributed` in the background, started once its
  `listening on` line is out; stderr in a file (`-X importtime` writes there)."""

  def __init__(self, port, tmp_path, *python_flags, preexec_fn=None):
    self.port = port
    self.stderr_path = tmp_path / f'worker_{port}.err'
    with open(self.stderr_path, 'wb') as stderr:
      self.process = subprocess.Popen(_worker_command(port, *python_flags), cwd=_REPO,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=stderr, text=True,
                                      env=processes.quiet_env(),
                                      preexec_fn=preexec_fn)
    # Blocks until ready (or exited); a launcher that never says so fails the test.
    readable, _, _ = select.select([self.process.stdout], [], [], _HANG)
    self.line = self.process.stdout.readline() if readable else ''
    self.binary_pid = (int(self.line.split(' pid ')[1].split(';')[0])
                       if ' pid ' in self.line else None)

  def stop(self):
    if self.process.poll() is None:
      self.process.send_signal(signal.SIGTERM)
    try:
      status = self.process.wait(timeout=_HANG)
    finally:
      if self.process.poll() is None:
        self.process.kill()
        self.process.wait()
      self.process.stdout.close()
    return status


@pytest.fixture
def worker(tmp_path):
  started = []

  def start(port, *python_flags, preexec_fn=None):
    started.append(_Worker(port, tmp_path, *python_flags, preexec_fn=preexec_fn))
    return started[-1]

  yield start
  for w in started:
    w.stop()
    assert not processes.running([w.binary_pid] if w.binary_pid else [])


def test_the_worker_prints_its_listening_line_without_importing_tensorflow(worker):
  port = portpicker.pick_unused_port()
  w = worker(port, '-X', 'importtime')
  assert w.line.startswith(f'listening on 127.0.0.1:{port} (this machine only'), (
      w.stderr_path.read_text())
  socket.create_connection(('127.0.0.1', port), timeout=_HANG).close()
  # The launcher's import statements (the binary writes no `import time:` lines;
  # importlib.import_module, as the package's lazy names use, writes none either).
  imported = [line.split('|')[-1].strip() for line in
              w.stderr_path.read_text(errors='replace').splitlines()
              if line.startswith('import time:') and '|' in line]
  assert 'tff_robust' in imported
  heavy = [m for m in imported if m.split('.')[0] in _HEAVY_MODULES]
  assert not heavy, heavy
  # However imported, TensorFlow would map its shared libraries into the launcher.
  with open(f'/proc/{w.process.pid}/maps') as f:
    mapped = {line.split()[-1] for line in f if '/' in line}
  assert not [path for path in mapped if 'tensorflow' in path], sorted(mapped)
  # ~12 MB of Python; importing TensorFlow peaked at ~600 MB.
  with open(f'/proc/{w.process.pid}/status') as f:
    peak_kb = next(int(l.split()[1]) for l in f if l.startswith('VmHWM'))
  assert peak_kb < 150_000
  # SIGTERM passes to the worker_binary; the launcher exits with 128 + 15.
  assert w.stop() == 128 + signal.SIGTERM
  assert not processes.running([w.binary_pid])


def _ignore_sigint():
  signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_a_background_worker_stops_on_sigint_and_sigterm(worker, signum):
  # Issue 54: a script's background job starts with SIGINT ignored, which the
  # launcher kept (and the binary inherited): SIGINT did nothing.
  w = worker(portpicker.pick_unused_port(), preexec_fn=_ignore_sigint)
  assert w.line.startswith('listening on '), w.stderr_path.read_text()
  w.process.send_signal(signum)
  assert w.process.wait(timeout=_HANG) == 128 + signum
  assert not processes.running([w.binary_pid])


def test_a_worker_started_by_root_runs_as_nobody_without_capabilities(worker):
  w = worker(portpicker.pick_unused_port())
  assert w.line.startswith('listening on '), w.stderr_path.read_text()
  for pid in (w.process.pid, w.binary_pid):
    with open(f'/proc/{pid}/status') as f:
      status = dict(line.split(':', 1) for line in f)
    uids = {int(u) for u in status['Uid'].split()}
    if os.geteuid() == 0:
      assert uids == {distributed.worker_network.unprivileged_ids()[0]}, pid
    else:
      assert uids == {os.geteuid()}
    assert int(status['CapEff'], 16) == 0 and int(status['CapPrm'], 16) == 0
    assert int(status['NoNewPrivs']) == 1


def test_a_second_worker_on_a_used_port_fails_naming_the_port(worker):
  port = portpicker.pick_unused_port()
  first = worker(port)
  assert first.line.startswith(f'listening on 127.0.0.1:{port} ')
  second = subprocess.run(_worker_command(port), cwd=_REPO, capture_output=True,
                          text=True, timeout=_HANG, env=processes.quiet_env())
  assert second.returncode == 1, second.stderr
  assert f'port {port} is already in use' in second.stderr
  # The first worker's launcher holds the port (its worker_binary is in a private
  # network).
  assert f'pid {first.process.pid}: python' in second.stderr
  assert 'pass another --port' in second.stderr
  assert 'listening' not in second.stdout
  # The first worker still listens, alone.
  assert set(worker_launcher._listening_sockets(port)) <= (  # pylint: disable=protected-access
      worker_launcher._socket_inodes(first.process.pid))  # pylint: disable=protected-access
  assert first.process.poll() is None


def test_a_port_held_by_another_program_fails_naming_the_port():
  with socket.socket() as held:
    held.bind(('127.0.0.1', 0))
    held.listen()
    port = held.getsockname()[1]
    result = subprocess.run(_worker_command(port), cwd=_REPO, capture_output=True,
                            text=True, timeout=_HANG, env=processes.quiet_env())
  assert result.returncode == 1, result.stderr
  assert f'port {port} is already in use (pid {os.getpid()}' in result.stderr


@pytest.mark.parametrize('flag, message', [
    ('--port=0', 'port number'), ('--port=70000', 'port number'),
    ('--flagfile=flags.txt', 'on the command line')])
def test_ports_it_cannot_check_are_refused(flag, message):
  result = subprocess.run([sys.executable, '-m', 'tff_robust.distributed', flag],
                          cwd=_REPO, capture_output=True, text=True, timeout=_HANG,
                          env=processes.quiet_env())
  assert result.returncode == 2
  assert message in result.stderr


def test_a_binary_that_cannot_bind_is_an_error_naming_the_port():
  # Started directly, past the launcher's check: it cannot bind, logs why and exits 0
  # (or is found listening beside another process's socket, if the check runs first).
  with socket.socket() as held:
    held.bind(('127.0.0.1', 0))
    held.listen()
    port = held.getsockname()[1]
    binary = worker_launcher.start_worker(
        worker_launcher.worker_binary_path(), [f'--port={port}'],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
      with pytest.raises(worker_launcher.WorkerStartError, match=f'port {port}'):
        worker_launcher.wait_until_listening(binary, port, timeout=_HANG)
    finally:
      binary.kill()
      binary.wait()


def test_a_process_that_exits_before_listening_is_an_error_with_its_status():
  port = portpicker.pick_unused_port()
  quitter = subprocess.Popen([sys.executable, '-c', 'pass'])
  with pytest.raises(worker_launcher.WorkerStartError,
                     match=f'exited with status 0 before listening on port {port}'):
    worker_launcher.wait_until_listening(quitter, port)


# Listens on argv[1] with SO_REUSEPORT, as the worker_binary does; says so.
_REUSEPORT_LISTENER = (
    'import socket, sys\n'
    's = socket.socket()\n'
    's.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n'
    's.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()\n'
    'print("listening", flush=True); sys.stdin.read()\n')


def test_a_process_sharing_its_port_with_another_is_found():
  # A second worker_binary would bind a used port without complaint (SO_REUSEPORT);
  # the check after it listens finds the other process's socket. (Here two stand-ins
  # bind like it: a worker_binary now only listens in its own private network.)
  port = portpicker.pick_unused_port()
  listeners = []
  try:
    for _ in range(2):
      listeners.append(subprocess.Popen(
          [sys.executable, '-c', _REUSEPORT_LISTENER, str(port)],
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
      assert listeners[-1].stdout.readline() == 'listening\n'
    first, second = listeners
    with pytest.raises(worker_launcher.PortInUseError,
                       match=f'port {port} is already in use .pid {first.pid}'):
      worker_launcher.wait_until_listening(second, port, timeout=_HANG)
  finally:
    for listener in listeners:
      listener.kill()
      listener.wait()
      listener.stdin.close()
      listener.stdout.close()


def test_local_workers_refuse_a_port_in_use():
  with distributed.LocalWorkers(1) as first:
    with pytest.raises(distributed.WorkerError,
                       match=f'{first.addresses[0]}: port .* is already in use') as error:
      with distributed.LocalWorkers(1, ports=[int(first.addresses[0].split(':')[1])]):
        pass
    assert error.value.address == first.addresses[0]
    assert processes.running(first.pids) == first.pids


def test_importing_the_package_imports_nothing():
  result = subprocess.run(
      [sys.executable, '-c', 'import sys, tff_robust\n'
       'print(sorted(m for m in sys.modules if m.startswith("tff_robust") or '
       'm.split(".")[0] in ("tensorflow", "tensorflow_federated")))\n'
       'print(tff_robust.GammaMeanFactory.__module__)'],
      cwd=_REPO, capture_output=True, text=True, timeout=_HANG, check=True,
      env=processes.quiet_env())
  assert result.stdout.splitlines() == ["['tff_robust']", 'tff_robust.aggregators.gamma_mean']


# Starts a launcher as LocalWorkers does, once TFF's local context has gRPC threads of
# its own (a computation ran), and reports its pids; then waits.
_DRIVER = '''
import subprocess, sys
import tensorflow_federated as tff
from tff_robust.distributed import runtime, worker_launcher

@tff.tensorflow.computation
def one():
  return 1

one()
launcher = worker_launcher.start_launcher(
    [f'--port={sys.argv[1]}'], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
    text=True)
line = launcher.stdout.readline()
print('PIDS', launcher.pid, line.split(' pid ')[1].split(';')[0], *runtime.worker_binaries(),
      flush=True)
sys.stdin.read()
'''


def test_a_launcher_dies_with_its_driver_which_forks_no_grpc_lines(tmp_path):
  # The launcher asks the kernel for its own death with the driver: the driver starts
  # it without the fork a preexec_fn needs, after which gRPC printed "Other threads are
  # currently calling into gRPC, skipping fork() handlers" per worker.
  stderr_path = tmp_path / 'driver.err'
  with open(stderr_path, 'wb') as stderr:
    driver = subprocess.Popen(
        [sys.executable, '-c', _DRIVER, str(portpicker.pick_unused_port())], cwd=_REPO,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
  pids = []
  try:
    readable, _, _ = select.select([driver.stdout], [], [], _HANG)
    line = driver.stdout.readline() if readable else ''
    assert line.startswith('PIDS'), stderr_path.read_text()
    pids = [int(pid) for pid in line.split()[1:]]
    launcher, binary, tffs_own = pids[0], pids[1], pids[2:]
    driver.kill()  # SIGKILL: nothing of the driver's runs any more.
    driver.wait(timeout=_HANG)
    deadline = time.monotonic() + 30
    while processes.running([launcher, binary]) and time.monotonic() < deadline:
      time.sleep(0.05)
    assert not processes.running([launcher, binary])
    assert tffs_own  # TFF's worker_binary (not ours: it outlives a killed driver).
    assert 'fork_posix' not in stderr_path.read_text(), stderr_path.read_text()
  finally:
    for pid in processes.running(pids):
      os.kill(pid, signal.SIGKILL)
    if driver.poll() is None:
      driver.kill()
      driver.wait()
    driver.stdin.close()
    driver.stdout.close()
