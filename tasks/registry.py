"""Every aggregator of the project by name, for flags and configuration files.

  factory = aggregator_from_name('gm', num_communication_passes=3)
  process = tff.learning.algorithms.build_weighted_fed_avg(
      model_fn, ..., model_aggregator=factory)

A name may compose pre-aggregation wrappers with an aggregator, outermost first:
'bucketing+median' is `BucketingFactory(CoordinateWiseMedianFactory())`; the wrappers'
arguments come in `wrapper_args` (wrapper name → keyword arguments).

In Python the factories compose as objects, and a name is sugar for exactly those
objects (this module builds every name that way): each wrapper takes its inner
factory as the first argument,

  from baselines.arc import AdaptiveRobustClippingFactory
  from baselines.bucketing import BucketingFactory
  from baselines.coordinatewise import CoordinateWiseMedianFactory
  from baselines.krum import KrumFactory
  from baselines.nnm import NearestNeighborMixingFactory
  from tff_robust import GeometricMedianFactory
  from tff_robust import NonfiniteFilteringFactory
  from tff_robust import TrustRegionFactory

  BucketingFactory(CoordinateWiseMedianFactory())               # 'bucketing+median'
  AdaptiveRobustClippingFactory(GeometricMedianFactory(),       # 'arc+gm'
                                byzantine_fraction=0.25)
  NearestNeighborMixingFactory(KrumFactory(byzantine_fraction=0.25),   # 'nnm+krum'
                               byzantine_fraction=0.25)
  TrustRegionFactory(GeometricMedianFactory())                  # 'trust+gm'

and `aggregator_from_name(name)` adds the outermost `NonfiniteFilteringFactory`. What a
wrapper wraps is declared by its class (`wraps`: bucketing and NNM the gathering
baselines, `baselines.gather.GatheringAggregationFactory`; ARC and the trust region any
weighted factory)
and checked by its constructor.

Every factory built here is weighted and unweighted (`create(value_type)` gives every
client weight 1; `build_unweighted_fed_avg` takes it) and is wrapped, outermost, in
`tff_robust.NonfiniteFilteringFactory`: a client with a NaN or an infinity, or a
negative, subnormal or non-finite weight, gets weight 0 and is counted in the
`num_nonfinite_clients` measurement. `weight_cap=` adds the robust weight cap inside it.

The names cover both layers: the deployable, secure-aggregation compatible factories of
`tff_robust` and the comparison methods of `baselines`. Every name returns a
`tff.aggregators.WeightedAggregationFactory` and `UnweightedAggregationFactory` (the
unweighted baselines accept and ignore the weights), so any of them plugs into
`build_weighted_fed_avg` and `build_unweighted_fed_avg`. Whether a
factory is secure-aggregation compatible is declared by its class
(`secure_compatible`), never listed here.

Adding an aggregator is one line in `AGGREGATORS`, a wrapper one line in `WRAPPERS`
(and its module in `_modules`, which imports them on the first build).
What the rest of the project needs to know of them is read from the factories, never
listed: whether one is secure-aggregation compatible (`is_secure_compatible`), gathers
the updates (`gathers`), and which wrappers take it (`wrappable`); the leaderboard's
default grid (`tasks.simulation.leaderboard`) is derived from these.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Optional, TYPE_CHECKING

if TYPE_CHECKING:
  import tensorflow_federated as tff


@functools.cache
def _modules() -> dict[str, Any]:
  """The factories' modules by name, imported on the first build: naming, listing
  and checking names needs no TensorFlow (the binaries check their flags first)."""
  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  from baselines import arc
  from baselines import bucketing
  from baselines import centered_clipping
  from baselines import coordinatewise
  from baselines import gather
  from baselines import geometric_median as gathered_geometric_median
  from baselines import krum
  from baselines import nnm
  from baselines import wrappers
  from tff_robust.aggregators import centered_clipping as secure_centered_clipping
  from tff_robust.aggregators import gamma_mean
  from tff_robust.aggregators import geometric_median
  from tff_robust.aggregators import gradient_masking
  from tff_robust.aggregators import nonfinite
  from tff_robust.aggregators import trust_region
  from tff_robust.aggregators import weight_cap as weight_cap_lib
  return dict(locals())


class _Lazy:
  """`module.name` of `_modules()`, called as the builder it names."""

  def __init__(self, module: str, name: str):
    self.module, self.name = module, name

  def resolve(self) -> Callable[..., Any]:
    return getattr(_modules()[self.module], self.name)

  def __call__(self, *args, **kwargs):
    return self.resolve()(*args, **kwargs)

  def __repr__(self):
    return f'{self.module}.{self.name}'


def _resolved(builder):
  """The class or function `builder` (an `AGGREGATORS` or `WRAPPERS` value) is."""
  return builder.resolve() if isinstance(builder, _Lazy) else builder


Builder = Callable[..., 'tff.aggregators.WeightedAggregationFactory']


# Krum's assumed fraction of corrupted clients when neither f nor a fraction is given
# and the run's ρ is unknown: f = ⌊n/4⌋, so n > 2f + 2 holds from n = 5 on.
DEFAULT_BYZANTINE_FRACTION = 0.25


def _with_assumed_byzantine(kwargs, assumed_fraction):
  """f defaults to ⌊ρ·n⌋, ρ the run's corruption level if known, else 0.25."""
  if kwargs.get('num_byzantine') is None and kwargs.get('byzantine_fraction') is None:
    kwargs = dict(kwargs, num_byzantine=None, byzantine_fraction=(
        DEFAULT_BYZANTINE_FRACTION if assumed_fraction is None else assumed_fraction))
  return kwargs


