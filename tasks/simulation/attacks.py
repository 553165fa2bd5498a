"""Corruption models of the simulation harness (RFA paper D.2.1, plus stronger attacks).

Nothing here is used inside a `tff_robust` aggregation factory: the harness picks the
corrupted set once per run (`select_corrupted_clients`), lets corrupted clients train
on poisoned data (a *data attack*, declared by the task in `Task.data_attacks`) or
replaces their updates after local training (an *update attack*, a class below), and
always evaluates on clean data.

Every update attack has one contract: parameters in the constructor, and
`attack(updates, weights, corrupted, rng)` returns the round's updates with the
corrupted clients' ones replaced. Subclasses only write `malicious_rows`, which sees
the round's honestly computed updates as one float64 matrix (a row per client, the
model flattened). Adding an attack is one class with its `@register('name')` line.
"""

import abc
import inspect
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_robust import arguments

NO_ATTACK = 'none'
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
  rows = [np.concatenate([np.ravel(np.asarray(t, np.float64))
                          for t in tf.nest.flatten(u)] or [np.zeros(0)])
          for u in updates]
  return np.stack(rows) if rows else np.zeros((0, 0))


def unflatten_update(row: np.ndarray, like: Any) -> Any:
  """`row` in the structure, shapes and dtypes of the update `like`."""
  leaves = [np.asarray(t) for t in tf.nest.flatten(like)]
  pieces, start = [], 0
  for leaf in leaves:
    pieces.append(row[start:start + leaf.size].reshape(leaf.shape).astype(leaf.dtype))
    start += leaf.size
  return tf.nest.pack_sequence_as(like, pieces)


class UpdateAttack(abc.ABC):
  """Replaces the corrupted clients' model updates of one round."""

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

  def __repr__(self):
    params = ', '.join(f'{k}={v!r}' for k, v in vars(self).items())
    return f'{type(self).__name__}({params})'


def honest_rows(updates: np.ndarray, corrupted: np.ndarray) -> np.ndarray:
  """The honest clients' updates; every client's if all are corrupted (an omniscient
  attacker knows the true updates either way)."""
  honest = updates[~corrupted]
  return honest if len(honest) else updates


@register('gaussian')
class GaussianNoise(UpdateAttack):
  """update + N(0, σ²I), σ the std of that update's components (DESIGN.md adds the
  noise to the update; the paper's text says the update is "replaced by" a Gaussian)."""

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights
    rows = updates[corrupted]
    return np.stack([row + rng.normal(0.0, row.std() if row.size else 0.0, row.shape)
                     for row in rows])


@register('omniscient')
class Omniscient(UpdateAttack):
  """Every corrupted client sends −(2 Σ_{S∖C} α_j w_j + Σ_{S∩C} α_j w_j) / Σ_{S∩C} α_j,
  which makes the weighted mean of the round exactly the negative of the clean one."""

  def malicious_rows(self, updates, weights, corrupted, rng):
    del rng
    corrupted_weight = weights[corrupted].sum()
    if corrupted_weight <= 0:  # Weightless attackers cannot move the mean.
      return updates[corrupted]
    honest_sum = (weights * ~corrupted) @ updates
    corrupted_sum = (weights * corrupted) @ updates
    return -(2 * honest_sum + corrupted_sum) / corrupted_weight


@register('sign_flip')
class SignFlip(UpdateAttack):
  """−update."""

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, rng
    return -updates[corrupted]


@register('alie')
class ALittleIsEnough(UpdateAttack):
  """"A little is enough" (Baruah et al. 2019): μ − z·σ per coordinate, with μ, σ the
  unweighted mean and population std (ddof 0) of the honest updates."""

  def __init__(self, z: float = 1.0):
    self.z = _finite('z', z)

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, rng
    honest = honest_rows(updates, corrupted)
    return honest.mean(axis=0) - self.z * honest.std(axis=0)


@register('ipm')
class InnerProductManipulation(UpdateAttack):
  """Inner-product manipulation (Xie et al. 2019): −ε × the honest updates' unweighted
  mean."""

  def __init__(self, epsilon: float = 0.1):
    self.epsilon = _finite('epsilon', epsilon)

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, rng
    return -self.epsilon * honest_rows(updates, corrupted).mean(axis=0)


