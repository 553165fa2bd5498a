"""Issue 39: a worker runs computations only for a driver holding the deployment's
credentials, over mutual TLS, and nothing else on the network reaches its executor.

The worker_binary lives in a private network namespace behind the launcher's
forwarder: plain gRPC, plain TCP, TLS without a client certificate and a certificate
of another CA are refused; the binary has no socket in the machine's network; a worker
without credentials is reachable from the machine's loopback only; and an authenticated
driver's FedAvg round equals the single-process round.

The machine's real addresses are never dialled: the test of what the network sees
runs in a network namespace of its own, with a documentation address (198.51.100.7)
on its loopback standing for the machine's network address.
"""

import contextlib
import datetime
import json
import os
import select
import signal
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
import grpc
import numpy as np
import portpicker
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.helpers import processes
from tff_robust import distributed
from tff_robust.distributed import runtime
from tff_robust.distributed import worker_credentials
from tff_robust.distributed import worker_launcher
from tff_robust.distributed import worker_network

_REPO = processes.REPOSITORY
# Generous: a subprocess that hangs fails the test instead of the session; nothing
# here waits a fixed time for something to happen.
_HANG = 300
_GET_EXECUTOR = '/tensorflow_federated.v0.ExecutorGroup/GetExecutor'
# The client preface of HTTP/2 and an empty SETTINGS frame: how a gRPC client starts.
_HTTP2_PREFACE = (b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' +
                  b'\x00\x00\x00\x04\x00\x00\x00\x00\x00')
slow = pytest.mark.slow


@pytest.fixture(scope='module')
def deployment(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp('deployment'))
  worker_credentials.make(directory, worker_hosts=['worker-a.example'])
  return directory


@pytest.fixture(scope='module')
def other_deployment(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp('other_deployment'))
  worker_credentials.make(directory)
  return directory


def _load(path):
  with open(path, 'rb') as f:
    return x509.load_pem_x509_certificate(f.read())


