"""`Task.preprocess`: the client datasets' pipeline."""

from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tasks import builders
from tasks.builders import task as task_lib


class ClientDatasetOptionsTest(parameterized.TestCase):

  @parameterized.parameters(
      dict(task='emnist', model='linear', spec=builders.ClientSpec(2, 10)),
      dict(task='emnist', model='linear',
           spec=builders.ClientSpec(1, 4, max_elements=9, shuffle_buffer_size=20)),
      dict(task='shakespeare', model='lstm', spec=builders.ClientSpec(1, 4)),
      dict(task='sent140', model='linear', spec=builders.ClientSpec(1, 8)))
  def test_without_default_rewrites_the_elements_and_their_order_are_kept(
      self, task, model, spec):
    built = builders.build_task(task, model, source='synthetic', client_spec=spec,
                                num_clients=3)

    def elements(options):
      with mock.patch.object(task_lib, '_CLIENT_DATASET_OPTIONS', options):
        tf.random.set_seed(7)  # The same shuffle seeds for both pipelines.
        return [list(built.client_dataset(c).as_numpy_iterator())
                for c in built.train_data.client_ids]

    rewritten = elements(tf.data.Options())  # tf.data's defaults.
    kept = elements(task_lib._CLIENT_DATASET_OPTIONS)  # pylint: disable=protected-access
    self.assertEqual(len(kept), len(rewritten))
    for client_kept, client_rewritten in zip(kept, rewritten):
      self.assertLen(client_kept, len(client_rewritten))
      self.assertNotEmpty(client_kept)
      for batch_kept, batch_rewritten in zip(client_kept, client_rewritten):
        tf.nest.map_structure(np.testing.assert_array_equal, batch_kept,
                              batch_rewritten)

  def test_the_options_are_those_of_the_client_datasets(self):
    built = builders.build_task('emnist', 'linear', source='synthetic', num_clients=2)
    options = built.client_dataset(built.train_data.client_ids[0]).options()
    self.assertFalse(options.experimental_optimization.apply_default_optimizations)


if __name__ == '__main__':
  absltest.main()
