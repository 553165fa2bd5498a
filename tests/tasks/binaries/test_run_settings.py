"""A run's settings, resolved once from the flags (`flag_groups.RunSettings`, the
sweeps' `SweepSpec`): every run keeps the identity the committed ledgers and run
directories know it by, and `train` builds its aggregation factory once."""

import csv
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import processes

# Starts Python processes (each binary defines its own flags): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

# Computed by the code of main before `RunSettings` (commit c872bf7): the run names
# and fingerprints the committed ledgers (results/leaderboard_emnist_<model>_runs.csv)
# and finished run directories key runs by. A change would make every committed run
# look stale; only a new `tasks.registry.RESULTS_REVISIONS` entry may change them, on purpose.
_TRAIN = [  # (command line, run name, fingerprint of `RunSettings.config()`)
    ([], 'emnist_linear_gm_none_rho0_seed0', 'e9dcd20240933319'),
    (['--aggregator=krum', '--attack=alie', '--rho=0.2', '--seed=3',
      '--clients_per_round=20'], 'emnist_linear_krum_alie_rho0.2_seed3', '66ecdea874d3d22f'),
    (['--aggregator=bucketing+gm', '--attack=omniscient', '--rho=0.25',
      '--aggregator_args=bucketing:bucket_size=3,num_communication_passes=2',
      '--client_work=ditto'], 'emnist_linear_bucketing+gm_omniscient_rho0.25_seed0_ditto',
     'edb51b10bf02114e'),
    (['--task=docs.examples.my_task:build_task', '--aggregator=mean'],
     'docs.examples.my_task.build_task_mean_none_rho0_seed0', '7ff7ba4170eae485'),
    (['--aggregator=nnm+krum', '--rho=0.1', '--worker_momentum=0.9', '--attack=alie',
      '--attack_args=z=1.5', '--experiment_name=study/x'], 'study/x', '04e516c84491fb2c'),
    (['--aggregator=one_step_gm', '--model=small_cnn', '--data_source=synthetic',
      '--rounds=7', '--eval_period=3', '--server_momentum=0.9'],
     'emnist_small_cnn_one_step_gm_none_rho0_seed0', '21c05d6245fd87af'),
]
_SYNTHETIC_SWEEP = ['--data_source=synthetic', '--rounds=2', '--clients_per_round=3']
_CELLS = {  # binary: [(command line, {cell: fingerprint of `sweep.run_fingerprint`})]
    'sweep': [
        ([], {'gm_omniscient_rho0.25_seed0': 'b46a5e85b72ed7a5',
              'mean_none_rho0_seed0': '595b95e44fbeb99c'}),
        ([*_SYNTHETIC_SWEEP, '--aggregators=gm,krum,nnm+krum', '--attacks=alie',
          '--rhos=0,0.25', '--seeds=0,1', '--attack_args=z=1.5',
          '--aggregator_args=gm:num_communication_passes=2,nnm:byzantine_fraction=0.1'],
         {'gm_none_rho0_seed0': '51e46259090e8999',
          'krum_alie_rho0.25_seed1': '4397e9a8d3faff69',
          'nnm+krum_alie_rho0.25_seed0': 'd4dbd106b651e0a0'}),
        (['--data_source=synthetic', '--aggregators=bucketing+median,mean',
          '--attacks=label_flip,ipm', '--rhos=0.1', '--worker_momenta=0,0.5',
          '--client_work=ditto', '--ditto_lambda=0.3', '--data_seed=2', '--num_clients=6'],
         {'bucketing+median_wm0.5_ipm_rho0.1_seed0': 'dcef35360fa562ad',
          'mean_label_flip_rho0.1_seed0': 'bd98792a153a24d8'}),
    ],
    'main_job': [
        ([], {'gamma_mean_omniscient_rho0.25_seed0': 'd1bb94e00687e70c',
              'gm_data_rho0.1_seed0': '6755747042aaafb2'}),
    ],
    # The leaderboard's default grids: entries of the committed ledgers.
    'leaderboard': [
        ([], {'mean_none_rho0_seed0': 'ab516f4a229e91f7',
              'gm_alie_rho0.25_seed1': 'cba82f08e74caf8f',
              'krum_ipm_rho0.1_seed0': '82cfe6cc18c82359',
              'nnm+krum_wm0.9_label_flip_rho0.25_seed2': 'aa6acb2c470511ef',
              'arc+gm_alie_rho0.1_seed0': 'bb132fb3a67ef260',
              'one_step_gm_optimal_ipm_rho0.25_seed0': '806449445197bfff'}),
        (['--model=small_cnn'], {'mean_none_rho0_seed0': '57209d5a23791f48',
                                 'krum_ipm_rho0.1_seed0': '9a98843561f62f42',
                                 'nnm+krum_wm0.9_label_flip_rho0.25_seed2': '071621c9f51fe513',
                                 'median_wm0.9_none_rho0_seed1': '49df788494cbc294'}),
    ],
}
# Prints, for binary argv[1] and the command lines argv[2], what names the runs:
# `train`'s (name, fingerprint), a sweep binary's {cell: fingerprint}.
_IDENTITIES = '''
import importlib, json, sys
import tensorflow  # As `exit_status.run` does, before the binary's main.
from absl import flags
from tasks.binaries import aggregator_flags
from tasks.binaries import flag_groups
from tasks.binaries import sweep_flags
from tasks.simulation import leaderboard, ledger, sweep
name, lines = sys.argv[1], json.loads(sys.argv[2])
binary = importlib.import_module('tasks.binaries.' + name)
found = []
for line in lines:
  flags.FLAGS.unparse_flags()
  flags.FLAGS([name, *line])
  if name == 'train':
    settings = binary.run_settings()
    found.append([settings.name, ledger.fingerprint(settings.config())])
    continue
  kwargs = {} if name != 'leaderboard' else dict(
      attacks_of_task=binary._attacks_of,
      aggregator_groups={binary._GRID: leaderboard.default_aggregators})
  task, spec = sweep_flags.start_sweep_binary([name], **kwargs)
  found.append({run.name: sweep.run_fingerprint(task, spec, run) for run in spec.runs()})
print(json.dumps(found))
'''


