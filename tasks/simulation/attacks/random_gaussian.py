"""`random_gaussian`: Ditto's (A2) random Gaussian updates."""

from tasks.simulation.attacks import base


@base.register('random_gaussian')
class RandomGaussian(base.UpdateAttack):
  """Ditto's (A2) random Gaussian updates: the update is replaced by N(0, σ²I)."""

  def __init__(self, sigma: float = 1.0):
    self.sigma = base.finite('sigma', sigma)

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights
    return rng.normal(0.0, self.sigma, (int(corrupted.sum()), updates.shape[1]))
