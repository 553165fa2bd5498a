"""Every aggregator of the project by name, for flags and configuration files.

  factory = aggregator_from_name('gm', num_communication_passes=3)
  process = tff.learning.algorithms.build_weighted_fed_avg(
      model_fn, ..., model_aggregator=factory)

A name may compose pre-aggregation wrappers with an aggregator, outermost first:
'bucketing+median' is `BucketingFactory(CoordinateWiseMedianFactory())`; the wrappers'
arguments come in `wrapper_args` (wrapper name → keyword arguments).

Every factory built here is wrapped, outermost, in
`tff_robust.NonfiniteFilteringFactory`: a client with a NaN or an infinity gets weight 0
and is counted in the `num_nonfinite_clients` measurement.

The names cover both layers: the deployable, secure-aggregation compatible factories of
`tff_robust` and the comparison methods of `baselines`. Every name returns a
`tff.aggregators.WeightedAggregationFactory` (the unweighted baselines accept and
ignore the weights), so any of them plugs into `build_weighted_fed_avg`. Whether a
factory is secure-aggregation compatible is declared by its class
(`secure_compatible`), never listed here.

Adding an aggregator is one line in `AGGREGATORS`, a wrapper one line in `WRAPPERS`.
"""

from typing import Any, Callable, Mapping, Optional

import tensorflow_federated as tff

from baselines import arc
from baselines import bucketing
from baselines import centered_clipping
from baselines import coordinatewise
from baselines import krum
from baselines import nnm
from baselines import wrappers
from tff_robust import centered_clipping as secure_centered_clipping
from tff_robust import gamma_mean
from tff_robust import geometric_median
from tff_robust import gradient_masking
from tff_robust import nonfinite

Builder = Callable[..., tff.aggregators.WeightedAggregationFactory]


def _multi_krum(**kwargs):
  kwargs.setdefault('num_selected', None)
  return krum.KrumFactory(**kwargs)


def _krum(**kwargs):
  if kwargs.get('num_selected', 1) != 1:
    raise ValueError("'krum' selects one update; use 'multi_krum' for num_selected.")
  return krum.KrumFactory(**kwargs)


def _gamma_mean_diagonal(**kwargs):
  if kwargs.setdefault('covariance', 'diagonal') != 'diagonal':
    raise ValueError("'gamma_mean_diagonal' has covariance='diagonal'.")
  return gamma_mean.GammaMeanFactory(**kwargs)


AGGREGATORS: dict[str, Builder] = {
    'mean': wrappers.mean_factory,
    'gm': geometric_median.GeometricMedianFactory,
    'one_step_gm': geometric_median.one_step_geometric_median_factory,
    'gamma_mean': gamma_mean.GammaMeanFactory,
    'gamma_mean_diagonal': _gamma_mean_diagonal,
    'gma': gradient_masking.GradientMaskedAveragingFactory,
    'median': coordinatewise.CoordinateWiseMedianFactory,
    'trimmed_mean': coordinatewise.TrimmedMeanFactory,
    'krum': _krum,
    'multi_krum': _multi_krum,
    'norm_clipping': wrappers.norm_clipping_factory,
    'centered_clipping': centered_clipping.CenteredClippingFactory,
    'secure_centered_clipping': secure_centered_clipping.SecureCenteredClippingFactory,
}


# Pre-aggregation wrappers: wrapper(inner_factory, **kwargs) → factory.
WRAPPERS: dict[str, Callable[..., tff.aggregators.WeightedAggregationFactory]] = {
    'bucketing': bucketing.BucketingFactory,
    'nnm': nnm.NearestNeighborMixingFactory,
    'arc': arc.AdaptiveRobustClippingFactory,
}
SEPARATOR = '+'


def known_aggregators() -> tuple[str, ...]:
  """The aggregator names `aggregator_from_name` accepts (wrappers compose with them)."""
  return tuple(AGGREGATORS)


def known_wrappers() -> tuple[str, ...]:
  return tuple(WRAPPERS)


def split_name(name: str) -> tuple[list[str], str]:
  """'w1+w2+aggregator' → (['w1', 'w2'], 'aggregator'), each part checked.

  Raises:
    ValueError: for an unknown part (the message lists the known ones).
  """
  if not isinstance(name, str):
    raise ValueError(f'An aggregator name must be a string, got {name!r}.')
  *wrappers, base = name.split(SEPARATOR)
  if base not in AGGREGATORS:
    raise ValueError(f'Unknown aggregator {base!r}; known aggregators: '
                     f'{", ".join(known_aggregators())}.')
  unknown = [w for w in wrappers if w not in WRAPPERS]
  if unknown:
    raise ValueError(f'Unknown wrapper(s) {unknown} in {name!r}; known wrappers: '
                     f'{", ".join(known_wrappers())}.')
  return wrappers, base


def aggregator_from_name(
    name: str, wrapper_args: Optional[Mapping[str, Mapping[str, Any]]] = None,
    **kwargs) -> tff.aggregators.WeightedAggregationFactory:
  """The weighted aggregation factory called `name`, built with `kwargs` (the named
  aggregator's constructor arguments; 'multi_krum' defaults `num_selected` to n − f)
  and wrapped by the wrappers the name lists, with `wrapper_args`.

  Raises:
    ValueError: for an unknown name (the message lists the known ones) or invalid
      arguments.
    TypeError: for arguments a factory does not take, or a wrapper that cannot wrap
      the aggregator.
  """
  wrappers, base = split_name(name)
  factory = AGGREGATORS[base](**kwargs)
  for wrapper in reversed(wrappers):
    factory = WRAPPERS[wrapper](factory, **(wrapper_args or {}).get(wrapper, {}))
  return nonfinite.NonfiniteFilteringFactory(factory)


def is_secure_compatible(factory: tff.aggregators.WeightedAggregationFactory) -> bool:
  """What the factory's class declares: True when client values reach the server only
  through sums (so a secure inner sum makes the whole aggregate secure)."""
  return bool(getattr(factory, 'secure_compatible', False))
