"""A trust region for the aggregate: its norm at most a multiple of the recent rounds'.

A robust aggregate such as the geometric median has breakdown point 1/2 of a round's
weight: in a round whose sampled weight is mostly corrupted (with 10 clients a round at
ρ = 0.25, about one round in 12), it is the corrupted clients' point, at whatever norm
they chose. The trust region keeps such a round's step no longer than `multiple` times
the median norm of the last `window` rounds' aggregates, which the server already
knows: it costs no communication and reveals nothing more about the clients. A round
whose direction is wrong still moves the model, but by a step of the usual length.

The bound is anchored at zero, i.e. at the current model when the aggregate is a model
delta: it is not translation-equivariant in the aggregate (the aggregate inside it is).
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_robust.common import arguments
from tff_robust.common import numerics
from tff_robust.iterative import iterative_mean
from tff_robust.iterative import iterative_steps

DEFAULT_MULTIPLE = 2.0
DEFAULT_WINDOW = 5
RADIUS_MEASUREMENT = 'trust_radius'
SCALE_MEASUREMENT = 'trust_scale'


def radius_from_history(norms, count, multiple: float):
  """`multiple` × the lower median of the recorded norms (float64), +inf before any.

  Args:
    norms: float64 `[window]`, a ring buffer: norm k of the run sits at k mod window.
    count: int32, how many norms were recorded so far (the first min(count, window)
      entries of `norms` are filled).
    multiple: the factor over the median.
  """
  window = norms.shape[0]
  filled = tf.minimum(count, window)
  ordered = tf.sort(tf.where(tf.range(window) < filled, norms,
                             tf.constant(np.inf, tf.float64)))
  median = ordered[tf.maximum(filled - 1, 0) // 2]
  return tf.where(filled > 0, multiple * median, tf.constant(np.inf, tf.float64))


def bounded_scale(norm, radius):
  """The factor (float64, in [0, 1]) that brings a result of `norm` within `radius`."""
  return tf.where(norm > radius, radius / norm, tf.constant(1.0, tf.float64))


def recorded(norms, count, norm):
  """(norms, count) after recording `norm`; a norm that is 0 or not finite (a round
  without clients, a NaN result) is not recorded, so it cannot shrink or blow up the
  radius."""
  usable = tf.logical_and(tf.math.is_finite(norm), norm > 0)
  window = norms.shape[0]
  slot = tf.equal(tf.range(window), count % window)
  return (tf.where(tf.logical_and(usable, slot), norm, norms),
          count + tf.cast(usable, tf.int32))


class TrustRegionFactory(iterative_steps.IterativeAggregationFactory):
  """Aggregates with `inner`, then scales the result down, if needed, to norm at most
  `multiple` × the lower median of the norms of the last `window` results it returned
  (unbounded until it has returned one with a finite norm > 0).

  The created process's `next` has type signature
  `(<state, {value}@CLIENTS, {weight}@CLIENTS> -> <state, result=value@SERVER,
  measurements@SERVER>)`; the state is `<inner=inner's state, norms=float64[window],
  count=int32>` (the recorded norms as a ring buffer and how many were recorded), and
  the recorded norm is the returned (bounded) result's. The passes are `inner`'s; the
  bound is server-side work in the last one.

  Measurements: the inner process's named measurements (kept flat; a non-named one
  under `inner`) plus
  *   `trust_radius`: the bound of this round (float64; +inf before any recorded norm);
  *   `trust_scale`: the factor the inner result was multiplied by (float64, 1 when
      within the bound).

  Privacy: nothing beyond `inner`'s aggregations; the bound uses only results the
  server already holds. Secure-aggregation compatible when `inner` is.
  """

  # The factories it wraps (checked by the constructor; `tasks.registry` reads it).
  wraps = tff.aggregators.WeightedAggregationFactory

  def __init__(self, inner: tff.aggregators.WeightedAggregationFactory, *,
               multiple: float = DEFAULT_MULTIPLE, window: int = DEFAULT_WINDOW):
    """Args:
      inner: the weighted factory whose result is bounded.
      multiple: ≥ 1: the longest step relative to the recent rounds' median.
      window: ≥ 1: how many recent results the median is taken over.

    Raises:
      TypeError: if `inner` is not a weighted factory or a number is not a number.
      ValueError: if `multiple` is below 1 or not finite, or `window` below 1.
    """
    if not isinstance(inner, self.wraps):
      raise TypeError('TrustRegionFactory wraps a tff.aggregators.'
                      f'WeightedAggregationFactory, got {type(inner).__name__}.')
    self._inner = inner
    self._multiple = arguments.check_finite_float('multiple', multiple)
    if self._multiple < 1.0:
      raise ValueError('multiple must be at least 1 (a bound below the recent '
                       'median shortens every honest step), got '
                       f'{multiple!r}.')
    self._window = arguments.check_positive_int('window', window)

  inner = property(lambda self: self._inner, doc='The aggregator whose result is bounded.')
  multiple = property(lambda self: self._multiple)
  window = property(lambda self: self._window)

  @property
  def secure_compatible(self) -> bool:
    """As the inner factory declares: the bound adds no aggregation."""
    return bool(getattr(self._inner, 'secure_compatible', False))

  def steps(self, value_type) -> iterative_steps.IterativeSteps:
    iterative_mean.check_float_structure(value_type)
    return _TrustRegionSteps(iterative_steps.steps_of(self._inner, value_type),
                             self._multiple, self._window)


class _TrustRegionSteps(iterative_steps.WrappedSteps):
  """`inner`'s passes; `finish` bounds the result and records its norm."""

  def __init__(self, inner: iterative_steps.IterativeSteps, multiple: float,
               window: int):
    super().__init__(inner)
    norms_type = tff.TensorType(np.float64, [window])

    @tff.tensorflow.computation
    def empty_history():
      return collections.OrderedDict(norms=tf.zeros([window], tf.float64),
                                     count=tf.constant(0, tf.int32))

    @tff.tensorflow.computation(inner.value_type, norms_type, tf.int32)
    def bound(result, norms, count):
      radius = radius_from_history(norms, count, multiple)
      norm = numerics.global_l2_norm(result)
      scale = bounded_scale(norm, radius)
      # The bounded result's norm is norm · scale: no second pass over the model.
      norms, count = recorded(norms, count, norm * scale)
      result = numerics.scaled(result, scale)
      return collections.OrderedDict(result=result, norms=norms, count=count,
                                     radius=radius, scale=scale)

    self._empty_history, self._bound = empty_history, bound

  def initialize(self):
    history = tff.federated_eval(self._empty_history, tff.SERVER)
    return tff.federated_zip(collections.OrderedDict(
        inner=self._inner.initialize(), norms=history.norms, count=history.count))

  def start(self, state):
    return {'inner': self._inner.start(state.inner), 'norms': state.norms,
            'count': state.count}

  def passes(self):
    return iterative_steps.nested(self._inner, 'inner')

  def finish(self, carry):
    output = self._inner.finish(carry['inner'])
    bounded = tff.federated_map(self._bound,
                                (output.result, carry['norms'], carry['count']))
    state = tff.federated_zip(collections.OrderedDict(
        inner=output.state, norms=bounded.norms, count=bounded.count))
    measurements = iterative_steps.with_measurements(
        output.measurements, collections.OrderedDict([
            (RADIUS_MEASUREMENT, bounded.radius), (SCALE_MEASUREMENT, bounded.scale)]))
    return tff.templates.MeasuredProcessOutput(
        state=state, result=bounded.result,
        measurements=tff.federated_zip(measurements))
