"""--aggregator and --aggregators with --aggregator_args: building their factories
(once for equal arguments), checking them at parse time, and refusing settings an
aggregator cannot train with (`UnworkableSettingsError`)."""

from __future__ import annotations

import functools
import math
from typing import Any, Optional, Sequence, TYPE_CHECKING

from absl import flags

from tasks import registry
from tasks.binaries import named_args

if TYPE_CHECKING:
  from tasks.binaries import flag_groups

FLAGS = flags.FLAGS
# As in flag_groups: the flags defined here belong to the binary that asks for them.
flags.disclaim_key_flags()


def aggregator_kwargs(name: str, entries: Sequence[str]) -> dict[str, Any]:
  """`aggregator_from_name` keyword arguments of the (possibly wrapped) aggregator
  `name` in --aggregator_args entries: untargeted entries and those targeting the
  aggregator go to it, entries targeting a wrapper go to `wrapper_args`."""
  wrappers, base = registry.split_name(name)
  targets = registry.known_aggregators() + registry.known_wrappers()
  kwargs = named_args.parse(entries, base, targets)
  wrapper_args = {w: named_args.parse(entries, w, targets, untargeted=False)
                  for w in wrappers}
  if any(wrapper_args.values()):
    kwargs['wrapper_args'] = wrapper_args
  return kwargs


def build_aggregator(name: str, entries: Sequence[str],
                     rho: Optional[float] = None):
  """`aggregator_from_name(name, ...)` with --aggregator_args, errors naming it; the
  run's `rho` is Krum's default assumed corrupted fraction. One object for equal
  arguments (`rho` only where it reaches the factory), shared by a run's uses."""
  try:
    return _factory(name, tuple(entries),
                    rho if registry.takes_assumed_byzantine_fraction(name) else None)
  except (TypeError, ValueError) as e:
    raise ValueError(f'--aggregator_args={",".join(entries)} is invalid for '
                     f'aggregator {name}: {e}') from e


@functools.lru_cache(maxsize=16)
def _factory(name: str, entries: tuple[str, ...], rho: Optional[float]):
  return registry.aggregator_from_name(
      name, assumed_byzantine_fraction=rho, **aggregator_kwargs(name, entries))


class UnworkableSettingsError(ValueError):
  """Flags valid one by one that cannot train together (e.g. Krum with too few
  clients per round for the corrupted clients it assumes); the binaries exit with
  status 2 on it, before loading any data."""


def _takes_round(factory, n: int) -> bool:
  try:
    registry.check_num_clients(factory, n)
  except ValueError:
    return False
  return True


def _sets_f(name: str, entries: Sequence[str]) -> bool:
  """Whether --aggregator_args gives f itself (else it comes from --rho)."""
  kwargs = aggregator_kwargs(name, entries)
  given = [kwargs] + list(kwargs.get('wrapper_args', {}).values())
  return any(key in args for args in given
             for key in ('num_byzantine', 'byzantine_fraction'))


def check_clients_per_round(settings: flag_groups.RunSettings) -> None:
  """Raises `UnworkableSettingsError`, naming the flags and the values that would
  work, when --aggregator cannot aggregate a round of --clients_per_round clients
  with f = ⌊rho·n⌋ assumed corrupted (Krum's and multi-Krum's n > 2f + 2, also inside
  NNM or bucketing; NNM's and ARC's n > f), trying one factory per lower ρ."""
  name, entries, rho, n = (settings[flag] for flag in (
      'aggregator', 'aggregator_args', 'rho', 'clients_per_round'))
  if not registry.takes_assumed_byzantine_fraction(name):
    return  # Only the factories assuming corrupted clients have a condition on n.
  factory = settings.factory()
  if _takes_round(factory, n):
    return
  explicit = _sets_f(name, entries)
  assumed = ('f (of --aggregator_args)' if explicit else
             f'f = ⌊{rho:g}·{n}⌋ = {math.floor(rho * n)}')
  fixes = []
  enough = next((m for m in range(n + 1, 100 * n + 100)
                 if _takes_round(factory, m)), None)
  if enough:
    fixes.append(f'raise --clients_per_round to {enough} or more')
  lower = next((k / n for k in range(math.floor(rho * n) - 1, -1, -1)
                if _takes_round(build_aggregator(name, entries, k / n), n)), None)
  if lower is not None:
    fixes.append(f'lower --rho to {lower:g}')
  fixes.append('lower f in --aggregator_args' if explicit else
               'set f apart from --rho with --aggregator_args=num_byzantine=<f>')
  raise UnworkableSettingsError(
      f'--aggregator={name} cannot aggregate a round of --clients_per_round={n} '
      f'clients at --rho={rho:g}: it assumes {assumed} of them corrupted, too many '
      f'(Krum and multi-Krum need n > 2f + 2, NNM and ARC n > f). Fix: '
      + '; or '.join(fixes) + '.')


