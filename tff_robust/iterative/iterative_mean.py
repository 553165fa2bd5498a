"""Building blocks of iterative secure aggregates: aggregates computed as a sequence of
weighted means, each through an inner `tff.aggregators` factory.

The geometric median and the γ-means share this shape: the server broadcasts a current
estimate, every client turns it into its own weight (and a few scalar statistics), and
one call of the inner weighted mean produces the next estimate. The server never sees a
single client's value: only the inner factory's aggregate and sums of client scalars.
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_robust.common import numerics
from tff_robust.common import traced
from tff_robust.common import type_checks
from tff_robust.common import weighted_or_unweighted

WEIGHT_TYPE = weighted_or_unweighted.UNIT_WEIGHT_TYPE
check_float_structure = type_checks.check_float_structure


def default_inner_mean_factory() -> tff.aggregators.WeightedAggregationFactory:
  """The plain weighted mean of unbounded values: overflow-free, zeros (not NaN) when
  every weight is zero (`Float64MeanFactory`)."""
  return Float64MeanFactory()


class Float32MeanFactory(weighted_or_unweighted.WeightedOrUnweightedFactory):
  """Weighted mean Σ w_i x_i / Σ w_i with the products and their sum in the values'
  own dtype, as `tff.aggregators.MeanFactory(no_nan_division=True)`, and two fixes for
  the weights an iterative aggregate produces:

  *   a weight below float32's smallest normal number multiplies in float64 instead of
      being flushed to zero: the Weiszfeld weight α/‖x‖ of a client at 1e38 is ~1e-39,
      and its term α·x/‖x‖ is of order α;
  *   the weights are summed in float64, and a client of weight 0 adds exact zeros
      (0 · inf would be NaN).

  The default inner mean of `GeometricMedianFactory`: its weighted values β_i·x_i are
  bounded by about α_i for far-away clients, so the float32 sum cannot overflow with
  the default start, and it costs the memory and bytes of TFF's mean (a float64 copy
  of every client's weighted value in each of R passes did not fit 50 ConvNet clients
  in 24 GB). For plain means of unbounded values use `Float64MeanFactory`.

  The created process is stateless (state `()` at SERVER); its `next` has type signature
  `(<state, {value}@CLIENTS, {weight}@CLIENTS> -> <state, value@SERVER, measurements>)`
  with the (empty) measurements of `MeanFactory`: `mean_value=()`, `mean_weight=()`.
  """

  # Two independent federated sums, as MeanFactory (mergeable across workers too).
  secure_compatible = True

  def create_weighted(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    check_float_structure(value_type)
    return _weighted_mean_process(value_type, weight_type,
                                  _float32_products(value_type, weight_type))


class Float64MeanFactory(weighted_or_unweighted.WeightedOrUnweightedFactory):
  """Weighted mean Σ α_i x_i / Σ α_i with the products and both sums in float64.

  The default inner mean of the plain means (`mean`, GMA, the γ-mean).
  `tff.aggregators.MeanFactory` forms α_i·x_i
  and their sum in the values' own dtype: in float32 that overflows to ±inf as soon as
  Σ α_i |x_ij| passes 3.4e38 (one client at 1e37 with 100 examples), although the mean
  itself is representable; a robust aggregator that starts from that mean never
  recovers. In float64 no product or sum of float32 values and weights overflows or
  underflows, so the result is the mean correctly rounded to the values' dtype (±inf
  only where the mean itself is beyond the float32 range, which a mean of finite
  float32 values never is). The price: each client's weighted value is a float64
  copy (twice the bytes of MeanFactory's float32 one).

  If the weights sum to zero the result is zero (as `MeanFactory(no_nan_division=True)`).
  A client of weight zero contributes nothing, even if its value holds an infinity.

  The created process is stateless (state `()` at SERVER); its `next` has type signature
  `(<state, {value}@CLIENTS, {weight}@CLIENTS> -> <state, value@SERVER, measurements>)`
  with the (empty) measurements of `MeanFactory`: `mean_value=()`, `mean_weight=()`.

  Privacy: exactly two `tff.federated_sum`s (weighted values, weights), as
  `MeanFactory`'s defaults. For secure aggregation pass a `MeanFactory` with secure sum
  factories instead.
  """

  # Two independent federated sums, as MeanFactory (mergeable across workers too).
  secure_compatible = True

  def create_weighted(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    check_float_structure(value_type)
    return _weighted_mean_process(value_type, weight_type,
                                  _float64_products(value_type, weight_type))


@traced.once
def _float32_products(value_type, weight_type):
  """The client computation (value, weight) → (weight · value in the values' dtype,
  float64 weight), exact zeros for a weight of 0."""

  @tff.tensorflow.computation(value_type, weight_type)
  def weighted(value, weight):
    value, weight = numerics.as_nest(value), tf.cast(weight, tf.float64)

    products = tf.cond(tf.equal(weight, 0.0),
                       lambda: tf.nest.map_structure(tf.zeros_like, value),
                       lambda: numerics.scaled(value, weight))
    return products, weight

  return weighted


@traced.once
def _float64_products(value_type, weight_type):
  """The client computation (value, weight) → (weight · value in float64, float64
  weight), exact zeros for a weight of 0."""

  @tff.tensorflow.computation(value_type, weight_type)
  def weighted(value, weight):
    weight = tf.cast(weight, tf.float64)
    # A client of weight 0 adds exact zeros: 0 · inf would be NaN (e.g. the γ-mean's
    # overflowed squares of a client whose γ-weight underflowed).
    return (tf.cond(
        tf.equal(weight, 0.0),
        lambda: tf.nest.map_structure(
            lambda t: tf.zeros(tf.shape(t), tf.float64), numerics.as_nest(value)),
        lambda: tf.nest.map_structure(lambda t: tf.cast(t, tf.float64) * weight,
                                      numerics.as_nest(value))), weight)

  return weighted


@traced.once
def _division(value_type, sums_type):
  """The server computation (Σ weighted values, Σ weights) → their quotient (in
  float64, zero for a zero weight sum) in the values' dtypes."""
  template = type_template(value_type)

  @tff.tensorflow.computation(sums_type)
  def divide(sums):
    total, weight_sum = numerics.as_nest(sums[0]), sums[1]
    return tf.nest.map_structure(
        lambda s, spec: tf.cast(
            tf.math.divide_no_nan(tf.cast(s, tf.float64), weight_sum), spec.dtype),
        total, template, check_types=False)

  return divide


def _weighted_mean_process(value_type, weight_type, weighted):
  """The stateless mean process around a client computation `weighted(value, weight)
  → (weighted value, float64 weight)`: two independent federated sums and a division
  (in float64, zero for a zero weight sum) back to the values' dtypes."""
  divide = _division(value_type, weighted.type_signature.result)

  @tff.federated_computation()
  def init_fn():
    return tff.federated_value((), tff.SERVER)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(value_type, tff.CLIENTS),
      tff.FederatedType(weight_type, tff.CLIENTS))
  def next_fn(state, value, weight):
    sums = tff.federated_sum(tff.federated_map(weighted, (value, weight)))
    return tff.templates.MeasuredProcessOutput(
        state=state,
        result=tff.federated_map(divide, sums),
        measurements=tff.federated_value(
            collections.OrderedDict(mean_value=(), mean_weight=()), tff.SERVER))

  return tff.templates.AggregationProcess(init_fn, next_fn)


