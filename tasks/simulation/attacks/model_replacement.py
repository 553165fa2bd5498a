"""`model_replacement`: the attackers' wanted update, boosted to survive averaging
(Bagdasaryan et al., AISTATS 2020; Ditto's attack A3)."""

from typing import Any, Optional

import numpy as np

from tasks.simulation.attacks import base


@base.register('model_replacement')
class ModelReplacement(base.UpdateAttack):
  """Model replacement (Bagdasaryan et al., AISTATS 2020; Ditto's attack A3): the
  attackers scale the update they want applied so that it survives averaging.

  Every corrupted client sends boost · t. t is the round's update the attackers want
  (TFF's convention, current − wanted model; flattened in `tf.nest` order):
  `target_update`, or by default −μ_α, the negative of the honest updates' α-weighted
  mean (the model is pushed back along the honest step). boost defaults to
  Σ_S α / Σ_{S∩C} α, Bagdasaryan's γ = n/η for equal weights and server rate η = 1:
  the weighted mean then becomes t + Σ_{S∖C} α_j x_j / Σ_S α, the target plus the
  honest clients' share.
  """

  def __init__(self, boost: Optional[float] = None, target_update: Any = None):
    self.boost = None if boost is None else base.positive('boost', boost)
    if target_update is not None:
      target_update = np.asarray(target_update, np.float64)
      if target_update.ndim != 1 or not np.all(np.isfinite(target_update)):
        raise ValueError('The attack parameter target_update must be a finite vector '
                         f'(the flattened update), got shape {target_update.shape}.')
    self.target_update = target_update

  def malicious_rows(self, updates, weights, corrupted, rng):
    del rng
    if self.target_update is None:
      honest = ~corrupted if (~corrupted).any() else np.ones_like(corrupted)
      honest_weight = weights[honest].sum()
      target = -(weights[honest] @ updates[honest]) / honest_weight if (
          honest_weight > 0) else -updates[honest].mean(axis=0)
    elif self.target_update.shape != (updates.shape[1],):
      raise ValueError(f'target_update has {self.target_update.size} components, the '
                       f'updates {updates.shape[1]}.')
    else:
      target = self.target_update
    boost = self.boost
    if boost is None:
      corrupted_weight = weights[corrupted].sum()
      boost = weights.sum() / corrupted_weight if corrupted_weight > 0 else 1.0
    return boost * target
