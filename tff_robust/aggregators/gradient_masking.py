"""Gradient Masked Averaging (Tenison, Sreeramadas, Mugunthan, Oyallon, Rish,
Belilovsky, "Gradient Masked Averaging for Federated Learning", Section 3.2, eq. 3).
"""

import collections
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_robust.common import arguments
from tff_robust.common import numerics
from tff_robust.iterative import contributions
from tff_robust.iterative import iterative_mean
from tff_robust.iterative import iterative_steps


def _map(fn, *structures):
  return tf.nest.map_structure(fn, *[numerics.as_nest(s) for s in structures])


def agreement_dtype(dtype: tf.DType) -> tf.DType:
  """The dtype of A_j and m_j for a tensor of `dtype`: float64 for float64 values, so
  that a float64 structure is masked to float64 accuracy (a float32 mask would round
  e.g. A = 7/20 with a relative error of ~1e-8); float32 otherwise."""
  return tf.float64 if dtype == tf.float64 else tf.float32


def agreement_of(sign_sum, num_clients):
  """A_j = |Σ_n sign(Δ_n)_j| / N for one tensor of sign sums, in `agreement_dtype`
  (0 when N = 0)."""
  dtype = agreement_dtype(sign_sum.dtype)
  return tf.math.divide_no_nan(tf.abs(tf.cast(sign_sum, dtype)),
                               tf.cast(num_clients, dtype))


def mask_statistics(agreement, tau):
  """(fraction of A_j below τ, mean of A_j), float32 scalars, over all tensors.

  Whether A_j < τ is decided in A's own dtype, as the mask is, so the reported
  fraction counts exactly the damped coordinates; both statistics are reduced in
  float32 whatever A's dtype.
  """
  flat = [tf.reshape(a, [-1]) for a in tf.nest.flatten(agreement)]
  below_tau = tf.concat([tf.cast(a < tau, tf.float32) for a in flat], axis=0)
  flat_agreement = tf.concat([tf.cast(a, tf.float32) for a in flat], axis=0)
  size = tf.cast(tf.size(flat_agreement), tf.float32)
  return (tf.math.divide_no_nan(tf.reduce_sum(below_tau), size),
          tf.math.divide_no_nan(tf.reduce_sum(flat_agreement), size))


class GradientMaskedAveragingFactory(iterative_steps.IterativeAggregationFactory):
  """Gradient masked averaging: the weighted mean, damped where clients disagree.

  With N finite clients and updates Δ_n, the agreement of scalar parameter j is
  A_j = |(1/N) Σ_n sign(Δ_n)_j| (unweighted, paper eq. 3), the soft mask is
  m_j = 1 if A_j ≥ τ else A_j, and the result is m ⊙ (Σ α_n Δ_n / Σ α_n).

  Two independent aggregations of the same client values, in one round and with no
  broadcast: the sum of the signs through `sign_sum_factory` and the weighted mean
  through `inner_mean_factory`. Both can be secure (e.g.
  `tff.aggregators.SecureSumFactory(1.0, -1.0)` for the signs, whose entries lie in
  [-1, 1], and `MeanFactory(value_sum_factory=SecureSumFactory(bound))` for the mean);
  N is a federated sum of 0/1 client flags.

  A float64 tensor is masked in float64 (A_j, m_j and the mean, to float64 accuracy);
  any other float tensor with a float32 A_j and m_j.

  N counts the clients of weight > 0; only they vote. Inputs must be finite: wrap the factory in
  `tff_robust.NonfiniteFilteringFactory` (the learning builders and `tasks.registry`
  do) to give a NaN or infinite client weight 0, so it counts neither in the mean, the
  signs nor N.

  The process's `next` has type signature
  `(<state, {value}@CLIENTS, {weight}@CLIENTS> -> <state, result=value@SERVER,
  measurements@SERVER>)`, the state being `<mean=inner state, sign_sum=sign-sum state>`.
  Measurements:
  *   `fraction_masked`: fraction of the scalar parameters with A_j < τ (scaled down).
  *   `mean_agreement`: the average of A_j over all scalar parameters.
  *   `mean`, `sign_sum`: the two inner processes' measurements.
  """

  # Client values reach the server only through sums (see the privacy tests).
  secure_compatible = True

  def __init__(
      self,
      tau: float = 0.4,
      sign_sum_factory: Optional[tff.aggregators.UnweightedAggregationFactory] = None,
      inner_mean_factory: Optional[tff.aggregators.WeightedAggregationFactory] = None,
  ):
    """Initializes the factory.

    Args:
      tau: τ in [0, 1], the agreement from which a coordinate is not damped. Paper
        default 0.4. τ = 0 gives the weighted mean.
      sign_sum_factory: an unweighted factory that must return the SUM of the client
        values (it receives sign(Δ_n) ∈ {-1, 0, 1}); default
        `tff.aggregators.SumFactory()`.
      inner_mean_factory: the weighted mean of the updates; default
        `tff_robust.iterative.iterative_mean.Float64MeanFactory()`.

    Raises:
      ValueError: if `tau` is outside [0, 1].
      TypeError: if `tau` is not a number, or for factories of the wrong kind.
    """
    self._tau = arguments.check_number_in('tau', tau, 0, 1, high_inclusive=True)
    if sign_sum_factory is None:
      sign_sum_factory = tff.aggregators.SumFactory()
    if not isinstance(sign_sum_factory, tff.aggregators.UnweightedAggregationFactory):
      raise TypeError(
          'sign_sum_factory must be a tff.aggregators.UnweightedAggregationFactory '
          'returning a sum (e.g. tff.aggregators.SecureSumFactory(1.0, -1.0)); got '
          f'{type(sign_sum_factory).__name__}.')
    self._sign_sum = sign_sum_factory
    self._inner = iterative_mean.check_inner_mean_factory(inner_mean_factory)

  def steps(self, value_type) -> iterative_steps.IterativeSteps:
    """One pass: the mean, the sign sums and N in one round."""
    iterative_mean.check_float_structure(value_type)
    return _MaskedSteps(value_type, self._inner.create(value_type,
                                                       iterative_mean.WEIGHT_TYPE),
                        self._sign_sum.create(value_type), self._tau)