def define_byzantine_fraction_flag(default: float = 0.25,
                                   flag_values: flags.FlagValues = FLAGS) -> None:
  """--byzantine_fraction, for binaries that build aggregators by name outside a
  sweep (no run's rho): the assumed corrupted fraction, in [0, 0.5), of the
  aggregators and wrappers that need one. Build them with `aggregator_from_flag`."""
  flags.DEFINE_float(
      'byzantine_fraction', default, 'The assumed corrupted fraction of the '
      'aggregators that need one (Krum, multi-Krum, NNM, ARC; also inside '
      'bucketing), in [0, 0.5).', flag_values=flag_values)
  flags.register_validator(
      'byzantine_fraction', lambda value: 0 <= value < 0.5,
      message='--byzantine_fraction must be in [0, 0.5): robust aggregation assumes '
      'fewer than half the clients corrupted.', flag_values=flag_values)


def aggregator_from_flag(name: str, flag_values: flags.FlagValues = FLAGS):
  """`aggregator_from_name(name)` with --byzantine_fraction, which the registry passes
  to the aggregators and wrappers that need f, and only them."""
  return registry.aggregator_from_name(
      name, assumed_byzantine_fraction=flag_values.byzantine_fraction)


def aggregator_help() -> str:
  return ('by name of tasks.registry, optionally wrapped as wrapper+name (e.g. '
          f'bucketing+median). Aggregators: {", ".join(registry.known_aggregators())}; '
          f'wrappers: {", ".join(registry.known_wrappers())}.')


def validate_aggregators(names_flag: str, also: Sequence[str] = ()) -> None:
  """Checks at parse time that every aggregator in --`names_flag` (but those in
  `also`) builds with --aggregator_args (building a factory is cheap: no TFF tracing,
  but TensorFlow is imported; with the binary's default --aggregator_args nothing is
  built)."""

  # The names alone first: an unknown name is the name's fault, not --aggregator_args'.
  validate_aggregator_names(names_flag, also)

  @flags.multi_flags_validator([names_flag, 'aggregator_args'],
                               message='invalid --aggregator_args')
  def _check(values):
    names = values[names_flag]
    if values['aggregator_args'] == FLAGS['aggregator_args'].default:
      # Nothing to build: without entries every name split_name takes builds; the
      # binary's own default entries are built by its tests.
      return True
    for name in [names] if isinstance(names, str) else names or []:
      if name in also:
        continue
      try:
        build_aggregator(name, values['aggregator_args'])
      except ValueError as e:
        raise flags.ValidationError(str(e)) from e
    return True


def validate_aggregator_names(names_flag: str, also: Sequence[str] = ()) -> None:
  """Checks at parse time that --`names_flag` (one name, a list, or None) names
  registry aggregators, optionally wrapped (`tasks.registry.split_name`), or one of
  `also`; for binaries that build aggregators without --aggregator_args."""

  def check(value):
    names = [value] if isinstance(value, str) else value or []
    for name in names:
      if name not in also:
        try:
          registry.split_name(name)
        except ValueError as e:
          raise flags.ValidationError(f'--{names_flag}: {e}') from e
    return True

  flags.register_validator(names_flag, check)