@register('zero_update')
class ZeroUpdate(UpdateAttack):
  """The free rider: the zero update (a client whose local model did not move, or one
  that skips training). Harmless to the mean; it pinned the geometric median with the
  paper's absolute ν at the zero start."""

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, rng
    return np.zeros_like(updates[corrupted])


@register('tiny_update')
class TinyUpdate(UpdateAttack):
  """A client's own update scaled to ε times the honest clients' median norm: an
  update that is almost, but not exactly, the zero update."""

  def __init__(self, epsilon: float = 1e-3):
    self.epsilon = _positive('epsilon', epsilon)

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, rng
    honest_scale = np.median(np.linalg.norm(honest_rows(updates, corrupted), axis=1))
    return (self.epsilon * honest_scale * unit_directions(updates[corrupted])).astype(
        updates.dtype)


@register('far_update')
class FarUpdate(UpdateAttack):
  """A client's own update rescaled to norm `norm` (default 1e30): the extreme outlier
  that an aggregator starting from the mean cannot recover from in a few passes."""

  def __init__(self, norm: float = 1e30):
    self.norm = _positive('norm', norm)

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, rng
    return (self.norm * unit_directions(updates[corrupted])).astype(updates.dtype)


@register('random_gaussian')
class RandomGaussian(UpdateAttack):
  """Ditto's (A2) random Gaussian updates: the update is replaced by N(0, σ²I)."""

  def __init__(self, sigma: float = 1.0):
    self.sigma = _finite('sigma', sigma)

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights
    return rng.normal(0.0, self.sigma, (int(corrupted.sum()), updates.shape[1]))


@register('min_max')
class MinMax(UpdateAttack):
  """AGR-agnostic Min-Max (Shejwalkar & Houmansadr, "Manipulating the Byzantine",
  NDSS 2021, eq. 7 and Algorithm 1): every corrupted client sends m = μ + γ·∇p, with
  the largest γ found such that m is no farther from any honest update than the two
  most distant honest updates are from each other:

    max_{i∈H} ‖m − x_i‖² ≤ max_{i,j∈H} ‖x_i − x_j‖².

  μ is the honest updates' unweighted mean (the attacker is omniscient) and ∇p the
  perturbation (`perturbation_vector`): 'std' −σ (the paper's default; σ the
  coordinate-wise population std, ddof 0, as in `alie`), 'unit_vector' −μ/‖μ‖ or
  'sign' −sign(μ). γ comes from the authors' bisection (`search_gamma`): it starts at
  `gamma_init` (10 in the authors' code) and stops once successive candidates are
  within `threshold` (1e-5), so γ ∈ [0, 2·gamma_init); about log2(gamma_init /
  threshold) ≈ 20 iterations, each one pass over the honest updates.

  Pairwise honest distances come from the centred Gram matrix (one BLAS product
  instead of h² row differences; honest updates are one cloud, so nothing cancels).
  """

  def __init__(self, perturbation: str = 'std', gamma_init: float = 10.0,
               threshold: float = 1e-5):
    self.perturbation = _choice('perturbation', perturbation, PERTURBATIONS)
    self.gamma_init = _positive('gamma_init', gamma_init)
    self.threshold = _positive('threshold', threshold)

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, rng
    honest = honest_rows(updates, corrupted)
    mean = honest.mean(axis=0)
    direction = perturbation_vector(honest, self.perturbation)
    bound = self._bound(honest, mean)
    gamma = search_gamma(
        lambda g: self._statistic(honest, mean + g * direction) <= bound,
        self.gamma_init, self.threshold)
    return mean + gamma * direction

  def _bound(self, honest, mean):
    return np.max(_pairwise_squared_distances(honest - mean), initial=0.0)

  def _statistic(self, honest, candidate):
    return np.max(np.sum((honest - candidate) ** 2, axis=1))


