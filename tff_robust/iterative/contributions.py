"""What each client contributes to the aggregations of a pass, and what an honest one can.

Every client-to-server aggregation of an iterative aggregate goes through `sum_of` (a
`tff.federated_sum`), `max_of` (a `tff.federated_max`), `mean_of` (one call of the
inner weighted mean on a value and a weight) or `unweighted_of` (one call of an
unweighted process, e.g. GMA's sign sum). Each names its contribution and states
its `Bound`: the values an honest client can send, given its weight α and what the
server broadcast.

Trust: the server learns only the aggregates and checks no client, so a corrupted
device may send anything in any of them, in any pass (the RFA paper's "aggregation"
corruption, its Table 1, which no aggregator here is robust to by itself). A secure
aggregation that checks the range of its inputs, with zero-knowledge range and norm
proofs (e.g. RoFL, https://arxiv.org/abs/2107.03311), can enforce the bounds: a
contribution outside its bound is refused and the client adds zero to that
aggregation. Such a protocol encodes values in a finite field, so a non-finite
contribution is always refused; `UNBOUNDED` admits every finite value. The
simulation applies the bounds as that protocol would
(`tasks.simulation.pass_attacks`); the library's computations carry them only as
declarations.

`intercepted(interceptor)` is the seam for that: while it is active, the passes
traced call the interceptor's `sum_of`, `max_of` and `mean_of` instead. Without one
(every deployed computation) they are `tff.federated_sum`, `tff.federated_max` and
`process.next`, so the compiled computations do not change.
"""

import contextlib
import contextvars
from typing import Callable, NamedTuple, Optional, Protocol, Sequence, Union

import tensorflow as tf
import tensorflow_federated as tff

from tff_robust.common import numerics


# Bumped when a declared bound changes what it admits: simulated results under the
# bounds are retrained (e.g. `benchmarks.protocol_attacks`' ledger).
BOUNDS_REVISION = 2


class Bound(NamedTuple):
  """The contributions an honest client can send.

  `admits(contribution, alpha, *context) → tf.bool`: TensorFlow at a client, with
  `contribution` a nest of tensors, `alpha` its float32 weight and `context` the
  broadcast values the call site passes (e.g. a clipping radius). Every bound also
  requires finite values. `description` says the rule in words.
  """
  description: str
  admits: Callable


def _finite(contribution) -> tf.Tensor:
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(tf.cast(x, tf.float64)))
                        for x in tf.nest.flatten(contribution)])


def _all(contribution, test) -> tf.Tensor:
  return tf.reduce_all([tf.reduce_all(test(tf.cast(x, tf.float64)))
                        for x in tf.nest.flatten(contribution)])


def _alpha(alpha) -> tf.Tensor:
  return tf.cast(alpha, tf.float64)


UNBOUNDED = Bound('any finite value', lambda contribution, alpha, *context: _finite(
    contribution))
NONNEGATIVE = Bound('≥ 0', lambda contribution, alpha, *context: tf.logical_and(
    _finite(contribution), _all(contribution, lambda x: x >= 0)))
EQUAL_TO_ALPHA = Bound('= α', lambda contribution, alpha, *context: tf.logical_and(
    _finite(contribution), _all(contribution, lambda x: tf.equal(x, _alpha(alpha)))))
AT_MOST_ALPHA = Bound('in [0, α]', lambda contribution, alpha, *context: tf.logical_and(
    _finite(contribution),
    _all(contribution, lambda x: tf.logical_and(x >= 0, x <= _alpha(alpha)))))
ZERO_OR_ALPHA = Bound('0 or α', lambda contribution, alpha, *context: tf.logical_and(
    _finite(contribution), _all(contribution, lambda x: tf.logical_or(
        tf.equal(x, 0), tf.equal(x, _alpha(alpha))))))
FLAG = Bound('0 or 1', lambda contribution, alpha, *context: tf.logical_and(
    _finite(contribution), _all(contribution, lambda x: tf.logical_or(
        tf.equal(x, 0), tf.equal(x, 1)))))
SIGN_VOTE = Bound('in [-1, 1]', lambda contribution, alpha, *context: tf.logical_and(
    _finite(contribution), _all(contribution, lambda x: tf.abs(x) <= 1)))


def one_hot(mass: str = 'alpha') -> Bound:
  """A histogram row that is all zeros or one entry of α (`mass='alpha'`) or of 1
  (`mass='one'`) and zeros elsewhere."""
  if mass not in ('alpha', 'one'):
    raise ValueError(f"mass must be 'alpha' or 'one', got {mass!r}.")

  def admits(contribution, alpha, *context):
    row = tf.reshape(tf.cast(contribution, tf.float64), [-1])
    value = _alpha(alpha) if mass == 'alpha' else tf.constant(1.0, tf.float64)
    nonzero = tf.not_equal(row, 0)
    return tf.logical_and(_finite(row), tf.logical_and(
        tf.reduce_sum(tf.cast(nonzero, tf.int32)) <= 1,
        tf.reduce_all(tf.logical_or(tf.logical_not(nonzero), tf.equal(row, value)))))

  return Bound(f'one-hot of {"α" if mass == "alpha" else "1"}', admits)


