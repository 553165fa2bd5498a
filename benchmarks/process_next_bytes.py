r"""The bytes a learning process's `next` sends to and receives from each worker: RFA's
process on mutual-TLS local workers, per computation and worker.

  .venv/bin/python -m benchmarks.process_next_bytes [--workers=2] [--merge=driver]

EMNIST's linear model (784 → 62: M = 194,680 bytes), --clients clients of 20 random
examples each (3,140 bytes an example: 628,000 bytes a round for 10), RFA with its
defaults (R = 3 passes, the relative ν: K = 7 aggregation calls), the datasets sent
by the driver (`process.next(state, client_datasets)`). One warm-up round, then one
measured round: `DistributedContext.traffic()` (serialized gRPC messages, both
ways) around each computation the round runs on the workers. --merge=driver merges
the workers' partial sums in the driver's own context (`private_local_execution`'s
`async_context`, as `tasks.binaries.train --workers` does), --merge=worker on the
first worker (`DistributedContext`'s default). Prints one JSON line: the model and
data bytes, the round's totals per worker (sent to it, received from it) and every
computation's.
"""

import collections
import json
import tempfile

from absl import flags
import numpy as np

from tasks.binaries import exit_status
from tff_robust.distributed import worker_credentials

_WORKERS = flags.DEFINE_integer('workers', 2, 'Local mutual-TLS workers.')
_CLIENTS = flags.DEFINE_integer('clients', 10, 'Clients per round.')
_MERGE = flags.DEFINE_enum('merge', 'driver', ['driver', 'worker'],
                           'Where the partial sums are merged.')


def _model_fn():
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  import tensorflow_federated as tff
  keras_model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(784,)),
                                     tf.keras.layers.Dense(62)])
  return tff.learning.models.from_keras_model(
      keras_model, input_spec=(tf.TensorSpec([None, 784], tf.float32),
                               tf.TensorSpec([None], tf.int32)),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def _clients(num_clients):
  rng = np.random.default_rng(0)
  return [(rng.normal(size=(20, 784)).astype(np.float32),
           rng.integers(0, 62, 20).astype(np.int32)) for _ in range(num_clients)]


class _Recorder:
  """Each computation's traffic, recorded around `DistributedContext`'s calls (the
  computations `next`'s pass-by-pass equivalent runs, not `next` itself)."""

  def __init__(self):
    self.calls = []
    self._depth = 0

  def _delta(self, context, before):
    after = context.traffic()
    return {a: (after[a][0] - before[a][0], after[a][1] - before[a][1]) for a in after}

  def invoke(self, original):
    recorder = self

    def invoke(context, comp, arg):
      depth, recorder._depth = recorder._depth, recorder._depth + 1
      try:
        before = context.traffic()
        result = original(context, comp, arg)
        if depth:
          recorder.calls.append((str(comp.type_signature)[:60],
                                 recorder._delta(context, before)))
        return result
      finally:
        recorder._depth = depth
    return invoke

  def invoke_keeping(self, original):
    recorder = self

    def invoke_keeping(context, comp, arg, keep):
      before = context.traffic()
      result = original(context, comp, arg, keep)
      recorder.calls.append(('training', recorder._delta(context, before)))
      return result
    return invoke_keeping


def main(argv):
  del argv
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  import tensorflow_federated as tff
  import tff_robust
  from tff_robust import distributed
  clients = _clients(_CLIENTS.value)
  datasets = [tf.data.Dataset.from_tensor_slices(c).batch(10) for c in clients]
  process = tff_robust.build_robust_federated_aggregation_process(
      _model_fn, tff.learning.optimizers.build_sgdm(0.1))
  credentials = tempfile.mkdtemp()
  worker_credentials.make(credentials)
  recorder = _Recorder()
  with distributed.private_local_execution() as driver:
    state = process.initialize()
    model_bytes = sum(np.asarray(w).nbytes
                      for w in process.get_model_weights(state).trainable)
    with distributed.LocalWorkers(
        _WORKERS.value,
        credentials=worker_credentials.Credentials.worker(credentials)) as workers:
      merge_context = driver.async_context if _MERGE.value == 'driver' else None
      with distributed.distributed_execution(
          workers.addresses, credentials=credentials,
          merge_context=merge_context) as context:
        state = process.next(state, datasets).state  # Warm-up.
        cls = distributed.DistributedContext
        originals = cls.invoke, cls.invoke_keeping
        cls.invoke = recorder.invoke(originals[0])
        cls.invoke_keeping = recorder.invoke_keeping(originals[1])
        try:
          before = context.traffic()
          process.next(state, datasets)
          after = context.traffic()
        finally:
          cls.invoke, cls.invoke_keeping = originals
  totals = collections.OrderedDict(
      (a, (after[a][0] - before[a][0], after[a][1] - before[a][1])) for a in after)
  print(json.dumps(dict(
      workers=_WORKERS.value, merge=_MERGE.value, model_bytes=model_bytes,
      data_bytes=sum(x.nbytes + y.nbytes for x, y in clients),
      sent=sum(s for s, _ in totals.values()),
      received=sum(r for _, r in totals.values()), per_worker=list(totals.values()),
      calls=[(name, list(t.values())) for name, t in recorder.calls])), flush=True)


if __name__ == '__main__':
  exit_status.run(main)
