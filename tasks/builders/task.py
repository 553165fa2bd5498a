"""The `Task` bundle every experiment runs on: model, client data, weights, data attacks.

Modelled on `tff.simulation.baselines.BaselineTask` / `ClientSpec`, but it keeps the
*raw* (unbatched) client examples, because the corruption harness poisons raw examples
before the usual shuffle / repeat / batch preprocessing.

The built-in tasks come from `tasks.builders.build_task`; a task of your own is a
`Task` too, most simply `Task.from_keras(...)`, run by the binaries as
`--task=package.module:function` (`tasks.builders.user_tasks`, docs/tasks.md).
"""

import dataclasses
from typing import Any, Callable, Mapping, Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import catalog
from tasks.builders import models
from tff_robust.common import teardown
from tff_robust.common import tff_private

# Importing this module moves TFF's finalizer of its idle local worker manager late
# enough in the interpreter's teardown to fail ("Exception ignored ... 'Popen'"):
# disarmed at exit (`tff_robust.common.teardown`).
teardown.disarm_idle_managers_at_exit()



TaskError = catalog.TaskError


@dataclasses.dataclass(frozen=True)
class ClientSpec:
  """How a client iterates over its local data in one round.

  Attributes:
    num_epochs: Passes over the local dataset per round.
    batch_size: Local minibatch size.
    max_elements: Cap on the examples a client uses per round, taken after repeating
      for `num_epochs` (as in `tff.simulation.baselines.ClientSpec`); `None` = all.
    shuffle_buffer_size: Shuffle buffer; 1 disables shuffling.
  """
  num_epochs: int = 1
  batch_size: int = 10
  max_elements: Optional[int] = None
  shuffle_buffer_size: int = 1000

  def __post_init__(self):
    for name in ('num_epochs', 'batch_size', 'shuffle_buffer_size'):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f'ClientSpec.{name} must be a positive integer, got {value!r}.')
    if self.max_elements is not None and (
        not isinstance(self.max_elements, (int, np.integer)) or self.max_elements <= 0):
      raise ValueError('ClientSpec.max_elements must be None or a positive integer, '
                       f'got {self.max_elements!r}.')


