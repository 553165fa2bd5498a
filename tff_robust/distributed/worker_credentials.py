"""A deployment's TLS credentials: who may drive its workers, and which workers to trust.

A worker started with credentials (`python -m tff_robust.distributed --port=N
--tls_cert=... --tls_key=... --tls_client_ca=...`) accepts only TLS connections whose
client presents a certificate signed by the deployment's CA for client use (the
driver's), and the driver (`distributed_execution(addresses, credentials=...)`,
`tasks.binaries.train --worker_credentials=DIR`) accepts only workers whose certificate
that CA signed for server use under the name `tff-robust-worker`.

Make a deployment's files once, on a trusted machine:

  python -m tff_robust.distributed.worker_credentials --out=creds/ [--worker_hosts=hostA,10.0.0.5]

writes into `creds/` (which must not hold them already):

  ca.pem                 the deployment's CA certificate: every worker and driver
  ca.key                 its private key: signs nothing after this; keep it offline
                         (or delete it: new credentials mean a new CA)
  worker.pem, worker.key the workers' certificate and key (copy to every worker)
  driver.pem, driver.key the driver's certificate and key (only on the driver)

Keys are written mode 0600. The worker certificate names `tff-robust-worker`, plus
`--worker_hosts`, `localhost`, 127.0.0.1 and ::1; the driver checks the fixed name
(gRPC's target name override), so workers may be addressed by any host name or address.
Every holder of `worker.key` is a worker to the driver, and every holder of
`driver.key` may run computations on the workers: give them to those machines only.

`make` needs the `cryptography` package; `Credentials` (reading the files, building
gRPC channel credentials) needs only grpc, and the worker side only Python's `ssl`.
"""

import argparse
import dataclasses
import datetime
import ipaddress
import os
import sys
from typing import Optional, Sequence

# The name every worker certificate carries and every driver checks.
WORKER_NAME = 'tff-robust-worker'
DRIVER_NAME = 'tff-robust-driver'
CA_NAME = 'tff-robust deployment CA'
FILES = ('ca.pem', 'ca.key', 'worker.pem', 'worker.key', 'driver.pem', 'driver.key')
DEFAULT_DAYS = 365


@dataclasses.dataclass(frozen=True)
class Credentials:
  """One side's TLS files (paths): its certificate and key, and the CA certificate it
  trusts for the other side.

  Attributes:
    ca: PEM CA certificate that signed the other side's certificate.
    cert: PEM certificate (chain) of this side.
    key: PEM private key of `cert`.
    server_name: the name a driver requires in the worker's certificate
      (`WORKER_NAME`); None checks the host of each worker address instead.
  """
  ca: str
  cert: str
  key: str
  server_name: Optional[str] = WORKER_NAME

  @classmethod
  def driver(cls, directory: str) -> 'Credentials':
    """The driver's files in a directory `make` wrote (driver.pem, driver.key, ca.pem)."""
    return cls._from(directory, 'driver')

  @classmethod
  def worker(cls, directory: str) -> 'Credentials':
    """The workers' files in a directory `make` wrote (worker.pem, worker.key, ca.pem)."""
    return cls._from(directory, 'worker')

  @classmethod
  def _from(cls, directory: str, side: str) -> 'Credentials':
    credentials = cls(ca=os.path.join(directory, 'ca.pem'),
                      cert=os.path.join(directory, f'{side}.pem'),
                      key=os.path.join(directory, f'{side}.key'))
    credentials.check_readable()
    return credentials

  def check_readable(self) -> None:
    """Raises ValueError naming a file that cannot be read."""
    for name in ('ca', 'cert', 'key'):
      path = getattr(self, name)
      try:
        with open(path, 'rb'):
          pass
      except OSError as e:
        raise ValueError(f'TLS credentials: cannot read the {name} file {path}: '
                         f'{e.strerror}. Make a deployment\'s files with `python -m '
                         'tff_robust.distributed.worker_credentials --out=DIR`.') from None

  def launcher_flags(self) -> list[str]:
    """This (worker) side as flags of `python -m tff_robust.distributed`."""
    return [f'--tls_cert={self.cert}', f'--tls_key={self.key}',
            f'--tls_client_ca={self.ca}']

  def channel_credentials(self):
    """`grpc.ChannelCredentials` of this (driver) side: mutual TLS."""
    import grpc  # pylint: disable=g-import-not-at-top
    contents = []
    for path in (self.ca, self.key, self.cert):
      with open(path, 'rb') as f:
        contents.append(f.read())
    ca, key, cert = contents
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                        certificate_chain=cert)

  def channel_options(self) -> list[tuple[str, str]]:
    """gRPC channel options: the worker name to check (see `server_name`)."""
    if self.server_name is None:
      return []
    return [('grpc.ssl_target_name_override', self.server_name)]


def as_driver_credentials(credentials) -> Optional[Credentials]:
  """None, `Credentials`, or a directory `make` wrote (its driver files)."""
  if credentials is None or isinstance(credentials, Credentials):
    return credentials
  if isinstance(credentials, (str, os.PathLike)):
    return Credentials.driver(os.fspath(credentials))
  raise TypeError('credentials must be a tff_robust.distributed.worker_credentials.Credentials or a '
                  f'directory of them, got {type(credentials).__name__}.')


