"""Tasks of your own: `Task.from_keras`, the checks of the `Task` protocol and loading
a task by import path, each problem refused with a message naming it and the fix."""

import collections
import re
import dataclasses
import textwrap

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import builders
from tasks.builders import task as task_lib
from tasks.builders import user_tasks

_FEATURES, _CLASSES = 4, 3


def _model(features=_FEATURES, classes=_CLASSES):
  return lambda: tf.keras.Sequential([tf.keras.Input(shape=(features,)),
                                      tf.keras.layers.Dense(classes)])


def _clients(num_clients=4, labels=None):
  rng = np.random.default_rng(0)
  return {f'c{i}': (rng.normal(size=(5 + i, _FEATURES)).astype(np.float32),
                    (np.arange(5 + i) % _CLASSES if labels is None else
                     labels(5 + i)).astype(np.int32))
          for i in range(num_clients)}


def _task(**changes):
  task = builders.Task.from_keras(
      'tiny', _model(), tff.simulation.datasets.TestClientData(_clients()),
      tff.simulation.datasets.TestClientData(_clients(2)),
      data_attacks={'flip': lambda dataset: dataset})
  return dataclasses.replace(task, **changes)


def _data(clients):
  return tff.simulation.datasets.TestClientData(clients)


class FromKerasTest(parameterized.TestCase):

  def test_a_task_from_keras_follows_the_protocol(self):
    task = _task()
    builders.check_task(task)
    self.assertEqual(task.client_weights, {'c0': 5.0, 'c1': 6.0, 'c2': 7.0, 'c3': 8.0})
    self.assertEqual(task.client_spec, builders.ClientSpec())
    with tf.Graph().as_default():
      model = task.model_fn()
      self.assertIsInstance(model, tff.learning.models.VariableModel)
    self.assertEqual(task.element_spec[0].shape.as_list(), [None, _FEATURES])

  def test_one_test_dataset_is_the_test_client(self):
    x, y = _clients(1)['c0']
    task = builders.Task.from_keras(
        'tiny', _model(), _data(_clients()), tf.data.Dataset.from_tensor_slices((x, y)))
    self.assertEqual(task.test_data.client_ids, ['test'])
    batches = list(task.centralized_test_dataset(batch_size=100))
    np.testing.assert_array_equal(batches[0][1], y)

  def test_given_weights_are_kept(self):
    task = builders.Task.from_keras('tiny', _model(), _data(_clients(2)),
                                    _data(_clients(2)),
                                    client_weights={'c0': 1.0, 'c1': 3.0})
    self.assertEqual(task.client_weights, {'c0': 1.0, 'c1': 3.0})

  @parameterized.named_parameters(
      ('empty_name', dict(name=''), 'name must be a non-empty string'),
      ('model_not_a_function', dict(keras_model_fn=tf.keras.Sequential()),
       'keras_model_fn is a Keras model, not a function building one .* Fix: pass a '
       'function building a fresh Keras model, e.g. lambda: tf.keras.Sequential'),
      ('train_data_a_dict', dict(train_data=_clients()),
       'train_data is a dict, not a tff.simulation.datasets.ClientData. Fix: wrap '
       'per-client arrays as tff.simulation.datasets.TestClientData'),
      ('test_data_a_list', dict(test_data=[1, 2]),
       r'test_data is \[1, 2\], not a tff.simulation.datasets.ClientData or a '
       'tf.data.Dataset'),
  )
  def test_bad_arguments_are_named(self, changes, message):
    arguments = dict(name='tiny', keras_model_fn=_model(), train_data=_data(_clients()),
                     test_data=_data(_clients(2)))
    arguments.update(changes)
    with self.assertRaisesRegex(builders.TaskError, r'Task\.from_keras: ' + message):
      builders.Task.from_keras(**arguments)

  @parameterized.named_parameters(
      ('image_digit', ('image', 'digit'), "e['image'], e['digit']"),
      ('label_first', ('label', 'features'), "e['features'], e['label']"),
      ('tutorials', ('pixels', 'label'), "e['pixels'], e['label']"))
  def test_dict_elements_get_a_fix_with_their_own_keys(self, keys, pair):
    x_key, y_key = keys
    data = tff.simulation.datasets.TestClientData({'c0': collections.OrderedDict([
        (x_key, np.zeros((3, _FEATURES), np.float32)) if x_key != 'label' else
        (x_key, np.zeros(3, np.int32)),
        (y_key, np.zeros(3, np.int32)) if x_key != 'label' else
        (y_key, np.zeros((3, _FEATURES), np.float32))])})
    with self.assertRaisesRegex(builders.TaskError, re.escape(pair)):
      builders.Task.from_keras('tiny', _model(), data, data)


def _dict_elements():
  return tff.simulation.datasets.TestClientData(
      {'c0': collections.OrderedDict(x=np.zeros((3, _FEATURES), np.float32),
                                     y=np.zeros(3, np.int32))})


