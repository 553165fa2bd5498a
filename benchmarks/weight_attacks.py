r"""What a client's reported weight buys it, with and without the robust weight cap,
and what the cap costs honest clients (docs/aggregators.md, "Threat model").

Part 1, the weight attack: 19 honest clients at
1 + 0.5·N(0, 1) in each of d = 100 coordinates, weight 1 each, and one client at −10 in
every coordinate claiming weight 1, 19 (half of the total), 100 or 1e4. The table is
‖result − m‖ / ‖m‖, m the honest clients' coordinate-wise median, for the registry's
secure-compatible rows as the main job builds them (`tasks.registry`, default
arguments), without the cap and with it (`weight_cap={}`: 2 × the median weight);
10.9 is the attacker's own point. Then the worst case of the update-only attacks at
weight 1 is beside it: the attacker's point at ±1e6 (`far`), which the robust rows
bound and the mean and GMA do not.

Part 2, the cap's cost: the bundled tasks' example counts (`tasks.builders`, source
'bundled': EMNIST's 100 Dirichlet-skewed MNIST clients, Shakespeare's roles, Sent140's
snippets dealt to users), rounds of 10 clients drawn as the main job draws them
(uniformly without replacement), 2,000 rounds per task: the share of honest clients
capped and the share of the honest weight the cap removes, at multiples 2, 4 and 8 of
the median.

Part 3 (`--parts=accuracy`, minutes): test accuracy of 'gm' without and with the cap
after 20 rounds of EMNIST-linear (bundled, 10 clients per round, seed 0), clean and
under IPM (ε = 10, ρ = 0.1) as an update-only attack, with `weight_inflation` (×100)
and with `adaptive_weight`.

  .venv/bin/python -m benchmarks.weight_attacks
  .venv/bin/python -m benchmarks.weight_attacks --parts=accuracy
"""

import collections

from absl import flags
import numpy as np

from tasks import builders
from tasks import references
from tasks import registry
from tasks.binaries import exit_status

_ROUNDS = flags.DEFINE_integer('rounds', 2000, 'Sampled rounds per task (part 2).')
_PARTS = flags.DEFINE_list('parts', ['attack', 'passes', 'cost'],
                           'Which parts to run.')

NUM_CLIENTS = 20
DIMENSION = 100
ATTACKER = 0
CLAIMS = (1.0, 19.0, 100.0, 1e4)
ROWS = ('mean', 'gm', 'one_step_gm', 'gamma_mean', 'gma', 'norm_clipping',
        'secure_centered_clipping')
CLIENTS_PER_ROUND = 10
MULTIPLES = (2.0, 4.0, 8.0)
TASKS = (('emnist', 'linear'), ('shakespeare', 'lstm'), ('sent140', 'linear'))


def weight_attack_inputs(seed=0):
  rng = np.random.default_rng(seed)
  x = 1.0 + 0.5 * rng.normal(size=(NUM_CLIENTS, DIMENSION))
  x[ATTACKER] = -10.0
  return x.astype(np.float32), np.ones(NUM_CLIENTS)


def _aggregate(process, x, weights):
  output = process.next(process.initialize(), list(x), [np.float32(w) for w in weights])
  return np.asarray(output.result, np.float64), output.measurements


def attack_table():
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  tff.backends.test.set_sync_test_cpp_execution_context()
  value_type = tff.TensorType(np.float32, [DIMENSION])
  weight_type = tff.TensorType(np.float32)
  x, weights = weight_attack_inputs()
  median = np.median(np.delete(x, ATTACKER, axis=0).astype(np.float64), axis=0)
  far = x.copy()
  far[ATTACKER] = 1e6

  def distance(result):
    return np.linalg.norm(result - median) / np.linalg.norm(median)

  header = ['row', 'cap'] + [f'claims {c:g}' for c in CLAIMS] + [
      'far (1e6), weight 1', 'cap (claim 1e4)', 'capped']
  print('| ' + ' | '.join(header) + ' |')
  print('|' + '---|' * 2 + '---:|' * (len(header) - 2))
  for name in ROWS:
    for cap in (None, {}):
      process = registry.aggregator_from_name(
          name, assumed_byzantine_fraction=0.1, weight_cap=cap).create(
              value_type, weight_type)
      cells, measurements = [], None
      for claim in CLAIMS:
        claimed = weights.copy()
        claimed[ATTACKER] = claim
        result, measurements = _aggregate(process, x, claimed)
        cells.append(f'{distance(result):.3g}')
      cells.append(f'{distance(_aggregate(process, far, weights)[0]):.3g}')
      if cap is None:
        cells += ['', '']
      else:
        cells += [f'{float(measurements["weight_cap"]):.3g}',
                  str(int(measurements['num_capped_clients']))]
      print(f'| {name} | {"on" if cap is not None else "off"} | ' + ' | '.join(cells)
            + ' |')


PASS_ROWS = ('gm', 'one_step_gm', 'gamma_mean', 'secure_centered_clipping')
# (column, LateSwitch arguments): the attacker at −10 × the honest mean.
PASS_ATTACKS = (
    ('every pass (update only)', dict(from_pass=0)),
    ('from pass 2', dict(from_pass=1)),
    ('every pass, claims 1e4', dict(from_pass=0, weight_factor=1e4)),
    ('from pass 2, claims 1e4', dict(from_pass=1, weight_factor=1e4)),
)