def test_credentials_are_a_ca_a_worker_and_a_driver(deployment):
  ca = _load(os.path.join(deployment, 'ca.pem'))
  worker = _load(os.path.join(deployment, 'worker.pem'))
  driver = _load(os.path.join(deployment, 'driver.pem'))
  worker.verify_directly_issued_by(ca)
  driver.verify_directly_issued_by(ca)
  usage = lambda c: list(  # pylint: disable=g-long-lambda
      c.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
  assert usage(worker) == [ExtendedKeyUsageOID.SERVER_AUTH]
  assert usage(driver) == [ExtendedKeyUsageOID.CLIENT_AUTH]
  names = worker.extensions.get_extension_for_class(
      x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
  assert names[:2] == [worker_credentials.WORKER_NAME, 'worker-a.example']
  for key in ('ca.key', 'worker.key', 'driver.key'):
    assert stat.S_IMODE(os.stat(os.path.join(deployment, key)).st_mode) == 0o600
  with pytest.raises(FileExistsError, match='already exist'):
    worker_credentials.make(deployment)


@pytest.mark.parametrize('flags, message', [
    (['--listen_host=0.0.0.0'], 'a worker reachable from the network must require '
     'credentials'),
    (['--listen_host=::'], 'must require credentials'),
    (['--tls_cert=a.pem', '--tls_key=a.key'], 'missing --tls_client_ca'),
    (['--tls_cert'], 'give a value'),
    (['--listen_unix=/tmp/worker.sock'], 'must be yours and closed to everyone else'),
    (['--listen_unix=/tmp/worker.sock', '--listen_host=127.0.0.1'],
     'give it without --listen_host and --tls_'),
])
def test_a_worker_on_the_network_without_credentials_is_refused(flags, message):
  with pytest.raises(ValueError, match=message):
    worker_launcher.listen_settings(worker_launcher.split_flags(flags)[0])


def test_a_worker_started_by_root_runs_as_an_unprivileged_user():
  if os.geteuid() == 0:
    uid, gid = worker_launcher._run_as(None)  # pylint: disable=protected-access
    assert uid != 0 and gid != 0
    assert (uid, gid) == worker_network.unprivileged_ids()
    with pytest.raises(ValueError, match='--user=root is root'):
      worker_launcher._run_as('root')  # pylint: disable=protected-access
    with pytest.raises(ValueError, match='--user=0 is root'):
      worker_launcher._run_as('0')  # pylint: disable=protected-access
  else:
    assert worker_launcher._run_as(None) is None  # pylint: disable=protected-access
    with pytest.raises(ValueError, match='only a worker started by root'):
      worker_launcher._run_as('nobody')  # pylint: disable=protected-access


def test_the_launchers_own_flags_are_not_the_binarys():
  own, rest = worker_launcher.split_flags(
      ['--port=5', '--tls_cert', 'c', '--tls_key=k', '--tls_client_ca=ca', '--x=1'])
  assert rest == ['--port=5', '--x=1']
  assert worker_launcher.listen_settings(own) == ('::', ('c', 'k', 'ca'))
  assert worker_launcher.listen_settings({}) == ('127.0.0.1', None)


def test_a_driver_without_credentials_dials_this_machine_only(deployment):
  # Refused before dialling (nothing listens at these addresses).
  with pytest.raises(ValueError, match='198.51.100.7:8000 is not on this machine: a '
                     'worker on the network requires credentials'):
    distributed.DistributedContext(['127.0.0.1:1', '198.51.100.7:8000'])
  with pytest.raises(ValueError, match='cannot read the ca file'):
    distributed.DistributedContext(['127.0.0.1:1'],
                                   credentials=os.path.join(deployment, 'missing'))
  with pytest.raises(ValueError, match='loopback address only'):
    distributed.LocalWorkers(1, host='0.0.0.0')


def _echo_server():
  """A port on 127.0.0.1 that returns what it receives (a stand-in for the binary)."""
  server = socket.socket()
  server.bind(('127.0.0.1', 0))
  server.listen()

  def echo(connection):
    with connection:
      while True:
        data = connection.recv(1 << 16)
        if not data:
          return
        connection.sendall(data)

  def serve():
    while True:
      try:
        connection, _ = server.accept()
      except OSError:  # Closed.
        return
      threading.Thread(target=echo, args=(connection,), daemon=True).start()

  threading.Thread(target=serve, daemon=True).start()
  return server


def _round_trip(context, port, payload) -> bytes:
  """What comes back of `payload`, sent in 64 KiB pieces, each read back before the
  next (one thread: an SSL socket is not to be used by two at once)."""
  received = bytearray()
  with socket.create_connection(('127.0.0.1', port), timeout=_HANG) as raw:
    with context.wrap_socket(raw, server_hostname=worker_credentials.WORKER_NAME) as s:
      for start in range(0, len(payload), 1 << 16):
        piece = payload[start:start + (1 << 16)]
        s.sendall(piece)
        expected = len(received) + len(piece)
        while len(received) < expected:
          chunk = s.recv(1 << 16)
          if not chunk:
            return bytes(received)
          received += chunk
  return bytes(received)


# Python 3.11 handshakes in the handler (and logs refusals); before, in the server.
@pytest.mark.parametrize('upgrades_streams', [True, False])
def test_the_forwarder_relays_the_deployments_driver_only(
    upgrades_streams, deployment, other_deployment, monkeypatch):
  monkeypatch.setattr(worker_network, '_UPGRADES_STREAMS', upgrades_streams)
  echo = _echo_server()
  listener = worker_network.bind_listener('127.0.0.1', 0)
  listener.listen()
  worker = worker_credentials.Credentials.worker(deployment)
  forwarder = worker_network.Forwarder(
      listener, echo.getsockname()[1],
      worker_network.server_ssl_context(worker.cert, worker.key, worker.ca))
  forwarder.start()
  port = listener.getsockname()[1]
  try:
    def client(directory):
      context = ssl.create_default_context(cafile=os.path.join(deployment, 'ca.pem'))
      if directory:
        context.load_cert_chain(os.path.join(directory, 'driver.pem'),
                                os.path.join(directory, 'driver.key'))
      return context

    payload = os.urandom(3 << 20)
    assert _round_trip(client(deployment), port, payload) == payload
    for refused in (None, other_deployment):
      try:
        assert _round_trip(client(refused), port, payload) == b''
      except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        pass  # The refusal: an alert, or the connection closed.
    assert forwarder.accepted == 1
  finally:
    forwarder.stop()
    echo.close()


@slow
@pytest.mark.parametrize('flags, message', [
    (['--listen_host=0.0.0.0'], 'must require credentials'),
    (['--tls_cert=/nonexistent.pem', '--tls_key=/nonexistent.key',
      '--tls_client_ca=/nonexistent-ca.pem'], 'cannot load them'),
])
def test_the_launcher_exits_with_status_2_naming_the_problem(flags, message):
  result = subprocess.run(
      [sys.executable, '-m', 'tff_robust.distributed',
       f'--port={portpicker.pick_unused_port()}', *flags],
      cwd=_REPO, capture_output=True, text=True, timeout=_HANG,
      env=processes.quiet_env())
  assert result.returncode == 2, result.stderr
  assert message in result.stderr
  assert not result.stdout


class _Launcher:
  """`python -m tff_robust.distributed` in the background, started once its
  `listening on` line is out; stderr (the forwarder's log) in a file."""

  def __init__(self, flags, log_path):
    self.port = portpicker.pick_unused_port()
    self.address = f'127.0.0.1:{self.port}'
    self.log_path = log_path
    with open(log_path, 'wb') as log:
      self.process = subprocess.Popen(
          [sys.executable, '-m', 'tff_robust.distributed', f'--port={self.port}',
           *flags], cwd=_REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
          stderr=log, text=True, env=processes.quiet_env())
    readable, _, _ = select.select([self.process.stdout], [], [], _HANG)
    self.line = self.process.stdout.readline() if readable else ''
    assert self.line.startswith('listening on '), self.log()
    self.binary_pid = int(self.line.split(' pid ')[1].split(';')[0])

  def log(self) -> str:
    with open(self.log_path, errors='replace') as f:
      return f.read()

  def wait_for_log(self, text: str, count: int = 1) -> str:
    """The log once it holds `text` `count` times (the forwarder writes it after the
    refusal)."""
    deadline = time.monotonic() + _HANG
    while self.log().count(text) < count:
      assert time.monotonic() < deadline, self.log()
      time.sleep(0.05)
    return self.log()

  def stop(self):
    self.process.send_signal(signal.SIGTERM)
    try:
      self.process.wait(timeout=_HANG)
    finally:
      if self.process.poll() is None:
        self.process.kill()
        self.process.wait()
      self.process.stdout.close()
    assert not processes.running([self.binary_pid])


@pytest.fixture(scope='module')
def tls_worker(deployment, tmp_path_factory):
  # On 127.0.0.1: the test machine's own network is no place for it. (Without
  # --listen_host a worker with credentials listens on every interface.)
  launcher = _Launcher(
      worker_credentials.Credentials.worker(deployment).launcher_flags() +
      ['--listen_host=127.0.0.1'], tmp_path_factory.mktemp('tls_worker') / 'log')
  yield launcher
  launcher.stop()


def _call(channel) -> grpc.StatusCode:
  """GetExecutor (empty request) over `channel`: the executor answers (NOT_FOUND: no
  cardinalities given), or UNAVAILABLE when it cannot be reached."""
  try:
    channel.unary_unary(_GET_EXECUTOR)(b'', timeout=_HANG)
    return grpc.StatusCode.OK
  except grpc.RpcError as e:
    return e.code()
  finally:
    channel.close()


@slow
def test_the_authenticated_driver_reaches_the_executor(tls_worker, deployment):
  assert 'TLS, drivers need a client certificate' in tls_worker.line
  channel = distributed.make_channel(tls_worker.address,
                                     worker_credentials.Credentials.driver(deployment))
  assert _call(channel) == grpc.StatusCode.NOT_FOUND  # The executor's own answer.
  assert "accepted a driver from 127.0.0.1:" in tls_worker.wait_for_log(
      "(certificate 'tff-robust-driver')")


@slow
def test_plain_grpc_is_refused(tls_worker):
  assert _call(grpc.insecure_channel(tls_worker.address)) == grpc.StatusCode.UNAVAILABLE
  tls_worker.wait_for_log('TLS handshake failed (WRONG_VERSION_NUMBER)')


@slow
def test_plain_tcp_gets_nothing_from_the_executor(tls_worker):
  with socket.create_connection(('127.0.0.1', tls_worker.port), timeout=_HANG) as s:
    s.sendall(_HTTP2_PREFACE)
    received = b''
    while True:
      try:
        chunk = s.recv(65536)
      except ConnectionResetError:
        break
      if not chunk:
        break
      received += chunk
  # At most a TLS alert record (content type 21); never the server's HTTP/2 SETTINGS.
  assert received == b'' or received[0] == 21, received[:64]


@slow
def test_tls_without_a_client_certificate_is_refused(tls_worker, deployment):
  context = ssl.create_default_context(cafile=os.path.join(deployment, 'ca.pem'))
  context.set_alpn_protocols(['h2'])
  with socket.create_connection(('127.0.0.1', tls_worker.port), timeout=_HANG) as raw:
    # TLS 1.3: the client's side of the handshake ends before the server checks the
    # client; the refusal arrives as an alert on the first read.
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
      with context.wrap_socket(raw, server_hostname=worker_credentials.WORKER_NAME) as s:
        s.sendall(_HTTP2_PREFACE)
        assert s.recv(65536) == b''  # Or the alert raises.
        raise ConnectionResetError('closed without an alert')
  tls_worker.wait_for_log('PEER_DID_NOT_RETURN_A_CERTIFICATE')


def _expired_driver_certificate(deployment, directory):
  """A driver certificate of the deployment's CA, for client use, that expired
  yesterday: (cert path, key path)."""
  with open(os.path.join(deployment, 'ca.key'), 'rb') as f:
    ca_key = serialization.load_pem_private_key(f.read(), password=None)
  ca = _load(os.path.join(deployment, 'ca.pem'))
  key = ec.generate_private_key(ec.SECP256R1())
  now = datetime.datetime.now(datetime.timezone.utc)
  certificate = (
      x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(
          x509.oid.NameOID.COMMON_NAME, 'tff-robust-driver')]))
      .issuer_name(ca.subject).public_key(key.public_key())
      .serial_number(x509.random_serial_number())
      .not_valid_before(now - datetime.timedelta(days=2))
      .not_valid_after(now - datetime.timedelta(days=1))
      .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                     critical=False)
      .sign(ca_key, hashes.SHA256()))
  cert_path, key_path = os.path.join(directory, 'expired.pem'), os.path.join(
      directory, 'expired.key')
  with open(cert_path, 'wb') as f:
    f.write(certificate.public_bytes(serialization.Encoding.PEM))
  with open(key_path, 'wb') as f:
    f.write(key.private_bytes(serialization.Encoding.PEM,
                              serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))
  return cert_path, key_path


