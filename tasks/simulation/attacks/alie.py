"""`alie`: "A little is enough" (Baruah et al. 2019). Its variant choosing z every
round, `optimal_alie`, is in `optimal`."""

from tasks.simulation.attacks import base


@base.register('alie')
class ALittleIsEnough(base.UpdateAttack):
  """"A little is enough" (Baruah et al. 2019): μ − z·σ per coordinate, with μ, σ the
  unweighted mean and population std (ddof 0) of the honest updates."""

  def __init__(self, z: float = 1.0):
    self.z = base.finite('z', z)

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, rng
    honest = base.honest_rows(updates, corrupted)
    return honest.mean(axis=0) - self.z * honest.std(axis=0)
