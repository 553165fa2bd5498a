"""Corrupted clients inside an iterative secure aggregate (protocol attacks).

Every pass of an iterative aggregate (the GM's Weiszfeld passes, the γ-mean's
iterations, secure centered clipping's, the weight cap's histogram pass) asks each
client for fresh contributions computed from its update and its weight. An honest
client computes them all from the same pair; a corrupted device may send anything.
This module expresses that in the simulation without touching a factory: the
aggregate runs pass by pass (the same `IterativeSteps`, driven by
`tff_robust.iterative.iterative_steps.PassByPass`, the non-finite filter in every
pass as deployed), and

*   a `PassAttack` chooses every corrupted client's (update, weight) for each pass
    (`late_switch`: honest in pass 1, attacking in pass 3);
*   a `ContributionAttack` also replaces what a corrupted client contributes to the
    aggregations of a pass (`tff_robust.iterative.contributions`): a β that is not
    α over its distance, a histogram row that is not one-hot of α, a poisoned Σβ.

`pass_by_pass(..., bounds=True)` applies every contribution's declared bound as a
secure aggregation with input range checks would: a contribution outside it is
refused (the client adds zero to that aggregation), and the refusals are counted in
the measurement `REFUSED_MEASUREMENT`.
"""

import abc
import collections
import dataclasses
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks.simulation.attacks import base
from tff_robust.aggregators import robust_scale
from tff_robust.iterative import contributions
from tff_robust.iterative import iterative_steps

# Contributions refused by the bounds in one call (`pass_by_pass(bounds=True)`).
REFUSED_MEASUREMENT = 'num_refused_contributions'

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


class ContributionAttack(LateSwitch):
  """A corrupted client that sends the update of `update_attack` in every pass from
  `from_pass` on (as `LateSwitch`) and replaces its contributions there: subclasses
  define `sum_contribution` and `mean_contribution`, TensorFlow traced at a client
  (the honest contribution and the client's α in, the one sent out)."""

  def __init__(self, from_pass: int = 0, **kwargs):
    super().__init__(from_pass=from_pass, **kwargs)

  def tampers(self, pass_index: int, num_passes: int) -> bool:
    return self._attacking(pass_index, num_passes)

  def sum_contribution(self, name: str, contribution, alpha):
    del name, alpha
    return contribution

  def mean_contribution(self, name: str, value, weight, alpha):
    del name, alpha
    return value, weight


def _histogram_at(row, bucket: int, mass):
  """`row`'s shape with `mass` in `bucket` (0 or -1) and zeros elsewhere."""
  size = row.shape[-1]
  index = bucket % size
  return tf.cast(tf.one_hot(index, size, dtype=tf.float64) * mass, row.dtype)


def _claimed_near(name: str, contribution, alpha, factor: float):
  """The histogram contributions with the client's mass × `factor` in the lowest
  bucket (as if at distance ~0; for the weight histogram, the lowest weight)."""
  alpha = tf.cast(alpha, tf.float64)
  if name == 'scale_statistics':
    lowest, _ = robust_scale.buckets(contribution.shape[-1] != robust_scale.NUM_BUCKETS)
    counts = _histogram_at(contribution[0], 0, alpha * factor)
    return tf.stack([counts, counts * float(lowest)])
  if name in ('radius_histogram', 'near_histogram'):
    return _histogram_at(contribution, 0, alpha * factor)
  if name == 'weight_histogram':
    return _histogram_at(contribution, 0, tf.constant(factor, tf.float64))
  return contribution


@register('claim_near')
class ClaimNear(ContributionAttack):
  """Every histogram says "I am at the estimate" and every inner-mean weight is α ×
  `factor` (an honest client's largest is α), whatever the distance of the update
  sent. `factor=1` is what the bounds admit; more is refused by them."""

  def __init__(self, factor: float = 1.0, **kwargs):
    super().__init__(**kwargs)
    self.factor = base.positive('factor', factor)

  def sum_contribution(self, name, contribution, alpha):
    return _claimed_near(name, contribution, alpha, self.factor)

  def mean_contribution(self, name, value, weight, alpha):
    return value, tf.cast(tf.cast(alpha, tf.float64) * self.factor, weight.dtype)


