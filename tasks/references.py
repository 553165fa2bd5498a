"""Plain-numpy float64 references of aggregators, one per aggregator, written from the
papers' definitions: what an adaptive attack expects the server to compute
(`tasks.simulation.attacks`: 'mean' and 'median' by name, or any of these bound to
its arguments), and what the tests check the factories of `tff_robust` and
`baselines` against.

  weighted_mean, coordinate_median, trimmed_mean, krum     the gathering rules
  geometric_median        RFA's smoothed Weiszfeld (paper Algorithm 2; Algorithm 3
                          for one pass), with the library's relative ν or an absolute
                          one, its starts and its stopping rule
  exact_geometric_median  argmin_v Σ α_i ‖v − x_i‖, Weiszfeld to convergence
  gamma_mean              the γ-mean (Entropy 2022, Algorithms 1 and 2), log-domain
  centered_clipping       Karimireddy et al. 2021, eq. (CC) with weights
  norm_clipping           the weighted mean of the rows clipped to a norm
  gradient_masked_mean    GMA: the weighted mean masked by the sign agreement
  arc_clipped_rows        ARC's pre-aggregation clipping (rows → rows)
  capped_weights          the robust weight cap (weights → weights)
  trust_region            the trust region's bound (a run's aggregates → bounded)

Every aggregator's reference is a function `(rows [n, d], weights [n], *arguments) →
[d]` of numpy arrays only (a pre-aggregation wrapper's maps the rows to rows); some
also fill an optional `trace` dict with what the factories report as measurements.
This module imports neither TensorFlow nor any code of the factories, so it stays an
independent check of them.
"""

from typing import Any, Optional, Union

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


def _row_norms(rows: np.ndarray) -> np.ndarray:
  """Row norms without overflow or underflow (each row scaled by its largest entry):
  ‖x‖ of a row holding 1e200 is finite in float64."""
  largest = np.max(np.abs(rows), axis=1, keepdims=True)
  safe = np.where(largest > 0, largest, 1.0)
  return safe[:, 0] * np.linalg.norm(rows / safe, axis=1)


def robust_typical_distance(distances: np.ndarray, weights: np.ndarray,
                            float64: bool = False, count_zero: bool = False) -> float:
  """The scale `tff_robust.aggregators.robust_scale` computes, written from its definition: the
  α-weighted geometric mean of the positive finite distances whose ⌊log2⌋ is within
  4 of the ⌊log2⌋ of the α-weighted lower tercile (the smallest distance with at
  least a third of the weight at or below it; buckets clamped to [−160, 159], or
  [−1080, 1049] for float64 models). `count_zero`: a distance 0 counts as
  2^(lowest bucket) (distances to an estimate), else it is left out."""
  low, high = (-1080, 1049) if float64 else (-160, 159)
  if count_zero:
    distances = np.where(distances == 0, 2.0**low, distances)
  counted = (distances > 0) & np.isfinite(distances)
  exponents = np.clip(np.floor(np.log2(distances[counted])), low, high)
  kept_weights = weights[counted]
  order = np.argsort(exponents, kind='stable')
  cumulative = np.cumsum(kept_weights[order])
  tercile_exponent = exponents[order][np.searchsorted(cumulative, cumulative[-1] / 3)]
  near = np.abs(exponents - tercile_exponent) <= 4
  return 2.0 ** (np.sum(kept_weights[near] * np.log2(distances[counted][near]))
                 / np.sum(kept_weights[near]))


def _radius_buckets(distances: np.ndarray, unit: float) -> np.ndarray:
  """⌊4·log2(d / unit)⌋ clamped to [−256, 255], d = 0 in the lowest."""
  unit = unit if 0 < unit < np.inf else 1.0
  with np.errstate(divide='ignore'):
    exponents = np.where(distances > 0, np.log2(distances / unit), -64)
  return np.clip(np.floor(4 * exponents), -256, 255)