@slow
@pytest.mark.parametrize('who', ['another CA', 'a worker certificate',
                                 'an expired certificate'])
def test_a_client_certificate_of_another_ca_or_for_a_server_is_refused(
    who, tls_worker, deployment, other_deployment, tmp_path):
  # The client trusts the worker (the right CA), but presents a certificate of another
  # deployment, the worker's own (signed by the right CA, but for server use), or the
  # right CA's driver certificate past its validity.
  if who == 'an expired certificate':
    cert, key = _expired_driver_certificate(deployment, str(tmp_path))
  else:
    certificate_from = other_deployment if who == 'another CA' else deployment
    side = 'driver' if who == 'another CA' else 'worker'
    cert = os.path.join(certificate_from, f'{side}.pem')
    key = os.path.join(certificate_from, f'{side}.key')
  credentials = worker_credentials.Credentials(
      ca=os.path.join(deployment, 'ca.pem'), cert=cert, key=key)
  before = tls_worker.log().count('CERTIFICATE_VERIFY_FAILED')
  assert _call(distributed.make_channel(tls_worker.address, credentials)) == (
      grpc.StatusCode.UNAVAILABLE)
  tls_worker.wait_for_log('CERTIFICATE_VERIFY_FAILED', before + 1)


@slow
def test_the_driver_refuses_a_worker_of_another_deployment(tls_worker, other_deployment):
  # Fails at the handshake, not after the connect timeout.
  with pytest.raises(distributed.WorkerError, match=f'{tls_worker.address}: refused '
                     'the connection .*CERTIFICATE_VERIFY_FAILED.*same deployment'):
    distributed.DistributedContext([tls_worker.address], credentials=other_deployment,
                                   connect_timeout=_HANG)