def _model_fn_of(keras_model_fn, features=_FEATURES):
  spec = (tf.TensorSpec([None, features], tf.float32), tf.TensorSpec([None], tf.int32))
  return lambda: tff.learning.models.from_keras_model(
      keras_model_fn(), loss=tf.keras.losses.SparseCategoricalCrossentropy(True),
      input_spec=spec)


def _unbuilt_model():
  return tf.keras.Sequential([tf.keras.layers.Dense(_CLASSES)])


class CheckTaskTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('keras_model_fn_a_model', dict(keras_model_fn=_model()()),
       r'Task\.keras_model_fn is a Keras model, not a function building one'),
      ('keras_model_fn', dict(keras_model_fn=None),
       r"Task\.keras_model_fn is None, not callable\. Fix: pass a function building "
       'a fresh Keras model'),
      ('model_fn', dict(model_fn='model'), r"Task\.model_fn is 'model', not callable"),
      ('loss_fn', dict(loss_fn=3), r'Task\.loss_fn is 3, not callable'),
      ('train_data', dict(train_data=None),
       r'Task\.train_data is None, not a tff\.simulation\.datasets\.ClientData\. Fix'),
      ('test_data', dict(test_data=np.zeros(3)),
       r'Task\.test_data is .*, not a tff\.simulation\.datasets\.ClientData'),
      ('client_spec', dict(client_spec=dict(batch_size=3)),
       r'Task\.client_spec is a dict, not a tasks\.builders\.ClientSpec\. Fix'),
      ('data_attacks_not_a_mapping', dict(data_attacks=['flip']),
       r"Task\.data_attacks is \['flip'\], not a mapping"),
      ('data_attack_not_callable', dict(data_attacks={'flip': 1}),
       r"Task\.data_attacks\['flip'\] is 1, not callable"),
      ('missing_weight', dict(client_weights={'c0': 1.0}),
       r"Task\.client_weights has no weight for clients 'c1', 'c2', 'c3' of "
       'train_data. Fix: give every client id'),
      ('extra_weight',
       dict(client_weights={'c0': 1, 'c1': 1, 'c2': 1, 'c3': 1, 'stranger': 1}),
       r"Task\.client_weights has weights of clients 'stranger' not in train_data"),
      ('negative_weight', dict(client_weights={'c0': -1, 'c1': 1, 'c2': 1, 'c3': 1}),
       r"Task\.client_weights\['c0'\] is -1, not a finite number ≥ 0"),
      ('nan_weight', dict(client_weights={'c0': float('nan'), 'c1': 1, 'c2': 1,
                                          'c3': 1}),
       r"Task\.client_weights\['c0'\] is nan"),
      ('zero_weights', dict(client_weights={'c0': 0, 'c1': 0, 'c2': 0, 'c3': 0}),
       r'Task\.client_weights are all 0'),
      ('dict_elements', dict(train_data=_dict_elements(),
                             client_weights={'c0': 3.0}),
       r"Task\.train_data's elements are .*, not \(x, y\) pairs\. Fix: map them to "
       r'\(x, y\) pairs, e\.g\. train_data\.preprocess'),
      ('string_labels', dict(train_data=_data({'c0': (np.zeros((2, _FEATURES),
                                                               np.float32),
                                                      np.array([b'a', b'b']))}),
                             client_weights={'c0': 2.0}),
       r"Task\.train_data's labels y are string\[\], not one tensor of integer class "
       'ids'),
      ('label_vectors', dict(train_data=_data({'c0': (np.zeros((2, _FEATURES),
                                                               np.float32),
                                                      np.zeros((2, 3), np.int32))}),
                             client_weights={'c0': 2.0}),
       r"Task\.train_data's labels y have shape \(3,\), not \(\) or \(1,\)"),
      ('test_elements_differ', dict(test_data=_data({'c0': (np.zeros((2, 7),
                                                                     np.float32),
                                                            np.zeros(2, np.int32))})),
       r"Task\.test_data's elements \(float32\[7\], int32\[\]\) are not "
       r"Task\.train_data's \(float32\[4\], int32\[\]\)"),
      ('not_a_keras_model', dict(keras_model_fn=lambda: 'model'),
       r"Task\.keras_model_fn\(\) returned 'model', not a tf\.keras\.Model"),
      ('unbuilt_keras_model', dict(keras_model_fn=_unbuilt_model),
       r'the model of Task\.keras_model_fn\(\) has no trainable weights when made '
       r'.* Fix: give it its input shape'),
      ('input_shape_differs', dict(keras_model_fn=_model(features=7)),
       r"the model of Task\.keras_model_fn\(\) cannot take a batch of train_data's x \(float32\[4\] per example\): .* Fix: "
       'give the model the input shape of x'),
      ('one_logit', dict(keras_model_fn=_model(classes=1)),
       r'the model of Task\.keras_model_fn\(\) returns float32\[5, 1\] for a batch,'
       r' not float logits \[batch, num_classes\] '
       'with num_classes ≥ 2'),
      ('labels_beyond_the_logits', dict(keras_model_fn=_model(classes=2)),
       r'train_data has the label 2 but the model of Task\.keras_model_fn\(\) has 2 '
       'logits'),
      ('model_fn_not_a_model', dict(model_fn=lambda: 'model'),
       r"Task\.model_fn\(\) returned 'model', not a "
       r'tff\.learning\.models\.VariableModel'),
      ('model_fn_input_spec', dict(model_fn=_model_fn_of(_model(features=7), 7)),
       r"Task\.model_fn\(\)'s input_spec \(float32\[None, 7\], int32\[None\]\) does "
       r"not take train_data's batches \(float32\[None, 4\], int32\[None\]\)"),
      ('model_fn_other_variables', dict(model_fn=_model_fn_of(lambda: (
          tf.keras.Sequential([tf.keras.Input(shape=(_FEATURES,)),
                               tf.keras.layers.Dense(8),
                               tf.keras.layers.Dense(_CLASSES)])))),
       r"Task\.model_fn\(\)'s trainable variables .* are not those of "
       r"Task\.keras_model_fn\(\)'s model .* Fix: build model_fn from keras_model_fn"),
  )
  def test_a_broken_field_is_named_with_the_fix(self, changes, message):
    with self.assertRaisesRegex(builders.TaskError,
                                r"^the task \('tiny'\): " + message):
      builders.check_task(_task(**changes), 'the task')

  def test_an_empty_name(self):
    with self.assertRaisesRegex(builders.TaskError, r'^the task: Task\.name must be a '
                                'non-empty string, got None'):
      builders.check_task(_task(name=None), 'the task')

  def test_not_a_task(self):
    with self.assertRaisesRegex(
        builders.TaskError, r'^the value of m:f\(\) is a builtins\.dict, not a '
        r'tasks\.builders\.Task\. Fix: build the task with '
        r'tasks\.builders\.Task\.from_keras'):
      builders.check_task({'name': 'tiny'}, 'the value of m:f()')

  def test_a_data_attack_may_not_take_an_update_attack_name(self):
    with self.assertRaisesRegex(builders.TaskError, r"names one 'alie', the name of an "
                                r"update attack .* Fix: rename it, e\.g\. 'alie_data'"):
      builders.check_task(_task(data_attacks={'alie': lambda d: d}),
                          reserved_attack_names=('none', 'alie'))

  def test_a_regression_task_passes(self):
    rng = np.random.default_rng(0)
    clients = {'c0': (rng.normal(size=(4, 2)).astype(np.float32),
                      rng.normal(size=(4, 1)).astype(np.float32))}
    task = builders.Task.from_keras(
        'regression', lambda: tf.keras.Sequential([tf.keras.Input(shape=(2,)),
                                                   tf.keras.layers.Dense(1)]),
        _data(clients), _data(clients), loss_fn=tf.keras.losses.MeanSquaredError)
    builders.check_task(task)

  def test_every_built_in_task_passes(self):
    for name, spec in builders.known_tasks().items():
      for model in spec['models']:
        builders.check_task(builders.build_task(name, model, source='synthetic'))


