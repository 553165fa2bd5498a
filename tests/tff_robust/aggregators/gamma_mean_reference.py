"""Float64 numpy γ-means (Entropy 2022, Algorithms 1 and 2) with log-domain weights,
written from the paper's fixed-point equations, independently of `tff_robust`.

`gamma_mean(x, alpha, ...)` runs the iterations `GammaMeanFactory` documents: the
weights w_i ∝ α_i exp(−γ'/2·D_i) are normalised with a log-sum-exp, so none underflows
whatever the dimension or the scale. An iteration whose every α_i is 0 keeps the
estimate.
"""

import numpy as np

SPREAD_GAMMA = 2.0
PAPER_GAMMA = 0.5
VARIANCE_FLOOR = 1e-12


def log_domain_weights(alpha, distance, gamma):
  """α_i exp(−γ/2·D_i) / Σ_k α_k exp(−γ/2·D_k), computed from logarithms."""
  with np.errstate(divide='ignore'):
    log_w = np.log(alpha) - 0.5 * gamma * distance
  log_w -= np.max(log_w)
  w = np.exp(log_w)
  return w / w.sum()


def gamma_mean(x, alpha, gamma=None, covariance='identity', scale='spread',
               iterations=3, start=None, floor=VARIANCE_FLOOR):
  """The γ-mean of the rows of `x` (float64 [n, p]) with weights `alpha`.

  scale='spread': γ' = γ/p with Σ estimated (σ²I for 'identity', diag for
  'diagonal'); scale='absolute': γ' = γ, Σ = I for 'identity'. Variances are taken
  about the previous estimate; the first one is isotropic, from Σα‖x − c‖²/Σα with
  c = 0 for the mean start and c = `start` otherwise.
  """
  x, alpha = np.asarray(x, np.float64), np.asarray(alpha, np.float64)
  p = x.shape[1]
  if gamma is None:
    gamma = SPREAD_GAMMA if scale == 'spread' else PAPER_GAMMA
  g = gamma / p if scale == 'spread' else gamma
  a = alpha / alpha.sum()
  if start is None:
    mu, center = a @ x, np.zeros(p)
  else:
    mu = center = np.asarray(start, np.float64)
  estimated = covariance == 'diagonal' or scale == 'spread'
  second = a @ np.sum((x - center) ** 2, axis=1)
  variance = np.full(p, max((1 + g) * second / p, floor)) if estimated else np.ones(p)
  for _ in range(iterations):
    w = log_domain_weights(alpha, np.sum((x - mu) ** 2 / variance, axis=1), g)
    if estimated:
      about_old = w @ (x - mu) ** 2
      if covariance == 'identity':
        about_old = np.full(p, about_old.sum() / p)
      variance = np.maximum((1 + g) * about_old, floor)
    mu = w @ x
  return mu


def honest_mean_and_spread(honest):
  """m, the honest clients' mean, and s, their root-mean-square distance to it."""
  m = honest.mean(axis=0)
  return m, np.sqrt(np.mean(np.sum((honest - m) ** 2, axis=1)))
