"""`optimal_alie` and `optimal_ipm`: ALIE's z and IPM's ε chosen every round by
ByzFL's line search to push the aggregate the attacker expects farthest from the
honest mean."""

from typing import Any

import numpy as np

from tasks.simulation.attacks import base
from tasks.simulation.attacks import search


@base.register('optimal_alie')
class OptimalALittleIsEnough(base.UpdateAttack):
  """`alie` with z chosen every round to do the most damage (ByzFL's "Optimal" ALIE):
  z ≥ 0 maximizes ‖A(X(z)) − μ‖, where X(z) is the round's updates with every
  corrupted row set to μ − z·σ, μ the honest updates' unweighted mean (ByzFL's
  reference point) and A the aggregator the attacker expects.

  Attacks never see the TFF factory, so A is a plain-numpy function of
  (rows `[n, d]`, weights `[n]`) → `[d]`: 'median' (coordinate-wise, the default),
  'mean' (weighted by α) — the references of `tasks.references`, by name
  (`search.NUMPY_AGGREGATORS`) — or any such callable. The search is ByzFL's
  `LineMaximize` (`search.line_maximize`): from `start`, step `delta` doubled while
  the objective improves, then shrunk by `ratio` around the best point, `evaluations`
  aggregator calls in all (ByzFL's defaults 16, 0, 1, 0.8).
  """

  def __init__(self, aggregator: Any = 'median', evaluations: int = 16,
               start: float = 0.0, delta: float = 1.0, ratio: float = 0.8):
    self.aggregator = search.check_expected_aggregator(aggregator)
    self.evaluations = base.positive_int('evaluations', evaluations)
    self.start = base.non_negative('start', start)
    self.delta = base.positive('delta', delta)
    self.ratio = base.finite('ratio', ratio)
    if not 0.5 < self.ratio < 1.0:
      raise ValueError(f'The attack parameter ratio must be in (0.5, 1), got {ratio!r}.')

  def candidate(self, honest: np.ndarray, factor: float) -> np.ndarray:
    return honest.mean(axis=0) - factor * honest.std(axis=0)

  def malicious_rows(self, updates, weights, corrupted, rng):
    del rng
    honest = base.honest_rows(updates, corrupted)
    mean = honest.mean(axis=0)
    aggregate = search.expected_aggregator(self.aggregator)

    def damage(factor):
      rows = updates.copy()
      rows[corrupted] = self.candidate(honest, factor)
      return np.linalg.norm(aggregate(rows, weights) - mean)

    factor = search.line_maximize(damage, self.evaluations, self.start, self.delta,
                                  self.ratio)
    return self.candidate(honest, factor)


@base.register('optimal_ipm')
class OptimalInnerProductManipulation(OptimalALittleIsEnough):
  """`ipm` with ε ≥ 0 chosen every round as `optimal_alie` chooses z: corrupted rows
  −ε·μ, ε maximizing ‖A(X(ε)) − μ‖ (ByzFL's "Optimal" IPM)."""

  def candidate(self, honest, factor):
    return -factor * honest.mean(axis=0)