@dataclasses.dataclass
class Task:
  """A federated task: model, per-client train data, test data and its corruption.

  This is the whole protocol a task follows, the built-in ones and yours alike. The
  simulation (`tasks.simulation.loop.Simulation`) and the binaries
  (`--task=package.module:function`) check it (`tasks.builders.check_task`) and name
  the field at fault and the fix.

  *   Every element of `train_data` and `test_data` is an unbatched `(x, y)` pair
      (a tuple; `x` any tensor or structure of tensors, `y` one tensor), with the
      same element spec in both. For a classification, `y` is an integer class id
      of shape `()` or `(1,)`; float labels make a regression (e.g. with a
      mean-squared-error `loss_fn`), whose accuracy columns mean nothing.
  *   `keras_model_fn()` builds a fresh, uncompiled Keras model, already built (it
      declares its input shape), mapping a batch of `x` to logits
      `[batch, num_classes]`. The simulation initializes the global model from it
      (seeded, so every run of a seed starts from the same weights) and evaluates
      with it: accuracy is the argmax of the logits against `y`, the loss is
      `loss_fn()`.
  *   `model_fn()` is the same model as a `tff.learning.models.VariableModel`, which
      TFF's client work trains; its trainable variables are the Keras model's, in
      the same order and shapes, and its `input_spec` is the batched element spec.
  *   `client_weights[c]` is α_c ≥ 0 (usually the example count) for exactly the ids
      of `train_data`: the weight of client c in the aggregate, and in ρ (the
      corrupted set is drawn until its weight share exceeds ρ).

  `Task.from_keras(name, keras_model_fn, train_data, test_data)` fills in `model_fn`,
  `loss_fn` (sparse categorical cross-entropy on logits), `client_weights` (the
  example counts) and the defaults of the others.

  Attributes:
    name: E.g. `'emnist_linear'`; names the task in run configurations and tables.
    keras_model_fn: Builds a fresh, uncompiled Keras model (logits output).
    model_fn: Builds the `tff.learning.models.VariableModel` (loss +
      `SparseCategoricalAccuracy`), as TFF's learning builders expect.
    loss_fn: Builds the loss on logits (sparse categorical cross-entropy for every
      built-in task); used by the evaluation and the personalized client works.
    train_data: Raw (unbatched) training examples per client; elements are `(x, y)`.
    test_data: Held-out examples, same element format. The global model is
      evaluated on all of them together; the personalized client works evaluate a
      client on its own (same client id), when it has some.
    client_weights: α_i (number of training examples of client i for the built-in
      tasks), for every id of `train_data`.
    client_spec: Local epochs, batch size, cap and shuffle buffer (`preprocess`).
      The binaries set it from --local_epochs, --batch_size and --max_elements.
    data_attacks: The task's data poisonings by attack name, each a function of raw
      element datasets (a corrupted client trains on `attack(its dataset)`); every
      built-in task has 'data', the paper's (RFA paper D.2.1), and may be empty for
      yours. The simulation offers them next to the update attacks of
      `tasks.simulation.attacks`, whose names they must not take.
    provenance: How `tasks.builders.build_task` made the data (source, client cap,
      seed, source options; not the directory, which differs between machines), so
      a results ledger can tell runs on other data apart.
  """
  name: str
  keras_model_fn: Callable[[], tf.keras.Model]
  model_fn: Callable[[], tff.learning.models.VariableModel]
  loss_fn: Callable[[], tf.keras.losses.Loss]
  train_data: tff.simulation.datasets.ClientData
  test_data: tff.simulation.datasets.ClientData
  client_weights: dict[str, float]
  client_spec: ClientSpec
  data_attacks: Mapping[str, Callable[[tf.data.Dataset], tf.data.Dataset]]
  provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @classmethod
  def from_keras(cls, name: str, keras_model_fn: Callable[[], tf.keras.Model],
                 train_data: tff.simulation.datasets.ClientData,
                 test_data: Union[tff.simulation.datasets.ClientData, tf.data.Dataset],
                 *, loss_fn: Optional[Callable[[], tf.keras.losses.Loss]] = None,
                 client_weights: Optional[Mapping[str, float]] = None,
                 client_spec: Optional[ClientSpec] = None,
                 data_attacks: Optional[Mapping[str, Callable[[tf.data.Dataset],
                                                              tf.data.Dataset]]] = None,
                 provenance: Optional[Mapping[str, Any]] = None) -> 'Task':
    """A task of your own from a Keras model constructor and client data.

    Args:
      name: Names the task in run configurations, tables and messages.
      keras_model_fn: Builds a fresh, uncompiled Keras model from a batch of `x` to
        logits `[batch, num_classes]`.
      train_data: A `tff.simulation.datasets.ClientData` of unbatched `(x, y)`
        pairs, e.g. `tff.simulation.datasets.TestClientData({client id: (xs, ys)})`;
        map other elements to pairs with `train_data.preprocess(...)`.
      test_data: The held-out examples: a `ClientData` of the same elements, or one
        `tf.data.Dataset` of them (a single test set, as client 'test').
      loss_fn: Builds the Keras loss on logits; default sparse categorical
        cross-entropy (`from_logits=True`).
      client_weights: α of every training client; default its number of examples
        (each client's dataset is read once to count them).
      client_spec: Local epochs, batch size, cap, shuffle buffer; default
        `ClientSpec()` (the binaries set it from their flags).
      data_attacks: Data poisonings by attack name (a function of a client's raw
        dataset); default none.
      provenance: What a results ledger should know of how the data was made.

    Returns:
      The `Task`; its `model_fn` is `tff.learning.models.from_keras_model` of
      `keras_model_fn()` with the loss and sparse categorical accuracy.

    Raises:
      TaskError: naming the argument that does not fit and the fix.
    """
    origin = 'Task.from_keras'
    if not isinstance(name, str) or not name:
      raise TaskError(f'{origin}: name must be a non-empty string, got {name!r}.')
    _check_callable(origin, 'keras_model_fn', keras_model_fn, 'a function building a '
                    'fresh Keras model, e.g. lambda: tf.keras.Sequential([...])')
    _check_client_data(origin, 'train_data', train_data)
    if isinstance(test_data, tf.data.Dataset):
      dataset = test_data
      test_data = tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
          ['test'], lambda _: dataset)
    _check_client_data(origin, 'test_data', test_data, dataset_too=True)
    if loss_fn is None:
      loss_fn = models.loss_fn
    _check_callable(origin, 'loss_fn', loss_fn, 'a function building a Keras loss on '
                    'logits, e.g. tf.keras.losses.SparseCategoricalCrossentropy')
    element_spec = _pair_spec(origin, 'train_data', train_data)
    if client_weights is None:
      client_weights = {c: float(_count(train_data.create_tf_dataset_for_client(c)))
                        for c in train_data.client_ids}
    return cls(name=name, keras_model_fn=keras_model_fn,
               model_fn=tff_model_fn(keras_model_fn, element_spec, loss_fn),
               loss_fn=loss_fn, train_data=train_data, test_data=test_data,
               client_weights=dict(client_weights),
               client_spec=client_spec or ClientSpec(),
               data_attacks=dict(data_attacks or {}),
               provenance=dict(provenance or {}))

  def preprocess(self, dataset: tf.data.Dataset,
                 shuffle_seeds: Optional[tuple[Any, Any]] = None) -> tf.data.Dataset:
    """Shuffles, repeats `num_epochs` times, caps at `max_elements` and batches.

    `shuffle_seeds`, a pair of int64 scalars (tensors too, e.g. inside a TFF
    computation), are the shuffle's `(seed, seed2)`; default the ones TF derives from
    the global seed, as `Dataset.shuffle` does (`shuffle_seeds` of that dataset).
    """
    spec = self.client_spec
    if spec.shuffle_buffer_size > 1 and shuffle_seeds is not None:
      dataset = _seeded_shuffle(dataset, spec.shuffle_buffer_size, *shuffle_seeds)
    elif spec.shuffle_buffer_size > 1:
      # Unseeded on purpose: a client sees a fresh order (and, with max_elements, a
      # fresh subset) every round. tf.random.set_seed makes whole runs reproducible.
      dataset = dataset.shuffle(spec.shuffle_buffer_size)
    dataset = dataset.repeat(spec.num_epochs)
    if spec.max_elements is not None:
      dataset = dataset.take(spec.max_elements)
    return dataset.batch(spec.batch_size).with_options(_CLIENT_DATASET_OPTIONS)

  def client_dataset(self, client_id: str,
                     data_attack: Optional[str] = None) -> tf.data.Dataset:
    """The preprocessed training data of one client, first poisoned by the data
    attack of that name if one is given."""
    dataset = self.train_data.create_tf_dataset_for_client(client_id)
    if data_attack is not None:
      if data_attack not in self.data_attacks:
        raise ValueError(f'Task {self.name} has no data attack {data_attack!r}; it has '
                         f'{", ".join(self.data_attacks)}.')
      dataset = self.data_attacks[data_attack](dataset)
    return self.preprocess(dataset)

  def centralized_test_dataset(self, batch_size: int = 500,
                               max_examples: Optional[int] = None) -> tf.data.Dataset:
    """All clients' clean test examples, batched (the first `max_examples` if given)."""
    dataset = self.test_data.create_tf_dataset_from_all_clients()
    if max_examples is not None:
      dataset = dataset.take(max_examples)
    return dataset.batch(batch_size)

  @property
  def element_spec(self):
    """The element spec of batched client datasets (TFF's `input_spec`)."""
    return self.preprocess(self.train_data.create_tf_dataset_for_client(
        self.train_data.client_ids[0])).element_spec


