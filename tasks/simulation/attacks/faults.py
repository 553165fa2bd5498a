"""Client faults rather than attacks: `nan` and `inf` updates (the filter in front of
every aggregator of `tasks.registry` drops such clients)."""

import numpy as np

from tasks.simulation.attacks import base


@base.register('nan')
class NaNFault(base.UpdateAttack):
  """A client fault: every component NaN."""

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, corrupted, rng
    return np.full(updates.shape[1], np.nan)


@base.register('inf')
class InfFault(base.UpdateAttack):
  """A client fault: every component +Inf."""

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, corrupted, rng
    return np.full(updates.shape[1], np.inf)
