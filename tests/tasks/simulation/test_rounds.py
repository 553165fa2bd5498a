"""The public round (`tasks.simulation.rounds.Round`) on TFF's own pieces: FedAvg's
result without an attack, the per-client updates an attack changed, what reaches the
aggregator and the server, and its arguments refused with their names."""

import collections

from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import builders
from tasks import registry
from tasks.simulation import attacks
from tasks.simulation import client_work as client_work_lib
from tasks.simulation import rounds
import tff_robust

_CLIENTS = 4


def _flat(structure):
  return np.concatenate([np.ravel(np.asarray(t, np.float64))
                         for t in tf.nest.flatten(structure)])


class RoundTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # No shuffling: every round of a test trains on the same batches.
    cls.task = builders.build_task(
        'emnist', 'linear', source='synthetic',
        client_spec=builders.ClientSpec(1, 10, shuffle_buffer_size=1))
    cls.datasets = [cls.task.client_dataset(c)
                    for c in cls.task.train_data.client_ids[:_CLIENTS]]
    cls.client_work = tff.learning.templates.build_model_delta_client_work(
        cls.task.model_fn, tff.learning.optimizers.build_sgdm(learning_rate=0.1),
        tff.learning.ClientWeighting.NUM_EXAMPLES)
    cls.fed_avg = tff.learning.algorithms.build_weighted_fed_avg(
        cls.task.model_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=0.1),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
        model_aggregator=tff.aggregators.MeanFactory())
    cls.initial = cls.fed_avg.get_model_weights(cls.fed_avg.initialize())
    cls.mean_round = rounds.Round(cls.client_work, tff.aggregators.MeanFactory())

  def test_without_an_attack_a_round_is_fedavg(self):
    output = self.mean_round.next(self.mean_round.initialize(self.initial),
                                  self.datasets)
    state = self.fed_avg.initialize()
    expected = self.fed_avg.get_model_weights(
        self.fed_avg.next(state, self.datasets).state)
    np.testing.assert_allclose(_flat(output.model_weights.trainable),
                               _flat(expected.trainable), rtol=1e-5, atol=1e-6)
    self.assertLen(output.updates, _CLIENTS)
    self.assertEqual(output.corrupted.tolist(), [False] * _CLIENTS)
    self.assertEqual(set(output.measurements),
                     {'client_work', 'aggregator', 'server_optimizer'})
    self.assertIn('train', output.measurements['client_work'])
    self.assertGreater(output.client_metrics['train_loss'], 0)

  def test_the_attack_replaces_the_corrupted_updates_that_are_aggregated(self):
    state = self.mean_round.initialize(self.initial)
    honest = self.mean_round.next(state, self.datasets)
    corrupted = [True, False, True, False]
    attacked = self.mean_round.next(
        state, self.datasets, attack=attacks.build_update_attack('sign_flip'),
        corrupted=corrupted, rng=np.random.default_rng(0))
    for i, is_corrupted in enumerate(corrupted):
      np.testing.assert_allclose(_flat(attacked.updates[i]),
                                 (-1 if is_corrupted else 1) * _flat(honest.updates[i]),
                                 rtol=1e-6)
    np.testing.assert_array_equal(attacked.weights, honest.weights)
    # The aggregate is the weighted mean of what the clients sent, and FedAvg's
    # server (SGD, learning rate 1) subtracts it from the model.
    sent = np.stack([_flat(u) for u in attacked.updates])
    mean = attacked.weights @ sent / attacked.weights.sum()
    np.testing.assert_allclose(_flat(attacked.aggregate), mean, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(_flat(attacked.model_weights.trainable),
                               _flat(self.initial.trainable) - mean, rtol=1e-4,
                               atol=1e-6)

  def test_a_robust_factory_sees_the_attack_and_reports(self):
    round_ = rounds.Round(self.client_work, tff_robust.GeometricMedianFactory(),
                          tff.learning.optimizers.build_sgdm(learning_rate=1.0))
    output = round_.next(round_.initialize(self.initial), self.datasets,
                         attack=attacks.build_update_attack('omniscient'),
                         corrupted=[True, False, False, False],
                         rng=np.random.default_rng(0))
    self.assertIn('objective', output.measurements['aggregator'])
    self.assertTrue(rounds.all_finite(output.state))

  def test_a_gathering_aggregator_keeps_the_updates_only_when_asked(self):
    round_ = rounds.Round(self.client_work, registry.aggregator_from_name('median'))
    state = round_.initialize(self.initial)
    kept = round_.next(state, self.datasets)
    dropped = round_.next(state, self.datasets, keep_updates=False)
    self.assertLen(kept.updates, _CLIENTS)
    self.assertIsNone(dropped.updates)
    np.testing.assert_allclose(_flat(kept.aggregate), _flat(dropped.aggregate))
    np.testing.assert_allclose(
        _flat(kept.aggregate),
        np.median(np.stack([_flat(u) for u in kept.updates]), axis=0), rtol=1e-5,
        atol=1e-7)

  def test_an_unweighted_factory_and_a_created_process(self):
    value_type = self.mean_round.model_weights_type.trainable
    for aggregator in (tff.aggregators.UnweightedMeanFactory(),
                       tff.aggregators.UnweightedMeanFactory().create(value_type)):
      round_ = rounds.Round(self.client_work, aggregator)
      output = round_.next(round_.initialize(self.initial), self.datasets)
      mean = np.mean([_flat(u) for u in output.updates], axis=0)
      np.testing.assert_allclose(_flat(output.aggregate), mean, rtol=1e-5, atol=1e-7)

  def test_rounds_of_one_factory_share_its_processes(self):
    # A sweep's runs of one aggregator create and compile it once.
    factory = registry.aggregator_from_name('gm')
    first, second = (rounds.Round(self.client_work, factory) for _ in range(2))
    self.assertIs(first.aggregation, second.aggregation)
    self.assertIs(first.aggregate, second.aggregate)
    other = rounds.Round(self.client_work, registry.aggregator_from_name('gm'))
    self.assertIsNot(other.aggregation, first.aggregation)
    reference = rounds.Round(self.client_work, factory, in_process=False)
    self.assertIsNot(reference.aggregate, first.aggregate)
    outputs = [round_.next(round_.initialize(self.initial), self.datasets)
               for round_ in (first, second, other)]
    for output in outputs[1:]:
      np.testing.assert_array_equal(_flat(output.aggregate),
                                    _flat(outputs[0].aggregate))

  def test_the_round_learning_rate_is_the_client_optimizers(self):
    state = self.mean_round.initialize(self.initial)
    still = self.mean_round.next(state, self.datasets, learning_rate=0.0)
    np.testing.assert_array_equal(_flat(still.updates), 0.0)
    self.assertEqual(float(still.state['client_work']['learning_rate']), 0.0)

  def test_a_variant_of_the_simulation_takes_client_ids(self):
    work = client_work_lib.DittoClientWork(self.task, personal_steps=1)
    round_ = rounds.Round(work, tff.aggregators.MeanFactory(),
                          model_weights_type=self.mean_round.model_weights_type)
    ids = self.task.train_data.client_ids[:2]
    output = round_.next(round_.initialize(self.initial),
                         lambda c: self.task.client_dataset(c), client_ids=ids,
                         learning_rate=0.1)
    self.assertEqual(output.client_metrics['num_personalized_clients'], 2)
    self.assertIn('client_work', output.state)

  def test_too_few_finite_updates_for_krum_name_the_attack(self):
    round_ = rounds.Round(self.client_work,
                          registry.aggregator_from_name('krum', num_byzantine=1))
    state = round_.initialize(self.initial)
    datasets = [self.task.client_dataset(c)
                for c in self.task.train_data.client_ids[:5]]
    with self.assertRaisesRegex(rounds.NonFiniteUpdatesError,
                                r'only 4 of 5 clients sent a finite update.*'
                                r'\(corrupted by the nan attack\)'):
      round_.next(state, datasets, attack=attacks.build_update_attack('nan'),
                  corrupted=[True, False, False, False, False])

  @parameterized.named_parameters(
      ('attack_without_corrupted', dict(attack=attacks.build_update_attack('alie')),
       r'Pass corrupted=\[\.\.\.\] \(one bool per client\) with an attack'),
      ('corrupted_of_another_length', dict(corrupted=[True]),
       r'corrupted has shape \(1,\), one bool per client \(4\) expected'),
      ('ids_of_another_length', dict(client_ids=['a']),
       r'4 datasets for 1 client ids'),
  )
  def test_bad_round_arguments_are_named(self, kwargs, message):
    with self.assertRaisesRegex(ValueError, message):
      self.mean_round.next(self.mean_round.initialize(self.initial), self.datasets,
                           **kwargs)

  def test_a_function_of_the_client_id_needs_the_ids(self):
    with self.assertRaisesRegex(ValueError, 'Pass client_ids='):
      self.mean_round.next(self.mean_round.initialize(self.initial),
                           self.task.client_dataset)

  @parameterized.named_parameters(
      ('client_work', dict(client_work=object()),
       r'client_work must be a tff\.learning\.templates\.ClientWorkProcess or a '
       r'client-work variant'),
      ('aggregator', dict(aggregator='gm'),
       r'aggregator must be an aggregation factory .* got str'),
      ('server_update', dict(server_update=0.1),
       r'server_update must be a tff\.learning\.templates\.FinalizerProcess or a '
       r'tff\.learning\.optimizers\.Optimizer, got float'),
  )
  def test_bad_pieces_are_named(self, changes, message):
    pieces = dict(client_work=self.client_work, aggregator=tff.aggregators.MeanFactory(),
                  server_update=None)
    pieces.update(changes)
    with self.assertRaisesRegex(TypeError, message):
      rounds.Round(**pieces)

  def test_a_variant_needs_the_model_type_and_a_learning_rate(self):
    work = client_work_lib.FedAvgClientWork(self.task)
    with self.assertRaisesRegex(ValueError, 'Pass model_weights_type='):
      rounds.Round(client_work_lib.DittoClientWork(self.task),
                   tff.aggregators.MeanFactory())
    round_ = rounds.Round(work, tff.aggregators.MeanFactory())
    self.assertEqual(
        list(round_.initialize(self.initial)),
        ['model', 'aggregator', 'server_optimizer'])  # FedAvg keeps no client state.
    ditto = rounds.Round(client_work_lib.DittoClientWork(self.task),
                         tff.aggregators.MeanFactory(),
                         model_weights_type=round_.model_weights_type)
    with self.assertRaisesRegex(ValueError, 'DittoClientWork needs the round\'s '
                                'learning_rate='):
      ditto.next(ditto.initialize(self.initial), self.datasets)

  def test_the_state_checkpoints_as_the_simulation_s(self):
    state = self.mean_round.initialize(self.initial)
    self.assertIsInstance(state, collections.OrderedDict)
    self.assertEqual(list(state),
                     ['model', 'client_work', 'aggregator', 'server_optimizer'])
    self.assertEqual(list(state['model']), ['trainable', 'non_trainable'])