@slow
def test_a_driver_without_credentials_is_told_the_worker_requires_them(tls_worker):
  with pytest.raises(distributed.WorkerError, match='refused the connection .*does the '
                     'worker require credentials'):
    distributed.DistributedContext([tls_worker.address], connect_timeout=_HANG)


@slow
def test_a_driver_with_credentials_at_a_worker_without_them(deployment):
  with distributed.LocalWorkers(1) as local:
    with pytest.raises(distributed.WorkerError, match='refused the connection .*does '
                       'the worker use TLS at all'):
      distributed.DistributedContext(local.addresses, credentials=deployment,
                                     connect_timeout=_HANG)


# Runs in a network namespace of its own (argv: credentials directory): a stand-in
# for the machine's network address on its loopback, a worker without credentials
# and one with them (every interface, as on a real machine), and what a client in
# that network reaches. Prints one JSON line.
_MACHINE = r'''
import fcntl, json, os, select, signal, socket, struct, subprocess, sys
import grpc
from tff_robust.distributed import worker_credentials
from tff_robust.distributed import worker_launcher
from tff_robust.distributed import worker_network
worker_network.enter_private_network()
NETWORK_ADDRESS = '198.51.100.7'
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # SIOCSIFADDR on lo:1
  fcntl.ioctl(s.fileno(), 0x8916, struct.pack(
      '16sH2s4s8s', b'lo:1', socket.AF_INET, b'\0\0',
      socket.inet_aton(NETWORK_ADDRESS), b'\0' * 8))
deployment = worker_credentials.Credentials.worker(sys.argv[1])
driver = worker_credentials.Credentials.driver(sys.argv[1])
workers = {}
for name, flags in (('local', []), ('tls', deployment.launcher_flags())):
  port = 20000 + len(workers)  # The namespace is new: every port is free.
  p = subprocess.Popen([sys.executable, '-m', 'tff_robust.distributed',
                        f'--port={port}', *flags], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
  select.select([p.stdout], [], [], 300)
  line = p.stdout.readline()
  workers[name] = dict(process=p, port=port, line=line,
                       binary=int(line.split(' pid ')[1].split(';')[0]))

def call(address, credentials=None):
  options = [('grpc.max_reconnect_backoff_ms', 1000)]
  channel = (grpc.insecure_channel(address, options) if credentials is None else
             grpc.secure_channel(address, credentials.channel_credentials(),
                                 options + credentials.channel_options()))
  try:
    channel.unary_unary('/tensorflow_federated.v0.ExecutorGroup/GetExecutor')(
        b'', timeout=300)
    return 'OK'
  except grpc.RpcError as e:
    return e.code().name
  finally:
    channel.close()

def tcp(host, port):
  try:
    socket.create_connection((host, port), timeout=300).close()
    return 'accepted'
  except ConnectionRefusedError:
    return 'refused'

result = {'machine_network': worker_network.network_namespace()}
listening = worker_launcher._listening_sockets
for name, w in workers.items():
  sockets = set(listening(w['port']))
  result[name] = dict(
      line=w['line'],
      binary_network=worker_network.network_namespace(w['binary']),
      binary_sockets_listening_here=sorted(
          sockets & worker_launcher._socket_inodes(w['binary'])),
      listening_here_not_the_launchers=sorted(
          sockets - worker_launcher._socket_inodes(w['process'].pid)),
      listening_here=len(sockets),
      reach={host: dict(tcp=tcp(host, w['port']),
                        plain_grpc=call(f'{host}:{w["port"]}'),
                        driver=call(f'{host}:{w["port"]}', driver))
             for host in ('127.0.0.1', NETWORK_ADDRESS)})
for w in workers.values():
  w['process'].send_signal(signal.SIGTERM)
  w['process'].wait()
print(json.dumps(result), flush=True)
'''


