"""Bytes per call and worker of RFA's process.next on two mutual-TLS workers."""
import collections, json, sys, tempfile
import numpy as np, tensorflow as tf, tensorflow_federated as tff
import tff_robust
from tff_robust import distributed
from tff_robust.distributed import execution, worker_credentials

SPEC = (tf.TensorSpec([None, 784], tf.float32), tf.TensorSpec([None], tf.int32))
def model_fn():
  keras = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(784,)), tf.keras.layers.Dense(62)])
  return tff.learning.models.from_keras_model(keras, input_spec=SPEC,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.default_rng(0)
clients = [(rng.normal(size=(20, 784)).astype(np.float32), rng.integers(0, 62, 20).astype(np.int32)) for _ in range(10)]
data_bytes = sum(x.nbytes + y.nbytes for x, y in clients)
datasets = [tf.data.Dataset.from_tensor_slices(c).batch(10) for c in clients]
process = tff_robust.build_robust_federated_aggregation_process(model_fn, tff.learning.optimizers.build_sgdm(0.1))
calls = []
orig_invoke = execution.DistributedContext.invoke
orig_keep = execution.DistributedContext.invoke_keeping
def snap(ctx): return {a: tuple(v) for a, v in ctx.traffic().items()}
def delta(a, b): return {k: (b[k][0] - a[k][0], b[k][1] - a[k][1]) for k in a}
def invoke(self, comp, arg):
  d = getattr(self, '_depth', 0); self._depth = d + 1
  try:
    before = snap(self); r = orig_invoke(self, comp, arg)
    if d >= 1: calls.append(('invoke', str(comp.type_signature)[:70], delta(before, snap(self))))
    return r
  finally: self._depth = d
def keeping(self, comp, arg, keep):
  before = snap(self); r = orig_keep(self, comp, arg, keep); calls.append(('train', '', delta(before, snap(self)))); return r
execution.DistributedContext.invoke_keeping = keeping
creds = tempfile.mkdtemp(); worker_credentials.make(creds)
with distributed.private_local_execution() as driver:
  model_bytes = sum(np.asarray(w).nbytes for w in process.get_model_weights(process.initialize()).trainable)
  with distributed.LocalWorkers(int(sys.argv[2]) if len(sys.argv) > 2 else 2, credentials=worker_credentials.Credentials.worker(creds)) as w:
    with distributed.distributed_execution(w.addresses, credentials=creds, merge_context=driver.async_context if sys.argv[1] == 'driver' else None) as ctx:
      state = process.initialize()
      state = process.next(state, datasets).state   # warm-up
      execution.DistributedContext.invoke = invoke
      calls.clear(); before = snap(ctx)
      process.next(state, datasets)
      total = delta(before, snap(ctx))
      execution.DistributedContext.invoke = orig_invoke
print(json.dumps(dict(model_bytes=model_bytes, data_bytes=data_bytes, total=total, calls=calls)))