@register('numerator_only')
class NumeratorOnly(ContributionAttack):
  """The inner mean gets (`scale` × update, α / `scale`): the weighted value α·w of
  a weight-α client with almost no weight in the denominator. Admitted by the
  bounds, which cannot bound an update's norm."""

  def __init__(self, scale: float = 1e6, **kwargs):
    super().__init__(**kwargs)
    self.scale = base.positive('scale', scale)

  def mean_contribution(self, name, value, weight, alpha):
    scaled = tf.nest.map_structure(lambda x: x * tf.cast(self.scale, x.dtype), value)
    return scaled, tf.cast(tf.cast(alpha, tf.float64) / self.scale, weight.dtype)


@register('poisoned_sums')
class PoisonedSums(ContributionAttack):
  """Every scalar and histogram sum (Σβ, Σα, the histograms, the γ-mean's and the
  clipping counts) gets `value` in every entry; the inner means stay honest."""

  def __init__(self, value: float = -1e6, **kwargs):
    super().__init__(**kwargs)
    self.value = float(value)

  def sum_contribution(self, name, contribution, alpha):
    return tf.nest.map_structure(
        lambda x: tf.cast(tf.fill(tf.shape(x), self.value), x.dtype)
        if x.dtype.is_floating else tf.fill(tf.shape(x), tf.cast(
            np.clip(self.value, -2**31, 2**31 - 1), x.dtype)), contribution)


@register('nan_contributions')
class NanContributions(ContributionAttack):
  """NaN in every floating contribution (sums and inner means)."""

  def sum_contribution(self, name, contribution, alpha):
    return tf.nest.map_structure(_nan_like, contribution)

  def mean_contribution(self, name, value, weight, alpha):
    return tf.nest.map_structure(_nan_like, value), _nan_like(weight)


def _nan_like(x):
  return tf.fill(tf.shape(x), tf.cast(np.nan, x.dtype)) if x.dtype.is_floating else x


class _Tampering:
  """The interceptor of one pass: corrupted clients' contributions replaced by the
  attack's, then (with `bounds`) each checked against its declared bound."""

  def __init__(self, attack: Optional[ContributionAttack], bounds: bool,
               corrupted, index: int, num_passes: int):
    self._attack = attack if attack is not None and attack.tampers(
        index, num_passes) else None
    self._bounds = bounds
    self._corrupted = corrupted
    self._refused, self._outputs = [], None

  def sum_of(self, name, values, alpha, bound, context):
    return tff.federated_sum(self._sent(name, values, alpha, bound, context, None))

  def max_of(self, name, values, alpha, bound, context):
    return tff.federated_max(self._sent(name, values, alpha, bound, context, None))

  def unweighted_of(self, name, process, state, value, alpha, bound, context):
    return process.next(state, self._sent(name, value, alpha, bound, context, None))

  def mean_of(self, name, process, state, value, weight, alpha, bound, context):
    pair = self._sent(name, tff.federated_zip((value, weight)), alpha, bound,
                      context, 'mean')
    return process.next(state, pair[0], pair[1])

  def outputs(self):
    """After the pass: {'refused': the number of refused contributions} at SERVER."""
    if self._refused and self._outputs is None:
      self._outputs = collections.OrderedDict(refused=tff.federated_sum(
          tff.federated_map(_sum_of_flags(len(self._refused)),
                            tff.federated_zip(tuple(self._refused)))))
    return self._outputs

  def _sent(self, name, values, alpha, bound, context, kind):
    if self._attack is None and not self._bounds:
      return values
    attack, bounds = self._attack, self._bounds
    types = [values.type_signature.member, alpha.type_signature.member,
             self._corrupted.type_signature.member]
    arguments = [values, alpha, self._corrupted]
    if context:
      # TFF's computations take no varargs: the bound's context as one struct.
      arguments.append(tff.federated_zip(tuple(context)))
      types.append(arguments[-1].type_signature.member)

    def send(contribution, client_alpha, corrupted, client_context=()):
      if attack is not None:
        if kind == 'mean':
          tampered = attack.mean_contribution(name, contribution[0], contribution[1],
                                              client_alpha)
        else:
          tampered = attack.sum_contribution(name, contribution, client_alpha)
        contribution = _where(corrupted, tampered, contribution)
      refused = tf.constant(0, tf.int32)
      if bounds:
        admitted = bound.admits(contribution, client_alpha, *client_context)
        contribution = tf.nest.map_structure(
            lambda t: tf.where(admitted, t, tf.zeros([], t.dtype)), contribution)
        refused = tf.cast(tf.logical_not(admitted), tf.int32)
      return contribution, refused

    if context:
      computation = tff.tensorflow.computation(
          lambda c, a, f, x: send(c, a, f, tuple(x)), *types)
    else:
      computation = tff.tensorflow.computation(lambda c, a, f: send(c, a, f), *types)
    sent = tff.federated_map(computation, tuple(arguments))
    if bounds:
      self._refused.append(sent[1])
    return sent[0]