@slow
def test_only_the_forwarder_is_on_the_network(deployment):
  result = subprocess.run([sys.executable, '-c', _MACHINE, deployment], cwd=_REPO,
                          capture_output=True, text=True, timeout=_HANG,
                          env=processes.quiet_env())
  assert result.returncode == 0, result.stderr[-3000:]
  machine = json.loads(result.stdout.splitlines()[-1])
  for name in ('local', 'tls'):
    worker = machine[name]
    # The worker_binary is in a network of its own: no socket of it in the machine's.
    assert worker['binary_network'] != machine['machine_network']
    assert worker['binary_sockets_listening_here'] == []
    assert worker['listening_here_not_the_launchers'] == []
    assert worker['listening_here'] == 1
  local, tls = machine['local']['reach'], machine['tls']['reach']
  assert machine['local']['line'].startswith('listening on 127.0.0.1:')
  # Without credentials: this machine only (the executor answers NOT_FOUND).
  assert local['127.0.0.1']['plain_grpc'] == 'NOT_FOUND'
  assert local['198.51.100.7'] == dict(tcp='refused', plain_grpc='UNAVAILABLE',
                                       driver='UNAVAILABLE')
  # With credentials: every interface, for the deployment's driver only.
  assert machine['tls']['line'].startswith('listening on [::]:')
  for host in ('127.0.0.1', '198.51.100.7'):
    assert tls[host] == dict(tcp='accepted', plain_grpc='UNAVAILABLE',
                             driver='NOT_FOUND'), host


