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

import collections
import json
import os
import sys
import time

from absl import app
from absl import flags
import matplotlib
matplotlib.use('Agg')  # Files only; no display on a server.
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np
import tensorflow as tf

from tasks import builders
from tasks import registry
from tasks.builders import builder_utils
from tasks.simulation import client_work
from tasks.simulation import loop
from tff_robust import runtime

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

NAME = 'fig6_personalization'
AGGREGATORS = (('mean', 'FedAvg'), ('gm', 'RFA'))
METHOD_LABELS = {'ditto': 'Ditto', 'personalized_rfa': 'Alg. 4'}
# The paper's EMNIST-linear numbers stated in Section 5.3 (%); None: only in the plot.
PAPER = {('FedAvg', 0.0): 64.3, ('RFA', 0.0): 62.9, ('RFA', 0.25): 52.8,
         ('FedAvg + Alg. 4', 0.0): 70.1, ('RFA + Alg. 4', 0.0): 69.9,
         ('RFA + Alg. 4', 0.25): 66.4}


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
  tf.keras.utils.set_random_seed(seed)
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
  tuning = builder_utils.validation_task(task, _VALIDATION_FRACTION.value, seed)
  return {lam: train_and_evaluate(tuning, 'ditto', 'mean', 0.0, seed,
                                  lam)['personalized/accuracy_mean']
          for lam in lambdas}


def line_values(run: dict) -> dict[str, float]:
  """Figure lines (name → accuracy %) measured by one run."""
  base = dict(AGGREGATORS)[run['aggregator']]
  values = {f'{base} + {METHOD_LABELS[run["method"]]}':
            100 * run['personalized/accuracy_mean']}
  if run['method'] == 'ditto':  # Ditto leaves the global model's training unchanged.
    values[base] = 100 * run['global_per_client/accuracy_mean']
  return values


def summarize(runs: list[dict]) -> dict[str, dict[float, tuple[float, float, float]]]:
  """line → ρ → (mean, min, max) over seeds."""
  values = collections.defaultdict(lambda: collections.defaultdict(list))
  for run in runs:
    for line, value in line_values(run).items():
      values[line][run['rho']].append(value)
  return {line: {rho: (float(np.mean(v)), float(np.min(v)), float(np.max(v)))
                 for rho, v in sorted(by_rho.items())}
          for line, by_rho in values.items()}


def line_order(summary) -> list[str]:
  order = [base for _, base in AGGREGATORS]
  order += [f'{base} + {label}' for label in METHOD_LABELS.values()
            for _, base in AGGREGATORS]
  return [line for line in order if line in summary]


def plot(summary, num_seeds: int, num_clients: int, path: str) -> None:
  styles = {'FedAvg': ('tab:blue', '--'), 'RFA': ('tab:red', '--'),
            'FedAvg + Ditto': ('tab:blue', '-'), 'RFA + Ditto': ('tab:red', '-'),
            'FedAvg + Alg. 4': ('tab:cyan', ':'), 'RFA + Alg. 4': ('tab:orange', ':')}
  fig, ax = plt.subplots(figsize=(6.4, 4.4))
  for line in line_order(summary):
    rhos = sorted(summary[line])
    mean, low, high = (np.array([summary[line][r][i] for r in rhos]) for i in range(3))
    color, style = styles[line]
    ax.plot(rhos, mean, style, color=color, marker='o', label=line)
    ax.fill_between(rhos, low, high, color=color, alpha=0.15)
  ax.set_xlabel('corruption level ρ (data corruption, x → 1 − x)')
  ax.set_ylabel('accuracy % (mean over benign clients,\nown held-out data)')
  ax.set_title(f'Personalization under data corruption, EMNIST-linear\n'
               f'(bundled MNIST, {num_clients} clients; mean and min–max over '
               f'{num_seeds} seeds)', fontsize=10)
  ax.set_xticks(sorted({r for line in summary for r in summary[line]}))
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8, loc='lower left')
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _cell(value: tuple[float, float, float]) -> str:
  return f'{value[0]:.1f} ({value[1]:.1f}..{value[2]:.1f})'