def _client_dataset_options() -> tf.data.Options:
  """Without tf.data's default graph rewrites (fusions, injected prefetches): each
  rewrites a client's pipeline again every time TFF's runtime iterates it, a sixth of
  a linear round's training, for a few dozen elements that gain nothing from them.
  They never change the elements or their order (tests/tasks/builders/test_task.py)."""
  options = tf.data.Options()
  options.experimental_optimization.apply_default_optimizations = False
  options.autotune.enabled = False
  return options


_CLIENT_DATASET_OPTIONS = _client_dataset_options()


def _seeded_shuffle(dataset: tf.data.Dataset, buffer_size: int, seed,
                    seed2) -> tf.data.Dataset:
  """`dataset.shuffle(buffer_size)` with the op's two seeds given (tensors allowed):
  the same op, arguments and order as the eager `Dataset.shuffle` whose `get_seed`
  returned them (TF's public `shuffle(seed=...)` takes one seed, the op two)."""
  variant = tf.raw_ops.ShuffleDatasetV3(
      input_dataset=tf.data.experimental.to_variant(dataset),
      buffer_size=tf.constant(buffer_size, tf.int64),
      seed=tf.cast(seed, tf.int64), seed2=tf.cast(seed2, tf.int64),
      seed_generator=tf.raw_ops.DummySeedGenerator(), reshuffle_each_iteration=True,
      output_types=[s.dtype for s in tf.nest.flatten(dataset.element_spec)],
      output_shapes=[s.shape for s in tf.nest.flatten(dataset.element_spec)])
  return tf.data.experimental.from_variant(variant, dataset.element_spec)