def _multi_krum(assumed_byzantine_fraction=None, **kwargs):
  kwargs.setdefault('num_selected', None)
  return _modules()['krum'].KrumFactory(
      **_with_assumed_byzantine(kwargs, assumed_byzantine_fraction))


def _krum(assumed_byzantine_fraction=None, **kwargs):
  if kwargs.get('num_selected', 1) != 1:
    raise ValueError("'krum' selects one update; use 'multi_krum' for num_selected.")
  return _modules()['krum'].KrumFactory(
      **_with_assumed_byzantine(kwargs, assumed_byzantine_fraction))


# The aggregators and wrappers whose default assumed number of corrupted clients
# comes from `aggregator_from_name(..., assumed_byzantine_fraction=ρ)`.
_TAKE_ASSUMED_FRACTION = ('krum', 'multi_krum')
_WRAPPERS_TAKING_ASSUMED_FRACTION = ('nnm', 'arc')


def _gamma_mean_diagonal(**kwargs):
  if kwargs.setdefault('covariance', 'diagonal') != 'diagonal':
    raise ValueError("'gamma_mean_diagonal' has covariance='diagonal'.")
  return _modules()['gamma_mean'].GammaMeanFactory(**kwargs)


AGGREGATORS: dict[str, Builder] = {
    'mean': _Lazy('wrappers', 'mean_factory'),
    'gm': _Lazy('geometric_median', 'GeometricMedianFactory'),
    'gathered_gm': _Lazy('gathered_geometric_median', 'GatheredGeometricMedianFactory'),
    'one_step_gm': _Lazy('geometric_median', 'one_step_geometric_median_factory'),
    'gamma_mean': _Lazy('gamma_mean', 'GammaMeanFactory'),
    'gamma_mean_diagonal': _gamma_mean_diagonal,
    'gma': _Lazy('gradient_masking', 'GradientMaskedAveragingFactory'),
    'median': _Lazy('coordinatewise', 'CoordinateWiseMedianFactory'),
    'trimmed_mean': _Lazy('coordinatewise', 'TrimmedMeanFactory'),
    'krum': _krum,
    'multi_krum': _multi_krum,
    'norm_clipping': _Lazy('wrappers', 'norm_clipping_factory'),
    'centered_clipping': _Lazy('centered_clipping', 'CenteredClippingFactory'),
    'secure_centered_clipping': _Lazy('secure_centered_clipping',
                                      'SecureCenteredClippingFactory'),
}


# Pre-aggregation wrappers: wrapper(inner_factory, **kwargs) → factory.
WRAPPERS: dict[str, Builder] = {
    'bucketing': _Lazy('bucketing', 'BucketingFactory'),
    'nnm': _Lazy('nnm', 'NearestNeighborMixingFactory'),
    'arc': _Lazy('arc', 'AdaptiveRobustClippingFactory'),
    'trust': _Lazy('trust_region', 'TrustRegionFactory'),
}
SEPARATOR = '+'

# Bucketing and NNM transform the gathered updates, so they wrap gathering baselines
# only (`wraps_gathering_only`): in front of them a secure-compatible name means its
# gathering twin (same arguments, same result), e.g. 'bucketing+gm' is bucketing
# around 'gathered_gm'.
_GATHERED_TWINS = {'gm': 'gathered_gm'}


def known_aggregators() -> tuple[str, ...]:
  """The aggregator names `aggregator_from_name` accepts (wrappers compose with them)."""
  return tuple(AGGREGATORS)


def known_wrappers() -> tuple[str, ...]:
  return tuple(WRAPPERS)