@register('min_sum')
class MinSum(MinMax):
  """AGR-agnostic Min-Sum (Shejwalkar & Houmansadr, NDSS 2021, eq. 8): as `min_max`
  with the sum of squared distances to the honest updates bounded instead of the
  maximum:

    Σ_{i∈H} ‖m − x_i‖² ≤ bound,

  bound = max_{i∈H} Σ_{j∈H} ‖x_i − x_j‖² as the paper writes it (`bound='max'`), or
  the minimum over i as the authors' released code has it (`bound='min'`, stronger
  stealth, smaller γ). Σ_j ‖x_i − x_j‖² = h‖x_i − μ‖² + Σ_j ‖x_j − μ‖² (exact for the
  unweighted mean μ), so no pairwise matrix is formed.
  """

  def __init__(self, perturbation: str = 'std', gamma_init: float = 10.0,
               threshold: float = 1e-5, bound: str = 'max'):
    super().__init__(perturbation, gamma_init, threshold)
    self.bound = _choice('bound', bound, ('max', 'min'))

  def _bound(self, honest, mean):
    centred = np.sum((honest - mean) ** 2, axis=1)
    scores = len(honest) * centred + centred.sum()
    return scores.max() if self.bound == 'max' else scores.min()

  def _statistic(self, honest, candidate):
    return np.sum((honest - candidate) ** 2)


@register('mimic')
class Mimic(UpdateAttack):
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
    honest = honest_rows(updates, corrupted)
    return honest[mimicked_client(honest)]


def mimicked_client(honest: np.ndarray) -> int:
  """Row of `honest` maximizing |⟨x_i − μ, z⟩|, z the top principal direction."""
  centred = honest - honest.mean(axis=0)
  if not np.any(centred):
    return 0
  top = np.linalg.svd(centred, full_matrices=False)[2][0]
  return int(np.argmax(np.abs(centred @ top)))


@register('optimal_alie')
class OptimalALittleIsEnough(UpdateAttack):
  """`alie` with z chosen every round to do the most damage (ByzFL's "Optimal" ALIE):
  z ≥ 0 maximizes ‖A(X(z)) − μ‖, where X(z) is the round's updates with every
  corrupted row set to μ − z·σ, μ the honest updates' unweighted mean (ByzFL's
  reference point) and A the aggregator the attacker expects.

  Attacks never see the TFF factory, so A is a plain-numpy function of
  (rows `[n, d]`, weights `[n]`) → `[d]`: 'median' (coordinate-wise, the default),
  'mean' (weighted by α), or any such callable. The search is ByzFL's `LineMaximize`
  (`line_maximize`): from `start`, step `delta` doubled while the objective improves,
  then shrunk by `ratio` around the best point, `evaluations` aggregator calls in all
  (ByzFL's defaults 16, 0, 1, 0.8).
  """

  def __init__(self, aggregator: Any = 'median', evaluations: int = 16,
               start: float = 0.0, delta: float = 1.0, ratio: float = 0.8):
    self.aggregator = _numpy_aggregator(aggregator)
    self.evaluations = _positive_int('evaluations', evaluations)
    self.start = _non_negative('start', start)
    self.delta = _positive('delta', delta)
    self.ratio = _finite('ratio', ratio)
    if not 0.5 < self.ratio < 1.0:
      raise ValueError(f'The attack parameter ratio must be in (0.5, 1), got {ratio!r}.')

  def candidate(self, honest: np.ndarray, factor: float) -> np.ndarray:
    return honest.mean(axis=0) - factor * honest.std(axis=0)

  def malicious_rows(self, updates, weights, corrupted, rng):
    del rng
    honest = honest_rows(updates, corrupted)
    mean = honest.mean(axis=0)
    aggregate = (self.aggregator if callable(self.aggregator) else
                 NUMPY_AGGREGATORS[self.aggregator])

    def damage(factor):
      rows = updates.copy()
      rows[corrupted] = self.candidate(honest, factor)
      return np.linalg.norm(aggregate(rows, weights) - mean)

    factor = line_maximize(damage, self.evaluations, self.start, self.delta,
                           self.ratio)
    return self.candidate(honest, factor)


@register('optimal_ipm')
class OptimalInnerProductManipulation(OptimalALittleIsEnough):
  """`ipm` with ε ≥ 0 chosen every round as `optimal_alie` chooses z: corrupted rows
  −ε·μ, ε maximizing ‖A(X(ε)) − μ‖ (ByzFL's "Optimal" IPM)."""

  def candidate(self, honest, factor):
    return -factor * honest.mean(axis=0)


