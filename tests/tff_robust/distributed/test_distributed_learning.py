"""Issue 39: every learning process tff_robust builds runs on workers as written.

`process.next(state, client_data)` inside `tff_robust.distributed.
distributed_execution(...)` over two local workers equals the single process to 1e-6
(state and every metric, two rounds): RFA, one-step RFA, the γ-mean, secure centered
clipping and GMA. Those TFF cannot merge as one computation run their pass-by-pass
equivalent; the others run as they are. Also: the context returns per-client results
in client order, splits arguments whose CLIENTS-placed value comes first, refuses an
unregistered multi-pass computation with a hint, serves the README's snippet and
authenticated (mutual TLS) workers, and personalized RFA's aggregation.
"""

import asyncio
import functools
import importlib.util
import os
import re
import signal
import subprocess
import sys

import numpy as np
import portpicker
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tff_robust.common.tff_private import mergeable_comp_compiler

from tests.helpers import structures
import tff_robust
from tff_robust import distributed
from tff_robust.aggregators import centered_clipping
from tff_robust.aggregators import gamma_mean
from tff_robust.aggregators import geometric_median
from tff_robust.aggregators import gradient_masking
from tff_robust.aggregators import nonfinite
from tff_robust.distributed import distributed_context
from tff_robust.distributed import passwise
from tff_robust.distributed import worker_credentials
from tff_robust.distributed import worker_launcher
from tff_robust.learning import personalization

# Starts worker processes and trains: not in the `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

# Generous: a worker that hangs fails the test instead of the session; nothing here
# waits a fixed time for something to happen.
_HANG = 300
INPUT_SPEC = (tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([None], tf.int32))


def keras_model():
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(4,)),
      tf.keras.layers.Dense(3, kernel_initializer='zeros'),
  ])


def model_fn():
  return tff.learning.models.from_keras_model(
      keras_model(), input_spec=INPUT_SPEC,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])