def _fed_avg_round():
  """One `build_weighted_fed_avg` round on three tiny clients (least squares), in the
  current context: the new model weights and the training loss."""
  rng = np.random.default_rng(0)
  clients = []
  for n in (4, 6, 8):
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = (x @ rng.normal(size=3) + 0.5).reshape(n, 1).astype(np.float32)
    clients.append(tf.data.Dataset.from_tensor_slices((x, y)).batch(2))
  spec = clients[0].element_spec

  def model_fn():
    keras_model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(3,)),
        tf.keras.layers.Dense(1, kernel_initializer='ones')])
    return tff.learning.models.from_keras_model(
        keras_model, loss=tf.keras.losses.MeanSquaredError(), input_spec=spec)

  process = tff.learning.algorithms.build_weighted_fed_avg(
      model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.05))
  state = process.initialize()
  output = process.next(state, clients)
  weights = process.get_model_weights(output.state).trainable
  return ([np.asarray(w) for w in weights],
          float(output.metrics['client_work']['train']['loss']))


@slow
def test_an_authenticated_fed_avg_round_equals_one_process(deployment):
  expected_weights, expected_loss = _fed_avg_round()
  with distributed.LocalWorkers(
      2, credentials=worker_credentials.Credentials.worker(deployment)) as local:
    with distributed.distributed_execution(local.addresses,
                                           credentials=deployment) as context:
      weights, loss = _fed_avg_round()
      traffic = context.traffic()
    binaries = local.binary_pids
    logs = [open(local.log_path(i)).read() for i in range(2)]
  assert not processes.running(binaries)
  for log in logs:
    assert "accepted a driver from 127.0.0.1:" in log
  assert all(sent > 0 and received > 0 for sent, received in traffic.values())
  for got, want in zip(weights, expected_weights):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)


_TRAIN = [sys.executable, '-m', 'tasks.binaries.train', '--task=emnist',
          '--model=linear', '--data_source=synthetic', '--clients_per_round=4',
          '--batch_size=10', '--aggregator=mean', '--rounds=1',
          '--experiment_name=run', '--noprogress', '--notensorboard']


@slow
def test_the_binary_refuses_workers_on_the_network_without_credentials(tmp_path):
  result = subprocess.run(
      _TRAIN + [f'--root_output_dir={tmp_path}', '--workers=198.51.100.7:8000'],
      cwd=_REPO, capture_output=True, text=True, timeout=_HANG,
      env=processes.quiet_env())
  assert result.returncode == 1, result.stderr[-3000:]
  assert ('198.51.100.7:8000 is not on this machine: a worker on the network requires '
          'credentials') in result.stderr
  assert '--worker_credentials=DIR' in result.stderr
  assert not (tmp_path / 'run').exists()


@slow
def test_the_binary_trains_on_workers_with_credentials(deployment, tmp_path):
  with distributed.LocalWorkers(2, credentials=deployment) as local:
    result = subprocess.run(
        _TRAIN + [f'--root_output_dir={tmp_path}',
                  '--workers=' + ','.join(local.addresses),
                  f'--worker_credentials={deployment}'],
        cwd=_REPO, capture_output=True, text=True, timeout=900,
        env=processes.quiet_env())
    logs = [open(local.log_path(i)).read() for i in range(2)]
  assert result.returncode == 0, result.stderr[-3000:]
  with open(tmp_path / 'run' / 'metrics.csv') as f:
    assert len(f.readlines()) == 2  # The header and round 0.
  for log in logs:
    assert "accepted a driver from 127.0.0.1:" in log


@slow
def test_the_overhead_benchmark_runs():
  # benchmarks.worker_tls_overhead on a small value: it enters a network namespace of
  # its own, and every mode returns the value it sent.
  result = subprocess.run(
      [sys.executable, '-m', 'benchmarks.worker_tls_overhead', '--megabytes=1',
       '--repeats=1'], cwd=_REPO, capture_output=True, text=True, timeout=_HANG,
      env=processes.quiet_env())
  assert result.returncode == 0, result.stderr[-3000:]
  rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[2:]}
  assert sorted(rows) == ['direct', 'plain', 'tls']
  # The same messages (but for the lengths of the ids the executors give values).
  sent = [int(row[3]) for row in rows.values()]
  assert max(sent) - min(sent) < 100 and min(sent) > 2**20, rows


