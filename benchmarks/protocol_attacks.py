r"""Protocol attacks on the secure-compatible iterative aggregators, with and without
the contributions' bounds (docs/aggregators.md, "Threat model").

Part 1, one aggregation (seconds): 20 clients at 1 + 0.5·N(0, 1) in each of d = 100
coordinates, weight 1 each, k ∈ {1, 5} of them corrupted: they send −10 × the honest
mean (IPM, ε = 10) in every pass and replace their contributions as the attack says.
The cell is ‖result − m‖ / ‖m‖, m the honest clients' coordinate-wise median (10.9 is
the attackers' point), without and with the bounds; `update_only` is the same
clients playing fair in every contribution.

Part 2, training: every run trains EMNIST-linear (bundled MNIST, 100 clients, 10 per round, 30 rounds,
client learning rate 0.1: the main job's protocol) with the aggregator run pass by
pass (`tasks.simulation.pass_attacks`), the corrupted clients (drawn as the update
attacks' are, ρ of the weight) playing a protocol attack in every pass: they send
−10 × the honest mean (IPM, ε = 10) and replace their contributions as the attack
says. 'bounds on' refuses every contribution outside its declared bound
(`tff_robust.iterative.contributions`), as a secure aggregation with input range
checks would; 'off' is today's secure sum. Beside them, the committed linear
leaderboard's worst case over the update-only attacks (results/leaderboard_emnist_linear.md).

Finished runs go to a ledger (`--ledger`, `tasks.simulation.ledger`), keyed by a
fingerprint of the run's configuration and the aggregators' results revisions, so an
interrupted grid resumes and a fix retrains only the runs it changes.

  .venv/bin/python -m benchmarks.protocol_attacks --output=results/protocol_attacks.md
"""

import math
import os
import time

from absl import flags
import numpy as np

from benchmarks import tables
from tasks import builders
from tasks import registry
from tasks.binaries import exit_status
from tasks.simulation import ledger

AGGREGATORS = ('gm', 'one_step_gm', 'gamma_mean', 'secure_centered_clipping')
# (label, registered protocol attack, its arguments).
ATTACKS = {
    # The same corrupted clients with honest contributions: the update attack alone
    # (its contributions are what an honest client at that update sends, which the
    # bounds admit, so it runs without them only).
    'update_only': ('late_switch', {'from_pass': 0}),
    'claim_near': ('claim_near', {}),
    'claim_near_x1000': ('claim_near', {'factor': 1e3}),
    'numerator_only': ('numerator_only', {}),
    'poisoned_sums': ('poisoned_sums', {}),
    'nan_contributions': ('nan_contributions', {}),
}
ROUNDS = 30
NUM_CLIENTS = 20
DIMENSION = 100
NUM_CORRUPTED = (1, 5)
LEADERBOARD = 'results/leaderboard_emnist_linear.md'

_AGGREGATORS = flags.DEFINE_list('aggregators', list(AGGREGATORS), 'Rows.')
_ATTACKS = flags.DEFINE_list('attacks', list(ATTACKS), 'Protocol attacks (labels).')
_RHOS = flags.DEFINE_list('rhos', ['0.1', '0.25'], 'Corruption levels ρ.')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds.')
_LEDGER = flags.DEFINE_string('ledger', 'results/protocol_attacks_runs.csv',
                              'Finished runs (read, then extended as runs finish).')
_OUTPUT = flags.DEFINE_string('output', '', 'Write the page here (and print it).')
_PARTS = flags.DEFINE_list('parts', ['aggregation', 'training'], 'Which parts to run.')
flags.register_validator('attacks', lambda v: set(v) <= set(ATTACKS),
                         message=f'--attacks must be a subset of {sorted(ATTACKS)}.')
flags.register_validator('aggregators', lambda v: set(v) <= set(AGGREGATORS),
                         message=f'--aggregators must be a subset of {AGGREGATORS}.')


