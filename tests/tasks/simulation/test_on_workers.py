"""tasks.simulation.on_workers: one round with the clients split over two local
workers (127.0.0.1) equals the single-process round, mergeable and pass by pass."""

import numpy as np
import pytest

from tasks import builders
from tasks import registry
from tasks.simulation import loop
from tasks.simulation import on_workers
from tests.helpers import processes
from tff_robust import distributed

# Starts subprocesses (binaries, benchmarks or worker processes): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

RELATIVE_TOLERANCE = 1e-6
# The harness's two paths on workers: a mergeable round (FedAvg's mean) and a round
# whose aggregate runs pass by pass (the GM). Every secure aggregator's passes on
# workers are tests/tff_robust/distributed/test_distributed.py's.
AGGREGATORS = {
    'mean': {},  # FedAvg.
    'gm': dict(num_communication_passes=3),
}


@pytest.fixture(scope='module')
def task():
  # No shuffling: both simulations train on identical batches.
  return builders.build_task('emnist', 'linear', source='synthetic', num_clients=12,
                             client_spec=builders.ClientSpec(1, 10, shuffle_buffer_size=1))


@pytest.fixture(scope='module')
def context():
  with distributed.LocalWorkers(2) as workers:
    context = distributed.DistributedContext(workers.addresses)
    yield context  # Not installed: the single-process reference runs locally.
    context.close()
    pids = workers.pids
  assert not processes.running(pids)


def _round(simulation):
  return simulation.run_round(simulation.initial_state(), round_num=0)


def _close(actual, expected):
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  return np.linalg.norm(actual - expected) <= RELATIVE_TOLERANCE * max(
      np.linalg.norm(expected), 1e-30)


@pytest.mark.parametrize('name', sorted(AGGREGATORS))
def test_a_round_on_two_workers_equals_the_single_process_round(name, task, context):
  kwargs = dict(attack='omniscient', rho=0.2, clients_per_round=6, seed=3)
  factory = registry.aggregator_from_name(name, **AGGREGATORS[name])
  expected_state, expected = _round(loop.Simulation(task, factory, **kwargs))
  simulation = on_workers.DistributedSimulation(
      task, factory, context=context, **kwargs)
  state, metrics = _round(simulation)

  for got, want in zip(state['model']['trainable'], expected_state['model']['trainable']):
    assert _close(got, want), name
  assert list(metrics) == list(expected)
  for key, want in expected.items():
    assert _close(metrics[key], want), (key, metrics[key], want)


def test_round_failure_names_the_worker_and_the_round(task):
  factory = registry.aggregator_from_name('one_step_gm')
  with distributed.LocalWorkers(2) as workers:
    with distributed.distributed_execution(workers.addresses,
                                           unavailable_timeout=2.0) as context:
      simulation = on_workers.DistributedSimulation(
          task, factory, context=context, clients_per_round=4)
      state, _ = simulation.run_round(simulation.initial_state(), 0)
      workers.kill(0)
      with pytest.raises(on_workers.WorkerRoundError,
                         match=rf'Round 1 failed: TFF worker {workers.addresses[0]}'):
        simulation.run_round(state, 1)
    pids = workers.pids
  assert not processes.running(pids)


def test_the_context_must_be_distributed(task):
  with pytest.raises(TypeError, match='DistributedContext'):
    on_workers.DistributedSimulation(
        task, registry.aggregator_from_name('mean'), context=object())


@pytest.mark.parametrize('data_on_workers', [True, False])
def test_workers_reading_clients_by_id_train_on_the_drivers_batches(data_on_workers,
                                                                     context):
  # Shuffled, capped, and a data attack: the workers must draw the driver's batches.
  task = builders.build_task('emnist', 'linear', source='synthetic', num_clients=12,
                             client_spec=builders.ClientSpec(2, 5, max_elements=20))
  kwargs = dict(attack='data', rho=0.25, clients_per_round=6, seed=1)
  factory = registry.aggregator_from_name('gm', num_communication_passes=2)
  simulation = loop.Simulation(task, factory, **kwargs)
  expected_state, expected = simulation.run_round(simulation.initial_state(), 2)
  assert expected['num_corrupted_clients'] > 0
  simulation = on_workers.DistributedSimulation(
      task, factory, context=context, data_on_workers=data_on_workers, **kwargs)
  state, metrics = simulation.run_round(simulation.initial_state(), 2)

  for got, want in zip(state['model']['trainable'],
                       expected_state['model']['trainable']):
    assert _close(got, want)
  for key, want in expected.items():
    assert _close(metrics[key], want), (key, metrics[key], want)
