"""`sign_flip`: the corrupted clients send their own updates negated."""

from tasks.simulation.attacks import base


@base.register('sign_flip')
class SignFlip(base.UpdateAttack):
  """−update."""

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, rng
    return -updates[corrupted]
