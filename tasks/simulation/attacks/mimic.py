"""`mimic`: the corrupted clients copy one honest client (Karimireddy, He, Jaggi,
ICLR 2022)."""

import numpy as np

from tasks.simulation.attacks import base


@base.register('mimic')
class Mimic(base.UpdateAttack):
  """Mimic (Karimireddy, He, Jaggi, ICLR 2022, Section 3): every corrupted client
  copies the update of one honest client, over-representing it so that a
  heterogeneous minority direction is lost or amplified.

  The paper picks the honest client i* = argmax_i |⟨x_i − μ, z⟩| with z the top
  eigenvector of the honest updates' covariance, which it learns online over warm-up
  rounds (ByzFL's `WorkerWithMaxVariance`). Here z is computed exactly every round (the
  first right singular vector of the centred honest matrix), so the attack keeps no
  state across rounds and a resumed run attacks as the original did. Ties (and
  identical honest updates) pick the first such honest client in round order.
  """

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, rng
    honest = base.honest_rows(updates, corrupted)
    return honest[mimicked_client(honest)]


def mimicked_client(honest: np.ndarray) -> int:
  """Row of `honest` maximizing |⟨x_i − μ, z⟩|, z the top principal direction."""
  centred = honest - honest.mean(axis=0)
  if not np.any(centred):
    return 0
  top = np.linalg.svd(centred, full_matrices=False)[2][0]
  return int(np.argmax(np.abs(centred @ top)))
