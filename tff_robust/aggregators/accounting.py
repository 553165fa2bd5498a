"""ε and δ of a run with the differentially private inner mean, through `dp_accounting`.

What is accounted: the values the inner mean returns and its clip
(`tff_robust.DifferentiallyPrivateWeightedMeanFactory`). Each call is one Gaussian
mechanism on the records of the round's clients: record β̃_i·(x̃_i/C, 1), L2 norm at
most √2 (x̃ the value clipped to C, β̃ ∈ [0, 1] the weight over its public bound),
N(0, (z·√2)²) on the sum, so noise multiplier z at L2 sensitivity √2 when one client
is added or removed. With the adaptive clip (`.adaptive`) a call is two Gaussian
mechanisms on the same clients, the records' (z_v) and the clip count's (z_c = 2σ_c),
composed to one of z = (z_v⁻² + z_c⁻²)^(-1/2): `factory.dp_event()`. An iterative
aggregate calls it R times a round on the same clients (the geometric median's R
passes, the γ-mean's S iterations and its start), each pass's β computed from the
previous passes' noised results: a round is R adaptively composed calls,
`SelfComposedDpEvent(dp_event, R)`, `SelfComposedDpEvent(GaussianDpEvent(z), R)` for a
fixed clip.
The round's clients are a sample: with `clients_per_round` of `total_clients` the
sampling probability is q = clients_per_round / total_clients, accounted as Poisson
sampling of each client with probability q: TFF's and tensorflow-privacy's
convention for federated DP, exact for Poisson sampling and the usual approximation for
a sample of exactly clients_per_round clients (what the simulation draws), not a proven
bound for it. A run of T rounds is

    SelfComposedDpEvent(PoissonSampledDpEvent(q, SelfComposedDpEvent(
        GaussianDpEvent(z), R)), T)

(`run_event`), and `epsilon` composes it with `dp_accounting`'s RDP accountant (or its
PLD accountant, tighter: `accountant='pld'`). R Gaussian mechanisms of multiplier z on
one sample are exactly one of multiplier z/√R (their privacy loss is that of a single
Gaussian, also composed adaptively: Dong, Roth and Su's Gaussian DP), inside the
sampling as well; the PLD accountant, which samples single mechanisms only, is given
that equivalent.

What is not: the un-noised side channels of the iterative aggregates (histograms,
Σβ, the objective, `max_effective_weight`'s maximum, the γ-mean's moment sums, the
weight cap's and the non-finite filter's counts) are outside ε; each is listed with its
sensitivity in `tff_robust.aggregators.privacy.SIDE_CHANNELS` and docs/aggregators.md.

Usage, for the main job's settings (10 of 100 clients a round, 30 rounds, the geometric
median's R = 3 passes, z = 1, δ = 1e-5):

    accounting.epsilon(noise_multiplier=1.0, passes=3, rounds=30,
                       sampling_probability=10 / 100, delta=1e-5)   # 15.4 (RDP)

or from the factory itself: `accounting.epsilon_of(factory, rounds=30,
sampling_probability=0.1, delta=1e-5)` (`round_event_of` counts its calls).
"""

import math
from typing import Optional

import dp_accounting

from tff_robust.aggregators import gamma_mean
from tff_robust.aggregators import geometric_median
from tff_robust.aggregators import nonfinite
from tff_robust.aggregators import privacy
from tff_robust.aggregators import weight_cap
from tff_robust.common import arguments

ACCOUNTANTS = ('rdp', 'pld')
# The PLD accountant's discretization of the privacy loss: dp_accounting's default, an
# upper bound within ~1e-3 of the exact ε for the settings here.
PLD_DISCRETIZATION = 1e-4


def round_event(noise_multiplier: float, passes: int) -> dp_accounting.DpEvent:
  """One round on the sampled clients: `passes` (R) calls of the DP inner mean, each a
  Gaussian mechanism of noise multiplier z = `noise_multiplier`."""
  noise_multiplier = arguments.check_nonnegative_float('noise_multiplier',
                                                       noise_multiplier)
  passes = arguments.check_positive_int('passes', passes)
  return dp_accounting.SelfComposedDpEvent(
      dp_accounting.GaussianDpEvent(noise_multiplier), passes)


def run_event(event: dp_accounting.DpEvent, rounds: int,
              sampling_probability: float) -> dp_accounting.DpEvent:
  """`rounds` rounds of the round event `event`, each on a Poisson sample of the
  clients with probability q = `sampling_probability` (clients_per_round /
  total_clients)."""
  rounds = arguments.check_positive_int('rounds', rounds)
  q = _check_sampling_probability(sampling_probability)
  if q == 1.0:
    return dp_accounting.SelfComposedDpEvent(event, rounds)
  return dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(q, event), rounds)


