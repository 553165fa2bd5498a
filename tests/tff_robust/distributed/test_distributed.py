"""tff_robust.distributed and tff_robust.distributed.passwise: aggregations with their clients split
over two local worker_binary processes (127.0.0.1) equal the single-process result."""

import os
import shutil
import signal
import time

import grpc
import numpy as np
import pytest
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import executor_pb2

from baselines import wrappers
from tests.helpers import aggregator_cases as cases
from tests.helpers import processes
from tests.helpers import structures
from tff_robust.aggregators import centered_clipping
from tff_robust import distributed
from tff_robust.aggregators import gamma_mean
from tff_robust.aggregators import geometric_median
from tff_robust.aggregators import gradient_masking
from tff_robust.aggregators import nonfinite
from tff_robust.distributed import passwise
from tff_robust.distributed import resident_values
from tff_robust.distributed import worker_connection

# Starts subprocesses (binaries, benchmarks or worker processes): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow


def _filtered(build):
  """As `tasks.registry` builds them: the non-finite filter in front (the inputs hold
  a NaN client)."""
  return lambda: nonfinite.NonfiniteFilteringFactory(build())


FACTORIES = {
    'mean': _filtered(wrappers.mean_factory),  # FedAvg's mean.
    'gm': _filtered(lambda: geometric_median.GeometricMedianFactory(
        num_communication_passes=3, tolerance=0.0)),
    'gm_warm_start': _filtered(lambda: geometric_median.GeometricMedianFactory(
        num_communication_passes=3, tolerance=0.0, initial_point='previous')),
    'gm_tolerance_freezes': _filtered(lambda: geometric_median.GeometricMedianFactory(
        num_communication_passes=4, nu=1e-6, tolerance=0.5)),
    'one_step_gm': _filtered(geometric_median.one_step_geometric_median_factory),
    'gamma_mean': _filtered(lambda: gamma_mean.GammaMeanFactory(gamma=0.05)),
    'gamma_mean_diagonal_from_gm': _filtered(lambda: gamma_mean.GammaMeanFactory(
        gamma=0.5, covariance='diagonal', initial_point='geometric_median')),
    'gma': _filtered(gradient_masking.GradientMaskedAveragingFactory),
    # Radius 5: the outliers are clipped, most of the others are not.
    'secure_cclip_previous': _filtered(
        lambda: centered_clipping.SecureCenteredClippingFactory(clip_radius=5.0)),
    'secure_cclip_mean': _filtered(lambda: centered_clipping.SecureCenteredClippingFactory(
        clip_radius=5.0, num_iterations=2, initial_point='mean')),
    'secure_cclip_zero': _filtered(lambda: centered_clipping.SecureCenteredClippingFactory(
        clip_radius=5.0, num_iterations=1, initial_point='zero')),
}


def round_of_clients(seed=0, num_clients=7, nonfinite=True):
  rng = np.random.default_rng(seed)
  matrix = rng.normal(size=(num_clients, cases.DIMENSION))
  matrix[:2] += 20.0  # Outliers, so the robust passes move.
  weights = rng.integers(1, 20, num_clients).astype(np.float32)
  values = [cases.to_struct(row) for row in matrix]
  if nonfinite:
    values[-1]['kernel'][0, 0] = np.nan  # Dropped and counted.
  return values, list(weights)


def single_process_rounds(name, rounds):
  """Outputs of one round per `(values, weights)` of `rounds`, the state carried."""
  process = cases.process(('distributed', name), FACTORIES[name])
  state, outputs = process.initialize(), []
  for values, weights in rounds:
    output = process.next(state, values, weights)
    outputs.append(output)
    state = output.state
  return outputs


def test_an_unweighted_factory_runs_pass_by_pass_ignoring_the_weights():
  values, weights = round_of_clients(nonfinite=False)
  process = passwise.PasswiseFactory(tff.aggregators.UnweightedMeanFactory()).create(
      cases.VALUE_TYPE, tff.TensorType(np.float32))
  got = process.next(process.initialize(), values, weights)
  reference = tff.aggregators.UnweightedMeanFactory().create(cases.VALUE_TYPE)
  structures.assert_same(got.result,
                         reference.next(reference.initialize(), values).result)