@traced.once
def zeros(value_type):
  """The computation `( -> value_type)` returning zeros of the value type."""

  @tff.tensorflow.computation
  def zeros_of_type():
    return tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype),
                                 type_template(value_type))

  return zeros_of_type


def type_template(value_type):
  """A Python structure of `tf.TensorSpec`s shaped like `value_type`."""
  if isinstance(value_type, tff.TensorType):
    return tf.TensorSpec(value_type.shape, tf.as_dtype(value_type.dtype))
  elements = [(name, type_template(t))
              for name, t in tff.structure.iter_elements(value_type)]
  return tff.types.type_to_py_container(tff.structure.Struct(elements), value_type)


def check_inner_mean_factory(factory) -> tff.aggregators.WeightedAggregationFactory:
  """`factory` if it can be an iterative aggregate's inner weighted mean (None: the
  default mean).

  Refused besides a factory that is not weighted: a weighted mean built around a
  *count-normalising* aggregation (`count_normalising_parts`), such as
  `tff.aggregators.MeanFactory(value_sum_factory=tff.aggregators.
  DifferentiallyPrivateFactory.gaussian_fixed(...))`. `MeanFactory` divides its value
  sum Σ β_i x_i by Σ β_i; TFF's DP factories already divide the sum by a fixed
  `clients_per_round`, so each pass returns Σ β_i x_i / (n · Σ β_i), a 1/n-th of the
  weighted mean (the geometric median shrinks by n every round), with no error.

  Raises:
    TypeError: for a factory that is not a `tff.aggregators.WeightedAggregationFactory`
      or one that normalises by a count.
  """
  if factory is None:
    return default_inner_mean_factory()
  if not isinstance(factory, tff.aggregators.WeightedAggregationFactory):
    raise TypeError(
        'inner_mean_factory must be a tff.aggregators.WeightedAggregationFactory '
        '(for example tff.aggregators.MeanFactory(value_sum_factory='
        f'tff.aggregators.SecureSumFactory(...))); got {type(factory).__name__}.'
    )
  normalising = count_normalising_parts(factory)
  if normalising:
    raise TypeError(
        f'inner_mean_factory {type(factory).__name__} holds '
        f'{", ".join(sorted(set(normalising)))}, which divides its sum by a count '
        "(TFF's DifferentiallyPrivateFactory.gaussian_fixed / gaussian_adaptive / "
        'tree_aggregation divide by a fixed clients_per_round): inside a weighted '
        'mean every pass would return Σ β_i x_i / (n · Σ β_i), a 1/n-th of the mean. '
        'For differential privacy use '
        'tff_robust.DifferentiallyPrivateWeightedMeanFactory(noise_multiplier, clip) '
        '(one Gaussian sum of the records (β_i x_i, β_i), then the division); a '
        'value_sum_factory of MeanFactory must be a sum (e.g. '
        'tff.aggregators.DifferentiallyPrivateFactory(tfp.GaussianSumQuery(...))).')
  return factory


