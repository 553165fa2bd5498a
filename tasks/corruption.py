"""Corruption models of the simulation harness (RFA paper D.2.1, plus stronger attacks).

Nothing here is used inside a `tff_robust` aggregation factory: the harness picks the
corrupted set once per run (`select_corrupted_clients`), trains corrupted clients on
poisoned data (`Task.poison_fn`, attack 'data') or replaces their updates after local
training (`corrupt_updates`), and always evaluates on clean data.

Updates are what TFF's client work returns for one round: a list with one nested
structure (lists / tuples / OrderedDicts) of numpy arrays per client.
"""

from typing import Any, Sequence

import numpy as np
import tensorflow as tf

# Attack name → kind: 'data' attacks poison the training data of corrupted clients
# (through Task.poison_fn); 'update' attacks replace their model updates.
ATTACKS = {
    'none': 'none',
    'data': 'data',
    'gaussian': 'update',
    'omniscient': 'update',
    'sign_flip': 'update',
    'alie': 'update',
    'ipm': 'update',
    'nan': 'update',
    'inf': 'update',
}
DEFAULT_ALIE_Z = 1.0
DEFAULT_IPM_EPSILON = 0.1


def attack_kind(attack: str) -> str:
  """'none', 'data' or 'update'; ValueError naming the known attacks otherwise."""
  if attack not in ATTACKS:
    raise ValueError(f'Unknown attack {attack!r}; known: {", ".join(ATTACKS)}.')
  return ATTACKS[attack]


def select_corrupted_clients(client_weights: dict[str, float], rho: float,
                             seed: int) -> frozenset[str]:
  """The corrupted set C of a run (paper D.2.1).

  Clients are drawn uniformly without replacement until their share of the total weight
  first exceeds `rho` (strictly). `rho = 0` gives the empty set; `rho ≥ 1` can never be
  exceeded, so every client is corrupted.

  Args:
    client_weights: client id → α_i.
    rho: Corruption level in [0, 1].
    seed: The same seed gives the same set.
  """
  if not 0.0 <= rho <= 1.0:
    raise ValueError(f'rho must be in [0, 1], got {rho}.')
  if rho == 0.0:
    return frozenset()
  ids = sorted(client_weights)  # Independent of dict order.
  total = float(sum(client_weights[c] for c in ids))
  order = np.random.default_rng(seed).permutation(len(ids))
  corrupted, weight = [], 0.0
  for i in order:
    corrupted.append(ids[i])
    weight += client_weights[ids[i]]
    if weight / total > rho:
      break
  return frozenset(corrupted)


def _flat(update) -> list[np.ndarray]:
  return [np.asarray(t, np.float64) for t in tf.nest.flatten(update)]


def _pack_like(update, flat: list[np.ndarray]):
  """`flat` in the structure and dtypes of `update`."""
  originals = tf.nest.flatten(update)
  cast = [np.asarray(f).astype(np.asarray(o).dtype) for f, o in zip(flat, originals)]
  return tf.nest.pack_sequence_as(update, cast)


def _honest_flats(flats, corrupted) -> list[list[np.ndarray]]:
  """The honest clients' updates; all clients' if every one is corrupted (an
  omniscient attacker knows the true updates either way)."""
  honest = [f for f, c in zip(flats, corrupted) if not c]
  return honest or list(flats)


def _per_tensor(flats: Sequence[list[np.ndarray]], fn) -> list[np.ndarray]:
  """fn applied to the stack (clients first) of each tensor position."""
  return [fn(np.stack(tensors)) for tensors in zip(*flats)]