def _san(hosts: Sequence[str]):
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  names, seen = [], set()
  for host in hosts:
    if not host or host in seen:
      continue
    seen.add(host)
    try:
      names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
      names.append(x509.DNSName(host))
  return x509.SubjectAlternativeName(names)


def make(directory: str, worker_hosts: Sequence[str] = (),
         days: int = DEFAULT_DAYS) -> dict[str, str]:
  """Writes a new deployment's CA, worker and driver credentials into `directory`.

  Args:
    directory: created if missing; must not hold any of `FILES` already.
    worker_hosts: extra names or addresses the worker certificate carries (for
      drivers that check the address, `Credentials(server_name=None)`).
    days: validity of the certificates.

  Returns:
    File name (`FILES`) → path.

  Raises:
    FileExistsError: `directory` already holds credentials.
    ValueError: for `days` < 1.
  """
  # pylint: disable=g-import-not-at-top
  from cryptography import x509
  from cryptography.hazmat.primitives import hashes
  from cryptography.hazmat.primitives import serialization
  from cryptography.hazmat.primitives.asymmetric import ec
  from cryptography.x509.oid import ExtendedKeyUsageOID
  from cryptography.x509.oid import NameOID
  # pylint: enable=g-import-not-at-top
  if isinstance(days, bool) or not isinstance(days, int) or days < 1:
    raise ValueError(f'days must be a positive integer, got {days!r}.')
  paths = {name: os.path.join(directory, name) for name in FILES}
  existing = [p for p in paths.values() if os.path.exists(p)]
  if existing:
    raise FileExistsError(f'{", ".join(existing)} already exist: new credentials go '
                          'into a directory of their own.')
  os.makedirs(directory, exist_ok=True)
  now = datetime.datetime.now(datetime.timezone.utc)
  start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

  def name(common_name):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

  def builder(subject, issuer, public_key):
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end))

  ca_key = ec.generate_private_key(ec.SECP256R1())
  ca_name = name(CA_NAME)
  ca_cert = (builder(ca_name, ca_name, ca_key.public_key())
             .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
             .add_extension(x509.KeyUsage(
                 digital_signature=False, content_commitment=False,
                 key_encipherment=False, data_encipherment=False, key_agreement=False,
                 key_cert_sign=True, crl_sign=True, encipher_only=False,
                 decipher_only=False), critical=True)
             .add_extension(x509.SubjectKeyIdentifier.from_public_key(
                 ca_key.public_key()), critical=False)
             .sign(ca_key, hashes.SHA256()))

  def leaf(common_name, usage, hosts):
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (builder(name(common_name), ca_name, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                           critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                key_cert_sign=False, crl_sign=False, encipher_only=False,
                decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(_san(hosts), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert

  worker = leaf(WORKER_NAME, ExtendedKeyUsageOID.SERVER_AUTH,
                [WORKER_NAME, *worker_hosts, 'localhost', '127.0.0.1', '::1'])
  driver = leaf(DRIVER_NAME, ExtendedKeyUsageOID.CLIENT_AUTH, [DRIVER_NAME])

  def write(path, data, private):
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    with os.fdopen(os.open(path, flags, 0o600 if private else 0o644), 'wb') as f:
      f.write(data)

  def key_bytes(key):
    return key.private_bytes(serialization.Encoding.PEM,
                             serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())

  pem = serialization.Encoding.PEM
  write(paths['ca.pem'], ca_cert.public_bytes(pem), private=False)
  write(paths['ca.key'], key_bytes(ca_key), private=True)
  for side, (key, cert) in (('worker', worker), ('driver', driver)):
    write(paths[f'{side}.pem'], cert.public_bytes(pem), private=False)
    write(paths[f'{side}.key'], key_bytes(key), private=True)
  return paths


def main(argv: Sequence[str]) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m tff_robust.distributed.worker_credentials',
      description='Writes a new deployment\'s CA, worker and driver TLS credentials.')
  parser.add_argument('--out', required=True, help='Directory to write them into.')
  parser.add_argument('--worker_hosts', default='',
                      help='Comma-separated extra names or addresses of the workers.')
  parser.add_argument('--days', type=int, default=DEFAULT_DAYS,
                      help='Validity of the certificates in days.')
  args = parser.parse_args(argv[1:])
  hosts = [h.strip() for h in args.worker_hosts.split(',') if h.strip()]
  try:
    paths = make(args.out, hosts, args.days)
  except (FileExistsError, ValueError) as e:
    print(f'tff_robust credentials: ERROR: {e}', file=sys.stderr)
    return 1
  directory = os.path.abspath(args.out)
  print(f'Wrote {", ".join(FILES)} into {directory}.\n'
        f'Workers: copy ca.pem, worker.pem and worker.key, then\n'
        f'  python -m tff_robust.distributed --port=8000 --tls_cert=worker.pem '
        '--tls_key=worker.key --tls_client_ca=ca.pem\n'
        f'Driver: keep ca.pem, driver.pem and driver.key in a directory DIR, then\n'
        f'  --workers=host:8000,... --worker_credentials=DIR  (or '
        'distributed_execution(addresses, credentials=DIR))\n'
        f'Keep ca.key offline or delete it: {paths["ca.key"]}')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