def aggregation_table() -> str:
  """Part 1's table (markdown)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tasks.simulation import pass_attacks  # pylint: disable=g-import-not-at-top
  value_type = tff.TensorType(np.float32, [DIMENSION])
  rng = np.random.default_rng(0)
  x = 1.0 + 0.5 * rng.normal(size=(NUM_CLIENTS, DIMENSION))
  weights = np.ones(NUM_CLIENTS)
  columns = [(k, bounds) for k in NUM_CORRUPTED for bounds in (False, True)]
  lines = ['| aggregator | protocol attack | ' + ' | '.join(
      f'{k} of {NUM_CLIENTS} {"on" if bounds else "off"}' for k, bounds in columns) +
           ' |', '|---|---|' + '---:|' * len(columns)]
  attacks = [(label, ATTACKS[label]) for label in _ATTACKS.value]
  for aggregator in _AGGREGATORS.value:
    factory = registry.aggregator_from_name(aggregator)
    for label, spec in attacks:
      attack = pass_attacks.PASS_ATTACKS[spec[0]](**spec[1])
      cells = []
      for k, bounds in columns:
        corrupted = np.zeros(NUM_CLIENTS, bool)
        corrupted[:k] = True
        median = np.median(x[~corrupted], axis=0)
        initialize, aggregate, _ = pass_attacks.pass_by_pass(
            factory, value_type, contribution_attack=(
                attack if isinstance(attack, pass_attacks.ContributionAttack)
                else None), bounds=bounds)
        output = aggregate(initialize(), x, weights, corrupted, attack,
                           np.random.default_rng(0))
        distance = np.linalg.norm(np.asarray(output.result, np.float64) - median)
        cells.append(f'{distance / np.linalg.norm(median):.3g}')
      lines.append(f'| {aggregator} | {label} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def _config(aggregator: str, attack: str, rho: float, seed: int, bounds: bool):
  from tff_robust.iterative import contributions  # pylint: disable=g-import-not-at-top
  factory = registry.aggregator_from_name(aggregator)
  attack_name, params = ATTACKS[attack] if attack else (None, {})
  return factory, registry.with_results_revisions(dict(
      task='emnist', model='linear', source='bundled', rounds=ROUNDS,
      clients_per_round=10, client_learning_rate=0.1, aggregator=aggregator,
      protocol_attack=attack_name, protocol_params=params, rho=rho, seed=seed,
      bounds=bounds, **({'bounds_revision': contributions.BOUNDS_REVISION}
                        if bounds else {})), factory)


def _run_name(aggregator, attack, rho, seed, bounds) -> str:
  return f'{aggregator}_{attack or "clean"}_rho{rho:g}_seed{seed}_bounds{int(bounds)}'


def train(task, aggregator, attack, rho, seed, bounds) -> ledger.Entry:
  from tasks.simulation import loop  # pylint: disable=g-import-not-at-top
  from tasks.simulation import pass_attacks  # pylint: disable=g-import-not-at-top
  factory, _ = _config(aggregator, attack, rho, seed, bounds)
  attack_name, params = ATTACKS[attack] if attack else (None, {})
  simulation = loop.Simulation(
      task, factory, rho=rho, seed=seed,
      protocol=pass_attacks.build_protocol(attack_name, params, bounds))
  state, calls = simulation.initial_state(), []
  for round_num in range(ROUNDS):
    state, metrics = simulation.run_round(state, round_num)
    calls.append(metrics.get('secure_average_calls', 1))
  accuracy = float(simulation.evaluate(state)['test_accuracy'])
  return ledger.Entry(accuracy, not math.isfinite(accuracy), float(np.mean(calls)))


def grid():
  """(aggregator, attack label or None (clean), ρ, seed, bounds) of every run."""
  seeds = [int(s) for s in _SEEDS.value]
  for aggregator in _AGGREGATORS.value:
    for seed in seeds:
      yield aggregator, None, 0.0, seed, False
    for attack in _ATTACKS.value:
      for rho in [float(r) for r in _RHOS.value]:
        for bounds in (False, True) if attack != 'update_only' else (False,):
          for seed in seeds:
            yield aggregator, attack, rho, seed, bounds


def _update_only_worst(aggregator: str) -> dict:
  """{ρ: cell} of the committed linear leaderboard's row of `aggregator`."""
  if not os.path.exists(LEADERBOARD):
    return {}
  with open(LEADERBOARD, encoding='utf-8') as f:
    for line in f:
      cells = [c.strip() for c in line.strip().strip('|').split('|')]
      if len(cells) == 5 and cells[1] == aggregator:
        return {0.1: cells[3], 0.25: cells[4]}
  return {}


def command() -> str:
  return 'python -m benchmarks.protocol_attacks ' + ' '.join(
      f'--{name}={",".join(getattr(flags.FLAGS, name))}'
      for name in ('aggregators', 'attacks', 'rhos', 'seeds', 'parts'))


