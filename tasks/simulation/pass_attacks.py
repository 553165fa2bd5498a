"""Corrupted clients inside an iterative secure aggregate: a client that sends
different inputs in different passes (honest in pass 1, attacking in pass 3).

Every pass of an iterative aggregate (the GM's Weiszfeld passes, the γ-mean's
iterations, secure centered clipping's, the weight cap's histogram pass) asks each
client for fresh contributions computed from its update and its weight. An honest
client computes them all from the same pair; a corrupted device may compute each
pass's from another one. This module expresses that in the simulation without
touching a factory: the aggregate runs pass by pass (the same `IterativeSteps`, driven
by `tff_robust.iterative.iterative_steps.PassByPass`, the non-finite filter in every
pass as deployed), and a `PassAttack` chooses every corrupted client's (update,
weight) for each pass.

What it does not express: contributions inconsistent *within* one pass (a β_i that is
not α_i over the client's distance, a histogram entry that is not one-hot of α_i, a
poisoned Σβ beside an honest β·w). Those need the per-pass client computations
themselves replaced (see docs/aggregators.md, "Threat model").
"""

import abc
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import tensorflow_federated as tff

from tasks.simulation.attacks import base
from tff_robust.aggregators import nonfinite
from tff_robust.iterative import iterative_steps

PASS_ATTACKS: dict[str, type['PassAttack']] = {}


def register(name: str):
  def add(cls):
    if name in PASS_ATTACKS:
      raise ValueError(f'Pass attack name {name!r} is taken.')
    PASS_ATTACKS[name] = cls
    return cls
  return add


class PassAttack(abc.ABC):
  """Chooses what the corrupted clients send in each pass of one call."""

  @abc.abstractmethod
  def pass_inputs(self, pass_index: int, num_passes: int, updates: np.ndarray,
                  weights: np.ndarray, corrupted: np.ndarray,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`(rows [num_corrupted, d], weights [num_corrupted])`: the corrupted clients'
    update and weight for pass `pass_index` of `num_passes` (0-based), from every
    client's honest `updates` (`[n, d]` float64) and true `weights` (`[n]`)."""


@register('late_switch')
class LateSwitch(PassAttack):
  """Honest in the passes before `from_pass`, from there on the update of the update
  attack `update_attack` (`update_params`) with `weight_factor` × the true weight:
  e.g. the last pass alone (`from_pass=-1`)."""

  def __init__(self, from_pass: int = -1, update_attack: str = 'ipm',
               update_params=None, weight_factor: float = 1.0):
    if not isinstance(from_pass, int) or isinstance(from_pass, bool):
      raise TypeError(f'from_pass must be an integer, got {from_pass!r}.')
    self.from_pass = from_pass
    if update_params is None and update_attack == 'ipm':
      update_params = {'epsilon': 10.0}
    self.update_attack = update_attack
    self.update_params = dict(update_params or {})
    self._updates = base.build_update_attack(update_attack, **self.update_params)
    if self._updates is None:
      raise ValueError(f'update_attack must be an update attack, got {update_attack!r}.')
    self.weight_factor = base.positive('weight_factor', weight_factor)

  def _attacking(self, pass_index, num_passes):
    start = self.from_pass if self.from_pass >= 0 else num_passes + self.from_pass
    return pass_index >= start

  def pass_inputs(self, pass_index, num_passes, updates, weights, corrupted, rng):
    if not self._attacking(pass_index, num_passes):
      return updates[corrupted], weights[corrupted]
    rows = np.broadcast_to(
        self._updates.malicious_rows(updates, weights, corrupted, rng),
        (int(corrupted.sum()), updates.shape[1]))
    return rows, self.weight_factor * weights[corrupted]


class PassByPassAggregation(NamedTuple):
  """`initialize()` → the state; `aggregate(state, updates, weights, corrupted,
  attack=None, rng=None)` → `MeasuredProcessOutput`; `num_passes`: computations per
  call (the passes a `PassAttack` sees)."""
  initialize: Callable[[], Any]
  aggregate: Callable[..., tff.templates.MeasuredProcessOutput]
  num_passes: int


def pass_by_pass(factory: tff.aggregators.WeightedAggregationFactory, value_type,
                 weight_type=tff.TensorType(np.float32)) -> PassByPassAggregation:
  """`aggregate(state, updates, weights, corrupted, attack, rng)` → the
  `MeasuredProcessOutput` of the registry's `factory` (the non-finite filter around
  an `IterativeAggregationFactory`) run pass by pass, each pass's corrupted inputs
  chosen by `attack` (a `PassAttack`, or None: every pass honest, the factory's own
  result). `updates` is `[n, d]` (the flattened `value_type`), `weights` `[n]`.

  Raises:
    TypeError: for a factory that is not a filtered iterative aggregate.
  """
  if not (isinstance(factory, nonfinite.NonfiniteFilteringFactory) and isinstance(
      factory.inner, iterative_steps.IterativeAggregationFactory)):
    raise TypeError('pass_by_pass takes the registry form of an iterative aggregate '
                    '(NonfiniteFilteringFactory around an IterativeAggregationFactory), '
                    f'got {factory!r}.')
  passes = iterative_steps.PassByPass(
      factory.inner.steps(value_type), weight_type,
      nonfinite.client_filter(value_type, weight_type))
  shapes = [tuple(leaf.shape) for leaf in _leaf_types(value_type)]

  def aggregate(state, updates, weights, corrupted, attack=None, rng=None):
    updates = np.asarray(updates, np.float64)
    weights = np.asarray(weights, np.float64)
    corrupted = np.asarray(corrupted, bool)
    rng = rng if rng is not None else np.random.default_rng()
    server, count = state, None
    num_passes = len(passes.computations)
    for index, computation in enumerate(passes.computations):
      rows, alphas = updates.copy(), weights.copy()
      if attack is not None and corrupted.any():
        rows[corrupted], alphas[corrupted] = attack.pass_inputs(
            index, num_passes, updates, weights, corrupted, rng)
      output = computation(server, [_structure(r, shapes) for r in rows],
                           [np.float32(a) for a in alphas])
      if count is None:
        count = output.get('count')
      server = output.get('carry')
    measurements = dict(output['measurements'])
    measurements[nonfinite.MEASUREMENT] = np.int32(count)
    return tff.templates.MeasuredProcessOutput(output['state'], output['result'],
                                               measurements)

  return PassByPassAggregation(passes.initialize, aggregate, len(passes.computations))


def _leaf_types(value_type) -> list:
  if isinstance(value_type, tff.TensorType):
    return [value_type]
  return [leaf for _, element in tff.structure.iter_elements(value_type)
          for leaf in _leaf_types(element)]


def _structure(row: np.ndarray, shapes: Sequence[tuple]) -> Any:
  """A flat row as the value (one tensor, or a list of tensors in type order)."""
  pieces, start = [], 0
  for shape in shapes:
    size = int(np.prod(shape, dtype=np.int64))
    pieces.append(row[start:start + size].reshape(shape).astype(np.float32))
    start += size
  return pieces[0] if len(pieces) == 1 else pieces
