"""Weight attacks: a corrupted device reports the weight it likes (the α_i of every
weighted aggregate are the clients' own example counts), beside the update another
attack sends.

`weight_inflation` claims a fixed multiple of the true weight; `adaptive_weight` the
largest weight a robust weight cap (`tff_robust.aggregators.weight_cap`) lets through,
the cap the defence computes when every corrupted client claims more than any honest
one (then each weighs exactly the cap, and is not counted as capped).
"""

import abc
from typing import Any, Mapping, Optional

import numpy as np

from tasks import references
from tasks.simulation.attacks import base

DEFAULT_UPDATE_ATTACK = 'ipm'
# The far point of the weight-attack benchmark (benchmarks.weight_attacks): −10 ×
# the honest mean.
DEFAULT_UPDATE_PARAMS = {'epsilon': 10.0}


def _update_attack(update_attack: str,
                   update_params: Optional[Mapping[str, Any]]):
  """`(name, params, attack)` of a weight attack's update: the update attack
  `update_attack` with `update_params` (default: IPM at ε = 10, −10 × the honest
  mean)."""
  if update_attack in _WEIGHT_ATTACKS:
    raise ValueError(f'update_attack must be an update attack, got the weight attack '
                     f'{update_attack!r}.')
  base.choice('update_attack', update_attack,
              [n for n in base.UPDATE_ATTACKS if n not in _WEIGHT_ATTACKS])
  if update_params is None and update_attack == DEFAULT_UPDATE_ATTACK:
    update_params = DEFAULT_UPDATE_PARAMS
  update_params = dict(update_params or {})
  return (update_attack, update_params,
          base.build_update_attack(update_attack, **update_params))


def _repr(attack) -> str:
  params = ', '.join(f'{k}={v!r}' for k, v in vars(attack).items()
                     if not k.startswith('_'))
  return f'{type(attack).__name__}({params})'


class _WeightAttack(base.UpdateAttack):
  """A weight attack's update: that of its `update_attack` (set as `self._updates`).
  Its subclasses say what weight the corrupted clients report."""

  @abc.abstractmethod
  def reported_weights(self, weights, corrupted):
    """The weights every client reports (the honest clients' own)."""

  def malicious_rows(self, updates, weights, corrupted, rng):
    return self._updates.malicious_rows(updates, weights, corrupted, rng)

  def __repr__(self):
    return _repr(self)


@base.register('weight_inflation')
class WeightInflation(_WeightAttack):
  """Every corrupted client reports `factor` × its true weight (its update that of
  `update_attack`)."""

  def __init__(self, factor: float = 100.0, update_attack: str = DEFAULT_UPDATE_ATTACK,
               update_params: Optional[Mapping[str, Any]] = None):
    self.factor = base.positive('factor', factor)
    self.update_attack, self.update_params, self._updates = _update_attack(
        update_attack, update_params)

  def reported_weights(self, weights, corrupted):
    weights = np.asarray(weights, np.float64)
    return np.where(np.asarray(corrupted, bool), self.factor * weights, weights)


@base.register('adaptive_weight')
class AdaptiveWeight(_WeightAttack):
  """Every corrupted client reports the cap of a weight cap at `multiple` × the
  `quantile` of the clients' weights (the defence's defaults), computed as the
  defence does with every corrupted client claiming more than any honest one:
  the largest weight that cap lets through. Against no cap it is a modest
  inflation (`multiple` × about the quantile)."""

  # The weight cap's defaults (`tff_robust.aggregators.weight_cap`; a test checks
  # they agree): that module imports TensorFlow, which the binaries' flag checks,
  # building attacks, do not.
  def __init__(self, quantile: float = 0.5, multiple: float = 2.0,
               update_attack: str = DEFAULT_UPDATE_ATTACK,
               update_params: Optional[Mapping[str, Any]] = None):
    self.quantile = base.positive('quantile', quantile)
    if not self.quantile < 1:
      raise ValueError(f'The attack parameter quantile must be in (0, 1), got {quantile!r}.')
    self.multiple = base.positive('multiple', multiple)
    self.update_attack, self.update_params, self._updates = _update_attack(
        update_attack, update_params)

  def reported_weights(self, weights, corrupted):
    weights = np.asarray(weights, np.float64)
    corrupted = np.asarray(corrupted, bool)
    usable = weights[np.isfinite(weights) & (weights > 0)]
    if not corrupted.any() or not len(usable):
      return weights.copy()
    claims = np.where(corrupted, _LARGEST_CLAIM, weights)
    trace = {}
    references.capped_weights(claims, self.quantile, self.multiple, trace=trace)
    # Where the attackers own the quantile the cap is unbounded: the largest claim a
    # float32 weight holds.
    return np.where(corrupted, min(trace['weight_cap'], _LARGEST_CLAIM), weights)


_WEIGHT_ATTACKS = ('weight_inflation', 'adaptive_weight')
_LARGEST_CLAIM = float(np.finfo(np.float32).max)
