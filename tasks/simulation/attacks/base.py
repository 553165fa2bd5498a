"""What every update attack shares: the `UpdateAttack` contract, the registry of
attacks by name, building one by name, the corrupted-set selection and the
flattening of a round's updates into one matrix.

Nothing here is used inside a `tff_robust` aggregation factory: the harness picks the
corrupted set once per run (`select_corrupted_clients`), lets corrupted clients train
on poisoned data (a *data attack*, declared by the task in `Task.data_attacks`) or
replaces their updates after local training (an *update attack*, a subclass of
`UpdateAttack` registered with `@register('name')`), and always evaluates on clean
data.
"""

import abc
import inspect
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from tff_robust.common import arguments

NO_ATTACK = 'none'
# Attack name → class, in registration order: the order of `known_attacks`, of the
# binaries' help and of the leaderboard's attack columns. The package's __init__
# imports the attack modules in that order.
UPDATE_ATTACKS: dict[str, type['UpdateAttack']] = {}


def register(name: str) -> Callable[[type['UpdateAttack']], type['UpdateAttack']]:
  """Class decorator adding an update attack to `UPDATE_ATTACKS` under `name`."""
  def add(cls):
    if name in UPDATE_ATTACKS or name == NO_ATTACK:
      raise ValueError(f'Attack name {name!r} is taken.')
    UPDATE_ATTACKS[name] = cls
    return cls
  return add


