"""The corrupted clients' own directions at an extreme norm: `zero_update` (norm 0,
the free rider), `tiny_update` (ε × the honest median norm) and `far_update` (1e30)."""

import numpy as np

from tasks.simulation.attacks import base


@base.register('zero_update')
class ZeroUpdate(base.UpdateAttack):
  """The free rider: the zero update (a client whose local model did not move, or one
  that skips training). Harmless to the mean; it pinned the geometric median with the
  paper's absolute ν at the zero start."""

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, rng
    return np.zeros_like(updates[corrupted])


@base.register('tiny_update')
class TinyUpdate(base.UpdateAttack):
  """A client's own update scaled to ε times the honest clients' median norm: an
  update that is almost, but not exactly, the zero update."""

  def __init__(self, epsilon: float = 1e-3):
    self.epsilon = base.positive('epsilon', epsilon)

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, rng
    honest_scale = np.median(np.linalg.norm(base.honest_rows(updates, corrupted),
                                            axis=1))
    return (self.epsilon * honest_scale *
            base.unit_directions(updates[corrupted])).astype(updates.dtype)


@base.register('far_update')
class FarUpdate(base.UpdateAttack):
  """A client's own update rescaled to norm `norm` (default 1e30): the extreme outlier
  that an aggregator starting from the mean cannot recover from in a few passes."""

  def __init__(self, norm: float = 1e30):
    self.norm = base.positive('norm', norm)

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, rng
    return (self.norm * base.unit_directions(updates[corrupted])).astype(updates.dtype)
