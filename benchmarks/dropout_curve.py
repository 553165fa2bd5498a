r"""Accuracy and robustness of RFA against clients leaving between its secure sums,
on the main job's task.

  .venv/bin/python -m benchmarks.dropout_curve [--rates=0,0.05,0.1,0.2,0.3]
      [--attacks=none,omniscient] [--rho=0.1] [--results=results/dropout_curves.md]

The main job's task and protocol (`tasks.binaries.main_job`: EMNIST-linear on the
bundled MNIST digits, 100 clients, Dirichlet(0.5), 30 rounds of 10 clients, one
local epoch, batch 10, client learning rate 0.1, seed 0) with the geometric median
('gm', 7 secure sums a round with its relative ν) wrapped in
`tasks.simulation.dropout.PassDropoutFactory`: before every secure sum after the
first, each client still present leaves with probability `rate`. Each attack at ρ
(`none` clean), and FedAvg ('mean', one secure sum: nobody leaves) for reference.
Prints and writes a Markdown table: final test accuracy, the mean clients present in
a round's last sum, refused rounds (every client gone).
"""

import csv
import os
import sys

from absl import flags

from tasks import registry
from tasks.binaries import exit_status
from tasks.binaries import flag_groups
from tff_robust.distributed import runtime

FLAGS = flags.FLAGS
flag_groups.define_task_flags(task='emnist', model='linear', data_source='bundled',
                              local_epochs=1, batch_size=10)
flag_groups.define_training_flags(rounds=30, clients_per_round=10,
                                  client_learning_rate=0.1, eval_period=30,
                                  checkpoint_period=30, tensorboard=False)
_RATES = flags.DEFINE_list('rates', ['0', '0.05', '0.1', '0.2', '0.3'],
                           'Per-sum dropout probabilities.')
_ATTACKS = flags.DEFINE_list('attacks', ['none', 'omniscient'], 'Attacks (at --rho).')
_RHO = flags.DEFINE_float('rho', 0.1, 'Corruption level of the attacks.')
_OUTPUT = flags.DEFINE_string('output_dir', 'runs/dropout_curve', 'Runs go here.')
_RESULTS = flags.DEFINE_string('results', None, 'Also write the table to this file.')
_COMMAND = ('.venv/bin/python -m benchmarks.dropout_curve '
            '--results=results/dropout_curves.md')


def _run(task, aggregator, attack, rate):
  # pylint: disable=g-import-not-at-top
  from tasks.simulation import dropout
  from tasks.simulation import experiment
  from tasks.simulation import metrics_file
  from tasks.simulation import loop
  name = f'{aggregator}_{attack}_rate{rate}'
  factory = dropout.dropout_factory(registry.aggregator_from_name(aggregator),
                                    float(rate), seed=0)
  simulation = loop.Simulation(
      task, factory, attack=attack, rho=_RHO.value if attack != 'none' else 0.0,
      seed=0, **flag_groups.simulation_kwargs_from_flags())
  directory = os.path.join(_OUTPUT.value, name)
  experiment.run_experiment(simulation, directory, FLAGS.rounds, FLAGS.rounds,
                            progress=False, tensorboard=False, description=name,
                            checkpoint_period=FLAGS.rounds)
  with open(os.path.join(directory, metrics_file.METRICS_FILE)) as f:
    rows = list(csv.DictReader(f))
  present = [FLAGS.clients_per_round - float(r.get('aggregator/dropped_clients') or 0)
             for r in rows]
  return dict(accuracy=float(rows[-1]['test_accuracy']),
              present=sum(present) / len(present),
              refused=dropout.refused_rounds(rows))


def main(argv):
  del argv
  with runtime.worker_binaries_stopped():
    task = flag_groups.task_from_flags(0)
    lines = ['| aggregator | attack | per-sum dropout | clients in the last sum '
             '(of 10) | refused rounds | final test accuracy |',
             '|---|---|---:|---:|---:|---:|']
    for attack in _ATTACKS.value:
      label = attack if attack == 'none' else f'{attack}, ρ = {_RHO.value:g}'
      runs = [('mean', '0')] + [('gm', rate) for rate in _RATES.value]
      for aggregator, rate in runs:
        result = _run(task, aggregator, attack, rate)
        lines.append(f'| {aggregator} | {label} | {float(rate):g} | '
                     f'{result["present"]:.2f} | {result["refused"]} | '
                     f'{100 * result["accuracy"]:.1f}% |')
        print(lines[-1], flush=True)
    table = '\n'.join(lines)
    if _RESULTS.value:
      with open(_RESULTS.value, 'w') as f:
        f.write('# RFA with clients leaving between secure sums\n\n'
                f'Made by `{_COMMAND}` (see the module docstring; '
                'docs/distributed.md, "Clients that leave between passes").\n\n'
                f'{table}\n')
    print(table, file=sys.stderr)


if __name__ == '__main__':
  exit_status.run(main)