def markdown(summary, sweep: dict[float, float], chosen: float, command: str,
             minutes: float, num_seeds: int, num_clients: int,
             validation_fraction: float) -> str:
  rhos = sorted({r for line in summary for r in summary[line]})
  header = ['| model | ' + ' | '.join(f'ρ={r:g} ours | ρ={r:g} paper' for r in rhos)
            + ' |', '|---|' + '---:|---:|' * len(rhos)]
  rows = []
  for line in line_order(summary):
    cells = []
    for rho in rhos:
      paper = PAPER.get((line, rho))
      cells += [_cell(summary[line][rho]) if rho in summary[line] else '',
                '' if paper is None else f'{paper:.1f}']
    rows.append(f'| {line} | ' + ' | '.join(cells) + ' |')
  sweep_rows = ['| λ | validation accuracy % |', '|---:|---:|'] + [
      f'| {lam:g}{" (chosen)" if lam == chosen else ""} | {100 * acc:.1f} |'
      for lam, acc in sweep.items()]
  return '\n'.join([
      f'# RFA paper Figure 6 on bundled MNIST ({num_clients} clients)', '',
      f'Command ({minutes:.1f} minutes wall time):', '', f'    {command}', '',
      f'Accuracy %: mean over benign clients of their own held-out accuracy, mean '
      f'(min..max) over {num_seeds} seeds. Data corruption x → 1 − x. Paper: EMNIST '
      'linear, numbers stated in its Section 5.3 (blank: only in its plot). "Alg. 4" '
      'is the paper\'s personalized RFA, the personalization of its Figure 6.', '',
      *header, *rows, '',
      f"Ditto's λ, chosen on a per-client validation split ({validation_fraction:g}"
      ' of each client\'s training data), FedAvg + Ditto, ρ = 0, first seed:', '',
      *sweep_rows, ''])


def main(argv):
  del argv
  seeds = [int(s) for s in _SEEDS.value]
  rhos = [float(r) for r in _RHOS.value]
  lambdas = [float(lam) for lam in _LAMBDAS.value]
  for method in _METHODS.value:
    if method not in METHOD_LABELS:
      raise app.UsageError(f'--methods: unknown {method!r}; known: '
                           f'{", ".join(METHOD_LABELS)}.')
  start = time.monotonic()
  tasks = {seed: build_task(seed) for seed in seeds}
  sweep = choose_lambda(tasks[seeds[0]], lambdas, seeds[0])
  chosen = max(sweep, key=sweep.get)
  print(f'λ sweep (validation accuracy): {sweep}; chosen λ = {chosen:g}', flush=True)
  runs = []
  for seed in seeds:
    for rho in rhos:
      for method in _METHODS.value:
        for aggregator, _ in AGGREGATORS:
          run = train_and_evaluate(tasks[seed], method, aggregator, rho, seed, chosen)
          print(json.dumps(run), flush=True)
          runs.append(run)
  minutes = (time.monotonic() - start) / 60
  summary = summarize(runs)
  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  path = os.path.join(_OUTPUT_DIR.value, NAME)
  plot(summary, len(seeds), _NUM_CLIENTS.value, path + '.png')
  command = '.venv/bin/python -m benchmarks.personalization ' + ' '.join(sys.argv[1:])
  table = markdown(summary, sweep, chosen, command.strip(), minutes, len(seeds),
                   _NUM_CLIENTS.value, _VALIDATION_FRACTION.value)
  with open(path + '.md', 'w') as f:
    f.write(table)
  with open(path + '.json', 'w') as f:
    json.dump(dict(lambda_sweep={str(k): v for k, v in sweep.items()},
                   chosen_lambda=chosen, minutes=minutes, runs=runs), f, indent=1)
  print(table)


if __name__ == '__main__':
  with runtime.worker_binaries_stopped():
    app.run(main)
