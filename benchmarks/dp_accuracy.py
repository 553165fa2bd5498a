r"""Accuracy at a stated ε: the robust aggregates with the DP inner mean beside DP-FedAvg.

Every run trains the main job's task (EMNIST-linear on the bundled digits, 100
clients, 10 a round, 30 rounds, 1 local epoch, batch 10, client learning rate 0.1:
`tasks.binaries.main_job`) with unit client weights (unweighted training: a client's
influence does not grow with its examples, as DP needs), clean and under the main
job's `omniscient` and `data` corruption, through the experiment harness
(`tasks.simulation.loop.Simulation`). Rows:

*   'gm', 'one_step_gm', 'gamma_mean' (from the geometric median, as in the main
    job): the registry's factories with `inner_mean_factory=tff_robust.
    DifferentiallyPrivateWeightedMeanFactory.adaptive(z, clients_per_round=10)`
    (adaptive clip at the median update norm, TFF's defaults otherwise), one row
    per --relative_nus (the GM's relative ν; the γ-mean's start's): 0.2 is the
    GM's default, 1 gives the clients within the typical distance the full
    weight β̃ = 1, so a call's noise z_v·√2·C/Σβ̃ is smaller.
*   'dp_fedavg': `tff.learning.dp_aggregator(z, clients_per_round=10)` (TFF's
    adaptive-clip Gaussian mean) with unweighted FedAvg.

Each row's z is the least one whose run has ε ≤ --target_epsilon at --delta
(`tff_robust.aggregators.accounting.noise_multiplier_for`, with the row's calls of
the DP mechanism a round: 3 for the GM, 1 for one-step RFA and DP-FedAvg, 6 for the
γ-mean from the GM; the adaptive clip's count is inside z), sampling q = 10/100
(Poisson-sampling accounting, the usual approximation for the simulation's sample of
exactly 10). What ε does not cover: the declared side channels of the robust
aggregates (`tff_robust.aggregators.privacy.SIDE_CHANNELS`) and DP-FedAvg's un-noised
zeroing quantile (as TFF documents).

Finished runs go to a ledger (`--ledger`, `tasks.simulation.ledger`) keyed by a
fingerprint of the run's configuration, so an interrupted grid resumes.

  .venv/bin/python -m benchmarks.dp_accuracy --output=results/dp_accuracy.md
"""

import math
import os
import time

from absl import flags
import numpy as np

from benchmarks import tables
from tasks.binaries import exit_status

ROWS = ('gm', 'one_step_gm', 'gamma_mean', 'dp_fedavg')
ROW_NAMES = {'gm': 'RFA (gm)', 'one_step_gm': 'one-step RFA',
             'gamma_mean': 'γ-mean (from the gm)',
             'dp_fedavg': 'DP-FedAvg (tff.learning.dp_aggregator)'}
TOTAL_CLIENTS = 100
CLIENTS_PER_ROUND = 10
CLIENT_LEARNING_RATE = 0.1

_ROWS = flags.DEFINE_list('aggregators', list(ROWS), 'Rows.')
_ATTACKS = flags.DEFINE_list('attacks', ['omniscient', 'data'], 'Corruption models.')
_RHOS = flags.DEFINE_list('rhos', ['0.1', '0.25'], 'Corruption levels ρ.')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds.')
_EPSILON = flags.DEFINE_float('target_epsilon', 8.0, 'ε of every run, at --delta.')
_DELTA = flags.DEFINE_float('delta', 1e-5, 'δ.')
_ROUNDS = flags.DEFINE_integer('rounds', 30, 'Training rounds.')
_RELATIVE_NUS = flags.DEFINE_list(
    'relative_nus', ['0.2', '1'], "The robust rows' relative ν "
    "(GeometricMedianFactory's relative_nu, 0.2 its default; the γ-mean's start's): "
    'one row per value.')
_LEDGER = flags.DEFINE_string('ledger', 'results/dp_accuracy_runs.csv',
                              'Finished runs (read, then extended as runs finish).')
_OUTPUT = flags.DEFINE_string('output', '', 'Write the page here (and print it).')
flags.register_validator('aggregators', lambda v: set(v) <= set(ROWS),
                         message=f'--aggregators must be a subset of {ROWS}.')
flags.register_validator('attacks', lambda v: set(v) <= {'omniscient', 'data'},
                         message="--attacks must be a subset of {'omniscient', 'data'}.")
flags.register_validator('rhos', lambda v: all(0 < float(r) < 0.5 for r in v),
                         message='--rhos must be in (0, 0.5).')
flags.register_validator('target_epsilon', lambda v: v > 0,
                         message='--target_epsilon must be > 0.')
flags.register_validator('delta', lambda v: 0 < v < 1, message='--delta must be in (0, 1).')
flags.register_validator('rounds', lambda v: v >= 1, message='--rounds must be >= 1.')
flags.register_validator('relative_nus', lambda v: all(float(x) > 0 for x in v),
                         message='--relative_nus must be > 0.')


