"""Dropping non-finite client updates in front of any aggregator: one wrapper, in the
spirit of TFF's `zeroing_factory`, instead of a check inside every factory.

A robust aggregator is only as robust as its arithmetic: one NaN or infinity from a
faulty or malicious client turns a weighted mean, a Weiszfeld pass or a sort into NaN.
TFF's own client work already zeroes a non-finite model delta, but a client that does
not run TFF's code can send anything; the wrapper runs on the clients' side of every
aggregator and needs nothing but a sum of 0/1 flags, so it keeps a secure aggregator
secure.

The same wrapper applies the one rule on client weights
(`tff_robust.common.numerics.is_usable_weight`): a weight is a count of examples, so a
negative, subnormal or non-finite one drops the client (weight 0, zero update) and is
counted with the non-finite updates. Without the rule a negative weight pulls a
secure aggregate away from the client while a gathering twin leaves the client out,
and a subnormal one is flushed to zero uncounted.
"""

import collections

import tensorflow as tf
import tensorflow_federated as tff

from tff_robust.common import numerics
from tff_robust.common import traced
from tff_robust.iterative import iterative_mean
from tff_robust.iterative import iterative_steps

MEASUREMENT = 'num_nonfinite_clients'


class NonfiniteFilteringFactory(iterative_steps.IterativeAggregationFactory):
  """Gives weight 0 and a zero update to every client whose update holds a NaN or an
  infinity or whose weight is negative, subnormal (below float32's smallest normal
  number) or non-finite, counts them, and aggregates with `inner` (weights as
  float32). A weight of exactly 0 is kept (and not counted).

  The created process's `next` has type signature
  `(<state, {value}@CLIENTS, {weight}@CLIENTS> -> <state, result=value@SERVER,
  measurements@SERVER>)`, with the inner process's state and result. Its measurements
  are the inner process's named measurements (kept flat, so names do not change when
  the wrapper is added) plus
  *   `num_nonfinite_clients`: clients given weight 0 for a non-finite update or an
      unusable (negative, subnormal or non-finite) weight;
  an inner process whose measurements are not a named structure has them under
  `inner`.

  The inner aggregator sees only finite values; a client it receives with weight 0 and
  a zero update is one it should ignore (the gathering baselines leave such rows out).

  It is a transformer of steps: `steps(value_type)` are the inner aggregate's
  (`iterative_steps.steps_of`: one pass for a factory that is not iterative) with the
  filter as their `client_step`, so the fused process filters once and the
  pass-by-pass drivers filter in every pass, with nothing to unwrap.
  """

  def __init__(self, inner: tff.aggregators.WeightedAggregationFactory):
    if not isinstance(inner, tff.aggregators.WeightedAggregationFactory):
      raise TypeError('NonfiniteFilteringFactory wraps a tff.aggregators.'
                      f'WeightedAggregationFactory, got {type(inner).__name__}.')
    self._inner = inner

  @property
  def inner(self) -> tff.aggregators.WeightedAggregationFactory:
    return self._inner

  @property
  def secure_compatible(self) -> bool:
    """As the inner factory declares: the wrapper adds only a sum of client flags."""
    return bool(getattr(self._inner, 'secure_compatible', False))

  def steps(self, value_type) -> iterative_steps.IterativeSteps:
    iterative_mean.check_float_structure(value_type)
    return _FilteredSteps(iterative_steps.steps_of(self._inner, value_type))


class _FilteredSteps(iterative_steps.WrappedSteps):
  """`inner`'s steps, carry and all, with the filter as their client step."""

  def start(self, state):
    return self._inner.start(state)

  def passes(self):
    return self._inner.passes()

  def finish(self, carry):
    return self._inner.finish(carry)

  def client_step(self, weight_type):
    return client_filter(self.value_type, weight_type)


def client_filter(value_type, weight_type):
  """The filter as a client step (`IterativeSteps.client_step`), to call inside a
  `tff.federated_computation`: `(value, weight) at CLIENTS → (value, float32 weight)
  at CLIENTS, {MEASUREMENT: int32 count at SERVER}`, dropped clients (a non-finite
  update, an unusable weight) with weight 0 and a zero update."""
  finite_weight, finite_value = _filter_steps(value_type, weight_type)

  def filter_clients(value, weight):
    # The finiteness scan runs once, in `finite_weight`; `finite_value` only reads its
    # verdict. Two maps rather than one returning a struct: selecting the value out of
    # a struct at CLIENTS would copy every client's update once more.
    weight_and_dropped = tff.federated_map(finite_weight, (value, weight))
    dropped = weight_and_dropped[1]
    return (tff.federated_map(finite_value, (value, dropped)), weight_and_dropped[0],
            collections.OrderedDict([(MEASUREMENT, tff.federated_sum(dropped))]))

  return filter_clients


@traced.once
def _filter_steps(value_type, weight_type):
  """The client computations of `client_filter`: (value, weight) → (float32 weight, 0
  or 1 for dropped), and (value, dropped) → the value or zeros."""

  @tff.tensorflow.computation(value_type, weight_type)
  def finite_weight(client_value, client_weight):
    return numerics.weight_if_usable(client_value, client_weight)

  @tff.tensorflow.computation(value_type, tf.int32)
  def finite_value(client_value, dropped):
    return numerics.zeros_if_dropped(client_value, dropped)

  return finite_weight, finite_value