def _root_only_file(tmp_path) -> str:
  """A file only root may read, in a directory everyone may enter: its own mode is
  all that protects it."""
  directory = tmp_path / 'open'
  directory.mkdir()
  os.chmod(tmp_path, 0o755)
  os.chmod(directory, 0o755)
  path = directory / 'root_only'
  path.write_text('secret')
  os.chmod(path, 0o600)
  return str(path)


def _read_file_computation(path):
  @tff.tensorflow.computation
  def read():
    return tf.io.read_file(path)
  return read


def _uid(pid: int) -> int:
  with open(f'/proc/{pid}/status') as f:
    return int(next(l for l in f if l.startswith('Uid:')).split()[2])


needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason='only root can make a file a worker started by root '
    'should not read (another user\'s worker runs as that user)')


@slow
@needs_root
@pytest.mark.parametrize('where', ['a worker', 'the driver\'s own worker'])
def test_a_computation_the_driver_sends_reads_no_root_only_file(where, tmp_path):
  # Issue 54: a worker started by root was uid 0 on the machine (root only inside
  # its user namespace), the owner of root's files, and read this one.
  secret = _root_only_file(tmp_path)
  read = _read_file_computation(secret)
  with contextlib.ExitStack() as stack:
    if where == 'a worker':
      local = stack.enter_context(distributed.LocalWorkers(1))
      stack.enter_context(distributed.distributed_execution(local.addresses))
      binaries = local.binary_pids
    else:
      stack.enter_context(distributed.private_local_execution())
      binaries = [pid for launcher in processes.worker_launchers()
                  for pid in runtime.worker_binaries(launcher)]
    with pytest.raises(Exception, match='Permission denied'):
      read()
    assert binaries and all(_uid(pid) == _unprivileged_uid() for pid in binaries)


def _unprivileged_uid() -> int:
  return worker_network.unprivileged_ids()[0]


# A fresh interpreter drops its privileges and tries. A fork of this test process,
# where gRPC's threads run, once aborted in gRPC's fork handlers before trying;
# subprocess starts the interpreter with vfork, which runs no fork handlers, as long as
# it is given no preexec_fn, user or group.
_CONNECT_AS = """
import os, socket, sys
uid, path = int(sys.argv[1]), sys.argv[2]
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
try:
  with socket.socket(socket.AF_UNIX) as s:
    s.connect(path)
  print('connected', end='')
except PermissionError:
  print('permission denied', end='')
"""


def _connects_as(uid: int, path: str) -> str:
  """Whether a process of `uid` can connect to the Unix socket `path`."""
  return subprocess.run([sys.executable, '-I', '-S', '-c', _CONNECT_AS, str(uid), path],
                        capture_output=True, text=True, check=True,
                        timeout=300).stdout


@slow
def test_the_drivers_own_worker_is_a_unix_socket_of_this_user_only():
  with distributed.private_local_execution():
    assert _read_file_computation('/dev/null')() == b''  # It computes.
    [launcher] = processes.worker_launchers()
    [binary] = runtime.worker_binaries(launcher)
    path = processes.flag_value(launcher, 'listen_unix')
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    directory = os.stat(os.path.dirname(path))
    assert directory.st_uid == os.geteuid()
    assert stat.S_IMODE(directory.st_mode) == 0o700
    # No socket of its own in this network: the binary is in another namespace, the
    # launcher listens on the Unix socket only.
    assert worker_network.network_namespace(binary) != (
        worker_network.network_namespace())
    for port_table in ('/proc/net/tcp', '/proc/net/tcp6'):
      with open(port_table) as f:
        inodes = {int(line.split()[9]) for line in f.readlines()[1:]}
      assert not inodes & worker_launcher._socket_inodes(launcher)  # pylint: disable=protected-access
    if os.geteuid() == 0:
      assert _connects_as(_unprivileged_uid(), path) == 'permission denied'
      assert _connects_as(0, path) == 'connected'
  assert not processes.running([launcher, binary])
  assert not os.path.exists(os.path.dirname(path))


