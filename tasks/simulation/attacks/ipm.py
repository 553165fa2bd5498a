"""`ipm`: inner-product manipulation (Xie et al. 2019). Its variant choosing ε every
round, `optimal_ipm`, is in `optimal`."""

from tasks.simulation.attacks import base


@base.register('ipm')
class InnerProductManipulation(base.UpdateAttack):
  """Inner-product manipulation (Xie et al. 2019): −ε × the honest updates' unweighted
  mean."""

  def __init__(self, epsilon: float = 0.1):
    self.epsilon = base.finite('epsilon', epsilon)

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, rng
    return -self.epsilon * base.honest_rows(updates, corrupted).mean(axis=0)
