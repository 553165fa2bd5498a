"""`omniscient`: the corrupted clients turn the round's weighted mean into the
negative of the clean one."""

from tasks.simulation.attacks import base


@base.register('omniscient')
class Omniscient(base.UpdateAttack):
  """Every corrupted client sends −(2 Σ_{S∖C} α_j w_j + Σ_{S∩C} α_j w_j) / Σ_{S∩C} α_j,
  which makes the weighted mean of the round exactly the negative of the clean one."""

  def malicious_rows(self, updates, weights, corrupted, rng):
    del rng
    corrupted_weight = weights[corrupted].sum()
    if corrupted_weight <= 0:  # Weightless attackers cannot move the mean.
      return updates[corrupted]
    honest_sum = (weights * ~corrupted) @ updates
    corrupted_sum = (weights * corrupted) @ updates
    return -(2 * honest_sum + corrupted_sum) / corrupted_weight