def _median_bucket(buckets: np.ndarray, weights: np.ndarray) -> float:
  """The smallest bucket with at least half of the weight in it or below."""
  order = np.argsort(buckets, kind='stable')
  cumulative = np.cumsum(weights[order])
  return buckets[order][np.searchsorted(cumulative, 0.5 * cumulative[-1])]


def trimmed_start(rows: np.ndarray, weights: np.ndarray
                  ) -> tuple[np.ndarray, float, np.ndarray]:
  """(the trimmed mean, its radius, the clients' weights in it) of
  `tff_robust.GeometricMedianFactory`'s default start, from its definition:
  m = the α-weighted mean, d_i = ‖x_i − m‖, D̄ = Σ α_i d_i / Σ α_i; the clients'
  buckets ⌊4·log2(d_i / D̄)⌋ clamped to [−256, 255] (d_i = 0 in the lowest); k = the
  smallest bucket with at least half of the weight in it or below; the α-weighted
  mean of the clients in bucket k or below, and the radius D̄·2^((k + 1)/4)."""
  mean = weights @ rows / weights.sum()
  distances = _row_norms(rows - mean)
  unit = weights @ distances / weights.sum()
  buckets = _radius_buckets(distances, unit)
  median_bucket = _median_bucket(buckets, weights)
  near = weights * (buckets <= median_bucket)
  unit = unit if 0 < unit < np.inf else 1.0
  return near @ rows / near.sum(), unit * 2.0 ** ((median_bucket + 1) / 4), near


def near_clients(rows: np.ndarray, weights: np.ndarray, center: np.ndarray,
                 radius: float) -> np.ndarray:
  """The trimmed start's restricted step (pass 3) keeps client i iff its bucket
  ⌊4·log2(‖x_i − v‖ / radius)⌋ is at most 4 above the bucket of the α-weighted
  median (about twice the median distance to v); `radius` is pass 2's."""
  buckets = _radius_buckets(_row_norms(rows - center), radius)
  return buckets <= _median_bucket(buckets, weights) + 4


