"""A few rounds of RFA (FedAvg with the geometric median) on every bundled task, with
the task's data attack on one of the 10 clients (10%), a client that trains."""

from unittest import mock

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import builders
from tasks.simulation import evaluation
import tff_robust

# Long training (every bundled task's model: CNNs, an LSTM): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow


def _run_rfa(task, num_rounds, clients_per_round, poisoned_clients=()):
  process = tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=0.05),
      model_aggregator=tff_robust.GeometricMedianFactory())
  state = process.initialize()
  client_ids = task.train_data.client_ids[:clients_per_round]
  results = []
  for _ in range(num_rounds):
    output = process.next(state, [task.client_dataset(c, "data" if c in poisoned_clients else None)
                                  for c in client_ids])
    state = output.state
    results.append((output.metrics, evaluation.evaluate(
        task.keras_model_fn, process.get_model_weights(state),
        task.centralized_test_dataset(max_examples=200))))
  return results


def _all_finite(metrics):
  return all(np.all(np.isfinite(v)) for v in tf.nest.flatten(metrics)
             if np.issubdtype(np.asarray(v).dtype, np.number))


def _same_elements(a, b):
  a, b = tf.nest.flatten(list(a)), tf.nest.flatten(list(b))
  return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


class BundledRfaTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('emnist_linear', 'emnist', 'linear', 2, 3, 20),
      ('emnist_cnn', 'emnist', 'cnn', 1, 2, 6),
      ('emnist_small_cnn', 'emnist', 'small_cnn', 1, 2, 6),
      ('shakespeare_lstm', 'shakespeare', 'lstm', 2, 3, 20),
      ('sent140_linear', 'sent140', 'linear', 2, 3, 20),
  )
  def test_rounds_give_finite_metrics(self, task_name, model, num_rounds,
                                      clients_per_round, max_elements):
    task = builders.build_task(
        task_name, model, 'bundled', num_clients=10, seed=1,
        client_spec=builders.ClientSpec(num_epochs=1, batch_size=5,
                                     max_elements=max_elements))
    poisoned = task.train_data.client_ids[0]
    raw = task.train_data.create_tf_dataset_for_client(poisoned)
    attack = task.data_attacks['data']
    self.assertFalse(_same_elements(attack(raw), raw))
    attacked = []  # The datasets the training rounds poisoned.
    with mock.patch.dict(task.data_attacks,
                         data=lambda dataset: attack(attacked.append(dataset) or dataset)):
      results = _run_rfa(task, num_rounds, clients_per_round, poisoned_clients={poisoned})
    self.assertLen(attacked, num_rounds)
    self.assertLen(results, num_rounds)
    for metrics, test_metrics in results:
      self.assertTrue(_all_finite(metrics), metrics)
      self.assertBetween(test_metrics['accuracy'], 0.0, 1.0)
      self.assertTrue(np.isfinite(test_metrics['loss']))
      self.assertGreater(test_metrics['num_examples'], 0)


if __name__ == '__main__':
  tf.test.main()
