"""A task of your own through the binaries, as a user runs them from the repository
root: `--task=docs.examples.my_task:build_task` trains under an attack, writes the
metrics CSV and TensorBoard, resumes, sweeps and makes a leaderboard of its own; a
--task that names no task stops the binary before training with one line naming the
problem and the fix."""

import csv
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import command_lines
from tests.helpers import processes

# Starts subprocesses (binaries, benchmarks or worker processes): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
_EXAMPLE = 'docs.examples.my_task:build_task'
_TRAIN = ['--aggregator=gm', '--attack=alie', '--rho=0.2', '--clients_per_round=4',
          '--experiment_name=run', '--noprogress']


def _binary(name, *args, cwd=_REPO, env=None):
  return subprocess.run([sys.executable, '-m', f'tasks.binaries.{name}', *args],
                        cwd=cwd, capture_output=True, text=True, timeout=900,
                        env=env or processes.quiet_env())


def _rows(run_dir):
  with open(os.path.join(run_dir, 'metrics.csv'), newline='') as f:
    return list(csv.DictReader(f))


_BAD_TASKS = '''
def returns_a_dict(seed=0):
  return {'name': 'mine'}
'''


# --task values (and flags beside them) that name no task: (flags, what stderr says).
_NOT_A_TASK = [
    (['--task=docs.examples.my_task'],
     '--task=docs.examples.my_task is not a built-in task (emnist, shakespeare, '
     'sent140) nor an import path package.module:function'),
    (['--task=docs.examples.nope:build_task'],
     "no module 'docs.examples.nope' is importable from"),
    (['--task=docs.examples.my_task:build'],
     "has no attribute 'build'. Fix: name one of its functions (build_task, "),
    (['--task=docs.examples.my_task:NUM_CLASSES'],
     'NUM_CLASSES is 3, not a function. Fix: point --task at a function'),
    ([f'--task={_EXAMPLE}', '--model=cnn', '--data_source=tff'],
     f'--model, --data_source: not read with --task={_EXAMPLE}, a task of your own'),
    ([f'--task={_EXAMPLE}', '--attack=data'],
     f'ERROR: --attack: data unknown for --task={_EXAMPLE}; known: none, label_flip, '
     'gaussian'),
    (['--task=bad_tasks_module:returns_a_dict'],
     'ERROR: the value of bad_tasks_module:returns_a_dict() is a builtins.dict, not '
     'a tasks.builders.Task. Fix: build the task with '
     'tasks.builders.Task.from_keras(...)'),
]


@pytest.fixture(scope='module')
def train(tmp_path_factory):
  """Every `train` run of this file: the example's first run in a process of its own,
  its rows read at once; then, in one other process (`command_lines.run_each`, which
  can import `bad_tasks_module`), its resume with a larger --rounds, an uninterrupted
  run, another configuration in the same directory, a run under the default name and
  each --task that names no task."""
  root = tmp_path_factory.mktemp('train')
  (root / 'bad_tasks_module.py').write_text(textwrap.dedent(_BAD_TASKS))
  first = _binary('train', f'--task={_EXAMPLE}', '--rounds=2',
                  f'--root_output_dir={root / "resumed"}', *_TRAIN)
  assert first.returncode == 0, first.stderr[-3000:]
  runs = dict(first=first, first_rows=_rows(root / 'resumed' / 'run'))
  lines = {
      'resumed': [f'--task={_EXAMPLE}', '--rounds=3',
                  f'--root_output_dir={root / "resumed"}', *_TRAIN],
      'whole': [f'--task={_EXAMPLE}', '--rounds=3', f'--root_output_dir={root / "whole"}',
                *_TRAIN],
      'other': [f'--task={_EXAMPLE}', '--rounds=3', '--rho=0.3',
                f'--root_output_dir={root / "resumed"}', *_TRAIN[:2], *_TRAIN[3:]],
      'default_name': [f'--task={_EXAMPLE}', '--rounds=1', '--batch_size=32',
                       f'--root_output_dir={root / "default_name"}', *_TRAIN[:4],
                       '--noprogress'],
  }
  for i, (flags, _) in enumerate(_NOT_A_TASK):
    lines[f'not_a_task_{i}'] = [*flags, '--rounds=1',
                                f'--root_output_dir={root / f"runs{i}"}', '--noprogress']
  env = dict(processes.quiet_env(), PYTHONPATH=str(root))
  runs.update(zip(lines, command_lines.run_each('tasks.binaries.train',
                                                list(lines.values()), env=env)))
  runs['root'] = root
  return runs