def corrupt_updates(attack: str, updates: list, weights: np.ndarray,
                    corrupted: np.ndarray, rng: np.random.Generator,
                    **params: Any) -> list:
  """Replaces the updates of the corrupted clients of one round.

  Attacks (`ATTACKS`):
    * 'none', 'data': unchanged (data poisoning acts on the datasets instead).
    * 'gaussian': update + N(0, σ²I), σ the std of that update's components. DESIGN.md
      adds noise to the update; the paper's text says the update is "replaced by" a
      Gaussian — this follows DESIGN.md.
    * 'omniscient': every corrupted client sends
      −(2 Σ_{S∖C} α_j w_j + Σ_{S∩C} α_j w_j) / Σ_{S∩C} α_j, making the weighted mean of
      the round exactly the negative of the clean one.
    * 'sign_flip': −update.
    * 'alie' ("A little is enough", Baruah et al. 2019): μ − z·σ per coordinate, with
      μ, σ the unweighted mean and population std (ddof 0) of the honest updates;
      `z` defaults to `DEFAULT_ALIE_Z` = 1.0.
    * 'ipm' (inner-product manipulation, Xie et al. 2019): −ε × unweighted mean of the
      honest updates; `epsilon` defaults to `DEFAULT_IPM_EPSILON` = 0.1.
    * 'nan', 'inf': client faults, every component NaN / +Inf.
  ALIE and IPM use all clients' true updates when no honest client is in the round.

  Args:
    attack: A name of `ATTACKS`.
    updates: One nested structure of numpy arrays per client of the round.
    weights: α_j of the round's clients.
    corrupted: Booleans, True for the round's clients in C.
    rng: Randomness of the Gaussian attack.
    **params: `z` (alie), `epsilon` (ipm).

  Returns:
    A new list of updates in the same structures and dtypes.
  """
  kind = attack_kind(attack)
  corrupted = np.asarray(corrupted, bool)
  weights = np.asarray(weights, np.float64)
  if len(updates) != len(corrupted) or len(updates) != len(weights):
    raise ValueError(f'{len(updates)} updates, {len(weights)} weights and '
                     f'{len(corrupted)} corrupted flags must match.')
  unknown = set(params) - {'z', 'epsilon'}
  if unknown:
    raise ValueError(f'Unknown attack parameters {sorted(unknown)}.')
  if kind != 'update' or not corrupted.any():
    return list(updates)
  flats = [_flat(u) for u in updates]
  replacement = _REPLACEMENTS[attack](flats, weights, corrupted, rng, **params)
  return [_pack_like(u, replacement(i, f)) if c else u
          for i, (u, f, c) in enumerate(zip(updates, flats, corrupted))]


def _gaussian(flats, weights, corrupted, rng, **_):
  del weights, corrupted
  def noisy(i, flat):
    del i
    sigma = np.concatenate([t.ravel() for t in flat]).std() if flat else 0.0
    return [t + rng.normal(0.0, sigma, t.shape) for t in flat]
  return noisy


def _omniscient(flats, weights, corrupted, rng, **_):
  del rng
  corrupted_weight = weights[corrupted].sum()
  def weighted_sum(mask):
    return _per_tensor(flats, lambda s: np.tensordot(weights * mask, s, axes=1))
  honest_sum, corrupted_sum = weighted_sum(~corrupted), weighted_sum(corrupted)
  if corrupted_weight <= 0:  # Weightless attackers cannot move the mean.
    return lambda i, flat: flat
  sent = [-(2 * h + c) / corrupted_weight for h, c in zip(honest_sum, corrupted_sum)]
  return lambda i, flat: sent


def _sign_flip(flats, weights, corrupted, rng, **_):
  del flats, weights, corrupted, rng
  return lambda i, flat: [-t for t in flat]


def _alie(flats, weights, corrupted, rng, z=DEFAULT_ALIE_Z, **_):
  del weights, rng
  honest = _honest_flats(flats, corrupted)
  sent = [m - z * s for m, s in zip(_per_tensor(honest, lambda s: s.mean(axis=0)),
                                    _per_tensor(honest, lambda s: s.std(axis=0)))]
  return lambda i, flat: sent


def _ipm(flats, weights, corrupted, rng, epsilon=DEFAULT_IPM_EPSILON, **_):
  del weights, rng
  honest_mean = _per_tensor(_honest_flats(flats, corrupted), lambda s: s.mean(axis=0))
  sent = [-epsilon * m for m in honest_mean]
  return lambda i, flat: sent


def _fill(value):
  def attack(flats, weights, corrupted, rng, **_):
    del flats, weights, corrupted, rng
    return lambda i, flat: [np.full(t.shape, value) for t in flat]
  return attack


_REPLACEMENTS = {
    'gaussian': _gaussian,
    'omniscient': _omniscient,
    'sign_flip': _sign_flip,
    'alie': _alie,
    'ipm': _ipm,
    'nan': _fill(np.nan),
    'inf': _fill(np.inf),
}