def _wrapped_type(wrapper: str) -> type:
  """The factories `wrapper` wraps, as its class declares (`wraps`); any weighted
  factory for a wrapper that declares nothing."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top,redefined-outer-name
  return getattr(_resolved(WRAPPERS[wrapper]), 'wraps',
                 tff.aggregators.WeightedAggregationFactory)


def wraps_gathering_only(wrapper: str) -> bool:
  """Whether `wrapper` wraps the gathering baselines only (bucketing, NNM): directly
  inside it, a name with a gathering twin means the twin ('gm' → 'gathered_gm')."""
  return issubclass(_wrapped_type(wrapper),
                    _modules()['gather'].GatheringAggregationFactory)


def _default_factory(name: str) -> tff.aggregators.WeightedAggregationFactory:
  """The factory of `name` built with default arguments, without the filter."""
  return aggregator_from_name(name).inner


def gathers(name: str) -> bool:
  """Whether the aggregator `name` gathers the individual client updates at the
  server (a `baselines.gather.GatheringAggregationFactory`: the gathering baselines,
  which bucketing and NNM wrap), as its factory built with default arguments does."""
  return isinstance(_default_factory(name),
                    _modules()['gather'].GatheringAggregationFactory)


def wrappable(wrapper: str) -> tuple[str, ...]:
  """The aggregators `wrapper+name` accepts: the names whose factory (by default
  arguments) the wrapper's class wraps, in `AGGREGATORS` order; then, for a wrapper of
  the gathering baselines only, the names it takes through their gathering twin
  ('gm'), the twin itself ('gathered_gm') being listed under that name only."""
  if wrapper not in WRAPPERS:
    raise ValueError(f'Unknown wrapper {wrapper!r}; known wrappers: '
                     f'{", ".join(known_wrappers())}.')
  wrapped = _wrapped_type(wrapper)
  twins = _GATHERED_TWINS if wraps_gathering_only(wrapper) else {}
  direct = [name for name in AGGREGATORS if name not in twins
            and name not in twins.values()
            and isinstance(_default_factory(name), wrapped)]
  through_twins = [name for name, twin in twins.items() if name in AGGREGATORS
                   and twin in AGGREGATORS
                   and isinstance(_default_factory(twin), wrapped)]
  return tuple(direct + through_twins)


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
                     f'{", ".join(known_aggregators())}, each optionally behind '
                     f'wrappers as wrapper{SEPARATOR}name (wrappers: '
                     f'{", ".join(known_wrappers())}).')
  unknown = [w for w in wrappers if w not in WRAPPERS]
  if unknown:
    raise ValueError(f'Unknown wrapper(s) {unknown} in {name!r}; known wrappers: '
                     f'{", ".join(known_wrappers())}.')
  return wrappers, base


def aggregator_from_name(
    name: str, wrapper_args: Optional[Mapping[str, Mapping[str, Any]]] = None,
    assumed_byzantine_fraction: Optional[float] = None,
    weight_cap: Optional[Mapping[str, Any]] = None,
    **kwargs) -> tff.aggregators.WeightedAggregationFactory:
  """The weighted aggregation factory called `name`, built with `kwargs` (the named
  aggregator's constructor arguments; 'multi_krum' defaults `num_selected` to n − f)
  and wrapped by the wrappers the name lists, with `wrapper_args`.

  Directly inside 'bucketing' or 'nnm', which wrap gathering baselines only, 'gm'
  means 'gathered_gm' (`baselines.geometric_median`: the same smoothed Weiszfeld
  passes and arguments, computed at the server on the gathered updates), so
  'bucketing+gm' gathers the updates and is not secure-aggregation compatible.

  'krum', 'multi_krum' and the wrappers 'nnm' and 'arc' need f, the assumed number
  of corrupted clients: without `num_byzantine` or `byzantine_fraction` (for a
  wrapper, in its `wrapper_args`) it is ⌊ρ·n⌋ for the n clients of a round,
  ρ = `assumed_byzantine_fraction` (the simulation binaries pass the run's --rho), or
  `DEFAULT_BYZANTINE_FRACTION` = 0.25 if that is None. Other aggregators ignore
  `assumed_byzantine_fraction`.

  `weight_cap`, if not None, puts `tff_robust.aggregators.weight_cap.
  WeightCappingFactory` (its keyword arguments, `{}` its defaults) around the named
  factory, inside the filter: every client's weight is capped at a multiple of the
  clients' median weight. Off by default here, so the committed results keep their
  meaning; the RFA learning builders turn it on by default.

  Every returned factory is both a weighted and an unweighted TFF factory
  (`create(value_type)` gives every client weight 1), so it plugs into
  `build_weighted_fed_avg` and `build_unweighted_fed_avg` alike.

  Raises:
    ValueError: for an unknown name (the message lists the known ones) or an
      argument out of range.
    TypeError: for arguments a factory does not take or of the wrong type, or a
      wrapper that cannot wrap the aggregator.
  """
  wrappers, base = split_name(name)
  if wrappers and wraps_gathering_only(wrappers[-1]):
    base = _GATHERED_TWINS.get(base, base)
  if base in _TAKE_ASSUMED_FRACTION:
    kwargs['assumed_byzantine_fraction'] = assumed_byzantine_fraction
  factory = AGGREGATORS[base](**kwargs)
  for wrapper in reversed(wrappers):
    args = (wrapper_args or {}).get(wrapper, {})
    if wrapper in _WRAPPERS_TAKING_ASSUMED_FRACTION:
      args = _with_assumed_byzantine(args, assumed_byzantine_fraction)
    factory = WRAPPERS[wrapper](factory, **args)
  if weight_cap is not None:
    factory = _modules()['weight_cap_lib'].WeightCappingFactory(factory, **weight_cap)
  return _modules()['nonfinite'].NonfiniteFilteringFactory(factory)


def takes_assumed_byzantine_fraction(name: str) -> bool:
  """Whether `aggregator_from_name(name, assumed_byzantine_fraction=ρ)` depends on ρ
  (Krum, multi-Krum, and anything behind NNM or ARC)."""
  wrappers, base = split_name(name)
  return (base in _TAKE_ASSUMED_FRACTION or
          any(w in _WRAPPERS_TAKING_ASSUMED_FRACTION for w in wrappers))


def is_secure_compatible(factory: tff.aggregators.WeightedAggregationFactory) -> bool:
  """What the factory's class declares: True when client values reach the server only
  through sums (so a secure inner sum makes the whole aggregate secure)."""
  return bool(getattr(factory, 'secure_compatible', False))


def check_num_clients(factory, num_clients: int) -> None:
  """Raises a ValueError, before a round runs, if `factory` (as built here) cannot
  aggregate `num_clients` clients of weight > 0 (Krum's n > 2f + 2, also inside
  bucketing, whose inner aggregator sees ⌈n/s⌉ bucket means; NNM's and ARC's n > f):
  a clear Python error instead of the failed assertion TFF's executor reports as a
  gRPC INTERNAL error. Factories without such a condition pass."""
  while factory is not None:
    check = getattr(factory, 'check_num_clients', None)
    if check is not None:
      check(num_clients)
    if isinstance(factory, _modules()['bucketing'].BucketingFactory):
      num_clients = -(-num_clients // factory.bucket_size)
    factory = getattr(factory, 'inner', None)  # Through the wrappers.


# {factory class: revision}, bumped when the class's results change for the same
# arguments (a new default), so the runs using it are retrained instead of taken from a
# ledger or resumed from checkpoints; the other runs keep their configurations.
# GeometricMedianFactory (and the gathered one) 4: the trimmed start and
# β = α·ν/max(ν, d); GammaMeanFactory 2: γ scaled by the spread by default.
RESULTS_REVISIONS = {'GeometricMedianFactory': 4, 'GatheredGeometricMedianFactory': 4,
                     'GammaMeanFactory': 2}


def _results_revision(obj):
  """The revision of `obj`'s class or of the nearest revised class it derives from."""
  for cls in type(obj).__mro__:
    if cls.__name__ in RESULTS_REVISIONS:
      return RESULTS_REVISIONS[cls.__name__]
  return None


def results_revisions(factory) -> dict[str, int]:
  """{class name: revision} (`RESULTS_REVISIONS`) of every factory in `factory`'s
  wrapping chain whose class, or a class it derives from, is revised."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top,redefined-outer-name
  factory_types = (tff.aggregators.WeightedAggregationFactory,
                   tff.aggregators.UnweightedAggregationFactory)
  found, pending, seen = {}, [factory], set()
  while pending:
    obj = pending.pop()
    if id(obj) in seen:
      continue
    seen.add(id(obj))
    revision = _results_revision(obj)
    if revision is not None:
      found[type(obj).__name__] = revision
    pending.extend(v for v in getattr(obj, '__dict__', {}).values()
                   if isinstance(v, factory_types))
  return dict(sorted(found.items()))


def with_results_revisions(config: dict[str, Any], factory) -> dict[str, Any]:
  """`config` with `aggregator_revisions` when some factory of `factory` declares
  one (absent otherwise, so configurations of unrevised factories stay as they were)."""
  revisions = results_revisions(factory)
  return dict(config, aggregator_revisions=revisions) if revisions else config