def test_train_runs_the_example_under_an_attack_and_resumes(train):
  run = train['root'] / 'resumed' / 'run'
  rows = train['first_rows']
  assert [r['round'] for r in rows] == ['0', '1']
  assert [r['num_corrupted_clients'] for r in rows] != ['0', '0']
  for column in ('train_loss', 'test_accuracy', 'cumulative_secure_average_calls',
                 'aggregator/objective/0'):
    assert rows[-1][column] != '', column
  assert os.listdir(run / 'tensorboard')
  config = json.loads((run / 'config.json').read_text())
  assert config['task'] == _EXAMPLE and config['attack'] == 'alie'
  assert not {'model', 'data_source', 'data_dir'} & set(config)

  # In another process: a larger --rounds resumes after round 1, the rows kept, the
  # next one added, and the same as an uninterrupted run's; other flags are another
  # run: refused, the files left as they are.
  resumed, whole, other = train['resumed'], train['whole'], train['other']
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert whole.returncode == 0, whole.stderr[-3000:]
  resumed_rows = _rows(run)
  assert resumed_rows[:2] == rows
  assert resumed_rows == _rows(train['root'] / 'whole' / 'run')
  assert other.returncode == 1
  assert 'different configuration (rho: 0.2 → 0.3)' in other.stderr


def test_the_default_run_name_is_the_import_path(train):
  result = train['default_name']
  assert result.returncode == 0, result.stderr[-3000:]
  assert os.listdir(train['root'] / 'default_name') == [
      'docs.examples.my_task.build_task_gm_alie_rho0.2_seed0']
  # The example's own client spec (batch 10) gives way to the flag, and says so.
  assert ('its client spec is set from the flags: batch_size=10 by --batch_size=32'
          in result.stderr)


@pytest.mark.parametrize('case', range(len(_NOT_A_TASK)),
                         ids=[message[:40] for _, message in _NOT_A_TASK])
def test_a_task_that_is_not_one_is_refused_before_training(train, case):
  result, runs = train[f'not_a_task_{case}'], train['root'] / f'runs{case}'
  assert result.returncode == 1, result.stderr[-3000:]
  assert _NOT_A_TASK[case][1] in result.stderr, result.stderr[-3000:]
  assert 'Traceback' not in result.stderr
  assert not runs.exists() or not any(runs.rglob('metrics.csv'))


def test_a_sweep_of_the_example_with_its_data_attack(tmp_path):
  result = _binary('sweep', f'--task={_EXAMPLE}', '--aggregators=mean,gm',
                   '--attacks=label_flip,sign_flip', '--rhos=0,0.2', '--seeds=0',
                   '--rounds=1', '--clients_per_round=4', '--noprogress',
                   f'--output_dir={tmp_path}')
  assert result.returncode == 0, result.stderr[-3000:]
  summary = (tmp_path / 'summary.md').read_text()
  assert '| gm |' in summary and 'label_flip ρ=0.2' in summary
  assert len(list((tmp_path / 'runs').iterdir())) == 6
  assert (tmp_path / 'curves_label_flip_rho0.2.png').exists()


def test_a_leaderboard_of_the_example_is_its_own(tmp_path):
  # In a copy of the sources, whose results/ and docs/results.md are the defaults:
  # the pages of a task of your own go to --output_dir, never to them.
  repo = tmp_path / 'repo'
  for package in ('tff_robust', 'baselines', 'tasks', 'docs'):
    shutil.copytree(os.path.join(_REPO, package), repo / package,
                    ignore=shutil.ignore_patterns('__pycache__', '*.md'))
  (repo / 'results').mkdir()
  page = repo / 'docs' / 'results.md'
  page.write_text('<!-- leaderboard:begin -->\nours\n<!-- leaderboard:end -->\n')
  result = _binary('leaderboard', f'--task={_EXAMPLE}', '--aggregators=mean',
                   '--rhos=0,0.25', '--seeds=0', '--worker_momenta=0', '--rounds=1',
                   '--clients_per_round=4', '--noprogress',
                   f'--output_dir={tmp_path / "runs"}', cwd=repo)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f'--task={_EXAMPLE} is a task of your own' in result.stderr
  assert page.read_text() == '<!-- leaderboard:begin -->\nours\n<!-- leaderboard:end -->\n'
  assert not os.listdir(repo / 'results')
  board = (tmp_path / 'runs' / 'leaderboard.md').read_text()
  # The default attacks: every update attack of the grid, and the task's data attack
  # (the built-in default names EMNIST's).
  assert 'attacks gaussian, omniscient' in board and 'label_flip at ρ' in board
  assert ' | mean | ' in board
  assert (tmp_path / 'runs' / 'ledger.csv').exists()