# Each binary's identities are computed under a string-hash seed of its own and held
# to constants computed in other processes: no identity may depend on Python's hash
# randomization.
_HASH_SEEDS = {'train': '1', 'sweep': '2', 'main_job': '3', 'leaderboard': '4'}


def _run(code, *args, hash_seed=None):
  env = processes.quiet_env()
  if hash_seed is not None:
    env['PYTHONHASHSEED'] = hash_seed
  result = subprocess.run([sys.executable, '-c', code, *args], cwd=processes.REPOSITORY,
                          capture_output=True, text=True, timeout=600, env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout.strip().splitlines()[-1]


def test_train_runs_keep_their_names_and_fingerprints():
  found = json.loads(_run(_IDENTITIES, 'train', json.dumps([l for l, _, _ in _TRAIN]),
                          hash_seed=_HASH_SEEDS['train']))
  assert found == [[name, fingerprint] for _, name, fingerprint in _TRAIN]


@pytest.mark.parametrize('binary', sorted(_CELLS))
def test_sweep_cells_keep_their_fingerprints(binary):
  cases = _CELLS[binary]
  found = json.loads(_run(_IDENTITIES, binary, json.dumps([l for l, _ in cases]),
                          hash_seed=_HASH_SEEDS[binary]))
  for (_, cells), computed in zip(cases, found):
    assert {name: computed.get(name) for name in cells} == cells
  if binary == 'leaderboard':
    for (line, cells), model in zip(cases, ('linear', 'small_cnn')):
      path = os.path.join(processes.REPOSITORY, 'results',
                          f'leaderboard_emnist_{model}_runs.csv')
      with open(path, newline='') as f:
        committed = {(row['run'], row['fingerprint']) for row in csv.DictReader(f)}
      assert set(cells.items()) <= committed, line


# Runs `train.run()` (flags parsed, checked, run) on each command line of argv[2] in
# turn, in one process, and prints how many aggregation factories each built.
_BUILDS = '''
import json, sys
from unittest import mock
from absl import flags
from absl.testing import flagsaver
from tasks import registry
from tasks.binaries import aggregator_flags
from tasks.binaries import flag_groups, train
from tasks.binaries import sweep_flags
built, build = [], registry.aggregator_from_name
counts = []
with mock.patch.object(registry, 'aggregator_from_name',
                       lambda *a, **k: built.append(a) or build(*a, **k)):
  for line in json.loads(sys.argv[1]):
    aggregator_flags._factory.cache_clear()
    built.clear()
    with flagsaver.flagsaver():
      flags.FLAGS.unparse_flags()
      sys.argv = ['train', *line]
      try:
        train.run()
      except SystemExit as e:
        counts.append([e.code or 0, len(built)])
print(json.dumps(counts))
'''


def test_a_run_builds_its_aggregation_factory_once(tmp_path):
  small = ['--data_source=synthetic', '--rounds=1', '--noprogress', '--notensorboard',
           f'--root_output_dir={tmp_path}']
  expected = [  # (exit status, factories built), command line
      # Its check, identity and simulation share it.
      ((0, 1), ['--aggregator=gm', '--clients_per_round=3']),
      ((0, 1), ['--aggregator=krum', '--rho=0.25', '--clients_per_round=5']),
      # Refused: the run's factory, and one per lower ρ the fix search tries
      # (ρ = 0.3 works), not one per number of clients.
      ((2, 2), ['--aggregator=krum', '--rho=0.45', '--clients_per_round=10']),
      # f of --aggregator_args: its factory built at parse time with the default ρ,
      # the run's, and one per lower ρ, ⌊0.45·10⌋ − 1 down to 0 (none works).
      ((2, 6), ['--aggregator=krum', '--aggregator_args=num_byzantine=20', '--rho=0.45',
                '--clients_per_round=10']),
  ]
  found = json.loads(_run(_BUILDS, json.dumps([small + line for _, line in expected])))
  assert [tuple(f) for f in found] == [counts for counts, _ in expected]