def client_arrays(seed, num_clients=7):
  """Clients of different sizes; the first two learn from flipped labels (their
  updates are outliers, so the robust aggregates move away from the mean)."""
  rng = np.random.default_rng(seed)
  clients = []
  for index, size in enumerate(rng.integers(3, 13, num_clients)):
    x = rng.normal(size=(size, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 1).astype(np.int32)
    if index < 2:
      y = 2 - y
      x *= 5.0
    clients.append((x, y))
  return clients


def client_datasets(seed):
  return [tf.data.Dataset.from_tensor_slices(arrays).batch(4)
          for arrays in client_arrays(seed)]


def _optimizer():
  return tff.learning.optimizers.build_sgdm(learning_rate=0.3)


def _with(factory):
  return lambda: tff_robust.build_process_with_aggregator(
      model_fn, _optimizer(), None, nonfinite.NonfiniteFilteringFactory(factory))


# name → (builds the process, whether TFF merges its `next` as one computation).
PROCESSES = {
    'rfa': (lambda: tff_robust.build_robust_federated_aggregation_process(
        model_fn, _optimizer()), False),
    'rfa_options': (lambda: tff_robust.build_robust_federated_aggregation_process(
        model_fn, _optimizer(),
        tff.learning.optimizers.build_sgdm(learning_rate=1.0, momentum=0.9),
        num_communication_passes=4, nu=1e-6, initial_point='previous',
        report_objective=False,
        client_weighting=tff.learning.ClientWeighting.UNIFORM), False),
    'one_step_rfa': (
        lambda: tff_robust.build_one_step_robust_federated_aggregation_process(
            model_fn, _optimizer()), False),
    # The paper's absolute ν without the objective and the weight cap: a single
    # aggregation (the cap's histogram sum comes before it).
    'one_step_rfa_paper': (
        lambda: tff_robust.build_one_step_robust_federated_aggregation_process(
            model_fn, _optimizer(), nu=geometric_median.PAPER_NU,
            report_objective=False, cap_weights=False), True),
    'gamma_mean': (_with(gamma_mean.GammaMeanFactory(gamma=0.05)), False),
    'secure_centered_clipping': (
        _with(centered_clipping.SecureCenteredClippingFactory(clip_radius=0.5)), False),
    'gma': (_with(gradient_masking.GradientMaskedAveragingFactory()), True),
}


@functools.cache
def _built(name):
  """The learning process `name`, built once per test process (a build traces the
  client update and the aggregation: seconds)."""
  return PROCESSES[name][0]()


def _two_rounds(process):
  state, outputs = process.initialize(), []
  for seed in (1, 2):
    output = process.next(state, client_datasets(seed))
    outputs.append(output)
    state = output.state
  return outputs




# The learning processes whose round on workers differs: the robust process with
# options (server optimizer state, a warm start carried into the next round), one
# computation TFF merges as it is (one-step RFA with the paper's ν, GMA). The default
# robust process on workers is the README snippet's and the authenticated workers'
# test; the aggregators' own differences on workers are tests/tff_robust/distributed/
# test_distributed.py's.
ON_WORKERS = ('rfa_options', 'one_step_rfa_paper', 'gma')


@pytest.mark.parametrize('name', ON_WORKERS)
def test_two_workers_equal_one_process(name, context):
  process, mergeable = _built(name), PROCESSES[name][1]
  assert isinstance(process, tff.learning.templates.LearningProcess)
  expected = _two_rounds(process)
  with tff.framework.get_context_stack().install(context):
    got = _two_rounds(process)
  for want, output in zip(expected, got):
    assert type(output) is type(want)
    assert type(output.state) is type(want.state)
    structures.assert_same(output.state, want.state)
    structures.assert_same(output.metrics, want.metrics)
  assert passwise.equivalent(process.next).mergeable is mergeable
  # Every client counted once (against an independent count, not only the process).
  assert output.metrics['client_work']['train']['num_examples'] == sum(
      len(y) for _, y in client_arrays(2))


# A state as `initialize` returns it, or restored as an OrderedDict or a Struct: `next`
# takes each, and so does its equivalent (before: AttributeError on
# `state.aggregator` for the restored ones).
_STATE_CONTAINERS = {
    'as_initialized': lambda state: state,
    'ordered_dict': lambda state: tff.structure.to_odict(
        tff.structure.from_container(state)),
    'struct': tff.structure.from_container,
}


@pytest.mark.parametrize('name, container', [
    ('rfa', 'as_initialized'), ('gamma_mean', 'ordered_dict'), ('gamma_mean', 'struct')])
def test_the_pass_by_pass_round_equals_the_single_computation_in_one_process(
    name, container):
  # Same TF code in one process: equal to rounding, without workers.
  process = _built(name)
  state = process.initialize()
  data = client_datasets(3)
  want = process.next(state, data)
  got = passwise.equivalent(process.next)((_STATE_CONTAINERS[container](state), data))
  structures.assert_same(got.state, want.state, rtol=1e-7)
  structures.assert_same(got.metrics, want.metrics, rtol=1e-7)


@pytest.mark.parametrize('factory', [geometric_median.GeometricMedianFactory,
                                     gamma_mean.GammaMeanFactory])
def test_an_unregistered_multi_pass_process_is_refused_with_a_hint_first(
    factory, context):
  process = tff.learning.algorithms.build_weighted_fed_avg(
      model_fn, _optimizer(), model_aggregator=factory())
  with tff.framework.get_context_stack().install(context):
    with pytest.raises(ValueError) as error:
      process.next(process.initialize(), client_datasets(1))
  hint, detail = str(error.value).split('\n')
  assert hint.startswith('Build learning processes with '
                         'tff_robust.build_process_with_aggregator')
  assert 'dependent on another' in detail and 'federated_aggregate' in detail
  assert error.value.__cause__ is None and error.value.__suppress_context__


@tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
def _plus_one_and_sum(values):
  plus_one = tff.federated_map(tff.tensorflow.computation(lambda v: v + 1.0), values)
  return plus_one, tff.federated_sum(values)


class _DelayedContext(tff.framework.AsyncContext):
  """A worker that answers after `delay` s (run in this process's own context)."""

  def __init__(self, delay):
    self._delay = delay
    self._local = tff.framework.get_context_stack().current

  async def invoke(self, comp, arg):
    await asyncio.sleep(self._delay)
    return await asyncio.to_thread(self._local.invoke, comp, arg)


def test_per_client_results_come_back_in_client_order():
  # The first worker answers last. TFF 0.87's mergeable context concatenated the
  # shards in the order the workers finished (here: clients 4-6, then 0-3).
  form = mergeable_comp_compiler.compile_to_mergeable_comp_form(_plus_one_and_sum)
  values = [np.float32(v) for v in range(7)]
  shards = distributed_context._shards(  # pylint: disable=protected-access
      values, form.up_to_merge.type_signature.parameter, 2)
  assert shards == [values[:4], values[4:]]
  contexts = [_DelayedContext(0.5), _DelayedContext(0.0)]
  result = asyncio.run(distributed_context._invoke_in_order(  # pylint: disable=protected-access
      form, shards, contexts))
  np.testing.assert_array_equal(np.asarray(result[0]), np.arange(1, 8))
  assert float(result[1]) == 21.0


def test_workers_return_per_client_results_in_client_order(context):
  values = [np.float32(v) for v in range(7)]
  with tff.framework.get_context_stack().install(context):
    plus_one, total = _plus_one_and_sum(values)
  np.testing.assert_array_equal(np.asarray(plus_one), np.arange(1, 8))
  assert total == 21.0


@tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS),
                           tff.FederatedType(np.float32, tff.SERVER))
def _clients_then_server(values, offset):
  return tff.federated_map(tff.tensorflow.computation(lambda a, b: a + b),
                           (tff.federated_sum(values), offset))