# Runs in a network namespace of its own, "the machine" (argv: output root): a peer
# in a second namespace reaches the machine at 198.51.100.1 over a veth link; two
# local workers, and a `tasks.binaries.train --workers` run on them. While the run
# lasts, every TCP port listening in the machine's network that is not a worker's is
# called with plain gRPC from the peer. Prints one JSON line.
_DRIVER_MACHINE = r'''
import json, os, socket, subprocess, sys, time
from tff_robust import distributed
from tff_robust.distributed import worker_launcher
def run(*command):
  subprocess.run(command, check=True, capture_output=True)
run('ip', 'link', 'set', 'lo', 'up')
peer = subprocess.Popen(['unshare', '--net', 'sleep', 'infinity'])
while os.readlink(f'/proc/{peer.pid}/ns/net') == os.readlink('/proc/self/ns/net'):
  time.sleep(0.01)  # Until `sleep` runs in its own network.
in_peer = ['nsenter', '-t', str(peer.pid), '-n']
run('ip', 'link', 'add', 'machine0', 'type', 'veth', 'peer', 'name', 'peer0', 'netns',
    str(peer.pid))
run('ip', 'addr', 'add', '198.51.100.1/24', 'dev', 'machine0')
run('ip', 'link', 'set', 'machine0', 'up')
run(*in_peer, 'ip', 'addr', 'add', '198.51.100.2/24', 'dev', 'peer0')
run(*in_peer, 'ip', 'link', 'set', 'peer0', 'up')
run(*in_peer, 'ip', 'link', 'set', 'lo', 'up')
PROBE = """
import sys, grpc
channel = grpc.insecure_channel(sys.argv[1])
try:
  channel.unary_unary('/tensorflow_federated.v0.ExecutorGroup/GetExecutor')(b'', timeout=60)
  print('OK')
except grpc.RpcError as e:
  print(e.code().name)
"""
def from_peer(address):
  return subprocess.run([*in_peer, sys.executable, '-c', PROBE, address],
                        capture_output=True, text=True).stdout.strip()
# The link works: a port open to the network here is reached from the peer.
control = socket.create_server(('0.0.0.0', 0))
control_port = control.getsockname()[1]
result = {'control': subprocess.run(
    [*in_peer, sys.executable, '-c', 'import socket, sys; socket.create_connection('
     '("198.51.100.1", int(sys.argv[1])), timeout=60); print("connected")',
     str(control_port)], capture_output=True, text=True).stdout.strip()}
control.close()
known = set()
def listening():
  ports = set()
  for table in ('/proc/net/tcp', '/proc/net/tcp6'):
    for line in open(table).readlines()[1:]:
      fields = line.split()
      if fields[3] == '0A':
        ports.add(int(fields[1].rsplit(':', 1)[1], 16))
  return ports
with distributed.LocalWorkers(2) as workers:
  known = listening()  # The workers' (on 127.0.0.1).
  train = subprocess.Popen(
      [sys.executable, '-m', 'tasks.binaries.train', '--task=emnist', '--model=linear',
       '--data_source=synthetic', '--clients_per_round=4', '--batch_size=10',
       '--aggregator=gm', '--rounds=2', '--experiment_name=run', '--noprogress',
       '--notensorboard', f'--root_output_dir={sys.argv[1]}',
       '--workers=' + ','.join(workers.addresses)],
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  reached = {}
  while train.poll() is None:
    for port in listening() - known - set(reached):
      reached[port] = from_peer(f'198.51.100.1:{port}')
    time.sleep(0.05)
  result.update(returncode=train.returncode, stderr=train.stderr.read()[-3000:],
                reached={str(p): code for p, code in reached.items()})
peer.kill()
print(json.dumps(result), flush=True)
'''


@slow
@needs_root
def test_the_driver_of_a_workers_run_listens_on_nothing_the_network_reaches(tmp_path):
  # Issue 54: the driver's own computations ran on TFF's local worker_binary,
  # listening on every interface; a plain gRPC client in another network namespace
  # ran TensorFlow in it.
  try:
    subprocess.run(['unshare', '--net', 'true'], check=True, capture_output=True)
  except (OSError, subprocess.CalledProcessError) as e:
    pytest.skip(f'network namespaces are not allowed here ({e})')
  result = subprocess.run(['unshare', '--net', sys.executable, '-c', _DRIVER_MACHINE,
                           str(tmp_path)], cwd=_REPO, capture_output=True, text=True,
                          timeout=900, env=processes.quiet_env())
  assert result.returncode == 0, result.stderr[-3000:]
  machine = json.loads(result.stdout.splitlines()[-1])
  assert machine['control'] == 'connected'
  assert machine['returncode'] == 0, machine['stderr']
  assert machine['reached'] == {}
