"""The searches of the adaptive attacks and the aggregators they expect.

  perturbation_vector, search_gamma   Shejwalkar & Houmansadr's ∇p and bisection
                                      (`min_max`, `min_sum`)
  line_maximize                       ByzFL's line search (`optimal_alie`,
                                      `optimal_ipm`)
  NUMPY_AGGREGATORS                   the aggregators an attack may expect by name:
                                      the plain-numpy references of `tasks.references`
"""

from typing import Any, Callable

import numpy as np

from tasks import references

PERTURBATIONS = ('std', 'unit_vector', 'sign')
MAX_SEARCH_ITERATIONS = 200


def perturbation_vector(honest: np.ndarray, kind: str) -> np.ndarray:
  """Shejwalkar & Houmansadr's ∇p: 'std' −σ (population std per coordinate),
  'unit_vector' −μ/‖μ‖ (0 if μ = 0), 'sign' −sign(μ); μ, σ of the honest rows."""
  mean = honest.mean(axis=0)
  if kind == 'std':
    return -honest.std(axis=0)
  if kind == 'unit_vector':
    norm = np.linalg.norm(mean)
    return -mean / norm if norm > 0 else np.zeros_like(mean)
  if kind == 'sign':
    return -np.sign(mean)
  raise ValueError(f'Unknown perturbation {kind!r}; known: {", ".join(PERTURBATIONS)}.')


def search_gamma(feasible: Callable[[float], bool], gamma_init: float,
                 threshold: float) -> float:
  """Shejwalkar & Houmansadr's bisection (Algorithm 1, as in the authors' code):

    γ ← γ_init, s ← γ_init, γ_ok ← 0
    while |γ_ok − γ| > τ:
      if feasible(γ): γ_ok ← γ; γ ← γ + s/2   else: γ ← γ − s/2
      s ← s/2
    return γ_ok

  The largest feasible γ in [0, 2γ_init) to within about 2τ when feasibility is an
  interval [0, γ*] (it is for both attacks: γ = 0, the mean, is always feasible and
  the constraints are convex in γ); 0 when γ_init/2^k never succeeds. Stops after
  `MAX_SEARCH_ITERATIONS` at the latest (never reached: the step halves).
  """
  gamma, step, best = gamma_init, gamma_init, 0.0
  for _ in range(MAX_SEARCH_ITERATIONS):
    if abs(best - gamma) <= threshold:
      break
    if feasible(gamma):
      best = gamma
      gamma += step / 2
    else:
      gamma -= step / 2
    step /= 2
  return best


def line_maximize(objective: Callable[[float], float], evaluations: int, start: float,
                  delta: float, ratio: float) -> float:
  """ByzFL's `LineMaximize`: a best-effort arg max of `objective` over x ≥ 0 in
  `evaluations` calls.

  Expansion: from x = start, try x + δ; while that improves (strictly), move there and
  double δ; on the first failure δ ← ratio·δ. Contraction: with the remaining calls,
  step the last proposal by δ towards the best point (below it: +δ; above it: −δ,
  halved back towards the proposal while negative), keep it when it improves, and
  δ ← ratio·δ after each call.
  """
  best_x, best_y = start, objective(start)
  remaining = evaluations - 1
  proposal = best_x
  while remaining > 0:
    proposal = best_x + delta
    value = objective(proposal)
    remaining -= 1
    if value > best_y:
      best_x, best_y = proposal, value
      delta *= 2
    else:
      delta *= ratio
      break
  while remaining > 0:
    if proposal < best_x:
      proposal += delta
    else:
      x = proposal - delta
      while x < 0:
        x = (x + proposal) / 2
      proposal = x
    value = objective(proposal)
    remaining -= 1
    if value > best_y:
      best_x, best_y = proposal, value
    delta *= ratio
  return best_x


# The aggregators an adaptive attack may expect, by name: (rows, weights) → vector.
# Any other reference of `tasks.references`, bound to its arguments (e.g.
# `functools.partial(references.krum, num_byzantine=2)`), is passed as a function.
NUMPY_AGGREGATORS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    'mean': references.weighted_mean,
    'median': references.coordinate_median,
}


def check_expected_aggregator(aggregator: Any) -> Any:
  """`aggregator` if it names one of `NUMPY_AGGREGATORS` or is a function
  (rows, weights) → vector; a ValueError naming the parameter otherwise."""
  if callable(aggregator) or (isinstance(aggregator, str)
                              and aggregator in NUMPY_AGGREGATORS):
    return aggregator
  raise ValueError(f'The attack parameter aggregator must be one of '
                   f'{", ".join(NUMPY_AGGREGATORS)} or a function (rows, weights) → '
                   f'vector, got {aggregator!r}.')


def expected_aggregator(aggregator: Any) -> Callable[[np.ndarray, np.ndarray],
                                                     np.ndarray]:
  """The function of an aggregator checked by `check_expected_aggregator`."""
  return aggregator if callable(aggregator) else NUMPY_AGGREGATORS[aggregator]