def shuffle_seeds(dataset: tf.data.Dataset) -> Optional[tuple[int, int]]:
  """The `(seed, seed2)` of the one shuffle in `dataset`'s pipeline (as built in
  Python by `Task.preprocess`), None if it has none.

  Reads the Python dataset objects' own fields (TF has no public accessor): the
  seeds TF drew from the global seed when the dataset was built.

  Raises:
    ValueError: if the pipeline shuffles more than once.
  """
  found = tff_private.shuffle_seeds(dataset)
  if len(found) > 1:
    raise ValueError(f'The client dataset shuffles {len(found)} times; expected once.')
  return found[0] if found else None


def tff_model_fn(keras_model_fn: Callable[[], tf.keras.Model], element_spec,
                 loss_fn: Callable[[], tf.keras.losses.Loss] = models.loss_fn
                 ) -> Callable[[], tff.learning.models.VariableModel]:
  """TFF's `model_fn` of a Keras model constructor: `from_keras_model` with the
  batched unbatched-`(x, y)` `element_spec` as input spec, `loss_fn()` and sparse
  categorical accuracy (how every task's `model_fn` is made)."""
  input_spec = tf.nest.map_structure(
      lambda spec: tf.TensorSpec([None, *spec.shape], spec.dtype), tuple(element_spec))

  def model_fn() -> tff.learning.models.VariableModel:
    return tff.learning.models.from_keras_model(
        keras_model_fn(), loss=loss_fn(), input_spec=input_spec,
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])

  return model_fn


_FIX = 'build the task with tasks.builders.Task.from_keras(...) (docs/tasks.md)'
# Tasks that passed `check_task`, by id (kept, so the id is not reused): a sweep runs
# dozens of simulations of one task.
_CHECKED: dict[int, 'Task'] = {}


def check_task(task: Any, origin: str = 'the task', *,
               reserved_attack_names: tuple[str, ...] = (), deep: bool = True) -> None:
  """Checks that `task` follows the `Task` protocol (see `Task`).

  Args:
    task: The task to check.
    origin: What the task is, for messages, e.g. 'the task of --task=m:build_task'.
    reserved_attack_names: Names a data attack must not take (the update attacks).
    deep: Also build the models: the Keras model on a batch of training data (the
      element spec, the logits' shape, the labels' range) and `model_fn`'s model
      (input spec, the same trainable variables). A task object's models are
      checked once (a sweep runs dozens of simulations of one task).

  Raises:
    TaskError: naming the field at fault and the fix.
  """
  if not isinstance(task, Task):
    hint = ''
    if type(task).__name__ == 'BaselineTask':
      hint = (' (a tff.simulation.baselines.BaselineTask has no Keras model to '
              'initialize and evaluate with)')
    raise TaskError(f'{origin} is a {type(task).__module__}.{type(task).__qualname__}'
                    f', not a tasks.builders.Task{hint}. Fix: {_FIX}.')
  where = f'{origin} ({task.name!r})'
  if not isinstance(task.name, str) or not task.name:
    raise TaskError(f'{origin}: Task.name must be a non-empty string, got '
                    f'{task.name!r}.')
  for field, what in (('keras_model_fn', 'a function building a fresh Keras model'),
                      ('model_fn', 'a function building a tff.learning.models.'
                       'VariableModel'),
                      ('loss_fn', 'a function building a Keras loss on logits')):
    _check_callable(where, f'Task.{field}', getattr(task, field), what)
  _check_client_data(where, 'Task.train_data', task.train_data)
  _check_client_data(where, 'Task.test_data', task.test_data)
  if not isinstance(task.client_spec, ClientSpec):
    raise TaskError(f'{where}: Task.client_spec is a {type(task.client_spec).__name__}'
                    ', not a tasks.builders.ClientSpec. Fix: pass ClientSpec(num_epochs'
                    '=..., batch_size=...) or leave it to Task.from_keras.')
  _check_data_attacks(where, task.data_attacks, reserved_attack_names)
  _check_client_weights(where, task)
  element_spec = _pair_spec(where, 'Task.train_data', task.train_data)
  test_spec = _pair_spec(where, 'Task.test_data', task.test_data)
  if not _compatible(test_spec, element_spec):
    raise TaskError(f'{where}: Task.test_data\'s elements {_describe(test_spec)} are '
                    f'not Task.train_data\'s {_describe(element_spec)}. Fix: give both '
                    'the same (x, y) elements (dtypes and shapes).')
  if deep and _CHECKED.get(id(task)) is not task:
    _check_models(where, task, element_spec)
    _CHECKED[id(task)] = task


