r"""The RFA paper's Figure 6: personalization under data corruption, FedAvg vs RFA.

On the bundled MNIST digits dealt to `--num_clients` = 25 clients (Dirichlet(0.5) label
skew, ~200 images each; each client's own 20% held out for testing), trains under the
paper's data corruption (x → 1 − x on a fixed set of clients holding a share ρ of the
data) for every ρ in `--rhos` and every seed in `--seeds`:

  * Ditto (Li et al. 2021) with FedAvg's mean and with the geometric median (RFA) as
    the global aggregator. Ditto does not change how the global model trains, so the
    same run also gives the plain FedAvg / RFA global model.
  * Personalized RFA (RFA paper Algorithm 4, the paper's Figure 6) with the geometric
    median and with the mean.

Accuracy is the mean over benign clients of each client's accuracy on its own held-out
data; the global models are evaluated the same per-client way. Ditto's λ is chosen
first, before any test data is looked at: every `--lambdas` value trains FedAvg + Ditto
at ρ = 0 (seed `--seeds[0]`) on 80% of each client's training data and is scored on
the other 20% (a per-client validation split); the best λ then runs everywhere.

Writes `<output_dir>/fig6_personalization.{png,md,json}`: the curves (mean over seeds,
min–max shading), the table (ours next to the paper's numbers, the λ sweep, the command
and its wall time) and every run's metrics.

  .venv/bin/python -m benchmarks.personalization --output_dir=results
"""

from __future__ import annotations

import json
import os
import time

from absl import flags

from benchmarks import personalization_report as report
from tasks import builders
from tasks import registry
from tasks.binaries import exit_status
from tasks.binaries import flag_groups
from tasks.binaries import sweep_flags
from tasks.simulation import attacks

_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds (data split, corrupted '
                           'set, sampling, initialization); the figure shades min–max.')
_RHOS = flags.DEFINE_list('rhos', ['0', '0.1', '0.25'], 'Corruption levels ρ.')
_ATTACK = flags.DEFINE_string('attack', 'data', "The task's data attack (the paper's "
                              'Figure 6: data, x → 1 − x).')
_NUM_CLIENTS = flags.DEFINE_integer('num_clients', 25, 'Clients the 5,000 bundled '
                                    'digits are dealt to.')