def norm_at_most(radius: Optional[float] = None, slack: float = 1e-5) -> Bound:
  """The structure's global L2 norm at most `radius` (None: the radius the call site
  passes as `context[0]`), × (1 + slack) for the rounding of an honest client's
  clipping."""

  def admits(contribution, alpha, *context):
    limit = radius if radius is not None else context[0]
    return tf.logical_and(_finite(contribution), numerics.global_l2_norm(
        contribution) <= tf.cast(limit, tf.float64) * (1.0 + slack))

  return Bound('norm ≤ τ', admits)


def weighted_distance_within(value, weight, alpha, center, limit) -> tf.Tensor:
  """The test of an inner mean's (w, weight) that an honest client's weight bounds:
  finite, weight ∈ [0, α] and weight·‖w − v‖ ≤ α·limit (v = 0 for `center` None),
  with a margin for float32 rounding. A client then moves the weighted mean around
  the broadcast v by at most α·limit / Σ weight, whatever it sends."""
  weight, alpha = tf.cast(weight, tf.float64), tf.cast(alpha, tf.float64)
  distance = (numerics.global_l2_norm(value) if center is None
              else numerics.global_l2_distance(value, center))
  return tf.reduce_all([
      _finite(value), tf.math.is_finite(weight), weight >= 0, weight <= alpha,
      weight * distance <= alpha * tf.cast(limit, tf.float64) * (1.0 + 1e-5)])


def fields(*bounds: Bound) -> Bound:
  """The bound of a tuple (or of the values of a dict, in order): `bounds[i]` on its
  element i."""

  def admits(contribution, alpha, *context):
    parts = (list(contribution.values()) if isinstance(contribution, dict)
             else list(contribution))
    if len(parts) != len(bounds):
      raise ValueError(f'{len(bounds)} bounds for a contribution of {len(parts)}.')
    return tf.reduce_all([bound.admits(part, alpha, *context)
                          for bound, part in zip(bounds, parts)])

  return Bound('(' + ', '.join(b.description for b in bounds) + ')', admits)


def pair(value: Bound, weight: Bound) -> Bound:
  """The bound of a `mean_of` contribution: `value` on the value, `weight` on the
  weight (`admits((value, weight), alpha, *context)`)."""
  return fields(value, weight)


class Interceptor(Protocol):
  """What stands in for the aggregations while `intercepted` is active."""

  def sum_of(self, name: str, values, alpha, bound: Bound, context: Sequence):
    ...

  def max_of(self, name: str, values, alpha, bound: Bound, context: Sequence):
    ...

  def mean_of(self, name: str, process: tff.templates.AggregationProcess, state,
              value, weight, alpha, bound: Bound, context: Sequence):
    ...

  def unweighted_of(self, name: str, process: tff.templates.AggregationProcess,
                    state, value, alpha, bound: Bound, context: Sequence):
    ...


_ACTIVE: contextvars.ContextVar[Optional[Interceptor]] = contextvars.ContextVar(
    'tff_robust_contribution_interceptor', default=None)


@contextlib.contextmanager
def intercepted(interceptor: Interceptor):
  """The aggregations traced inside go through `interceptor`."""
  token = _ACTIVE.set(interceptor)
  try:
    yield interceptor
  finally:
    _ACTIVE.reset(token)


Context = Union[Sequence, Callable[[], Sequence]]


def _context(context: Context) -> tuple:
  return tuple(context() if callable(context) else context)


def sum_of(name: str, values, alpha, bound: Bound, context: Context = ()):
  """`tff.federated_sum(values)`: the clients' contribution `name` (at CLIENTS),
  within `bound` for an honest client of weight `alpha` (at CLIENTS); `context`:
  values at CLIENTS that the bound reads, or a function returning them (called only
  under an interceptor, so a deployed computation broadcasts nothing for them)."""
  interceptor = _ACTIVE.get()
  if interceptor is None:
    return tff.federated_sum(values)
  return interceptor.sum_of(name, values, alpha, bound, _context(context))


def max_of(name: str, values, alpha, bound: Bound, context: Context = ()):
  """`tff.federated_max(values)`, as `sum_of`."""
  interceptor = _ACTIVE.get()
  if interceptor is None:
    return tff.federated_max(values)
  return interceptor.max_of(name, values, alpha, bound, _context(context))


def mean_of(name: str, process: tff.templates.AggregationProcess, state, value,
            weight, alpha, bound: Bound, context: Context = ()):
  """`process.next(state, value, weight)`: the clients' contribution `name`, the
  pair (value, weight) at CLIENTS, within `bound` (a `pair`)."""
  interceptor = _ACTIVE.get()
  if interceptor is None:
    return process.next(state, value, weight)
  return interceptor.mean_of(name, process, state, value, weight, alpha, bound,
                             _context(context))


def unweighted_of(name: str, process: tff.templates.AggregationProcess, state, value,
                  alpha, bound: Bound, context: Context = ()):
  """`process.next(state, value)` of an unweighted process (e.g. a secure sum): the
  clients' contribution `name`, `value` at CLIENTS, within `bound`."""
  interceptor = _ACTIVE.get()
  if interceptor is None:
    return process.next(state, value)
  return interceptor.unweighted_of(name, process, state, value, alpha, bound,
                                   _context(context))
