"""Factories both weighted and unweighted: unweighted is weighted with every weight 1.

TFF keeps the two kinds apart: `build_weighted_fed_avg` takes a
`tff.aggregators.WeightedAggregationFactory` (`create(value_type, weight_type)`),
`build_unweighted_fed_avg` an `UnweightedAggregationFactory` (`create(value_type)`).
A robust aggregator's unweighted form is its weighted form with α_i = 1 (the unweighted
geometric median, γ-mean, coordinate-wise median, ...), so the factories of this
package are both kinds at once (`WeightedOrUnweightedFactory`), and `unweighted(f)`
turns any other weighted factory into an unweighted one the same way.
"""

import abc
from typing import Optional

import numpy as np
import tensorflow_federated as tff

from tff_robust.common import secure_sums
from tff_robust.common import type_checks

UNIT_WEIGHT_TYPE = tff.TensorType(np.float32)


def with_unit_weights(
    weighted_process: tff.templates.AggregationProcess,
) -> tff.templates.AggregationProcess:
  """The unweighted process `(<state, {value}@CLIENTS> -> <state, value@SERVER,
  measurements>)` running `weighted_process` with weight 1.0 (float32) at every
  client; state and measurements are the weighted process's."""
  value_type = weighted_process.next.type_signature.parameter[1].member

  @tff.federated_computation(weighted_process.state_type,
                             tff.FederatedType(value_type, tff.CLIENTS))
  def next_fn(state, value):
    ones = tff.federated_value(np.float32(1.0), tff.CLIENTS)
    return weighted_process.next(state, value, ones)

  return tff.templates.AggregationProcess(weighted_process.initialize, next_fn)


class WeightedOrUnweightedFactory(tff.aggregators.WeightedAggregationFactory,
                                  tff.aggregators.UnweightedAggregationFactory,
                                  metaclass=abc.ABCMeta):
  """Base of the factories that plug into both `build_weighted_fed_avg` and
  `build_unweighted_fed_avg`.

  `create(value_type, weight_type)` creates the weighted process (subclasses implement
  it as `create_weighted`); `create(value_type)` the unweighted one, the weighted
  process with weight 1 at every client (`with_unit_weights`). Both check their types
  as TFF's `MeanFactory` does (TypeError, see `check_types`), and refuse a process
  holding secure sums in a context that cannot run them (`secure_sums`, ValueError).
  """

  def create(self, value_type, weight_type=None) -> tff.templates.AggregationProcess:
    check_types(value_type, weight_type)
    if weight_type is None:
      process = with_unit_weights(self.create_weighted(value_type, UNIT_WEIGHT_TYPE))
    else:
      process = self.create_weighted(value_type, weight_type)
    secure_sums.check_runnable(process)
    return process

  @abc.abstractmethod
  def create_weighted(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    """The weighted process; `value_type` and `weight_type` are already checked."""
    raise NotImplementedError


class UnitWeightFactory(tff.aggregators.UnweightedAggregationFactory):
  """An `UnweightedAggregationFactory` from any weighted one: weight 1 per client.

  The reverse of TFF's `tff.aggregators.factory_utils.as_weighted_aggregator`. The
  created process has the weighted process's state and measurements and type signature
  `(<state, {value}@CLIENTS> -> <state, value@SERVER, measurements@SERVER>)`.
  """

  def __init__(self, weighted_factory: tff.aggregators.WeightedAggregationFactory):
    if not isinstance(weighted_factory, tff.aggregators.WeightedAggregationFactory):
      raise TypeError('unweighted() takes a tff.aggregators.WeightedAggregationFactory, '
                      f'got {type(weighted_factory).__name__}.')
    self._weighted = weighted_factory

  @property
  def secure_compatible(self) -> bool:
    return bool(getattr(self._weighted, 'secure_compatible', False))

  def create(self, value_type) -> tff.templates.AggregationProcess:
    return with_unit_weights(self._weighted.create(value_type, UNIT_WEIGHT_TYPE))


def unweighted(
    factory: tff.aggregators.WeightedAggregationFactory,
) -> tff.aggregators.UnweightedAggregationFactory:
  """`factory` for `build_unweighted_fed_avg`: the factory itself when it already is
  unweighted too (every factory of this package and of `tasks.registry`), else a
  `UnitWeightFactory` around it (e.g. TFF's `MeanFactory` or a user's factory)."""
  if isinstance(factory, tff.aggregators.UnweightedAggregationFactory):
    return factory
  return UnitWeightFactory(factory)


def check_types(value_type, weight_type: Optional[tff.Type]) -> None:
  """TypeError unless the value type is a structure of floats and the weight type (if
  given, i.e. not None) a scalar float or integer type (`type_checks`)."""
  type_checks.check_float_structure(value_type)
  if weight_type is not None:
    type_checks.check_weight_type(weight_type)
