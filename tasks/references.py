"""Plain-numpy float64 references of aggregators, one per aggregator, written from the
papers' definitions: what an adaptive attack expects the server to compute
(`tasks.simulation.attacks`: 'mean' and 'median' by name, or any of these bound to
its arguments), and what the tests check the factories of `tff_robust` and
`baselines` against.

Every reference is a function `(rows [n, d], weights [n], *arguments) → [d]` of numpy
arrays only: this module imports neither TensorFlow nor any code of the factories, so
it stays an independent check of them. (The geometric median's references are in
tests/helpers/gm_reference.py.)
"""

from typing import Optional

import numpy as np


def weighted_mean(rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
  """Σ α_i x_i / Σ α_i; the unweighted mean when every weight is 0."""
  total = weights.sum()
  return weights @ rows / total if total > 0 else rows.mean(axis=0)


def coordinate_median(rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
  """The coordinate-wise median (Yin et al. 2018), unweighted: the weights are
  ignored, as the gathering baseline ignores them."""
  del weights
  return np.median(rows, axis=0)


def trimmed_mean(rows: np.ndarray, weights: np.ndarray,
                 trim_fraction: float) -> np.ndarray:
  """The coordinate-wise β-trimmed mean (Yin et al. 2018), unweighted: per coordinate,
  the mean of the values left after dropping the k = ⌊β·n⌋ smallest and k largest."""
  del weights
  n = rows.shape[0]
  k = int(np.floor(trim_fraction * n))
  return np.sort(rows, axis=0)[k:n - k].mean(axis=0)


def krum(rows: np.ndarray, weights: np.ndarray, num_byzantine: int,
         num_selected: Optional[int] = 1) -> np.ndarray:
  """Krum and Multi-Krum (Blanchard et al. 2017): client i's score is the sum of its
  n − f − 2 smallest squared distances to the other clients; the α-weighted mean of
  the m lowest-scored clients (ties: the first in client order), m = `num_selected`,
  n − f when None (Multi-Krum's default), 1 for Krum."""
  n = rows.shape[0]
  scores = []
  for i in range(n):
    distances = sorted(np.sum((rows[i] - rows[j]) ** 2) for j in range(n) if j != i)
    scores.append(sum(distances[:n - num_byzantine - 2]))
  m = n - num_byzantine if num_selected is None else num_selected
  chosen = np.argsort(np.array(scores), kind='stable')[:m]
  return np.average(rows[chosen], axis=0, weights=weights[chosen])