def geometric_median(rows: np.ndarray, weights: np.ndarray, passes: int = 3,
                     nu: Optional[float] = None, relative_nu: float = 0.2,
                     tolerance: float = 0.0,
                     start: Union[str, np.ndarray] = 'trimmed', float64: bool = False,
                     trace: Optional[dict[str, Any]] = None) -> np.ndarray:
  """RFA's smoothed Weiszfeld (Pillutla et al., Algorithm 2; `passes=1` from zero is
  Algorithm 3, one-step RFA), as `tff_robust.GeometricMedianFactory` documents it.

  A Weiszfeld step from v is v⁺ = Σ β_i x_i / Σ β_i with β_i = α_i / max(ν, ‖v − x_i‖)
  (0 when every β_i is 0). ν is `nu` (absolute, the paper's 1e-6) if given, else
  `relative_nu` × `robust_typical_distance` of the distances ‖v − x_i‖ at every step
  (the library's default; `float64` selects float64 models' buckets; a client at
  distance 0 counts, except in the step from 0). Pass 1 is a step from 0
  (`start='zero'`), from the point `start` (an array: the warm start), or the
  α-weighted mean (`'mean'`, and `'trimmed'`, whose pass 2 is `trimmed_start`'s
  mean and whose Weiszfeld steps start at pass 3, that one over `near_clients`). Each pass r ≥ 2 computes the step v⁺ from v and the
  relative gradient ‖v⁺ − v‖·Σβ/Σα; v⁺ is applied unless the estimate is frozen, and
  it freezes after the first pass whose relative gradient is at most a positive
  `tolerance` (that pass is applied).

  `trace`, if given, receives the factory's measurements: `objective` (the smoothed
  objective g_ν(v) = Σ α_i ‖v − x_i‖_(ν) at v before every pass r ≥ 2 and at the
  result, ν that of a step from v), `relative_gradient` (passes 2..R),
  `max_effective_weight` (max_i β_i/Σβ over every pass), `num_passes_applied`,
  `frozen_at_pass` (0 if never), and `centers` (every point a step started from).
  """
  rows = np.asarray(rows, np.float64)
  weights = np.asarray(weights, np.float64)
  centers, max_weights = [], []

  def smoothing(v, distances, count_zero=True):
    if nu is not None:
      return nu
    return relative_nu * robust_typical_distance(distances, weights, float64,
                                                 count_zero)

  def objective(v):
    """g_ν(v), with the ν of a step from v."""
    distances = _row_norms(rows - v)
    floor = smoothing(v, distances)
    return np.sum(weights * np.where(
        distances > floor, distances, distances * distances / (2 * floor) + floor / 2))

  def step(v, count_zero=True, keep=None):
    """(v⁺, Σβ) of a Weiszfeld step from v (over the clients `keep`, default all)."""
    centers.append(v)
    distances = _row_norms(rows - v)
    beta = weights / np.maximum(distances, smoothing(v, distances, count_zero))
    if keep is not None:
      beta = np.where(keep, beta, 0.0)
    if beta.sum() == 0:
      return np.zeros(rows.shape[1]), 0.0
    max_weights.append(beta.max() / beta.sum())
    return beta @ rows / beta.sum(), beta.sum()

  if weights.sum() == 0:
    v = np.zeros(rows.shape[1])  # No client counts: the factories return zero.
    passes = 0
  elif isinstance(start, np.ndarray):
    v = step(np.asarray(start, np.float64))[0]
  elif start == 'zero':
    v = step(np.zeros(rows.shape[1]), count_zero=False)[0]
  elif start in ('mean', 'trimmed'):
    v = weights @ rows / weights.sum()
    max_weights.append(weights.max() / weights.sum())
  else:
    raise ValueError(f'Unknown start {start!r}.')
  applied, frozen_at, objectives, gradients = 1, 0, [], []
  first_step = 2
  radius = None
  if isinstance(start, str) and start == 'trimmed' and passes >= 2:
    v, radius, near = trimmed_start(rows, weights)
    applied, first_step = 2, 3
    max_weights.append(near.max() / near.sum())
  for r in range(first_step, passes + 1):
    objectives.append(objective(v))
    keep = near_clients(rows, weights, v, radius) if radius and r == 3 else None
    proposal, beta_sum = step(v, keep=keep)
    gradients.append(np.linalg.norm(proposal - v) * beta_sum / weights.sum())
    if not frozen_at:
      v, applied = proposal, applied + 1
      if tolerance > 0 and gradients[-1] <= tolerance:
        frozen_at = r
  if trace is not None and passes:
    objectives.append(objective(v))
    trace.update(objective=np.array(objectives), relative_gradient=np.array(gradients),
                 max_effective_weight=max(max_weights), num_passes_applied=applied,
                 frozen_at_pass=frozen_at, centers=centers)
  return v