# What an honest client contributes (`contributions`): its weight α with its update
# (unbounded: GMA's mean is the mean), a sign vote in [-1, 1] per coordinate (0 for a
# client of weight 0) and a 0/1 flag.
_MEAN_BOUND = contributions.pair(contributions.UNBOUNDED, contributions.EQUAL_TO_ALPHA)


class _MaskedSteps(iterative_steps.IterativeSteps):
  """GMA as the steps of one pass."""

  def __init__(self, value_type, mean_process, sign_process, tau: float):
    self.value_type = value_type
    self._mean, self._sign = mean_process, sign_process

    @tff.tensorflow.computation(value_type, tf.float32)
    def signs(value, weight):
      # A client of weight 0 does not vote, as it does not count in N.
      votes = tf.cast(weight > 0, tf.float32)
      return _map(lambda x: tf.sign(x) * tf.cast(votes, x.dtype), value)

    @tff.tensorflow.computation(tf.float32)
    def is_counted(weight):
      # N counts the clients with weight > 0: a client the non-finite filter dropped
      # arrives with weight 0 and a zero update, and must not dilute the agreement.
      return tf.cast(weight > 0, tf.int32)

    @tff.tensorflow.computation(value_type, value_type, tf.int32)
    def apply_mask(mean, sign_sum, num_clients):
      agreement = _map(lambda s: agreement_of(s, num_clients), sign_sum)
      masks = _map(lambda a: tf.where(a >= tau, tf.ones_like(a), a), agreement)
      result = _map(lambda m, x: tf.cast(m, x.dtype) * x, masks, mean)
      fraction_masked, mean_agreement = mask_statistics(agreement, tau)
      return result, fraction_masked, mean_agreement

    self._signs, self._is_counted, self._apply_mask = signs, is_counted, apply_mask

  def initialize(self):
    return tff.federated_zip(collections.OrderedDict(
        mean=self._mean.initialize(), sign_sum=self._sign.initialize()))

  def start(self, state):
    return {'state': state}

  def passes(self):
    return [iterative_steps.Pass('masked_mean', self._pass)]

  def _pass(self, carry, value, alpha):
    state = carry['state']
    mean_output = contributions.mean_of('mean', self._mean, state.mean, value, alpha,
                                        alpha, _MEAN_BOUND)
    sign_output = contributions.unweighted_of(
        'sign_votes', self._sign, state.sign_sum,
        tff.federated_map(self._signs, (value, alpha)), alpha,
        contributions.SIGN_VOTE)
    num_voters = contributions.sum_of('voters', tff.federated_map(
        self._is_counted, alpha), alpha, contributions.FLAG)
    masked = tff.federated_map(
        self._apply_mask, (mean_output.result, sign_output.result, num_voters))
    return {'result': masked[0], 'measurements': collections.OrderedDict(
        fraction_masked=masked[1], mean_agreement=masked[2],
        mean=mean_output.measurements, sign_sum=sign_output.measurements),
            'state': collections.OrderedDict(mean=mean_output.state,
                                             sign_sum=sign_output.state)}

  def finish(self, carry):
    return tff.templates.MeasuredProcessOutput(
        state=tff.federated_zip(carry['state']), result=carry['result'],
        measurements=tff.federated_zip(carry['measurements']))