_GOOD_MODULE = '''
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tasks import builders

CALLS = []

def clients(seed):
  rng = np.random.default_rng(seed)
  return {f'c{i}': (rng.normal(size=(4, 2)).astype(np.float32),
                    np.arange(4, dtype=np.int32) % 2) for i in range(5)}

def build(seed=0):
  CALLS.append(seed)
  data = tff.simulation.datasets.TestClientData(clients(seed))
  return builders.Task.from_keras(
      'mine', lambda: tf.keras.Sequential([tf.keras.Input(shape=(2,)),
                                           tf.keras.layers.Dense(2)]),
      data, data, client_spec=builders.ClientSpec(batch_size=2, shuffle_buffer_size=7))

def build_without_seed():
  CALLS.append(None)
  return build(3)

class Namespace:
  build = staticmethod(build)

def returns_a_dict():
  return {'name': 'mine'}

def raises():
  raise RuntimeError('my own bug')

NOT_A_FUNCTION = 3
'''


@pytest.fixture
def module(tmp_path, monkeypatch, request):
  """A module of tasks importable by a name unique to the test."""
  name = ''.join(c if c.isalnum() else '_' for c in f'tasks_of_{request.node.name}')
  (tmp_path / f'{name}.py').write_text(textwrap.dedent(_GOOD_MODULE))
  monkeypatch.syspath_prepend(str(tmp_path))
  return name


