"""Plain-numpy float64 references of the geometric median: the exact one, and the
default smoothed Weiszfeld of `tff_robust.GeometricMedianFactory` (ν relative to the
robust typical distance of `tff_robust.aggregators.robust_scale`), written from their
definitions, independently of the factories' code."""

import numpy as np


def exact_geometric_median(points, alphas):
  """argmin_v Σ α_i ‖v − x_i‖ in float64, Weiszfeld run to convergence from the mean
  (no smoothing: no client of these cases sits on the median)."""
  v = np.average(points, axis=0, weights=alphas)
  for _ in range(100_000):
    beta = alphas / np.maximum(np.linalg.norm(points - v, axis=1), 1e-300)
    proposal = beta @ points / beta.sum()
    if np.linalg.norm(proposal - v) <= 1e-14 * np.linalg.norm(v):
      return proposal
    v = proposal
  return v


def robust_typical_distance(distances, alphas, float64=False):
  """The scale of `tff_robust.aggregators.robust_scale`, written from its definition: the
  α-weighted geometric mean of the positive finite distances whose ⌊log2⌋ is within
  4 of the ⌊log2⌋ of the α-weighted lower tercile (the smallest distance with at
  least a third of the weight at or below it; buckets clamped to [−160, 159], or
  [−1080, 1049] for float64 models)."""
  counted = (distances > 0) & np.isfinite(distances)
  low, high = (-1080, 1049) if float64 else (-160, 159)
  exponents = np.clip(np.floor(np.log2(distances[counted])), low, high)
  weights = alphas[counted]
  order = np.argsort(exponents, kind='stable')
  cumulative = np.cumsum(weights[order])
  tercile_exponent = exponents[order][np.searchsorted(cumulative, cumulative[-1] / 3)]
  near = np.abs(exponents - tercile_exponent) <= 4
  return 2.0 ** (np.sum(weights[near] * np.log2(distances[counted][near]))
                 / np.sum(weights[near]))


def norms(rows):
  """Row norms without overflow (rows scaled by their largest entry)."""
  largest = np.max(np.abs(rows), axis=1, keepdims=True)
  safe = np.where(largest > 0, largest, 1.0)
  return safe[:, 0] * np.linalg.norm(rows / safe, axis=1)


def numpy_default_gm(points, alphas, passes, relative_nu=0.2, float64=False):
  """Algorithm 2 from v = 0 (Algorithm 3 for one pass), ν relative per pass, every
  pass applied (the factories' `tolerance=0`)."""
  v = np.zeros(points.shape[1])
  for _ in range(passes):
    distances = norms(points - v)
    nu = relative_nu * robust_typical_distance(distances, alphas, float64)
    beta = alphas / np.maximum(distances, nu)
    v = beta @ points / beta.sum()
  return v