def _robust_factory(row: str, inner, relative_nu: float):
  from tasks import registry  # pylint: disable=g-import-not-at-top
  nu = {'relative_nu': relative_nu}
  if row == 'gamma_mean':
    from tff_robust.aggregators import geometric_median  # pylint: disable=g-import-not-at-top
    return registry.aggregator_from_name(
        'gamma_mean', initial_point='geometric_median', inner_mean_factory=inner,
        geometric_median_factory=geometric_median.GeometricMedianFactory(
            inner_mean_factory=inner, **nu))
  return registry.aggregator_from_name(row, inner_mean_factory=inner, **nu)


def _dp_mean(z: float):
  import tff_robust  # pylint: disable=g-import-not-at-top
  return tff_robust.DifferentiallyPrivateWeightedMeanFactory.adaptive(
      z, clients_per_round=CLIENTS_PER_ROUND)


def calls_per_round(row: str, relative_nu: float) -> int:
  """The Gaussian mechanisms of a round (R), counted by the accountant."""
  from tff_robust.aggregators import accounting  # pylint: disable=g-import-not-at-top
  if row == 'dp_fedavg':
    return 1
  z = accounting.effective_noise_multiplier(
      accounting.round_event_of(_robust_factory(row, _dp_mean(1.0), relative_nu)))
  return int(round(z ** -2))


def noise_and_epsilon(row: str, relative_nu: float) -> tuple[float, int, float, float]:
  """(z, R, ε of the run as built, z_v: the records' noise multiplier) for `row`."""
  from tff_robust.aggregators import accounting  # pylint: disable=g-import-not-at-top
  q = CLIENTS_PER_ROUND / TOTAL_CLIENTS
  passes = calls_per_round(row, relative_nu)
  z = accounting.noise_multiplier_for(_EPSILON.value, passes, _ROUNDS.value, q,
                                      _DELTA.value)
  if row == 'dp_fedavg':
    epsilon = accounting.epsilon(z, 1, _ROUNDS.value, q, _DELTA.value)
    # TFF's gaussian_adaptive split, its count's σ_c = 0.05·clients_per_round.
    records = (z ** -2 - (2 * 0.05 * CLIENTS_PER_ROUND) ** -2) ** -0.5
  else:
    epsilon = accounting.epsilon_of(_robust_factory(row, _dp_mean(z), relative_nu),
                                    _ROUNDS.value, q, _DELTA.value)
    records = _dp_mean(z).value_noise_multiplier
  return z, passes, epsilon, records