def epsilon(noise_multiplier: float, passes: int, rounds: int,
            sampling_probability: float, delta: float,
            accountant: str = 'rdp') -> float:
  """ε at `delta` of `rounds` rounds of `passes` DP inner-mean calls each (see the
  module docstring); inf for `noise_multiplier=0`.

  Args:
    noise_multiplier: z >= 0 of `DifferentiallyPrivateWeightedMeanFactory` (of
      `.adaptive`: the call's total, the clip count's included).
    passes: R >= 1, its calls per round (`num_communication_passes` of the
      geometric median; S + 1 for the γ-mean's mean start: `round_event_of`).
    rounds: T >= 1 training rounds.
    sampling_probability: q in (0, 1], clients_per_round / total_clients.
    delta: δ in (0, 1).
    accountant: 'rdp' (dp_accounting's `RdpAccountant`) or 'pld'
      (`PLDAccountant`, tighter).
  """
  return epsilon_of_event(round_event(noise_multiplier, passes), rounds,
                          sampling_probability, delta, accountant)


def delta(noise_multiplier: float, passes: int, rounds: int,
          sampling_probability: float, epsilon: float,
          accountant: str = 'rdp') -> float:
  """δ at `epsilon` of the same run as `epsilon(...)`."""
  epsilon = arguments.check_nonnegative_float('epsilon', epsilon)
  event = run_event(round_event(noise_multiplier, passes), rounds, sampling_probability)
  composed = _accountant(accountant)
  if noise_multiplier == 0:
    return 1.0  # No noise: no δ < 1 at any ε.
  composed.compose(_for_accountant(event, accountant))
  return float(composed.get_delta(epsilon))


def epsilon_of_event(event: dp_accounting.DpEvent, rounds: int,
                     sampling_probability: float, delta: float,
                     accountant: str = 'rdp') -> float:
  """ε at `delta` of `rounds` rounds of the round event `event` (`round_event`,
  `round_event_of`), sampled with probability `sampling_probability`."""
  delta = _check_delta(delta)
  run = run_event(event, rounds, sampling_probability)
  composed = _accountant(accountant)
  if effective_noise_multiplier(event) == 0:
    return math.inf  # A mechanism without noise (the accountants divide by z).
  composed.compose(_for_accountant(run, accountant))
  return float(composed.get_epsilon(delta))


def epsilon_of(factory, rounds: int, sampling_probability: float, delta: float,
               accountant: str = 'rdp') -> float:
  """ε at `delta` of a run with `factory` as the model aggregator: its DP inner-mean
  calls of a round (`round_event_of`) over `rounds` sampled rounds."""
  return epsilon_of_event(round_event_of(factory), rounds, sampling_probability, delta,
                          accountant)


def noise_multiplier_for(target_epsilon: float, passes: int, rounds: int,
                         sampling_probability: float, delta: float,
                         accountant: str = 'rdp') -> float:
  """The least noise multiplier z whose run (as `epsilon(...)`) has ε ≤
  `target_epsilon` at `delta` (dp_accounting's `calibrate_dp_mechanism`, to 1e-4)."""
  target_epsilon = arguments.check_positive_float('target_epsilon', target_epsilon)
  delta = _check_delta(delta)
  round_event(1.0, passes)  # Checks `passes`.
  run_event(round_event(1.0, 1), rounds, sampling_probability)  # And these.

  _accountant(accountant)  # Checks `accountant`.

  def make_event(z):
    return _for_accountant(
        run_event(round_event(z, passes), rounds, sampling_probability), accountant)

  if accountant == 'pld':
    # The PLD of a small z spans a huge range of losses: search between half the RDP
    # answer and the RDP answer, whose PLD ε is at most the target (PLD is tighter).
    upper = noise_multiplier_for(target_epsilon, passes, rounds, sampling_probability,
                                 delta, 'rdp')
    bracket = dp_accounting.ExplicitBracketInterval(0.5 * upper, upper)
  else:
    bracket = dp_accounting.LowerEndpointAndGuess(1e-3, 1.0)
  return float(dp_accounting.calibrate_dp_mechanism(
      lambda: _accountant(accountant), make_event, target_epsilon, delta, bracket,
      tol=1e-4))


