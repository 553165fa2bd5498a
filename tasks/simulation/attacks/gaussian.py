"""`gaussian`: Gaussian noise added to the corrupted clients' own updates."""

import numpy as np

from tasks.simulation.attacks import base


@base.register('gaussian')
class GaussianNoise(base.UpdateAttack):
  """update + N(0, σ²I), σ the std of that update's components (docs/design.md: adds the
  noise to the update; the paper's text says the update is "replaced by" a Gaussian)."""

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights
    rows = updates[corrupted]
    return np.stack([row + rng.normal(0.0, row.std() if row.size else 0.0, row.shape)
                     for row in rows])