def unit_weights(factory):
  """A weighted factory that aggregates with weight 1 per client (unweighted
  training), so the harness runs it as a weighted one."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  class UnitWeights(tff.aggregators.WeightedAggregationFactory):

    def create(self, value_type, weight_type):
      process = factory.create(value_type)

      @tff.federated_computation(process.state_type,
                                 tff.FederatedType(value_type, tff.CLIENTS),
                                 tff.FederatedType(weight_type, tff.CLIENTS))
      def next_fn(state, value, weight):
        del weight
        return process.next(state, value)

      return tff.templates.AggregationProcess(process.initialize, next_fn)

  return UnitWeights()


def build(row: str, z: float, relative_nu: float):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  if row == 'dp_fedavg':
    return unit_weights(tff.learning.dp_aggregator(z, CLIENTS_PER_ROUND))
  return unit_weights(_robust_factory(row, _dp_mean(z), relative_nu))


def _config(row, nu, attack, rho, seed, z):
  from tasks import registry  # pylint: disable=g-import-not-at-top
  config = dict(
      task='emnist', model='linear', source='bundled', rounds=_ROUNDS.value,
      clients_per_round=CLIENTS_PER_ROUND, client_learning_rate=CLIENT_LEARNING_RATE,
      weights='unit', aggregator=row, attack=attack or 'none', rho=rho, seed=seed,
      target_epsilon=_EPSILON.value, delta=_DELTA.value, noise_multiplier=round(z, 6),
      dp_mean='adaptive(clients_per_round=10)', dp_record_revision=1)
  if row != 'dp_fedavg':
    config['relative_nu'] = nu
    config = registry.with_results_revisions(config,
                                             _robust_factory(row, _dp_mean(z), nu))
  return config


def _run_name(row, nu, attack, rho, seed) -> str:
  nu = '' if row == 'dp_fedavg' else f'_nu{nu:g}'
  return (f'{row}{nu}_{attack or "clean"}_rho{rho:g}_seed{seed}'
          f'_eps{_EPSILON.value:g}')


def train(task, row, nu, attack, rho, seed, z):
  from tasks.simulation import ledger  # pylint: disable=g-import-not-at-top
  from tasks.simulation import loop  # pylint: disable=g-import-not-at-top
  simulation = loop.Simulation(
      task, build(row, z, nu), attack=attack or 'none', rho=rho, seed=seed,
      clients_per_round=CLIENTS_PER_ROUND,
      client_learning_rate=loop.StepSchedule(CLIENT_LEARNING_RATE))
  state, calls = simulation.initial_state(), []
  for round_num in range(_ROUNDS.value):
    state, metrics = simulation.run_round(state, round_num)
    calls.append(metrics.get('secure_average_calls', 1))
  accuracy = float(simulation.evaluate(state)['test_accuracy'])
  return ledger.Entry(accuracy, not math.isfinite(accuracy), float(np.mean(calls)))


def rows():
  """(row, relative ν or None) of every table row."""
  for row in _ROWS.value:
    for nu in ([None] if row == 'dp_fedavg' else
               [float(v) for v in _RELATIVE_NUS.value]):
      yield row, nu


def grid():
  """(row, ν, attack or None (clean), ρ, seed) of every run."""
  seeds = [int(s) for s in _SEEDS.value]
  for row, nu in rows():
    for seed in seeds:
      yield row, nu, None, 0.0, seed
    for attack in _ATTACKS.value:
      for rho in [float(r) for r in _RHOS.value]:
        for seed in seeds:
          yield row, nu, attack, rho, seed


def command() -> str:
  listed = ' '.join(f'--{name}={",".join(getattr(flags.FLAGS, name))}'
                    for name in ('aggregators', 'relative_nus', 'attacks', 'rhos',
                                 'seeds'))
  return (f'python -m benchmarks.dp_accuracy {listed} '
          f'--target_epsilon={_EPSILON.value:g} --delta={_DELTA.value:g} '
          f'--rounds={_ROUNDS.value}')


def page(results, noise, seconds, trained, total) -> str:
  rhos = [float(r) for r in _RHOS.value]
  columns = [(None, 0.0)] + [(a, r) for a in _ATTACKS.value for r in rhos]
  header = ['aggregator', 'calls R', 'z', 'z_v', 'ε'] + [
      'clean' if a is None else f'{a} ρ={r:g}' for a, r in columns]
  lines = [
      f'{trained} of {total} runs trained in {seconds / 60:.1f} minutes by this '
      f'invocation, the others from the ledger ({os.path.basename(_LEDGER.value)}).',
      '',
      f'Differential privacy at ε = {_EPSILON.value:g}, δ = {_DELTA.value:g} for every '
      f'row ({_ROUNDS.value} rounds, {CLIENTS_PER_ROUND} of {TOTAL_CLIENTS} clients a '
      'round, Poisson-sampling accounting with dp-accounting\'s RDP accountant; z: '
      'the noise multiplier of each call, the adaptive clip\'s count included, z_v: '
      'its records\' share (TFF\'s split: the count\'s σ_c = 0.05·10 for DP-FedAvg, '
      'max(0.05·10, z) for the DP means); R: the calls a round). EMNIST-linear (bundled), unit client weights, 1 local '
      f'epoch, batch 10, client learning rate {CLIENT_LEARNING_RATE}. Final clean '
      f'test accuracy (%), mean [min, max] over seeds {",".join(_SEEDS.value)}. '
      'ε covers the DP means\' results and clips, not the robust aggregates\' '
      'declared side channels (docs/aggregators.md) nor DP-FedAvg\'s un-noised '
      'zeroing quantile.', '',
      '| ' + ' | '.join(header) + ' |', '|---|---:|---:|---:|---:|' + '---:|' * len(columns)]
  for row, nu in rows():
    z, passes, epsilon, records = noise[row, nu]
    name = ROW_NAMES[row] + ('' if nu is None else f', relative ν {nu:g}')
    cells = [tables.accuracy_cell(results.get((row, nu, a, r), []))
             for a, r in columns]
    lines.append(f'| {name} | {passes} | {z:.3f} | {records:.3f} | {epsilon:.2f} | ' +
                 ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n'


def main(argv):
  del argv
  from tasks import builders  # pylint: disable=g-import-not-at-top
  from tasks.simulation import ledger  # pylint: disable=g-import-not-at-top
  noise = {(row, nu): noise_and_epsilon(row, nu) for row, nu in rows()}
  for (row, nu), (z, passes, epsilon, _) in noise.items():
    print(f'{row} ν={nu}: R = {passes}, z = {z:.4f}, ε = {epsilon:.3f}', flush=True)
  task = builders.build_task('emnist', 'linear', source='bundled')
  recorded = ledger.read(_LEDGER.value)
  runs = list(grid())
  results, trained, start = {}, 0, time.time()
  for index, (row, nu, attack, rho, seed) in enumerate(runs):
    z = noise[row, nu][0]
    key = (_run_name(row, nu, attack, rho, seed),
           ledger.fingerprint(_config(row, nu, attack, rho, seed, z)))
    entry = recorded.get(key)
    if entry is None:
      entry = train(task, row, nu, attack, rho, seed, z)
      recorded = ledger.merge(_LEDGER.value, {key: entry})
      trained += 1
      print(f'[{index + 1}/{len(runs)}] {key[0]}: {100 * entry.final_accuracy:.1f}% '
            f'({time.time() - start:.0f} s)', flush=True)
    results.setdefault((row, nu, attack, rho), []).append(entry.final_accuracy)
  text = '\n'.join([f'<!-- Written by `{command()}`; rerun it to update. -->', '',
                    page(results, noise, time.time() - start, trained, len(runs))])
  tables.print_and_write(text, _OUTPUT.value)


if __name__ == '__main__':
  exit_status.run(main)