def _check_callable(where: str, field: str, value: Any, what: str) -> None:
  if isinstance(value, tf.keras.Model):
    raise TaskError(f'{where}: {field} is a Keras model, not a function building one '
                    '(every run, and the evaluation, needs a fresh model). Fix: pass '
                    f'{what}.')
  if not callable(value):
    raise TaskError(f'{where}: {field} is {_short(value)}, not callable. Fix: pass '
                    f'{what}.')


def _short(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= 60 else f'a {type(value).__name__}'


def _check_client_data(where: str, field: str, value: Any,
                       dataset_too: bool = False) -> None:
  if not isinstance(value, tff.simulation.datasets.ClientData):
    also = ' or a tf.data.Dataset' if dataset_too else ''
    raise TaskError(
        f'{where}: {field} is {_short(value)}, not a tff.simulation.datasets.'
        f'ClientData{also}. Fix: wrap per-client arrays as tff.simulation.datasets.'
        'TestClientData({client_id: (xs, ys)}), or a function of the client id as '
        'ClientData.from_clients_and_tf_fn(client_ids, dataset_fn).')
  if not list(value.client_ids):
    raise TaskError(f'{where}: {field} has no client. Fix: give it at least one '
                    'client id with examples.')


def _pair_spec(where: str, field: str, data: tff.simulation.datasets.ClientData):
  """The `(x, y)` element spec of `data`; a TaskError unless its elements are such
  pairs with one label tensor (integer class ids of shape () or (1,), or floats)."""
  spec = data.element_type_structure
  x_key, y_key = _feature_and_label_keys(spec)
  fix = (f'map them to (x, y) pairs, e.g. {field.split(".")[-1]}.preprocess(lambda ds: '
         f'ds.map(lambda e: (e[{x_key!r}], e[{y_key!r}])))')
  if not isinstance(spec, (tuple, list)) or len(spec) != 2:
    raise TaskError(f'{where}: {field}\'s elements are {_describe(spec)}, not (x, y) '
                    f'pairs. Fix: {fix}.')
  label = spec[1]
  if not isinstance(label, tf.TensorSpec) or not (label.dtype.is_integer or
                                                  label.dtype.is_floating):
    raise TaskError(f'{where}: {field}\'s labels y are {_describe(label)}, not one '
                    'tensor of integer class ids (or of floats, for a regression). '
                    'Fix: map y to an integer class id, e.g. tf.cast(y, tf.int32).')
  if label.dtype.is_integer and (label.shape.rank is None or label.shape.rank > 1 or (
      label.shape.rank == 1 and label.shape[0] != 1)):
    raise TaskError(f'{where}: {field}\'s labels y have shape {label.shape}, not () or '
                    '(1,): one class id per example. Fix: '
                    f'{field.split(".")[-1]}.preprocess(lambda ds: ds.map(lambda x, y: '
                    '(x, tf.reshape(y, [])))).')
  return tuple(spec)


_LABEL_KEYS = ('label', 'labels', 'y', 'target', 'targets', 'class')


def _feature_and_label_keys(spec) -> tuple[str, str]:
  """The keys a fix should name for elements that are mappings (the label's by its
  usual names, else the last key); TFF's tutorials' ('pixels', 'label') otherwise."""
  if not isinstance(spec, Mapping) or len(spec) < 2:
    return 'pixels', 'label'
  keys = [str(k) for k in spec]
  y_key = next((k for k in keys if k.lower() in _LABEL_KEYS), keys[-1])
  return next(k for k in keys if k != y_key), y_key


def _describe(spec) -> str:
  """An element spec as `(float32[28, 28], int32[])` or `{x: float32[4], ...}`."""
  if isinstance(spec, tf.TensorSpec):
    return f'{spec.dtype.name}{list(spec.shape)}'
  if isinstance(spec, Mapping):
    return '{' + ', '.join(f'{k}: {_describe(v)}' for k, v in spec.items()) + '}'
  if isinstance(spec, (tuple, list)):
    return '(' + ', '.join(_describe(v) for v in spec) + ')'
  return type(spec).__name__


def _compatible(spec, reference) -> bool:
  try:
    tf.nest.assert_same_structure(spec, reference, check_types=False)
  except (TypeError, ValueError):
    return False
  return all(isinstance(s, tf.TensorSpec) and isinstance(r, tf.TensorSpec) and
             s.dtype == r.dtype and s.shape.is_compatible_with(r.shape)
             for s, r in zip(tf.nest.flatten(spec), tf.nest.flatten(reference)))


def _check_data_attacks(where: str, data_attacks: Any,
                        reserved: tuple[str, ...]) -> None:
  if not isinstance(data_attacks, Mapping):
    raise TaskError(f'{where}: Task.data_attacks is {_short(data_attacks)}, not a '
                    'mapping. Fix: pass {} or {name: function of a raw client '
                    'dataset}.')
  for name, attack in data_attacks.items():
    if not isinstance(name, str) or not name:
      raise TaskError(f'{where}: Task.data_attacks has the name {name!r}. Fix: name '
                      'each data attack by a non-empty string.')
    if name in reserved:
      raise TaskError(f'{where}: Task.data_attacks names one {name!r}, the name of an '
                      'update attack (or "none"). Fix: rename it, e.g. '
                      f'{name + "_data"!r}.')
    _check_callable(where, f'Task.data_attacks[{name!r}]', attack,
                    'a function of a client\'s raw (x, y) dataset returning the '
                    'poisoned one')


def _check_client_weights(where: str, task: 'Task') -> None:
  weights = task.client_weights
  fix = ('Fix: give every client id of train_data its weight (e.g. its number of '
         'examples), or leave client_weights to Task.from_keras')
  if not isinstance(weights, Mapping):
    raise TaskError(f'{where}: Task.client_weights is {_short(weights)}, not a '
                    f'mapping of client id to weight. {fix}.')
  ids = set(task.train_data.client_ids)
  missing = sorted(ids - set(weights))
  extra = sorted(set(weights) - ids)
  if missing or extra:
    problem = (f'has no weight for clients {_few(missing)} of train_data' if missing
               else f'has weights of clients {_few(extra)} not in train_data (they '
               'would count in the corrupted share ρ)')
    raise TaskError(f'{where}: Task.client_weights {problem}. {fix}.')
  for client, weight in weights.items():
    try:
      value = float(weight)
    except (TypeError, ValueError):
      value = float('nan')
    if not np.isfinite(value) or value < 0:
      raise TaskError(f'{where}: Task.client_weights[{client!r}] is {weight!r}, not a '
                      f'finite number ≥ 0. {fix}.')
  if not sum(float(w) for w in weights.values()) > 0:
    raise TaskError(f'{where}: Task.client_weights are all 0. {fix}.')


def _few(ids: list[str]) -> str:
  shown = ', '.join(repr(c) for c in ids[:3])
  return shown + (f' and {len(ids) - 3} more' if len(ids) > 3 else '')


def _first_batch(task: 'Task'):
  """A batch of training examples of the first client that has one (of ten), or None."""
  for client_id in list(task.train_data.client_ids)[:10]:
    dataset = task.train_data.create_tf_dataset_for_client(client_id)
    for batch in dataset.batch(task.client_spec.batch_size).take(1):
      return batch
  return None


def _check_models(where: str, task: 'Task', element_spec) -> None:
  """Builds the Keras model on a batch of training data and `model_fn`'s model."""
  keras_model = task.keras_model_fn()
  if not isinstance(keras_model, tf.keras.Model):
    raise TaskError(f'{where}: Task.keras_model_fn() returned {_short(keras_model)}, '
                    'not a tf.keras.Model. Fix: return a fresh, uncompiled Keras model '
                    '(e.g. tf.keras.Sequential([...])).')
  if not keras_model.built or not keras_model.trainable_variables:
    raise TaskError(f'{where}: the model of Task.keras_model_fn() has no trainable '
                    'weights when made (the simulation initializes the global model '
                    'from them). Fix: give it its input shape, e.g. '
                    'tf.keras.Input(shape=...) first, so that it is built when made.')
  batch = _first_batch(task)
  if batch is not None:
    x, y = batch
    try:
      logits = keras_model(x, training=False)
    except Exception as e:  # pylint: disable=broad-except
      raise TaskError(
          f'{where}: the model of Task.keras_model_fn() cannot take a batch of '
          f'train_data\'s x ({_describe(element_spec[0])} per example): '
          f'{_one_line(e)}. Fix: give the model the input shape of x.') from e
    shape = (_describe(tf.TensorSpec.from_tensor(logits))
             if isinstance(logits, tf.Tensor) else _short(logits))
    classification = element_spec[1].dtype.is_integer
    if (not isinstance(logits, tf.Tensor) or logits.shape.rank != 2 or
        not logits.dtype.is_floating or (classification and logits.shape[1] < 2)):
      raise TaskError(
          f'{where}: the model of Task.keras_model_fn() returns {shape} for a batch, '
          'not float logits [batch, num_classes]' +
          (' with num_classes ≥ 2' if classification else '') + '. Fix: end the '
          'model with tf.keras.layers.Dense(num_classes), without a softmax.')
    num_classes = int(logits.shape[1])
    labels = np.asarray(y).ravel()
    outside = labels[(labels < 0) | (labels >= num_classes)] if classification else []
    if len(outside):
      raise TaskError(
          f'{where}: train_data has the label {int(outside[0])} but the model of '
          f'Task.keras_model_fn() has {num_classes} logits (class ids 0..'
          f'{num_classes - 1}). Fix: give the last layer one unit per class.')
  with tf.Graph().as_default():
    model = task.model_fn()
    if not isinstance(model, tff.learning.models.VariableModel):
      raise TaskError(f'{where}: Task.model_fn() returned {_short(model)}, not a '
                      'tff.learning.models.VariableModel. Fix: wrap the Keras model '
                      'with tff.learning.models.from_keras_model(...), or leave '
                      'model_fn to Task.from_keras.')
    batched = tf.nest.map_structure(
        lambda s: tf.TensorSpec([None, *s.shape], s.dtype), element_spec)
    if not _compatible(model.input_spec, batched):
      raise TaskError(f'{where}: Task.model_fn()\'s input_spec '
                      f'{_describe(model.input_spec)} does not take train_data\'s '
                      f'batches {_describe(batched)}. Fix: pass input_spec=<that> to '
                      'from_keras_model, or leave model_fn to Task.from_keras.')
    tff_shapes = [(tuple(v.shape), v.dtype.base_dtype.name)
                  for v in model.trainable_variables]
  keras_shapes = [(tuple(v.shape), v.dtype.base_dtype.name)
                  for v in keras_model.trainable_variables]
  if tff_shapes != keras_shapes:
    raise TaskError(f'{where}: Task.model_fn()\'s trainable variables {tff_shapes} are '
                    f'not those of Task.keras_model_fn()\'s model {keras_shapes}. Fix: '
                    'build model_fn from keras_model_fn (Task.from_keras does).')


def _one_line(error: BaseException, limit: int = 300) -> str:
  text = ' '.join(str(error).split()) or type(error).__name__
  return text if len(text) <= limit else text[:limit - 1] + '…'


def _count(dataset: tf.data.Dataset) -> int:
  cardinality = int(dataset.cardinality())
  if cardinality >= 0:
    return cardinality
  return int(dataset.reduce(np.int64(0), lambda count, _: count + 1))