# One case per kind of client-to-server aggregation a pass sends to the workers: the
# plain mean, a GM's sums, maximum, histograms and inner means, a chain of two
# iterative aggregates (the γ-mean from the GM), an unweighted sum of signs (GMA), and
# a state carried into the next call (secure centered clipping's previous center). The
# other configurations (warm starts, freezing, other starts) differ from these at the
# server only; tests/tff_robust/iterative holds both drivers to each other on them.
ON_WORKERS = ('mean', 'gm', 'gamma_mean_diagonal_from_gm', 'gma', 'secure_cclip_previous')


@pytest.mark.parametrize('name', ON_WORKERS)
def test_two_workers_equal_the_single_process(name, context):
  # The pass-by-pass process in one process, without workers, is held to the fused
  # computation on many more configurations by tests/tff_robust/iterative (both drivers
  # against the golden outputs); here it runs on workers, where it is what is deployed.
  # Other clients in round 2: with the same ones a warm start would begin at their
  # median, where the relative gradient is a rounding-level difference of iterates.
  rounds = [round_of_clients(seed=1), round_of_clients(seed=11)]
  expected = single_process_rounds(name, rounds)
  process = passwise.PasswiseFactory(FACTORIES[name]()).create(
      cases.VALUE_TYPE, cases.WEIGHT_TYPE)
  with tff.framework.get_context_stack().install(context):
    state = process.initialize()
    for want, (values, weights) in zip(expected, rounds):
      got = process.next(state, values, weights)
      structures.assert_same(got.result, want.result)
      structures.assert_same(got.measurements, want.measurements)
      structures.assert_same(got.state, want.state)
      state = got.state


@pytest.mark.parametrize('name', ['gm', 'secure_cclip_previous'])
def test_multi_pass_aggregate_as_one_computation_is_refused_by_the_mergeable_context(
    name, context):
  values, weights = round_of_clients(nonfinite=False)
  process = cases.process(('distributed', name), FACTORIES[name])
  with tff.framework.get_context_stack().install(context):
    with pytest.raises(ValueError, match='dependent'):
      process.next(process.initialize(), values, weights)


def test_one_step_median_without_objective_is_mergeable_as_it_is(context):
  # With the paper's absolute ν one-step RFA is a single aggregation (the relative ν
  # sums its histogram first: that one runs pass by pass).
  values, weights = round_of_clients(seed=2)
  factory = nonfinite.NonfiniteFilteringFactory(
      geometric_median.one_step_geometric_median_factory(
          nu=geometric_median.PAPER_NU, report_objective=False))
  process = factory.create(cases.VALUE_TYPE, cases.WEIGHT_TYPE)
  expected = process.next(process.initialize(), values, weights)
  assert 'objective' not in expected.measurements
  with tff.framework.get_context_stack().install(context):
    got = process.next(process.initialize(), values, weights)
  structures.assert_same(got.result, expected.result)
  structures.assert_same(got.measurements, expected.measurements)


def test_report_objective_false_drops_only_the_objective():
  values, weights = round_of_clients(seed=3)
  process = nonfinite.NonfiniteFilteringFactory(geometric_median.GeometricMedianFactory(
      num_communication_passes=3, tolerance=0.0, report_objective=False)).create(
          cases.VALUE_TYPE, cases.WEIGHT_TYPE)
  output = process.next(process.initialize(), values, weights)
  reference = single_process_rounds('gm', [(values, weights)])[0]
  assert list(output.measurements) == [
      k for k in reference.measurements if k != 'objective']
  structures.assert_same(output.result, reference.result)