def aggregation_page(table: str) -> str:
  return '\n'.join([
      f'One aggregation: {NUM_CLIENTS} clients at 1 + 0.5·N(0, 1), d = {DIMENSION}, '
      'weight 1 each, k of them corrupted (−10 × the honest mean in every pass, their '
      'contributions replaced as the attack says); ‖result − m‖ / ‖m‖, m the honest '
      'clients\' coordinate-wise median (10.9: the attackers\' point); bounds off / '
      'on.', '', table, ''])


def page(results: dict, seconds: float, trained: int, total: int) -> str:
  rhos = [float(r) for r in _RHOS.value]
  lines = [
      f'Training: {trained} of {total} runs trained in {seconds / 60:.1f} minutes '
      f'by this invocation, the others from the ledger '
      f'({os.path.basename(_LEDGER.value)}).', '',
      'Protocol attacks: EMNIST linear (bundled), 30 rounds, 10 clients/round, client '
      'learning rate 0.1; the corrupted clients send −10 × the honest mean (IPM, '
      'ε = 10) in every pass and replace their contributions as the attack says '
      '(`tasks.simulation.pass_attacks`). Final test accuracy (%), mean [min, max] '
      f'over seeds {",".join(_SEEDS.value)}; "off": the secure sum as deployed, "on": '
      'every contribution outside its declared bound refused. The rows "update-only '
      'worst" are the committed leaderboard\'s worst case over the update-only '
      f'attacks ({LEADERBOARD}), with that attack.', '']
  header = ['aggregator', 'protocol attack'] + [
      f'ρ={rho:g} {side}' for rho in rhos for side in ('off', 'on')]
  lines += ['| ' + ' | '.join(header) + ' |',
            '|---|---|' + '---:|' * (len(header) - 2)]
  for aggregator in _AGGREGATORS.value:
    clean = tables.accuracy_cell(results.get((aggregator, None, 0.0, False), []))
    lines.append(f'| {aggregator} | none (clean) | ' +
                 ' | '.join([clean] + [''] * (len(header) - 3)) + ' |')
    for attack in _ATTACKS.value:
      cells = [tables.accuracy_cell(results.get((aggregator, attack, rho, bounds), []))
               for rho in rhos for bounds in (False, True)]
      if attack == 'update_only':
        cells = [tables.accuracy_cell(results.get((aggregator, attack, rho, False), []))
                 for rho in rhos for _ in (0, 1)]
      lines.append(f'| {aggregator} | {attack} | ' + ' | '.join(cells) + ' |')
    worst = _update_only_worst(aggregator)
    cells = [cell for rho in rhos for cell in (worst.get(rho, ''), '')]
    lines.append(f'| {aggregator} | update-only worst (leaderboard) | ' +
                 ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n'


def training_page() -> str:
  """Part 2: trains the runs the ledger lacks; its table (markdown)."""
  task = builders.build_task('emnist', 'linear', source='bundled')
  recorded = ledger.read(_LEDGER.value)
  runs = list(grid())
  results, trained, start = {}, 0, time.time()
  for index, (aggregator, attack, rho, seed, bounds) in enumerate(runs):
    _, config = _config(aggregator, attack, rho, seed, bounds)
    key = (_run_name(aggregator, attack, rho, seed, bounds), ledger.fingerprint(config))
    entry = recorded.get(key)
    if entry is None:
      entry = train(task, aggregator, attack, rho, seed, bounds)
      recorded = ledger.merge(_LEDGER.value, {key: entry})
      trained += 1
      print(f'[{index + 1}/{len(runs)}] {key[0]}: '
            f'{100 * entry.final_accuracy:.1f}%', flush=True)
    results.setdefault((aggregator, attack, rho, bounds), []).append(
        entry.final_accuracy)
  return page(results, time.time() - start, trained, len(runs))


def main(argv):
  del argv
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  sections = [f'<!-- Written by `{command()}`; rerun it to update. -->', '']
  if 'aggregation' in _PARTS.value:
    tff.backends.test.set_sync_test_cpp_execution_context()
    sections.append(aggregation_page(aggregation_table()))
  if 'training' in _PARTS.value:
    sections.append(training_page())
  text = '\n'.join(sections)
  tables.print_and_write(text, _OUTPUT.value)


if __name__ == '__main__':
  exit_status.run(main)
