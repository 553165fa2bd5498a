"""tasks.simulation.dropout: clients leaving between a round's secure sums."""

import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import aggregator_cases as cases
from tests.helpers import structures
from tasks import registry
from tasks.simulation import dropout
from tff_robust.distributed import passwise


def _round(seed=0, num_clients=8):
  rng = np.random.default_rng(seed)
  matrix = rng.normal(size=(num_clients, cases.DIMENSION))
  matrix[:2] += 20.0
  return ([cases.to_struct(row) for row in matrix],
          list(rng.integers(1, 20, num_clients).astype(np.float32)))


def _create(factory):
  return factory.create(cases.VALUE_TYPE, cases.WEIGHT_TYPE)


def test_without_dropout_the_passes_are_the_factorys():
  values, weights = _round()
  factory = registry.aggregator_from_name('gm')
  got = _create(dropout.PassDropoutFactory(factory, 0.0))
  want = _create(passwise.PasswiseFactory(factory))
  output = got.next(got.initialize(), values, weights)
  expected = want.next(want.initialize(), values, weights)
  structures.assert_same(output.result, expected.result)
  assert output.measurements['dropped_clients'] == 0
  assert output.measurements['refused'] == 0


def test_the_aggregate_continues_over_the_clients_still_present():
  values, weights = _round(seed=1)
  factory = registry.aggregator_from_name('gm')
  process = _create(dropout.PassDropoutFactory(factory, 0.1, seed=3))
  state = process.initialize()
  outputs = [process.next(state, values, weights) for _ in range(4)]
  dropped = [int(o.measurements['dropped_clients']) for o in outputs]
  assert any(dropped) and all(0 <= d < len(values) for d in dropped)
  assert not any(int(o.measurements['refused']) for o in outputs)
  full = _create(passwise.PasswiseFactory(factory))
  expected = full.next(full.initialize(), values, weights).result
  for output, gone in zip(outputs, dropped):
    leaves = tf.nest.flatten(output.result)
    assert all(np.all(np.isfinite(leaf)) for leaf in leaves)
    if gone:  # Fewer clients in the later sums: another estimate.
      assert not all(np.allclose(a, b) for a, b in zip(
          leaves, tf.nest.flatten(expected)))


def test_a_round_with_too_few_clients_left_is_refused():
  values, weights = _round(seed=2)
  factory = registry.aggregator_from_name('gm')
  process = _create(dropout.PassDropoutFactory(factory, 0.5, seed=0,
                                               min_clients=len(values)))
  state = process.initialize()
  output = process.next(state, values, weights)
  assert output.measurements['refused'] == 1
  assert all(not np.any(leaf) for leaf in tf.nest.flatten(output.result))
  structures.assert_same(output.state, state)


def test_a_single_secure_sum_has_no_dropout():
  values, weights = _round(seed=3)
  factory = registry.aggregator_from_name('mean')
  got = _create(dropout.PassDropoutFactory(factory, 0.5))
  want = _create(passwise.PasswiseFactory(factory))
  structures.assert_same(got.next(got.initialize(), values, weights).result,
                         want.next(want.initialize(), values, weights).result)


@pytest.mark.parametrize('rate', [-0.1, 1.0])
def test_the_rate_is_a_probability(rate):
  with pytest.raises(ValueError, match='rate must be in'):
    dropout.PassDropoutFactory(registry.aggregator_from_name('gm'), rate)