_CONCENTRATION = flags.DEFINE_float('concentration', 0.5, 'Dirichlet label skew.')
# 30 rounds of 6 of the 25 clients: every client is selected ~7 times.
_ROUNDS = flags.DEFINE_integer('rounds', 30, 'Rounds per run.')
_CLIENTS_PER_ROUND = flags.DEFINE_integer('clients_per_round', 6, 'Clients per round.')
_EPOCHS = flags.DEFINE_integer('local_epochs', 2, 'Local epochs of each phase.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 32, 'Local batch size.')
_LEARNING_RATE = flags.DEFINE_float('client_learning_rate', 0.1,
                                    'Local SGD rate (both phases).')
# Ditto's grid is {0.01, 0.1, 1, 2}; 0.01 (nearly local training) scored last in a
# trial run, so it is left out to save a run.
_LAMBDAS = flags.DEFINE_list('lambdas', ['0.1', '1', '2'], "Ditto's λ candidates.")
_VALIDATION_FRACTION = flags.DEFINE_float(
    'validation_fraction', 0.2, 'Share of each client\'s training data that scores λ.')
_METHODS = flags.DEFINE_list('methods', ['ditto', 'personalized_rfa'],
                             'Personalization methods to run.')
_OUTPUT_DIR = flags.DEFINE_string('output_dir', 'results', 'Where the outputs go.')


# Checked at parse time: every run's results are written only after the last run.
flag_groups.validate_output_paths(directories=['output_dir'])
sweep_flags.validate_rhos_and_seeds()
_KNOWN_ATTACKS = [name for name in attacks.known_attacks(
    builders.known_tasks()['emnist']['data_attacks']) if name != attacks.NO_ATTACK]
flags.register_validator(
    'attack', lambda name: name in _KNOWN_ATTACKS,
    message=f'--attack must be one of {", ".join(_KNOWN_ATTACKS)} (ρ = 0 in --rhos '
    'is the clean run).')
flags.register_validator(
    'lambdas', lambda values: flag_groups.numbers_in(values, 0.0, float('inf')),
    message="--lambdas must be numbers ≥ 0 (Ditto's λ).")
flags.register_validator(
    'methods', lambda values: bool(values) and set(values) <= set(report.METHOD_LABELS),
    message=f'--methods must name some of: {", ".join(report.METHOD_LABELS)}.')


def build_task(seed: int) -> builders.Task:
  return builders.build_task(
      'emnist', 'linear', 'bundled', seed=seed,
      client_spec=builders.ClientSpec(num_epochs=_EPOCHS.value,
                                      batch_size=_BATCH_SIZE.value),
      bundled_num_clients=_NUM_CLIENTS.value,
      bundled_concentration=_CONCENTRATION.value)


def train_and_evaluate(task, method: str, aggregator: str, rho: float, seed: int,
                       ditto_lambda: float) -> dict:
  """Trains one run; its final per-client evaluation over benign clients."""
  # pylint: disable=g-import-not-at-top
  from tasks.simulation import client_work
  from tasks.simulation import loop
  loop.set_random_seed(seed)
  work = client_work.client_work_from_name(method, task, ditto_lambda=ditto_lambda,
                                           personal_steps=None)
  simulation = loop.Simulation(
      task, registry.aggregator_from_name(aggregator), work,
      clients_per_round=_CLIENTS_PER_ROUND.value,
      client_learning_rate=loop.StepSchedule(_LEARNING_RATE.value),
      attack=_ATTACK.value if rho > 0 else 'none', rho=rho, seed=seed)
  state = simulation.initial_state()
  start = time.monotonic()
  for round_num in range(_ROUNDS.value):
    state, metrics = simulation.run_round(state, round_num)
  results = dict(simulation.evaluate(state))
  results.update(method=method, aggregator=aggregator, rho=rho, seed=seed,
                 ditto_lambda=ditto_lambda if method == 'ditto' else None,
                 seconds=time.monotonic() - start,
                 num_personalized_clients=metrics['num_personalized_clients'],
                 num_corrupted_clients=len(simulation.corrupted_clients))
  return results


def choose_lambda(task, lambdas: list[float], seed: int) -> dict[float, float]:
  """λ → FedAvg + Ditto's mean per-client accuracy on the validation split (ρ = 0)."""
  from tasks.builders import builder_utils  # pylint: disable=g-import-not-at-top
  tuning = builder_utils.validation_task(task, _VALIDATION_FRACTION.value, seed)
  return {lam: train_and_evaluate(tuning, 'ditto', 'mean', 0.0, seed,
                                  lam)['personalized/accuracy_mean']
          for lam in lambdas}


def main(argv):
  del argv
  seeds = [int(s) for s in _SEEDS.value]
  rhos = [float(r) for r in _RHOS.value]
  lambdas = [float(lam) for lam in _LAMBDAS.value]
  start = time.monotonic()
  tasks = {seed: build_task(seed) for seed in seeds}
  sweep = choose_lambda(tasks[seeds[0]], lambdas, seeds[0])
  chosen = max(sweep, key=sweep.get)
  print(f'λ sweep (validation accuracy): {sweep}; chosen λ = {chosen:g}', flush=True)
  runs = []
  for seed in seeds:
    for rho in rhos:
      for method in _METHODS.value:
        for aggregator, _ in report.AGGREGATORS:
          run = train_and_evaluate(tasks[seed], method, aggregator, rho, seed, chosen)
          print(json.dumps(run), flush=True)
          runs.append(run)
  minutes = (time.monotonic() - start) / 60
  summary = report.summarize(runs)
  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  path = os.path.join(_OUTPUT_DIR.value, report.NAME)
  report.plot(summary, len(seeds), _NUM_CLIENTS.value, path + '.png')
  command = sweep_flags.quoted_command('benchmarks.personalization', ('--output_dir',))
  table = report.markdown(summary, sweep, chosen, command, minutes, len(seeds),
                          _NUM_CLIENTS.value, _VALIDATION_FRACTION.value)
  with open(path + '.md', 'w') as f:
    f.write(table)
  with open(path + '.json', 'w') as f:
    json.dump(dict(lambda_sweep={str(k): v for k, v in sweep.items()},
                   chosen_lambda=chosen, minutes=minutes, runs=runs), f, indent=1)
  print(table)


if __name__ == '__main__':
  exit_status.run(main)