def round_event_of(factory) -> dp_accounting.DpEvent:
  """The DP event of one round of `factory` on its sampled clients: one
  `dp_event()` (a Gaussian, or the adaptive clip's two) per call of its
  `DifferentiallyPrivateWeightedMeanFactory`.

  Understands `DifferentiallyPrivateWeightedMeanFactory` itself (one call),
  `GeometricMedianFactory` (R = `num_communication_passes` calls, one-step RFA 1),
  `GammaMeanFactory` (S iterations, plus 1 for the mean start or the geometric median's
  calls for its start) and the wrappers `NonfiniteFilteringFactory` and
  `WeightCappingFactory` (no call of their own).

  Raises:
    ValueError: if an inner mean that `factory` calls is not a
      `DifferentiallyPrivateWeightedMeanFactory` (its values reach the server
      un-noised: there is no ε).
    TypeError: for another factory (count its inner-mean calls R and call
      `epsilon(noise_multiplier, R, ...)`).
  """
  if isinstance(factory, privacy.DifferentiallyPrivateWeightedMeanFactory):
    return _event_of_mean(factory)
  if isinstance(factory, (nonfinite.NonfiniteFilteringFactory,
                          weight_cap.WeightCappingFactory)):
    return round_event_of(factory.inner)
  if isinstance(factory, geometric_median.GeometricMedianFactory):
    return _calls(factory, factory.inner_mean_factory,
                  factory.num_communication_passes)
  if isinstance(factory, gamma_mean.GammaMeanFactory):
    iterations = _calls(factory, factory.inner_mean_factory, factory.num_iterations)
    if factory.initial_point == 'mean':
      return _compose([_calls(factory, factory.inner_mean_factory, 1), iterations])
    return _compose([round_event_of(factory.geometric_median_factory), iterations])
  raise TypeError(
      f'round_event_of does not know the inner-mean calls of {type(factory).__name__}: '
      'count them (R) and call epsilon(noise_multiplier, passes=R, ...).')


def _calls(factory, inner, count: int) -> dp_accounting.DpEvent:
  if not isinstance(inner, privacy.DifferentiallyPrivateWeightedMeanFactory):
    raise ValueError(
        f'{type(factory).__name__} averages through {type(inner).__name__}, not '
        'tff_robust.DifferentiallyPrivateWeightedMeanFactory: its means reach the '
        'server un-noised, so a run has no ε. Pass inner_mean_factory='
        'tff_robust.DifferentiallyPrivateWeightedMeanFactory(noise_multiplier, clip).')
  return dp_accounting.SelfComposedDpEvent(_event_of_mean(inner), count)


def _event_of_mean(mean) -> dp_accounting.DpEvent:
  return mean.dp_event()


def _compose(events) -> dp_accounting.DpEvent:
  return dp_accounting.ComposedDpEvent(list(events))


def effective_noise_multiplier(event: dp_accounting.DpEvent) -> Optional[float]:
  """The noise multiplier of the single Gaussian mechanism equivalent to `event`, a
  Gaussian or a composition of Gaussians on the same records: (Σ_k z_k⁻²)^(-1/2)
  (z/√R for R calls of multiplier z); 0 if one has no noise; None for any other
  event."""
  if isinstance(event, dp_accounting.GaussianDpEvent):
    return float(event.noise_multiplier)
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    inner = effective_noise_multiplier(event.event)
    return None if inner is None else inner / math.sqrt(event.count)
  if isinstance(event, dp_accounting.ComposedDpEvent):
    multipliers = [effective_noise_multiplier(e) for e in event.events]
    if any(z is None for z in multipliers):
      return None
    if any(z == 0 for z in multipliers):
      return 0.0
    return sum(z ** -2 for z in multipliers) ** -0.5 if multipliers else math.inf
  return None


def _for_accountant(event: dp_accounting.DpEvent,
                    accountant: str) -> dp_accounting.DpEvent:
  """`event` as the accountant takes it: the PLD accountant samples a single
  Gaussian only, so a sampled composition of Gaussians becomes its equivalent
  single Gaussian (`effective_noise_multiplier`), an exact rewrite."""
  if accountant != 'pld':
    return event
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    return dp_accounting.SelfComposedDpEvent(_for_accountant(event.event, accountant),
                                             event.count)
  if isinstance(event, dp_accounting.ComposedDpEvent):
    return dp_accounting.ComposedDpEvent(
        [_for_accountant(e, accountant) for e in event.events])
  if isinstance(event, dp_accounting.PoissonSampledDpEvent):
    z = effective_noise_multiplier(event.event)
    if z is not None:
      return dp_accounting.PoissonSampledDpEvent(event.sampling_probability,
                                                 dp_accounting.GaussianDpEvent(z))
  return event


def _accountant(name: str) -> dp_accounting.PrivacyAccountant:
  if name == 'rdp':
    return dp_accounting.rdp.RdpAccountant()
  if name == 'pld':
    return dp_accounting.pld.PLDAccountant(
        value_discretization_interval=PLD_DISCRETIZATION)
  raise ValueError(f'accountant must be one of {ACCOUNTANTS}, got {name!r}.')


def _check_sampling_probability(q) -> float:
  q = arguments.check_number_in('sampling_probability', q, 0.0, 1.0,
                                high_inclusive=True)
  if q == 0.0:
    raise ValueError('sampling_probability must be in (0, 1] (clients_per_round / '
                     'total_clients), got 0.')
  return q


def _check_delta(value) -> float:
  value = arguments.check_number_in('delta', value, 0.0, 1.0, high_inclusive=False)
  if value == 0.0:
    raise ValueError('delta must be in (0, 1): a Gaussian mechanism has no ε at '
                     'δ = 0.')
  return value