def test_a_stopped_worker_is_named_in_the_error():
  values, weights = round_of_clients(seed=4, nonfinite=False)
  process = cases.process(('distributed', 'mean'), FACTORIES['mean'])
  with distributed.LocalWorkers(2) as local:
    with distributed.distributed_execution(local.addresses,
                                           unavailable_timeout=2.0) as context:
      process.next(process.initialize(), values, weights)
      local.kill(1)
      with pytest.raises(distributed.WorkerError, match=local.addresses[1]) as error:
        process.next(process.initialize(), values, weights)
      assert error.value.address == local.addresses[1]
      local.restart(1)  # Back on the same port: the same context goes on.
      # Once its channel has reconnected (not within a fixed time: gRPC's backoff
      # grows while the worker is away, and with the machine's load).
      context.wait_until_connected(timeout=300)
      del context
      got = process.next(process.initialize(), values, weights)
    pids = local.pids
  assert not processes.running(pids)
  want = process.next(process.initialize(), values, weights)
  structures.assert_same(got.result, want.result)


def test_a_dead_worker_fails_the_call_once_and_closing_does_not_wait_for_it():
  # The calls of the failed computation share the worker's deadline, and freeing its
  # state does not wait: before issue 39 each of them waited the timeout again (3 × 10
  # s to the error, 3 × 10 s more in close()).
  timeout = 10.0
  values, weights = round_of_clients(seed=5, nonfinite=False)
  process = passwise.PasswiseFactory(FACTORIES['gm']()).create(
      cases.VALUE_TYPE, cases.WEIGHT_TYPE)
  with distributed.LocalWorkers(2) as local:
    context = distributed.DistributedContext(local.addresses,
                                             unavailable_timeout=timeout)
    try:
      with tff.framework.get_context_stack().install(context):
        state = process.initialize()
        process.next(state, values, weights)
        local.kill(1)
        killed = time.monotonic()
        with pytest.raises(distributed.WorkerError, match=local.addresses[1]):
          process.next(state, values, weights)
        failed = time.monotonic()
    finally:
      context.close()
    closed = time.monotonic()
  assert timeout <= failed - killed < 2 * timeout
  assert closed - failed < timeout


@pytest.mark.filterwarnings('error::pytest.PytestUnhandledThreadExceptionWarning')
def test_calls_on_a_closed_channel_raise_no_grpc_value_error():
  # Issue 54: a program ended by SIGTERM during a call closed its channels while
  # TFF's threads still freed values on them: gRPC's ValueError ("Cannot invoke
  # RPC: Channel closed!") printed as thread tracebacks.
  address = '127.0.0.1:1'
  channel = grpc.insecure_channel(address)
  stub = worker_connection._FailFastStub(address, channel, 1.0)  # pylint: disable=protected-access
  channel.close()
  assert stub.dispose(executor_pb2.DisposeRequest()) is None
  assert stub.dispose_executor(executor_pb2.DisposeExecutorRequest()) is None
  with pytest.raises(distributed.WorkerError, match='closed its channel'):
    stub.compute(executor_pb2.ComputeRequest())


def test_partial_sums_merge_in_the_drivers_own_context(workers):
  # Issue 54: the workers' partial sums were merged on the first worker, which so
  # received every other worker's. With merge_context, no worker runs a merge.
  values, weights = round_of_clients(seed=7, nonfinite=False)
  process = passwise.PasswiseFactory(FACTORIES['gm']()).create(
      cases.VALUE_TYPE, cases.WEIGHT_TYPE)
  merges, on_workers = [], []
  worker_invoke = resident_values.WorkerInvoker.invoke

  async def recording_invoke(self, comp, arg):
    on_workers.append(comp)
    return await worker_invoke(self, comp, arg)

  with distributed.private_local_execution() as driver:
    merge_invoke = driver.async_context.invoke

    async def recording_merge(comp, arg):
      merges.append(comp)
      return await merge_invoke(comp, arg)

    driver.async_context.invoke = recording_merge
    context = distributed.DistributedContext(
        workers.addresses, merge_context=driver.async_context, connect_timeout=60)
    try:
      with pytest.MonkeyPatch.context() as patch:
        patch.setattr(resident_values.WorkerInvoker, 'invoke', recording_invoke)
        with tff.framework.get_context_stack().install(context):
          got = process.next(process.initialize(), values, weights)
    finally:
      context.close()
  # A merge for every pass computation at least (two workers), none on a worker.
  assert len(merges) >= process.computations_per_call
  assert not {id(m) for m in merges} & {id(c) for c in on_workers}
  want = single_process_rounds('gm', [(values, weights)])[0]
  structures.assert_same(got.result, want.result)


