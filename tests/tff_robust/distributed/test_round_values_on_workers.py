"""What crosses from the driver to the workers in a pass-by-pass round.

A pass-by-pass aggregation (RFA: 2R + 1 calls) sends each worker its clients'
updates and weights once per round, not with every call (and not a second time for
TFF's after-merge part); a learning process's pass-by-pass `next` sends none, they
stay where training computed them; and the round frees them on the workers. Counted
on the gRPC requests the driver sends (every CLIENTS-placed value's members), with
the results equal to one process.
"""

import collections

import numpy as np
import pytest
import tensorflow_federated as tff

from tests.helpers import aggregator_cases as cases
from tests.helpers import structures
from tests.tff_robust.distributed import test_distributed as aggregation_cases
from tests.tff_robust.distributed import test_distributed_learning as learning_cases
from tff_robust import distributed
from tff_robust.distributed import passwise
from tff_robust.distributed import resident_values
from tff_robust.distributed import worker_connection

# Starts worker processes: not in the `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

NUM_CLIENTS = 7
SHARDS = (4, 3)  # The contiguous shards of 7 clients over 2 workers.


class _Requests:
  """What the driver's stubs send: per worker, the members of CLIENTS-placed values
  (one per client of the shard) and the references of those values; the references
  disposed."""

  def __init__(self, monkeypatch):
    self.client_members = collections.Counter()
    self.client_refs = collections.defaultdict(set)
    self.disposed = collections.defaultdict(set)
    create_value = worker_connection._FailFastStub.create_value  # pylint: disable=protected-access
    dispose = worker_connection._FailFastStub.dispose  # pylint: disable=protected-access
    requests = self

    def counting_create_value(stub, request):
      response = create_value(stub, request)
      members = _client_members(request.value)
      if members:
        requests.client_members[stub._address] += members  # pylint: disable=protected-access
        requests.client_refs[stub._address].add(response.value_ref.id)  # pylint: disable=protected-access
      return response

    def recording_dispose(stub, request):
      requests.disposed[stub._address].update(r.id for r in request.value_ref)  # pylint: disable=protected-access
      return dispose(stub, request)

    monkeypatch.setattr(worker_connection._FailFastStub, 'create_value', counting_create_value)  # pylint: disable=protected-access
    monkeypatch.setattr(worker_connection._FailFastStub, 'dispose', recording_dispose)  # pylint: disable=protected-access

  def clear(self):
    self.client_members.clear()
    self.client_refs.clear()
    self.disposed.clear()

  def members(self, addresses):
    return tuple(self.client_members[a] for a in addresses)


def _client_members(value) -> int:
  """The members of the CLIENTS-placed (not all-equal) values in `value` (an
  `executor_pb2.Value`), inside structs too."""
  kind = value.WhichOneof('value')
  if kind == 'struct':
    return sum(_client_members(element.value) for element in value.struct.element)
  if (kind == 'federated' and
      value.federated.type.placement.value.uri == tff.CLIENTS.uri and
      not value.federated.type.all_equal):
    return len(value.federated.value)
  return 0



@pytest.fixture(scope='module', params=[True, False], ids=['kept', 'resent'])
def context(workers, request):
  context = distributed.DistributedContext(workers.addresses, connect_timeout=60,
                                           keep_round_values=request.param)
  yield context
  context.close()


def _gm_process():
  return passwise.PasswiseFactory(aggregation_cases.FACTORIES['gm']()).create(
      cases.VALUE_TYPE, cases.WEIGHT_TYPE)


def test_an_iterative_aggregate_sends_each_update_once_per_round(context, monkeypatch):
  rounds = [aggregation_cases.round_of_clients(seed=seed) for seed in (1, 11)]
  expected = aggregation_cases.single_process_rounds('gm', rounds)
  process = _gm_process()
  calls = process.computations_per_call
  assert calls == 7  # R = 3 passes, each with its scale pass, and the last one.
  requests = _Requests(monkeypatch)
  with tff.framework.get_context_stack().install(context):
    state = process.initialize()
    for want, (values, weights) in zip(expected, rounds):
      assert len(values) == NUM_CLIENTS
      requests.clear()
      got = process.next(state, values, weights)
      structures.assert_same(got.result, want.result)
      structures.assert_same(got.state, want.state)
      structures.assert_same(got.measurements, want.measurements)
      state = got.state
      sent = requests.members(context.addresses)
      if context.keep_round_values:
        # Each client's update and weight, once, to its own worker.
        assert sent == tuple(2 * shard for shard in SHARDS)
        # ... and freed there when the round ends.
        for address in context.addresses:
          assert requests.client_refs[address] <= requests.disposed[address]
      else:
        # Resent: with every call, and the first shard again for the part after the
        # merge.
        assert sent == (2 * calls * 2 * SHARDS[0], 2 * calls * SHARDS[1])


# The kept values only: the resent path of a learning round is the aggregate's
# (above) plus the datasets, which both paths send alike.
@pytest.mark.parametrize('context', [True], ids=['kept'], indirect=True)
def test_a_learning_process_sends_no_update(context, monkeypatch):
  process = learning_cases.PROCESSES['rfa'][0]()
  requests = _Requests(monkeypatch)
  state = process.initialize()
  want = process.next(state, learning_cases.client_datasets(1))
  with tff.framework.get_context_stack().install(context):
    requests.clear()
    got = process.next(state, learning_cases.client_datasets(1))
  structures.assert_same(got.state, want.state)
  structures.assert_same(got.metrics, want.metrics)
  sent = requests.members(context.addresses)
  # The clients' datasets, for training; no update, weight or per-client metric after
  # it.
  assert sent == SHARDS
  for address in context.addresses:
    assert requests.client_refs[address] <= requests.disposed[address]


def test_a_resident_value_is_used_in_its_shards_only():
  pieces = [resident_values._Piece(None, None, 4), resident_values._Piece(None, None, 3)]  # pylint: disable=protected-access
  value = resident_values.ResidentValue(tff.FederatedType(np.float32, tff.CLIENTS), pieces)
  assert value.cardinality == {tff.CLIENTS: 7}
  assert value[0:4] is pieces[0] and value[4:7] is pieces[1]
  with pytest.raises(ValueError, match='not one worker'):
    value[0:3]  # pylint: disable=pointless-statement