def _where(condition, if_true, if_false):
  """`if_true` or `if_false`, structures of the same shapes, by a scalar `condition`
  (a selection of two computed values: no branch graphs to trace, unlike `tf.cond`).

  Raises:
    ValueError: if two tensors differ in shape (an attack's contribution must have
      the honest one's).
  """
  def select(a, b):
    if not a.shape.is_compatible_with(b.shape):
      raise ValueError(f'A tampered contribution of shape {a.shape} replaces one of '
                       f'shape {b.shape}.')
    return tf.where(condition, a, b)

  return tf.nest.map_structure(select, if_true, if_false)


def _sum_of_flags(count: int):
  @tff.tensorflow.computation(tff.StructType([np.int32] * count))
  def total(flags):
    return tf.add_n(list(flags))
  return total


@dataclasses.dataclass(frozen=True)
class Protocol:
  """A protocol attack on an iterative aggregate (`PASS_ATTACKS`; its corrupted
  clients are the round's) and whether the secure aggregation refuses contributions
  outside their declared bounds (`tasks.simulation.rounds.Round(protocol=...)`)."""
  attack: Optional[PassAttack] = None
  bounds: bool = False

  def __post_init__(self):
    if self.attack is not None and not isinstance(self.attack, PassAttack):
      raise TypeError(f'attack must be a PassAttack, got {self.attack!r}.')


def build_protocol(attack: Optional[str], params=None, bounds: bool = False) -> Protocol:
  """The `Protocol` of a registered pass attack's name and arguments (None: honest
  clients, only the bounds)."""
  if attack is not None and attack not in PASS_ATTACKS:
    raise ValueError(f'Unknown protocol attack {attack!r}; known: '
                     f'{", ".join(sorted(PASS_ATTACKS))}.')
  built = PASS_ATTACKS[attack](**dict(params or {})) if attack is not None else None
  return Protocol(built, bool(bounds))


class PassByPassAggregation(NamedTuple):
  """`initialize()` → the state; `aggregate(state, updates, weights, corrupted,
  attack=None, rng=None)` → `MeasuredProcessOutput`; `num_passes`: computations per
  call (the passes a `PassAttack` sees)."""
  initialize: Callable[[], Any]
  aggregate: Callable[..., tff.templates.MeasuredProcessOutput]
  num_passes: int