def test_a_task_is_loaded_with_the_data_seed(module):
  task = builders.load_task(f'{module}:build', seed=5)
  assert task.name == 'mine'
  imported = __import__(module)
  assert imported.CALLS == [5]
  assert dict(task.provenance) == {'task': f'{module}:build', 'seed': 5,
                                   'num_clients': None}


def test_a_function_without_seed_is_called_without_arguments(module):
  builders.load_task(f'{module}:build_without_seed', seed=5)
  assert __import__(module).CALLS == [None, 3]


def test_a_dotted_attribute_is_followed(module):
  assert builders.load_task(f'{module}:Namespace.build').name == 'mine'


def test_client_spec_and_num_clients_apply(module):
  task = builders.load_task(f'{module}:build', seed=1,
                            client_spec=builders.ClientSpec(3, 4, max_elements=6),
                            num_clients=2)
  assert task.client_spec == builders.ClientSpec(3, 4, max_elements=6,
                                                 shuffle_buffer_size=7)
  assert len(task.train_data.client_ids) == 2
  assert set(task.client_weights) == set(task.train_data.client_ids)
  assert len(task.test_data.client_ids) == 5  # The test data stays whole.
  builders.check_task(task)
  again = builders.load_task(f'{module}:build', seed=1, num_clients=2)
  assert again.train_data.client_ids == task.train_data.client_ids


def test_what_the_function_raises_is_raised_as_it_is(module):
  with pytest.raises(RuntimeError, match='my own bug'):
    builders.load_task(f'{module}:raises')


@pytest.mark.parametrize('attribute, message', [
    ('returns_a_dict', r"^the value of {m}:returns_a_dict\(\) is a builtins\.dict, not "
     r'a tasks\.builders\.Task\. Fix'),
    ('NOT_A_FUNCTION', r'^--task={m}:NOT_A_FUNCTION: NOT_A_FUNCTION is 3, not a '
     r'function\. Fix: point --task at a function returning a tasks\.builders\.Task'),
    ('missing', r"^--task={m}:missing: {m} \(.*{m}\.py\) has no attribute 'missing'\. "
     r'Fix: name one of its functions \(.*build, build_without_seed'),
    ('Namespace.missing', r"has no attribute 'Namespace\.missing'"),
])
def test_a_path_to_no_task_is_named(module, attribute, message):
  with pytest.raises(builders.TaskError, match=message.format(m=module)):
    builders.load_task(f'{module}:{attribute}')


@pytest.mark.parametrize('path, message', [
    ('no_such_module_here:build', r"^--task=no_such_module_here:build: no module "
     r"'no_such_module_here' is importable from .* Fix: run from the directory that "
     r'holds no_such_module_here\.py'),
    ('docs.examples.no_such:build', r"no module 'docs\.examples\.no_such' is "
     r'importable'),
    ('my task:build', r'^--task=my task:build is not an import path '
     r'package\.module:function\. Fix: .* e\.g\. --task=docs\.examples\.my_task:'
     'build_task'),
    ('a.b:', r'is not an import path'),
    ('a:b:c', r'is not an import path'),
])
def test_a_path_that_does_not_import_is_named(path, message):
  with pytest.raises(builders.TaskError, match=message):
    builders.load_task(path)


@pytest.mark.parametrize('source, message', [
    ('import not_installed_dependency_xyz\n',
     r"importing {m} failed: it imports 'not_installed_dependency_xyz', which is not "
     r'installed .* Fix: install it'),
    ('raise ValueError("broken at import")\n',
     r'importing {m} raised ValueError: broken at import\. Fix: run `python -c '
     r'"import {m}"` to see the traceback'),
])
def test_a_module_that_fails_to_import_is_named(tmp_path, monkeypatch, request, source,
                                                message):
  name = f'broken_{request.node.callspec.id}'.replace('-', '_').replace(' ', '_')
  name = ''.join(c if c.isalnum() or c == '_' else '_' for c in name)
  (tmp_path / f'{name}.py').write_text(source)
  monkeypatch.syspath_prepend(str(tmp_path))
  with pytest.raises(builders.TaskError, match=message.format(m=name)):
    builders.load_task(f'{name}:build')


def test_the_current_directory_is_searched_as_python_m_does(tmp_path, monkeypatch):
  (tmp_path / 'cwd_only_task_module.py').write_text(textwrap.dedent(_GOOD_MODULE))
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr('sys.path', [p for p in __import__('sys').path if p not in
                                   ('', str(tmp_path))])
  assert user_tasks.resolve('cwd_only_task_module:build').__name__ == 'build'


def test_the_example_task_of_the_docs_follows_the_protocol():
  task = builders.load_task(user_tasks.EXAMPLE, seed=0)
  assert task.name == 'my_task' and list(task.data_attacks) == ['label_flip']
  assert len(task.train_data.client_ids) == 12
  task_lib.check_task(task)