def select_corrupted_clients(client_weights: Mapping[str, float], rho: float,
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


def flatten_updates(updates: Sequence[Any]) -> np.ndarray:
  """The updates as a float64 matrix, one row per client (tensors in `tf.nest` order)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rows = [np.concatenate([np.ravel(np.asarray(t, np.float64))
                          for t in tf.nest.flatten(u)] or [np.zeros(0)])
          for u in updates]
  return np.stack(rows) if rows else np.zeros((0, 0))


def unflatten_update(row: np.ndarray, like: Any) -> Any:
  """`row` in the structure, shapes and dtypes of the update `like`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  leaves = [np.asarray(t) for t in tf.nest.flatten(like)]
  pieces, start = [], 0
  for leaf in leaves:
    pieces.append(row[start:start + leaf.size].reshape(leaf.shape).astype(leaf.dtype))
    start += leaf.size
  return tf.nest.pack_sequence_as(like, pieces)


class UpdateAttack(abc.ABC):
  """Replaces the corrupted clients' model updates of one round.

  One contract: parameters in the constructor, and
  `attack(updates, weights, corrupted, rng)` returns the round's updates with the
  corrupted clients' ones replaced; `reported_weights` the weights the clients report
  (by default the true ones: a weight attack overrides it), and `attack_round` both,
  which is what the harness sends. Subclasses only write `malicious_rows`, which sees
  the round's honestly computed updates as one float64 matrix (a row per client, the
  model flattened).
  """

  def __call__(self, updates: Sequence[Any], weights: Sequence[float],
               corrupted: Sequence[bool], rng: np.random.Generator) -> list:
    """The round's updates with the corrupted clients' replaced.

    Args:
      updates: One nested structure of numpy arrays per client of the round, as
        computed honestly.
      weights: α_j of the round's clients.
      corrupted: True for the round's clients in C.
      rng: The attack's randomness, seeded per round by the harness.

    Returns:
      A new list of updates in the same structures and dtypes.
    """
    corrupted = np.asarray(corrupted, bool)
    weights = np.asarray(weights, np.float64)
    if not len(updates) == len(weights) == len(corrupted):
      raise ValueError(f'{len(updates)} updates, {len(weights)} weights and '
                       f'{len(corrupted)} corrupted flags must match.')
    if not corrupted.any():
      return list(updates)
    matrix = flatten_updates(updates)
    rows = np.broadcast_to(self.malicious_rows(matrix, weights, corrupted, rng),
                           (int(corrupted.sum()), matrix.shape[1]))
    sent = iter(rows)
    return [unflatten_update(next(sent), u) if c else u
            for u, c in zip(updates, corrupted)]

  @abc.abstractmethod
  def malicious_rows(self, updates: np.ndarray, weights: np.ndarray,
                     corrupted: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """What the corrupted clients send: `[num_corrupted, d]`, or one `[d]` row for all.

    Args:
      updates: `[n, d]` float64, every client's honest update (an omniscient attacker
        knows them all).
      weights: `[n]` float64 α_j.
      corrupted: `[n]` bool.
      rng: Randomness.
    """

  def reported_weights(self, weights: Sequence[float],
                       corrupted: Sequence[bool]) -> np.ndarray:
    """The weights the round's clients report (`[n]` float64): a corrupted device
    reports any weight it likes, as it sends any update. The default reports the true
    ones; a weight attack overrides this (honest clients' weights stay as they are).

    Args:
      weights: α_j of the round's clients, their true example counts.
      corrupted: True for the round's clients in C.
    """
    del corrupted
    return np.asarray(weights, np.float64).copy()

  def attack_round(self, updates: Sequence[Any], weights: Sequence[float],
                   corrupted: Sequence[bool],
                   rng: np.random.Generator) -> tuple[list, np.ndarray]:
    """What the round's clients send: `(updates, weights)`, the corrupted clients'
    updates replaced (`__call__`, from the true weights) and their weights as they
    report them (`reported_weights`)."""
    updates = self(updates, weights, corrupted, rng)
    reported = np.asarray(self.reported_weights(weights, corrupted), np.float64)
    honest = ~np.asarray(corrupted, bool)
    if reported.shape != np.shape(weights) or not np.array_equal(
        reported[honest], np.asarray(weights, np.float64)[honest], equal_nan=True):
      raise ValueError(f'{type(self).__name__}.reported_weights changed an honest '
                       "client's weight or the number of weights.")
    return updates, reported

  def __repr__(self):
    params = ', '.join(f'{k}={v!r}' for k, v in vars(self).items())
    return f'{type(self).__name__}({params})'


def honest_rows(updates: np.ndarray, corrupted: np.ndarray) -> np.ndarray:
  """The honest clients' updates; every client's if all are corrupted (an omniscient
  attacker knows the true updates either way)."""
  honest = updates[~corrupted]
  return honest if len(honest) else updates


def unit_directions(rows: np.ndarray) -> np.ndarray:
  """Every row divided by its norm (float64); a zero row, which has no direction, is
  the all-ones direction."""
  rows = rows.astype(np.float64)
  norms = np.linalg.norm(rows, axis=1, keepdims=True)
  fallback = np.full_like(rows, 1.0 / np.sqrt(max(rows.shape[1], 1)))
  return np.where(norms > 0, rows / np.where(norms > 0, norms, 1.0), fallback)


# ---- the attacks' parameter checks ------------------------------------------------
# TypeError for a parameter of the wrong type, ValueError out of range, as the
# aggregators' arguments (`tff_robust.common.arguments`); the message names the parameter.


def choice(name: str, value, known: Sequence[str]) -> str:
  if value not in known:
    raise ValueError(f'The attack parameter {name} must be one of {", ".join(known)}, '
                     f'got {value!r}.')
  return value


def positive(name: str, value) -> float:
  return arguments.check_positive_float(f'The attack parameter {name}', value)


def non_negative(name: str, value) -> float:
  return arguments.check_nonnegative_float(f'The attack parameter {name}', value)


def positive_int(name: str, value) -> int:
  return arguments.check_positive_int(f'The attack parameter {name}', value)


def finite(name: str, value) -> float:
  return arguments.check_finite_float(f'The attack parameter {name}', value)


# ---- by name -----------------------------------------------------------------------


def known_attacks(data_attacks: Sequence[str] = ()) -> tuple[str, ...]:
  """'none', the given data attacks (a task's `data_attacks`), and every update attack."""
  return (NO_ATTACK, *data_attacks, *UPDATE_ATTACKS)


def build_update_attack(name: str, **params) -> Optional[UpdateAttack]:
  """The update attack `name` built with `params`; None for a data attack or 'none'.

  Raises:
    ValueError: for an unknown parameter, naming the attack's parameters.
  """
  cls = UPDATE_ATTACKS.get(name)
  if cls is None:
    if params:
      raise ValueError(f'Attack {name!r} takes no parameters, got {sorted(params)}.')
    return None
  accepted = [p for p in inspect.signature(cls).parameters]
  unknown = sorted(set(params) - set(accepted))
  if unknown:
    raise ValueError(f'Unknown parameters {unknown} for attack {name!r}; it takes '
                     f'{accepted or "none"}.')
  return cls(**params)
