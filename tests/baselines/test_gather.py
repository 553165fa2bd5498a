"""The gathering machinery against plain numpy: rows in client order, clients of weight
0 left out, within and beyond the queue's capacity, and merged accumulators."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from baselines import gather

_NUM_PARAMETERS = 4
_VALUE_TYPE = tff.TensorType(np.float32, [_NUM_PARAMETERS])
_WEIGHT_TYPE = tff.TensorType(np.float32)


def _accumulated(steps, values, weights):
  to_row, zero, accumulate, _, _ = steps
  accumulator = zero()
  for value, weight in zip(values, weights):
    accumulator = accumulate(accumulator, to_row(value, weight))
  return accumulator


def _clients(num_clients, seed):
  rng = np.random.default_rng(seed)
  values = rng.normal(size=[num_clients, _NUM_PARAMETERS]).astype(np.float32)
  weights = rng.integers(1, 5, size=num_clients).astype(np.float32)
  return values, weights


class GatheringStepsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('within_capacity', 8),
      ('at_capacity', 5),
      ('beyond_capacity', 3),
      ('capacity_one', 1),
  )
  def test_report_is_every_row_of_positive_weight_in_client_order(self, capacity):
    values, weights = _clients(5, seed=capacity)
    weights[[1, 3]] = 0.0
    steps = gather.gathering_steps(_VALUE_TYPE, _WEIGHT_TYPE, capacity)
    report = steps[4]

    gathered = report(_accumulated(steps, values, weights))

    kept = weights > 0
    np.testing.assert_array_equal(gathered['values'], values[kept])
    np.testing.assert_array_equal(gathered['weights'], weights[kept])

  def test_no_client_gives_an_empty_matrix(self):
    steps = gather.gathering_steps(_VALUE_TYPE, _WEIGHT_TYPE, capacity=2)
    gathered = steps[4](steps[1]())
    self.assertEqual(gathered['values'].shape, (0, _NUM_PARAMETERS))
    self.assertEqual(gathered['weights'].shape, (0,))

  @parameterized.named_parameters(('within_capacity', 6), ('beyond_capacity', 2))
  def test_merge_keeps_both_sides_in_order(self, capacity):
    values, weights = _clients(7, seed=7)
    weights[4] = 0.0
    steps = gather.gathering_steps(_VALUE_TYPE, _WEIGHT_TYPE, capacity)
    merge, report = steps[3], steps[4]

    merged = merge(_accumulated(steps, values[:3], weights[:3]),
                   _accumulated(steps, values[3:], weights[3:]))
    gathered = report(merged)

    kept = weights > 0
    np.testing.assert_array_equal(gathered['values'], values[kept])
    np.testing.assert_array_equal(gathered['weights'], weights[kept])


class ByColumnBlocksTest(parameterized.TestCase):

  @parameterized.parameters(1, 3, 10, 64)
  def test_equals_the_function_on_the_whole_matrix(self, block):
    matrix = np.random.default_rng(block).normal(size=[5, 10]).astype(np.float32)
    median_of = lambda columns: tf.sort(columns, axis=0)[2]

    @tf.function(input_signature=[tf.TensorSpec([None, 10], tf.float32)])
    def blockwise(values):
      return gather.by_column_blocks(median_of, values, block)

    np.testing.assert_array_equal(blockwise(matrix), np.median(matrix, axis=0))

  def test_no_column(self):
    result = gather.by_column_blocks(lambda c: tf.reduce_sum(c, axis=0),
                                     tf.zeros([3, 0]), block=4)
    self.assertEqual(result.shape, (0,))


if __name__ == '__main__':
  absltest.main()
