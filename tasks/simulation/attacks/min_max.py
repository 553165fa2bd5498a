"""`min_max` and `min_sum`: Shejwalkar & Houmansadr's AGR-agnostic attacks ("Manipulating
the Byzantine", NDSS 2021), μ + γ·∇p with the largest γ that keeps the distances to
the honest updates within theirs."""

import numpy as np

from tasks.simulation.attacks import base
from tasks.simulation.attacks import search


@base.register('min_max')
class MinMax(base.UpdateAttack):
  """AGR-agnostic Min-Max (Shejwalkar & Houmansadr, "Manipulating the Byzantine",
  NDSS 2021, eq. 7 and Algorithm 1): every corrupted client sends m = μ + γ·∇p, with
  the largest γ found such that m is no farther from any honest update than the two
  most distant honest updates are from each other:

    max_{i∈H} ‖m − x_i‖² ≤ max_{i,j∈H} ‖x_i − x_j‖².

  μ is the honest updates' unweighted mean (the attacker is omniscient) and ∇p the
  perturbation (`search.perturbation_vector`): 'std' −σ (the paper's default; σ the
  coordinate-wise population std, ddof 0, as in `alie`), 'unit_vector' −μ/‖μ‖ or
  'sign' −sign(μ). γ comes from the authors' bisection (`search.search_gamma`): it
  starts at `gamma_init` (10 in the authors' code) and stops once successive
  candidates are within `threshold` (1e-5), so γ ∈ [0, 2·gamma_init); about
  log2(gamma_init / threshold) ≈ 20 iterations, each one pass over the honest updates.

  Pairwise honest distances come from the centred Gram matrix (one BLAS product
  instead of h² row differences; honest updates are one cloud, so nothing cancels).
  """

  def __init__(self, perturbation: str = 'std', gamma_init: float = 10.0,
               threshold: float = 1e-5):
    self.perturbation = base.choice('perturbation', perturbation, search.PERTURBATIONS)
    self.gamma_init = base.positive('gamma_init', gamma_init)
    self.threshold = base.positive('threshold', threshold)

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, rng
    honest = base.honest_rows(updates, corrupted)
    mean = honest.mean(axis=0)
    direction = search.perturbation_vector(honest, self.perturbation)
    bound = self._bound(honest, mean)
    gamma = search.search_gamma(
        lambda g: self._statistic(honest, mean + g * direction) <= bound,
        self.gamma_init, self.threshold)
    return mean + gamma * direction

  def _bound(self, honest, mean):
    return np.max(pairwise_squared_distances(honest - mean), initial=0.0)

  def _statistic(self, honest, candidate):
    return np.max(np.sum((honest - candidate) ** 2, axis=1))


@base.register('min_sum')
class MinSum(MinMax):
  """AGR-agnostic Min-Sum (Shejwalkar & Houmansadr, NDSS 2021, eq. 8): as `min_max`
  with the sum of squared distances to the honest updates bounded instead of the
  maximum:

    Σ_{i∈H} ‖m − x_i‖² ≤ bound,

  bound = max_{i∈H} Σ_{j∈H} ‖x_i − x_j‖² as the paper writes it (`bound='max'`), or
  the minimum over i as the authors' released code has it (`bound='min'`, stronger
  stealth, smaller γ). Σ_j ‖x_i − x_j‖² = h‖x_i − μ‖² + Σ_j ‖x_j − μ‖² (exact for the
  unweighted mean μ), so no pairwise matrix is formed.
  """

  def __init__(self, perturbation: str = 'std', gamma_init: float = 10.0,
               threshold: float = 1e-5, bound: str = 'max'):
    super().__init__(perturbation, gamma_init, threshold)
    self.bound = base.choice('bound', bound, ('max', 'min'))

  def _bound(self, honest, mean):
    centred = np.sum((honest - mean) ** 2, axis=1)
    scores = len(honest) * centred + centred.sum()
    return scores.max() if self.bound == 'max' else scores.min()

  def _statistic(self, honest, candidate):
    return np.sum((honest - candidate) ** 2)


def pairwise_squared_distances(centred: np.ndarray) -> np.ndarray:
  """‖x_i − x_j‖² of the rows of `centred` from their Gram matrix (rows of one cloud,
  centred on its mean, so nothing cancels)."""
  gram = centred @ centred.T
  norms = np.diag(gram)
  return np.maximum(norms[:, None] + norms[None, :] - 2 * gram, 0.0)