# No thread traceback either: gRPC's "Channel closed!" printed twice after such a
# failure (issue 54), from the channel's connectivity watch.
@pytest.mark.filterwarnings('error::pytest.PytestUnhandledThreadExceptionWarning')
@pytest.mark.parametrize('stopped', ['launcher', 'worker_binary'])
def test_a_stopped_worker_fails_the_call_within_the_probe_bound(stopped):
  # Issue 54: a worker stopped by SIGSTOP keeps its connections open; before, the
  # call waited for as long as it was watched. Its forwarder (the launcher) or its
  # binary stopped: no probe is answered, and the call fails within
  # PROBE_INTERVAL + unavailable_timeout (15 s here), allowed twice that on a loaded
  # machine.
  timeout = 10.0
  values, weights = round_of_clients(seed=6, nonfinite=False)
  process = cases.process(('distributed', 'mean'), FACTORIES['mean'])
  with distributed.LocalWorkers(2) as local:
    with distributed.distributed_execution(local.addresses,
                                           unavailable_timeout=timeout) as context:
      process.next(process.initialize(), values, weights)
      pid = local.pids[1] if stopped == 'launcher' else local.binary_pids[1]
      os.kill(pid, signal.SIGSTOP)
      stopped_at = time.monotonic()
      try:
        with pytest.raises(distributed.WorkerError,
                           match=f'{local.addresses[1]}: stopped answering'):
          process.next(process.initialize(), values, weights)
        detected = time.monotonic() - stopped_at
      finally:
        os.kill(pid, signal.SIGCONT)
      # Answering again (once a probe says so: not within a fixed time), the same
      # context goes on.
      context.wait_until_connected(timeout=300)
      got = process.next(process.initialize(), values, weights)
    pids = local.pids
  assert not processes.running(pids)
  print(f'MEASURED stopped {stopped}: the error {detected:.1f} s after SIGSTOP')
  assert timeout <= detected <= 2 * (worker_connection.PROBE_INTERVAL + timeout)
  want = process.next(process.initialize(), values, weights)
  structures.assert_same(got.result, want.result)


def test_local_workers_stop_when_the_block_raises():
  with pytest.raises(KeyError):
    with distributed.LocalWorkers(1) as local:
      pids = local.pids
      assert processes.running(pids) == pids
      log = local.log_path(0)
      raise KeyError('boom')
  assert not processes.running(pids)
  assert os.path.exists(log)  # Kept for the error.
  shutil.rmtree(os.path.dirname(log))


def test_local_workers_remove_their_temporary_logs_when_the_block_ends():
  with distributed.LocalWorkers(1) as local:
    log = local.log_path(0)
    assert os.path.exists(log)
  assert not os.path.exists(os.path.dirname(log))


def test_local_workers_pass_worker_flags_to_the_binary():
  flag = '--max_concurrent_computation_calls=2'
  process = _filtered(wrappers.mean_factory)().create(
      tff.TensorType(np.float32, [3]), tff.TensorType(np.float32))
  values = [np.full(3, i, np.float32) for i in range(5)]
  with distributed.LocalWorkers(1, worker_flags=[flag]) as local:
    with open(f'/proc/{local.binary_pids[0]}/cmdline', 'rb') as f:
      assert flag.encode() in f.read().split(b'\0')
    with distributed.distributed_execution(local.addresses):
      result = process.next(process.initialize(), values, [1.0] * 5).result
  np.testing.assert_array_equal(result, np.full(3, 2.0, np.float32))


@pytest.mark.parametrize('worker_flags, error, message', [
    ('--max_concurrent_computation_calls=2', TypeError, 'a list of flags'),
    (['max_concurrent_computation_calls=2'], ValueError, '--name=value'),
    (['--max_concurrent_computation_calls'], ValueError, '--name=value'),
    (['--port=8000'], ValueError, '--port is not for'),
    (['--tls_cert=a.pem'], ValueError, '--tls_cert is not for'),
    (['--grpc_max_message_length_megabytes=1'], ValueError, 'message size'),
    (['--flagfile=worker.flags'], ValueError, '--flagfile is not for'),
    (['--helpfull=true'], ValueError, '--helpfull is not for')])