def count_normalising_parts(factory) -> list[str]:
  """The class names of the parts of `factory` that normalise by a count: TFF's
  `UnweightedMeanFactory`, tensorflow-privacy's `NormalizedQuery` (behind TFF's
  `DifferentiallyPrivateFactory.gaussian_fixed`, `gaussian_adaptive` and
  `tree_aggregation`, and `DistributedSkellamAverageQuery`) and
  `NoPrivacyAverageQuery`, found through the attributes (and closures) of the
  factory, its inner factories and their DP queries (a structural check: nothing is
  built or run)."""
  normalising_types = (tff.aggregators.UnweightedMeanFactory, tfp.NormalizedQuery,
                       tfp.NoPrivacyAverageQuery)
  walked_types = (tff.aggregators.WeightedAggregationFactory,
                  tff.aggregators.UnweightedAggregationFactory, tfp.DPQuery)
  found, seen, stack = [], set(), [factory]
  while stack:
    part = stack.pop()
    if id(part) in seen:
      continue
    seen.add(id(part))
    if isinstance(part, normalising_types):
      found.append(type(part).__name__)
    if isinstance(part, (list, tuple)):
      stack.extend(part)
    elif isinstance(part, dict):
      stack.extend(part.values())
    elif isinstance(part, walked_types):
      stack.extend(getattr(part, '__dict__', {}).values())
      stack.extend(_closed_over(type(part)))
  return found


def _closed_over(cls) -> list:
  """What the methods of `cls` close over: TFF's wrappers (`clipping_factory`,
  `zeroing_factory`) define their class inside a function and keep the inner factory
  in the closure of `create`, not in an attribute."""
  contents = []
  for attribute in vars(cls).values():
    for cell in getattr(attribute, '__closure__', None) or ():
      try:
        contents.append(cell.cell_contents)
      except ValueError:  # An empty cell.
        pass
  return contents


def float32_weights(weight_type, weight):
  """Federated step: the clients' weights as float32 (the type every step here takes);
  the weights themselves when they already are."""
  if weight_type == WEIGHT_TYPE:
    return weight
  return tff.federated_map(_float32_cast(weight_type), weight)


@traced.once
def _float32_cast(weight_type):
  """The client computation weight → float32 weight."""
  @tff.tensorflow.computation(weight_type)
  def cast(client_weight):
    return tf.cast(client_weight, tf.float32)

  return cast


@tff.tensorflow.computation(tf.float32, tf.float32)
def effective_weight(max_weight, weight_sum):
  return tf.math.divide_no_nan(max_weight, weight_sum)


def stack_at_server(server_scalars, dtype=tf.float32):
  """Stacks a Python list of SERVER scalars into one `dtype` vector at SERVER (an
  empty vector for an empty list)."""
  if not server_scalars:
    return tff.federated_value(np.zeros([0], dtype.as_numpy_dtype), tff.SERVER)
  zipped = tff.federated_zip(collections.OrderedDict(
      (f'p{i}', s) for i, s in enumerate(server_scalars)))
  return tff.federated_map(_stacking(zipped.type_signature.member, dtype), zipped)


@traced.once
def _stacking(scalars_type, dtype):
  """The server computation of `stack_at_server`: a struct of scalars → one `dtype`
  vector."""
  @tff.tensorflow.computation(scalars_type)
  def stack(scalars):
    return tf.stack([tf.cast(s, dtype) for s in scalars.values()])

  return stack


@tff.tensorflow.computation(tff.TensorType(np.float32, [None]))
def max_of_vector(vector):
  return tf.reduce_max(vector)


def tensor_types(value_type) -> list:
  """The `tff.TensorType` leaves of a value type, in the type's own element order."""
  if isinstance(value_type, tff.TensorType):
    return [value_type]
  leaves = []
  for _, element in tff.structure.iter_elements(value_type):
    leaves.extend(tensor_types(element))
  return leaves


def num_parameters(value_type) -> int:
  """p: the total number of scalars of a structure of fully defined tensors."""
  total = 0
  for leaf in tensor_types(value_type):
    if leaf.shape is None or any(d is None for d in leaf.shape):
      raise TypeError(f'Aggregators need fully defined shapes, got {value_type}.')
    total += int(np.prod(leaf.shape, dtype=np.int64))
  return total
