"""Clients that leave between the secure sums of a round (the simulation path).

In a cross-device deployment an iterative secure aggregate (RFA's R passes, with the
relative ν 2R + 1 secure sums) is R rounds of secure aggregation: a device can drop
out between two of them. `PassDropoutFactory(factory, rate)` stands in for the
aggregation factory of `tasks.simulation.loop.Simulation`: it runs the factory's
steps one TFF computation per secure sum (`iterative_steps.PassByPass`, as the
workers do) and, before every computation after the first, each client still present
leaves with probability `rate`. A secure sum is over the clients present (secure
aggregation tolerates dropouts above its threshold), so the aggregate continues over
them; when fewer than `min_clients` are left the round is refused: the aggregate is
zero (the server model stays), the aggregator's state stays.

Measurements added: `dropped_clients` (clients gone before the last sum) and
`refused` (1 for a refused round). A factory that is not iterative (FedAvg's mean,
GMA) is one secure sum: nobody can leave between sums, it runs as it is.
"""

import collections
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_robust.distributed import passwise
from tff_robust.iterative import iterative_mean
from tff_robust.iterative import iterative_steps


class PassDropoutFactory:
  """`factory` whose clients leave between secure sums with probability `rate`
  (module docstring); `create(value_type, weight_type)` → a
  `passwise.PasswiseProcess`. The dropouts are drawn from `seed` and a counter of the
  calls of `next` (a run's rounds in order)."""

  def __init__(self, factory, rate: float, seed: int = 0, min_clients: int = 1):
    if not 0.0 <= rate < 1.0:
      raise ValueError(f'rate must be in [0, 1), got {rate}.')
    if min_clients < 1:
      raise ValueError(f'min_clients must be ≥ 1, got {min_clients}.')
    self._factory, self._rate, self._seed = factory, float(rate), seed
    self._min_clients = int(min_clients)

  def create(self, value_type, weight_type) -> passwise.PasswiseProcess:
    factory = self._factory
    if not isinstance(factory, iterative_steps.IterativeAggregationFactory):
      return passwise.PasswiseFactory(factory).create(value_type, weight_type)
    iterative_mean.check_float_structure(value_type)
    passes = iterative_steps.PassByPass(factory.steps(value_type), weight_type)
    calls = [0]

    def next_fn(state, values, weights):
      rng = np.random.default_rng([self._seed, calls[0]])
      calls[0] += 1
      output, dropped, refused = self._next(passes, rng, state, values, weights)
      measurements = collections.OrderedDict(output.measurements)
      measurements['dropped_clients'] = np.int32(dropped)
      measurements['refused'] = np.int32(refused)
      return tff.templates.MeasuredProcessOutput(output.state, output.result,
                                                 measurements)

    return passwise.PasswiseProcess(passes.initialize, next_fn,
                                    len(passes.computations))

  def _next(self, passes, rng, state, values, weights):
    """(output, clients dropped, refused) of one round."""
    present = list(range(len(values)))
    server, first, refused = state, None, False
    for index, computation in enumerate(passes.computations):
      if index:
        staying = [i for i in present if rng.random() >= self._rate]
        if len(staying) < self._min_clients:
          refused = True  # The sums go on over the last clients, only for the types.
        else:
          present = staying
      output = computation(server, [values[i] for i in present],
                           [weights[i] for i in present])
      first = output if first is None else first
      server = output.get('carry')
    output = passes.output(first, output)
    dropped = len(values) - len(present)
    if refused:
      output = tff.templates.MeasuredProcessOutput(
          state, tf.nest.map_structure(np.zeros_like, output.result),
          output.measurements)
    return output, dropped, int(refused)


def refused_rounds(metrics_rows) -> int:
  """How many rows of a run's metrics.csv were refused rounds."""
  return sum(1 for row in metrics_rows
             if float(row.get('aggregator/refused') or 0) > 0)


def dropout_factory(factory, rate: Optional[float], seed: int = 0):
  """`PassDropoutFactory(factory, rate)`, or `factory` itself for no dropout."""
  return factory if not rate else PassDropoutFactory(factory, rate, seed)