def pass_table():
  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff
  from tasks.simulation import pass_attacks
  tff.backends.test.set_sync_test_cpp_execution_context()
  value_type = tff.TensorType(np.float32, [DIMENSION])
  x, weights = weight_attack_inputs()
  honest = np.delete(x, ATTACKER, axis=0).astype(np.float64)
  median = np.median(honest, axis=0)
  corrupted = np.zeros(NUM_CLIENTS, bool)
  corrupted[ATTACKER] = True
  # The attacker's honest update, which it sends in the passes it plays fair.
  x = x.copy()
  x[ATTACKER] = honest.mean(axis=0)
  header = ['row', 'cap', 'passes'] + [column for column, _ in PASS_ATTACKS]
  print('| ' + ' | '.join(header) + ' |')
  print('|' + '---|' * 3 + '---:|' * len(PASS_ATTACKS))
  for name in PASS_ROWS:
    for cap in (None, {}):
      factory = registry.aggregator_from_name(name, weight_cap=cap)
      initialize, aggregate, num_passes = pass_attacks.pass_by_pass(factory, value_type)
      cells = []
      for _, arguments in PASS_ATTACKS:
        output = aggregate(initialize(), x, weights, corrupted,
                           pass_attacks.LateSwitch(**arguments),
                           np.random.default_rng(0))
        result = np.asarray(output.result, np.float64)
        cells.append(f'{np.linalg.norm(result - median) / np.linalg.norm(median):.3g}')
      print(f'| {name} | {"on" if cap is not None else "off"} | {num_passes} | '
            + ' | '.join(cells) + ' |')


def _client_weights(task, model):
  built = builders.build_task(task, model, source='bundled')
  return np.array(sorted(built.client_weights.values()), np.float64)


def cost_table(num_rounds):
  print('| task | clients | α min / median / max | multiple | clients capped '
        '(share) | honest weight removed (share) |')
  print('|---|---:|---|---:|---:|---:|')
  for task, model in TASKS:
    try:
      alphas = _client_weights(task, model)
    except Exception as e:  # pylint: disable=broad-except
      print(f'| {task} | not built: {type(e).__name__}: {e} | | | | |')
      continue
    rng = np.random.default_rng(0)
    rounds = [rng.choice(alphas, size=min(CLIENTS_PER_ROUND, len(alphas)),
                         replace=False) for _ in range(num_rounds)]
    spread = f'{alphas.min():g} / {np.median(alphas):g} / {alphas.max():g}'
    for multiple in MULTIPLES:
      capped_share, removed_share = [], []
      for weights in rounds:
        trace = {}
        capped = references.capped_weights(weights, 0.5, multiple, trace=trace)
        capped_share.append(trace['num_capped_clients'] / len(weights))
        removed_share.append(1.0 - capped.sum() / weights.sum())
      print(f'| {task} | {len(alphas)} | {spread} | {multiple:g} | '
            f'{np.mean(capped_share):.3%} | {np.mean(removed_share):.3%} |')


ACCURACY_ROUNDS = 20
# (column, attack, its parameters, ρ).
ACCURACY_ATTACKS = (('clean', 'none', {}, 0.0),
                    ('ipm ε = 10 (update only), ρ = 0.1', 'ipm', {'epsilon': 10.0}, 0.1),
                    ('the same, claiming ×100 (weight_inflation)', 'weight_inflation',
                     {'factor': 100.0}, 0.1),
                    ('the same, claiming the cap (adaptive_weight)', 'adaptive_weight',
                     {}, 0.1))


def accuracy_table():
  """Test accuracy after `ACCURACY_ROUNDS` rounds of EMNIST-linear (bundled), 10
  clients per round, client learning rate 0.1, seed 0, 'gm' without the cap, with it
  (2 × the median, the default) and with 4 × the median."""
  from tasks.simulation import loop  # pylint: disable=g-import-not-at-top
  task = builders.build_task('emnist', 'linear', source='bundled')
  print('| row | cap | ' + ' | '.join(c for c, *_ in ACCURACY_ATTACKS) +
        ' | clients capped per round (clean) |')
  print('|---|---|' + '---:|' * (len(ACCURACY_ATTACKS) + 1))
  for cap in (None, {}, {'multiple': 4.0}):
    cells, capped = [], ''
    for column, attack, params, rho in ACCURACY_ATTACKS:
      simulation = loop.Simulation(
          task, registry.aggregator_from_name('gm', weight_cap=cap), attack=attack,
          attack_params=params, rho=rho, seed=0)
      state, counts = simulation.initial_state(), []
      for round_num in range(ACCURACY_ROUNDS):
        state, metrics = simulation.run_round(state, round_num)
        counts.append(metrics.get('aggregator/num_capped_clients', 0))
      cells.append(f'{100 * simulation.evaluate(state)["test_accuracy"]:.1f}')
      if column == 'clean' and cap is not None:
        capped = f'{np.mean(counts):.2f}'
    print(f'| gm | {_cap_name(cap)} | ' + ' | '.join(cells) + f' | {capped} |')


def _cap_name(cap) -> str:
  from tff_robust.aggregators import weight_cap  # pylint: disable=g-import-not-at-top
  if cap is None:
    return 'off'
  return f'{cap.get("multiple", weight_cap.DEFAULT_MULTIPLE):g} × median'



def main(argv):
  del argv
  if 'attack' in _PARTS.value:
    attack_table()
    print()
  if 'passes' in _PARTS.value:
    pass_table()
    print()
  if 'cost' in _PARTS.value:
    cost_table(_ROUNDS.value)
  if 'accuracy' in _PARTS.value:
    print()
    accuracy_table()


if __name__ == '__main__':
  exit_status.run(main)
