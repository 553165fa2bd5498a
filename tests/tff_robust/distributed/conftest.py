"""Fixtures of the tests on TFF workers: two local workers per test module, and a
context on them (modules may override `context`)."""

import pytest

from tests.helpers import processes
from tff_robust import distributed


@pytest.fixture(scope='module')
def workers():
  with distributed.LocalWorkers(2) as local:
    yield local
  assert not processes.running(local.pids)


@pytest.fixture(scope='module')
def context(workers):
  context = distributed.DistributedContext(workers.addresses, connect_timeout=60)
  yield context
  context.close()