def exact_geometric_median(rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
  """argmin_v Σ α_i ‖v − x_i‖ in float64: Weiszfeld run to convergence from the mean
  (without smoothing, for inputs where no client sits on the median)."""
  v = np.average(rows, axis=0, weights=weights)
  for _ in range(100_000):
    beta = weights / np.maximum(_row_norms(rows - v), 1e-300)
    proposal = beta @ rows / beta.sum()
    if np.linalg.norm(proposal - v) <= 1e-14 * np.linalg.norm(v):
      return proposal
    v = proposal
  return v


# The γ-mean's defaults (`tff_robust.GammaMeanFactory`).
SPREAD_GAMMA = 2.0
PAPER_GAMMA = 0.5
# float32's smallest normal number, as the factory's default for float32 values.
VARIANCE_FLOOR = float(np.finfo(np.float32).tiny)


def _log_domain_weights(weights, distances, gamma):
  """α_i exp(−γ/2·D_i) / Σ_k α_k exp(−γ/2·D_k), computed from logarithms (none
  underflows whatever the dimension or the scale)."""
  with np.errstate(divide='ignore'):
    log_w = np.log(weights) - 0.5 * gamma * distances
  log_w -= np.max(log_w)
  w = np.exp(log_w)
  return w / w.sum()


def gamma_mean(rows: np.ndarray, weights: np.ndarray, gamma: Optional[float] = None,
               covariance: str = 'identity', scale: str = 'spread',
               iterations: int = 3, start: Optional[np.ndarray] = None,
               floor: float = VARIANCE_FLOOR) -> np.ndarray:
  """The γ-mean (Entropy 2022, Algorithms 1 and 2) of the rows, with weights α_i
  exp(−γ'/2·D_i) normalised in the log domain, as `tff_robust.GammaMeanFactory`
  documents its iterations.

  scale='spread': γ' = γ/p (γ default 2) with Σ estimated (σ²I for 'identity', diag
  for 'diagonal'); scale='absolute': γ' = γ (default the paper's 0.5), Σ = I for
  'identity'. Variances are taken about the previous estimate; the first one is
  isotropic, (1 + γ')·Σα‖x − c‖²/(pΣα) with c = 0 for the mean start (`start=None`)
  and c = `start` otherwise, and every variance is at least `floor`.
  """
  rows = np.asarray(rows, np.float64)
  weights = np.asarray(weights, np.float64)
  p = rows.shape[1]
  if gamma is None:
    gamma = SPREAD_GAMMA if scale == 'spread' else PAPER_GAMMA
  g = gamma / p if scale == 'spread' else gamma
  a = weights / weights.sum()
  if start is None:
    mu, center = a @ rows, np.zeros(p)
  else:
    mu = center = np.asarray(start, np.float64)
  estimated = covariance == 'diagonal' or scale == 'spread'
  second = a @ np.sum((rows - center) ** 2, axis=1)
  variance = np.full(p, max((1 + g) * second / p, floor)) if estimated else np.ones(p)
  for _ in range(iterations):
    w = _log_domain_weights(weights, np.sum((rows - mu) ** 2 / variance, axis=1), g)
    if estimated:
      about_old = w @ (rows - mu) ** 2
      if covariance == 'identity':
        about_old = np.full(p, about_old.sum() / p)
      variance = np.maximum((1 + g) * about_old, floor)
    mu = w @ rows
  return mu


def _clipped_rows(rows: np.ndarray, bound: float) -> np.ndarray:
  """The rows of norm above `bound` scaled to norm `bound`."""
  norms = _row_norms(rows)
  return rows * np.minimum(1.0, bound / np.maximum(norms, 1e-300))[:, np.newaxis]


def norm_clipping(rows: np.ndarray, weights: np.ndarray,
                  clip_norm: float) -> np.ndarray:
  """The weighted mean of the rows clipped to norm `clip_norm` (Sun et al. 2019)."""
  return weighted_mean(_clipped_rows(rows, clip_norm), weights)


def centered_clipping(rows: np.ndarray, weights: np.ndarray, clip_radius: float,
                      iterations: int, start: np.ndarray,
                      trace: Optional[dict[str, Any]] = None) -> np.ndarray:
  """Centered clipping (Karimireddy et al. 2021, eq. (CC)) with weights: `iterations`
  times v ← v + Σ α_i clip_τ(x_i − v) / Σ α_i from v = `start`, τ = `clip_radius`.
  `trace`, if given, receives `fraction_clipped`: the last iteration's fraction of
  clients with ‖x_i − v‖ > τ."""
  rows = np.asarray(rows, np.float64)
  v = np.array(start, np.float64)
  for _ in range(iterations):
    distances = _row_norms(rows - v)
    v = v + weighted_mean(_clipped_rows(rows - v, clip_radius), weights)
  if trace is not None and iterations:
    trace['fraction_clipped'] = float(np.mean(distances > clip_radius))
  return v


def gradient_masked_mean(rows: np.ndarray, weights: np.ndarray, tau: float,
                         trace: Optional[dict[str, Any]] = None) -> np.ndarray:
  """GMA (Tenison et al. 2022): the weighted mean times the mask m_j = 1 where the
  sign agreement A_j = |Σ_n sign(x_nj)| / N is at least τ, A_j elsewhere. `trace`, if
  given, receives `agreement` (A per coordinate)."""
  agreement = np.abs(np.sum(np.sign(rows), axis=0)) / len(rows)
  if trace is not None:
    trace['agreement'] = agreement
  return np.where(agreement >= tau, 1.0, agreement) * weighted_mean(rows, weights)


def arc_clipped_rows(rows: np.ndarray, num_byzantine: int,
                     trace: Optional[dict[str, Any]] = None) -> np.ndarray:
  """ARC (Allouah et al. 2024): the rows of norm above the (k+1)-th largest norm
  scaled to that norm, k = ⌊2f(n − f)/n⌋ for f = `num_byzantine`. `trace`, if given,
  receives that `threshold` and `num_clipped`, the number of rows above it."""
  n = len(rows)
  norms = _row_norms(rows)
  threshold = np.sort(norms)[::-1][2 * num_byzantine * (n - num_byzantine) // n]
  if trace is not None:
    trace.update(threshold=threshold, num_clipped=int(np.sum(norms > threshold)))
  return _clipped_rows(rows, threshold)


def capped_weights(weights: np.ndarray, quantile: float = 0.5, multiple: float = 2.0,
                   buckets_per_octave: int = 8,
                   trace: Optional[dict[str, Any]] = None) -> np.ndarray:
  """The weight cap (`tff_robust.aggregators.weight_cap`): every α_i truncated at
  `multiple` × u, u the smallest edge 2^(k / `buckets_per_octave`) (k from −126 to 128
  octaves' worth) strictly above the ⌈quantile · n⌉-th smallest of the n weights > 0
  (the upper edge of its histogram bucket; any weight beyond the last edge is in the
  last bucket, u = ∞). No weight > 0: nothing is capped, cap 0.

  `trace`, if given, gets `weight_cap` and `num_capped_clients`.
  """
  weights = np.asarray(weights, np.float64)
  positive = np.sort(weights[weights > 0])
  if not len(positive):
    cap, capped = 0.0, weights.copy()
  else:
    edges = np.exp2(np.arange(-126 * buckets_per_octave, 128 * buckets_per_octave + 1)
                    / buckets_per_octave)
    kth = positive[int(np.ceil(quantile * len(positive))) - 1]
    above = edges[edges > kth]
    cap = multiple * (above[0] if len(above) else np.inf)
    capped = np.minimum(weights, cap)
  if trace is not None:
    trace['weight_cap'] = cap
    trace['num_capped_clients'] = int(np.sum(weights > cap))
  return capped


def trust_region(aggregates: Any, multiple: float = 2.0, window: int = 5,
                 trace: Optional[dict[str, Any]] = None) -> list[np.ndarray]:
  """The trust region (`tff_robust.aggregators.trust_region`) over a run: aggregate t
  scaled to norm at most `multiple` × the lower median of the norms of the last
  `window` bounded aggregates whose norm was finite and > 0 (none: unbounded).

  `trace`, if given, gets `trust_radius` and `trust_scale`, one entry per round.
  """
  recent, bounded = [], []
  radii, scales = [], []
  for aggregate in aggregates:
    aggregate = np.asarray(aggregate, np.float64)
    last = sorted(recent[-window:])
    radius = multiple * last[(len(last) - 1) // 2] if last else np.inf
    norm = float(_row_norms(aggregate[np.newaxis])[0])
    scale = radius / norm if norm > radius else 1.0
    bounded.append(aggregate * scale)
    result_norm = float(_row_norms(bounded[-1][np.newaxis])[0])
    if np.isfinite(result_norm) and result_norm > 0:
      recent.append(result_norm)
    radii.append(radius)
    scales.append(scale)
  if trace is not None:
    trace.update(trust_radius=radii, trust_scale=scales)
  return bounded