@register('model_replacement')
class ModelReplacement(UpdateAttack):
  """Model replacement (Bagdasaryan et al., AISTATS 2020; Ditto's attack A3): the
  attackers scale the update they want applied so that it survives averaging.

  Every corrupted client sends boost · t. t is the round's update the attackers want
  (TFF's convention, current − wanted model; flattened in `tf.nest` order):
  `target_update`, or by default −μ_α, the negative of the honest updates' α-weighted
  mean (the model is pushed back along the honest step). boost defaults to
  Σ_S α / Σ_{S∩C} α, Bagdasaryan's γ = n/η for equal weights and server rate η = 1:
  the weighted mean then becomes t + Σ_{S∖C} α_j x_j / Σ_S α, the target plus the
  honest clients' share.
  """

  def __init__(self, boost: Optional[float] = None, target_update: Any = None):
    self.boost = None if boost is None else _positive('boost', boost)
    if target_update is not None:
      target_update = np.asarray(target_update, np.float64)
      if target_update.ndim != 1 or not np.all(np.isfinite(target_update)):
        raise ValueError('The attack parameter target_update must be a finite vector '
                         f'(the flattened update), got shape {target_update.shape}.')
    self.target_update = target_update

  def malicious_rows(self, updates, weights, corrupted, rng):
    del rng
    if self.target_update is None:
      honest = ~corrupted if (~corrupted).any() else np.ones_like(corrupted)
      honest_weight = weights[honest].sum()
      target = -(weights[honest] @ updates[honest]) / honest_weight if (
          honest_weight > 0) else -updates[honest].mean(axis=0)
    elif self.target_update.shape != (updates.shape[1],):
      raise ValueError(f'target_update has {self.target_update.size} components, the '
                       f'updates {updates.shape[1]}.')
    else:
      target = self.target_update
    boost = self.boost
    if boost is None:
      corrupted_weight = weights[corrupted].sum()
      boost = weights.sum() / corrupted_weight if corrupted_weight > 0 else 1.0
    return boost * target


@register('nan')
class NaNFault(UpdateAttack):
  """A client fault: every component NaN."""

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, corrupted, rng
    return np.full(updates.shape[1], np.nan)


@register('inf')
class InfFault(UpdateAttack):
  """A client fault: every component +Inf."""

  def malicious_rows(self, updates, weights, corrupted, rng):
    del weights, corrupted, rng
    return np.full(updates.shape[1], np.inf)


# ---- the searches and numpy aggregators of the adaptive attacks --------------------

PERTURBATIONS = ('std', 'unit_vector', 'sign')
MAX_SEARCH_ITERATIONS = 200


def perturbation_vector(honest: np.ndarray, kind: str) -> np.ndarray:
  """Shejwalkar & Houmansadr's ∇p: 'std' −σ (population std per coordinate),
  'unit_vector' −μ/‖μ‖ (0 if μ = 0), 'sign' −sign(μ); μ, σ of the honest rows."""
  mean = honest.mean(axis=0)
  if kind == 'std':
    return -honest.std(axis=0)
  if kind == 'unit_vector':
    norm = np.linalg.norm(mean)
    return -mean / norm if norm > 0 else np.zeros_like(mean)
  if kind == 'sign':
    return -np.sign(mean)
  raise ValueError(f'Unknown perturbation {kind!r}; known: {", ".join(PERTURBATIONS)}.')


def search_gamma(feasible: Callable[[float], bool], gamma_init: float,
                 threshold: float) -> float:
  """Shejwalkar & Houmansadr's bisection (Algorithm 1, as in the authors' code):

    γ ← γ_init, s ← γ_init, γ_ok ← 0
    while |γ_ok − γ| > τ:
      if feasible(γ): γ_ok ← γ; γ ← γ + s/2   else: γ ← γ − s/2
      s ← s/2
    return γ_ok

  The largest feasible γ in [0, 2γ_init) to within about 2τ when feasibility is an
  interval [0, γ*] (it is for both attacks: γ = 0, the mean, is always feasible and
  the constraints are convex in γ); 0 when γ_init/2^k never succeeds. Stops after
  `MAX_SEARCH_ITERATIONS` at the latest (never reached: the step halves).
  """
  gamma, step, best = gamma_init, gamma_init, 0.0
  for _ in range(MAX_SEARCH_ITERATIONS):
    if abs(best - gamma) <= threshold:
      break
    if feasible(gamma):
      best = gamma
      gamma += step / 2
    else:
      gamma -= step / 2
    step /= 2
  return best