def pass_by_pass(factory: tff.aggregators.WeightedAggregationFactory, value_type,
                 weight_type=tff.TensorType(np.float32),
                 contribution_attack: Optional[ContributionAttack] = None,
                 bounds: bool = False) -> PassByPassAggregation:
  """`aggregate(state, updates, weights, corrupted, attack, rng)` → the
  `MeasuredProcessOutput` of the registry's `factory` (the non-finite filter around
  an `IterativeAggregationFactory`) run pass by pass, each pass's corrupted inputs
  chosen by `attack` (a `PassAttack`, or None: every pass honest, the factory's own
  result; default `contribution_attack`). `updates` is `[n, d]` (the flattened
  `value_type`), `weights` `[n]`.

  `contribution_attack` replaces the corrupted clients' contributions in the passes
  it tampers with; `bounds` refuses every contribution outside its declared bound
  (and reports the count as `REFUSED_MEASUREMENT`). Either traces one computation
  per pass, with the corrupted flags as a client argument.

  Raises:
    TypeError: for a factory that is not a filtered iterative aggregate.
  """
  if not isinstance(factory, iterative_steps.IterativeAggregationFactory):
    raise TypeError('pass_by_pass takes an iterative aggregate (e.g. the registry\'s '
                    'NonfiniteFilteringFactory around one, a transformer of its steps), '
                    f'got {factory!r}.')
  if contribution_attack is not None and not isinstance(contribution_attack,
                                                       ContributionAttack):
    raise TypeError('contribution_attack must be a ContributionAttack, got '
                    f'{contribution_attack!r}.')
  simulated = contribution_attack is not None or bounds
  interceptor_for = None
  if simulated:
    interceptor_for = lambda index, count, flags: _Tampering(  # pylint: disable=g-long-lambda
        contribution_attack, bounds, flags, index, count)
  passes = iterative_steps.PassByPass(
      factory.steps(value_type), weight_type, flags_type=tff.TensorType(np.bool_) if simulated else None,
      interceptor_for=interceptor_for)
  shapes = [tuple(leaf.shape) for leaf in _leaf_types(value_type)]
  single_tensor = isinstance(value_type, tff.TensorType)

  def aggregate(state, updates, weights, corrupted, attack=None, rng=None):
    updates = np.asarray(updates, np.float64)
    weights = np.asarray(weights, np.float64)
    corrupted = np.asarray(corrupted, bool)
    rng = rng if rng is not None else np.random.default_rng()
    attack = attack if attack is not None else contribution_attack
    flags = ([[np.bool_(c) for c in corrupted]] if simulated else [])
    server, first, refused = state, None, 0
    num_passes = len(passes.computations)
    for index, computation in enumerate(passes.computations):
      rows, alphas = updates.copy(), weights.copy()
      if attack is not None and corrupted.any():
        rows[corrupted], alphas[corrupted] = attack.pass_inputs(
            index, num_passes, updates, weights, corrupted, rng)
      output = computation(server, [_structure(r, shapes, single_tensor) for r in rows],
                           [np.float32(a) for a in alphas], *flags)
      first = output if first is None else first
      if 'intercepted' in output:
        refused += int(output['intercepted']['refused'])
      server = output.get('carry')
    output = passes.output(first, output)
    if bounds:
      output.measurements[REFUSED_MEASUREMENT] = np.int32(refused)
    return output

  return PassByPassAggregation(passes.initialize, aggregate, len(passes.computations))


def _leaf_types(value_type) -> list:
  if isinstance(value_type, tff.TensorType):
    return [value_type]
  return [leaf for _, element in tff.structure.iter_elements(value_type)
          for leaf in _leaf_types(element)]


def _structure(row: np.ndarray, shapes: Sequence[tuple], single_tensor: bool) -> Any:
  """A flat row as the value (one tensor, or a list of tensors in type order)."""
  pieces, start = [], 0
  for shape in shapes:
    size = int(np.prod(shape, dtype=np.int64))
    pieces.append(row[start:start + size].reshape(shape).astype(np.float32))
    start += size
  return pieces[0] if single_tensor else pieces