def test_bad_worker_flags_are_refused(worker_flags, error, message):
  with pytest.raises(error, match=message):
    distributed.LocalWorkers(1, worker_flags=worker_flags)


@pytest.mark.parametrize('addresses, message', [
    ('', 'at least one'), ('localhost', 'host:port'), ('a:1,a:1', 'repeat'),
    ('a:0', 'host:port'), ('a:port', 'host:port')])
def test_bad_addresses_are_refused(addresses, message):
  with pytest.raises(ValueError, match=message):
    distributed.parse_addresses(addresses)


def test_arguments_are_validated():
  with pytest.raises(ValueError, match='num_workers'):
    distributed.LocalWorkers(0)
  with pytest.raises(ValueError, match='ports'):
    distributed.LocalWorkers(2, ports=[1])
  for name, kwargs in (('num_workers', dict(num_workers=2.0)),
                       ('startup_timeout', dict(num_workers=1, startup_timeout='9')),
                       ('max_message_megabytes',
                        dict(num_workers=1, max_message_megabytes=1.5))):
    with pytest.raises(TypeError, match=f'{name} must be'):
      distributed.LocalWorkers(**kwargs)
  # Checked before any worker is dialled (this port is closed).
  with pytest.raises(TypeError, match='max_message_bytes must be an integer'):
    distributed.DistributedContext(['127.0.0.1:1'], max_message_bytes=1e6)
  with pytest.raises(ValueError, match='max_message_bytes must be < 2'):
    distributed.DistributedContext(['127.0.0.1:1'], max_message_bytes=2**31)
  with pytest.raises(TypeError, match='aggregation factory'):
    passwise.PasswiseFactory(object())
  with pytest.raises(distributed.WorkerError, match='127.0.0.1:1'):
    distributed.DistributedContext(['127.0.0.1:1'], connect_timeout=0.5)


@pytest.mark.parametrize('name', ['connect_timeout', 'unavailable_timeout',
                                  'call_timeout'])
@pytest.mark.parametrize('value, error', [
    (0.0, ValueError), (-1.0, ValueError), (float('inf'), ValueError),
    (float('nan'), ValueError), ('5', TypeError), (True, TypeError)])
def test_timeouts_must_be_finite_positive_numbers(name, value, error):
  # Not the WorkerError that dialling this closed port would raise.
  with pytest.raises(error, match=f'{name} must be a'):
    distributed.DistributedContext(['127.0.0.1:1'], **{name: value})


def test_pass_counts():
  create = lambda f: passwise.PasswiseFactory(f).create(  # pylint: disable=g-long-lambda
      cases.VALUE_TYPE, cases.WEIGHT_TYPE)
  # The trimmed start: the mean, D̄, the radius histogram, the trimmed mean, ν with
  # the near histogram, the restricted step; and the objective.
  assert create(FACTORIES['gm']()).computations_per_call == 7
  assert create(geometric_median.GeometricMedianFactory(
      nu=geometric_median.PAPER_NU)).computations_per_call == 7
  # From zero with the paper's ν: R passes and the objective.
  assert create(geometric_median.GeometricMedianFactory(
      nu=geometric_median.PAPER_NU, initial_point='zero')).computations_per_call == 4
  assert create(geometric_median.one_step_geometric_median_factory(
      report_objective=False)).computations_per_call == 2
  assert create(geometric_median.one_step_geometric_median_factory(
      nu=geometric_median.PAPER_NU, report_objective=False)).computations_per_call == 1
  assert create(FACTORIES['gma']()).computations_per_call == 1
  assert create(FACTORIES['gamma_mean']()).computations_per_call == 4  # mean + S.
  assert create(FACTORIES['secure_cclip_previous']()).computations_per_call == 3  # L.
  assert create(FACTORIES['secure_cclip_mean']()).computations_per_call == 3  # mean + L.