def line_maximize(objective: Callable[[float], float], evaluations: int, start: float,
                  delta: float, ratio: float) -> float:
  """ByzFL's `LineMaximize`: a best-effort arg max of `objective` over x ≥ 0 in
  `evaluations` calls.

  Expansion: from x = start, try x + δ; while that improves (strictly), move there and
  double δ; on the first failure δ ← ratio·δ. Contraction: with the remaining calls,
  step the last proposal by δ towards the best point (below it: +δ; above it: −δ,
  halved back towards the proposal while negative), keep it when it improves, and
  δ ← ratio·δ after each call.
  """
  best_x, best_y = start, objective(start)
  remaining = evaluations - 1
  proposal = best_x
  while remaining > 0:
    proposal = best_x + delta
    value = objective(proposal)
    remaining -= 1
    if value > best_y:
      best_x, best_y = proposal, value
      delta *= 2
    else:
      delta *= ratio
      break
  while remaining > 0:
    if proposal < best_x:
      proposal += delta
    else:
      x = proposal - delta
      while x < 0:
        x = (x + proposal) / 2
      proposal = x
    value = objective(proposal)
    remaining -= 1
    if value > best_y:
      best_x, best_y = proposal, value
    delta *= ratio
  return best_x


def unit_directions(rows: np.ndarray) -> np.ndarray:
  """Every row divided by its norm (float64); a zero row, which has no direction, is
  the all-ones direction."""
  rows = rows.astype(np.float64)
  norms = np.linalg.norm(rows, axis=1, keepdims=True)
  fallback = np.full_like(rows, 1.0 / np.sqrt(max(rows.shape[1], 1)))
  return np.where(norms > 0, rows / np.where(norms > 0, norms, 1.0), fallback)


def _weighted_mean(rows, weights):
  total = weights.sum()
  return weights @ rows / total if total > 0 else rows.mean(axis=0)


def _coordinate_median(rows, weights):
  del weights
  return np.median(rows, axis=0)


# The aggregators an adaptive attack may expect, by name: (rows, weights) → vector.
NUMPY_AGGREGATORS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    'mean': _weighted_mean,
    'median': _coordinate_median,
}


def _pairwise_squared_distances(centred: np.ndarray) -> np.ndarray:
  gram = centred @ centred.T
  norms = np.diag(gram)
  return np.maximum(norms[:, None] + norms[None, :] - 2 * gram, 0.0)


def _numpy_aggregator(aggregator):
  if callable(aggregator) or (isinstance(aggregator, str)
                              and aggregator in NUMPY_AGGREGATORS):
    return aggregator
  raise ValueError(f'The attack parameter aggregator must be one of '
                   f'{", ".join(NUMPY_AGGREGATORS)} or a function (rows, weights) → '
                   f'vector, got {aggregator!r}.')


def _choice(name: str, value, known: Sequence[str]) -> str:
  if value not in known:
    raise ValueError(f'The attack parameter {name} must be one of {", ".join(known)}, '
                     f'got {value!r}.')
  return value


# TypeError for a parameter of the wrong type, ValueError out of range, as the
# aggregators' arguments (`tff_robust.arguments`).
def _positive(name: str, value) -> float:
  return arguments.check_positive_float(f'The attack parameter {name}', value)


def _non_negative(name: str, value) -> float:
  return arguments.check_nonnegative_float(f'The attack parameter {name}', value)


def _positive_int(name: str, value) -> int:
  return arguments.check_positive_int(f'The attack parameter {name}', value)


def _finite(name: str, value) -> float:
  return arguments.check_finite_float(f'The attack parameter {name}', value)


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