def test_a_clients_argument_before_a_server_argument_is_split_once(context):
  # TFF 0.87's own splitting gave the second worker the first clients again here.
  values = [np.float32(v) for v in (1, 2, 4, 8, 16)]
  with tff.framework.get_context_stack().install(context):
    got = _clients_then_server(values, np.float32(100))
  assert got == 131.0


README_SNIPPET = re.compile(r'## Several workers and machines\n\n```python\n(.*?)```',
                            re.S)


def test_the_readme_snippet_runs_rfa_as_written():
  with open('README.md') as f:
    snippet = README_SNIPPET.search(f.read()).group(1)
  assert 'build_robust_federated_aggregation_process' in snippet
  client_data = client_datasets(4)
  namespace = dict(tff_robust=tff_robust, tff=tff, model_fn=model_fn,
                   client_data=client_data)
  exec(snippet, namespace)  # pylint: disable=exec-used
  process = namespace['process']
  want = process.next(process.initialize(), client_data)
  structures.assert_same(namespace['output'].state, want.state)
  structures.assert_same(namespace['output'].metrics, want.metrics)


@pytest.fixture(scope='module')
def deployment(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp('deployment'))
  worker_credentials.make(directory)
  return directory


@pytest.fixture
def worker_image(tmp_path):
  """What a worker's machine or container needs (docs/distributed.md, Deployment):
  a Python without site-packages (`-S`) that finds only the TFF package's files (its
  self-contained worker_binary; TFF is never imported) and tff_robust: no
  TensorFlow, no numpy, no grpc, no cryptography."""
  root = tmp_path / 'worker_image'
  root.mkdir()
  tff_package = os.path.dirname(importlib.util.find_spec('tensorflow_federated').origin)
  os.symlink(tff_package, root / 'tensorflow_federated')
  os.symlink(os.path.dirname(tff_robust.__file__), root / 'tff_robust')
  return str(root)


def test_rfa_on_authenticated_workers_equals_one_process(deployment, worker_image,
                                                         tmp_path):
  process = _built('rfa')
  expected = _two_rounds(process)
  ports = [portpicker.pick_unused_port() for _ in range(2)]
  logs = [str(tmp_path / f'worker_{port}.log') for port in ports]
  launchers = []
  try:
    for port, log in zip(ports, logs):
      with open(log, 'wb') as out:
        launchers.append(worker_launcher.start_worker(
            sys.executable, ['-S', '-m', 'tff_robust.distributed', f'--port={port}',
                             '--listen_host=127.0.0.1',
                             f'--tls_cert={deployment}/worker.pem',
                             f'--tls_key={deployment}/worker.key',
                             f'--tls_client_ca={deployment}/ca.pem'],
            cwd=worker_image, env={'PATH': os.environ.get('PATH', '')},
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT))
    for launcher, port in zip(launchers, ports):
      worker_launcher.wait_until_listening(launcher, port, timeout=_HANG)
    with distributed.distributed_execution([f'127.0.0.1:{p}' for p in ports],
                                           credentials=deployment) as context:
      got = _two_rounds(process)
      traffic = context.traffic()
  finally:
    for launcher in launchers:
      launcher.send_signal(signal.SIGINT)
    for launcher in launchers:
      launcher.wait(_HANG)
  for log in logs:
    with open(log) as f:
      assert 'accepted a driver from 127.0.0.1:' in f.read()
  assert all(sent > 0 and received > 0 for sent, received in traffic.values())
  for want, output in zip(expected, got):
    structures.assert_same(output.state, want.state)
    structures.assert_same(output.metrics, want.metrics)


def test_personalized_rfa_aggregates_on_workers(context):
  # Personalized client work is eager TF on the driver (no TFF computation: it runs
  # wherever it is called); only the shared updates' aggregation is a TFF
  # computation, and the geometric median's is distributable pass by pass.
  client = personalization.PersonalizationClient(
      keras_model, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  weights = client.initial_weights()
  deltas, sizes = [], []
  for x, y in client_arrays(5):
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    update = client.personalized_rfa_update(client.zeros_like_weights(), weights,
                                            dataset, dataset, learning_rate=0.1)
    deltas.append(update.shared_delta)
    sizes.append(np.float32(len(y)))
  value_type = tff.types.to_type([(w.dtype, w.shape) for w in weights])
  factory = geometric_median.GeometricMedianFactory()
  fused = factory.create(value_type, tff.TensorType(np.float32))
  want = fused.next(fused.initialize(), deltas, sizes)
  with tff.framework.get_context_stack().install(context):
    with pytest.raises(ValueError, match='dependent on another'):
      fused.next(fused.initialize(), deltas, sizes)
    pass_by_pass = passwise.PasswiseFactory(factory).create(
        value_type, tff.TensorType(np.float32))
    got = pass_by_pass.next(pass_by_pass.initialize(), deltas, sizes)
  structures.assert_same(got.result, want.result)
  structures.assert_same(got.measurements, want.measurements)
