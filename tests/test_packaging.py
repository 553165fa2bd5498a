"""The project's shape: BUILD in step with the tree, a wheel that holds tff_robust
only, and the import graph of the layers (docs/design.md)."""

import ast
import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Layer → the layers of ours it may import (tests import everything).
ALLOWED = {
    'tff_robust': {'tff_robust'},
    'baselines': {'baselines', 'tff_robust'},
    'tasks': {'tasks', 'baselines', 'tff_robust'},
    'benchmarks': {'benchmarks', 'tasks', 'baselines', 'tff_robust'},
}


def _imports(path: pathlib.Path) -> set[str]:
  """Dotted names of everything `path` imports (module-level or not)."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names.update(f'{node.module}.{alias.name}' for alias in node.names)
  return names


def _ours(layer: str):
  return sorted((ROOT / layer).rglob('*.py'))


def _module(path: pathlib.Path) -> str:
  return '.'.join(path.relative_to(ROOT).with_suffix('').parts)


def test_build_file_is_in_step_with_the_sources():
  result = subprocess.run(
      [sys.executable, str(ROOT / 'scripts' / 'generate_build.py'), '--check'],
      capture_output=True, text=True, timeout=60, check=False)
  assert result.returncode == 0, result.stdout + result.stderr


def test_every_test_file_has_a_py_test_target():
  build = (ROOT / 'BUILD').read_text(encoding='utf-8')
  for path in (ROOT / 'tests').rglob('test_*.py'):
    name = '_'.join(path.relative_to(ROOT).with_suffix('').parts)
    assert f'py_test(\n    name = "{name}"' in build, path


@pytest.mark.parametrize('layer', sorted(ALLOWED))
def test_layers_import_only_the_layers_below(layer):
  wrong = [(_module(path), name) for path in _ours(layer) for name in _imports(path)
           if name.split('.')[0] in ALLOWED and name.split('.')[0] not in ALLOWED[layer]]
  assert not wrong


# The one module that may import TFF's and TensorFlow's private modules.
PRIVATE_DOOR = ROOT / 'tff_robust' / 'common' / 'tff_private.py'
_PRIVATE = re.compile(r'^(tensorflow|tensorflow_federated)\.python(\.|$)')
_PRIVATE_TEXT = re.compile(r"""['"](tensorflow|tensorflow_federated)\.python[.'"]""")


@pytest.mark.parametrize('layer', sorted(ALLOWED) + ['tests', 'scripts'])
def test_private_tff_and_tensorflow_names_come_through_one_module(layer):
  wrong = []
  for path in _ours(layer):
    if path == PRIVATE_DOOR:
      continue
    text = path.read_text(encoding='utf-8')
    wrong += [(_module(path), name) for name in _imports(path) if _PRIVATE.match(name)]
    # importlib.import_module('tensorflow_federated.python...') and the like.
    wrong += [(_module(path), match.group(0)) for match in _PRIVATE_TEXT.finditer(text)
              if 'test_packaging' not in path.name]
  assert not wrong, f'import these through {PRIVATE_DOOR.relative_to(ROOT)}: {wrong}'


# tff_robust's sub-packages → the sub-packages they may import (docs/development.md).
SUBPACKAGES = {
    'common': {'common'},
    'iterative': {'common', 'iterative'},
    'aggregators': {'common', 'iterative', 'aggregators'},
    'learning': {'common', 'iterative', 'aggregators', 'learning', 'distributed'},
    'distributed': {'common', 'iterative', 'aggregators', 'distributed'},
}


def test_tff_robust_is_its_sub_packages_only():
  top = sorted(p.name for p in (ROOT / 'tff_robust').iterdir()
               if p.suffix == '.py' or (p / '__init__.py').exists())
  assert top == ['__init__.py', *sorted(SUBPACKAGES)]


@pytest.mark.parametrize('subpackage', sorted(SUBPACKAGES))
def test_tff_robust_sub_packages_import_only_the_ones_below(subpackage):
  wrong = [(_module(path), name)
           for path in _ours(f'tff_robust/{subpackage}') for name in _imports(path)
           if name.startswith('tff_robust.') and
           name.split('.')[1] not in SUBPACKAGES[subpackage]]
  assert not wrong


def test_task_builders_and_aggregators_never_import_the_harness():
  harness = ('tasks.simulation', 'tasks.binaries')
  paths = _ours('tff_robust') + _ours('baselines') + _ours('tasks/builders')
  wrong = [(_module(path), name) for path in paths for name in _imports(path)
           if name.startswith(harness)]
  assert not wrong


def test_the_numpy_references_import_numpy_only():
  # The independent check of the factories, and what the attacks expect: never
  # TensorFlow, nor any code of the factories.
  imported = _imports(ROOT / 'tasks' / 'references.py')
  assert {name.split('.')[0] for name in imported} <= {'numpy', 'typing'}, imported


def test_no_binary_imports_another_binary():
  binaries = {_module(p) for p in _ours('tasks/binaries')
              if "if __name__ == '__main__':" in p.read_text(encoding='utf-8')}
  assert binaries >= {'tasks.binaries.train', 'tasks.binaries.sweep',
                      'tasks.binaries.main_job'}
  wrong = [(_module(path), name) for path in _ours('tasks') for name in _imports(path)
           if name in binaries or any(name.startswith(b + '.') for b in binaries)]
  assert not wrong


def _main_block(path: pathlib.Path) -> str:
  """The source of `path`'s `if __name__ == '__main__':` block ('' without one)."""
  source = path.read_text(encoding='utf-8')
  for node in ast.parse(source).body:
    if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and
        isinstance(node.test.left, ast.Name) and node.test.left.id == '__name__'):
      return ast.get_source_segment(source, node)
  return ''


# Programs that never run a TFF computation in TFF's default context: each names why.
_NO_DEFAULT_CONTEXT = {
    'benchmarks.main_job_time': 'runs the main job in subprocesses, each a binary',
    'benchmarks.worker_tls_overhead': 'runs on workers it starts and stops itself',
}


def _called(path: pathlib.Path) -> set[str]:
  """`name` and `module.name` of every function `path` calls (by a plain name or an
  attribute)."""
  called = set()
  for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
    if isinstance(node, ast.Call):
      function = node.func
      if isinstance(function, ast.Name):
        called.add(function.id)
      elif isinstance(function, ast.Attribute):
        called.add(function.attr)
        if isinstance(function.value, ast.Name):
          called.add(f'{function.value.id}.{function.attr}')
  return called


def test_programs_stop_their_worker_binary():
  # TFF starts a worker_binary on the first computation and leaves it running when the
  # interpreter exits (its finalizer fails at shutdown): every program (a module with
  # a `__main__` block) stops it, with `exit_status.run` or
  # `runtime.worker_binaries_stopped`, unless it is listed above.
  programs = {_module(path): path for layer in ('tasks', 'benchmarks')
              for path in _ours(layer) if _main_block(path)}
  assert len(programs) > 10 and set(_NO_DEFAULT_CONTEXT) <= set(programs)
  leaking = [module for module, path in programs.items()
             if module not in _NO_DEFAULT_CONTEXT and
             not {'exit_status.run', 'worker_binaries_stopped'} & _called(path)]
  assert not leaking, leaking


def _defines_flags_on_import(path: pathlib.Path) -> bool:
  """Whether a module-level statement of `path` defines absl flags."""
  for node in ast.parse(path.read_text(encoding='utf-8')).body:
    for call in ast.walk(node):
      if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and
          isinstance(call.func.value, ast.Name) and
          (call.func.value.id, call.func.attr[:6]) in (('flags', 'DEFINE'),
                                                       ('flag_groups', 'define'))):
        return True
  return False


@pytest.mark.slow  # Imports them, with TensorFlow, in a new process.
def test_flag_defining_modules_that_tests_import_can_share_a_process():
  # pytest imports every test module in one process (per xdist worker): two modules
  # defining the same absl flag there fail collection with DuplicateFlagError.
  flagged = {_module(path) for layer in ('tasks', 'benchmarks')
             for path in _ours(layer) if _defines_flags_on_import(path)}
  assert {'tasks.binaries.train', 'benchmarks.personalization'} <= flagged
  imported = sorted({name for path in _ours('tests') for name in _imports(path)
                     if name in flagged})
  result = subprocess.run(
      [sys.executable, '-c', ''.join(f'import {name}; ' for name in imported)],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, (imported, result.stderr[-2000:])


# Imported by tff_robust but installed by scripts/setup.sh, not by the wheel's
# requirements: TFF 0.87 pins a jax the registry no longer serves (setup.py's docstring).
NOT_DECLARED = {'tensorflow_federated'}


def _install_requires() -> set[str]:
  """The distribution names in setup.py's install_requires, normalized."""
  setup = ast.parse((ROOT / 'setup.py').read_text(encoding='utf-8'))
  for node in ast.walk(setup):
    if isinstance(node, ast.keyword) and node.arg == 'install_requires':
      requirements = ast.literal_eval(node.value)
      return {re.split(r'[<>=~!\[; ]', r, maxsplit=1)[0].lower().replace('_', '-')
              for r in requirements}
  raise AssertionError('setup.py has no install_requires')


def test_every_third_party_import_of_the_wheel_is_declared():
  declared = _install_requires()
  distributions = importlib.metadata.packages_distributions()
  missing = {}
  for path in _ours('tff_robust'):
    for name in _imports(path):
      top = name.split('.')[0]
      if top in sys.stdlib_module_names or top in NOT_DECLARED or top == 'tff_robust':
        continue
      providers = {d.lower().replace('_', '-') for d in distributions.get(top, [top])}
      if not providers & declared:
        missing.setdefault(top, set()).add(_module(path))
  assert not missing, (
      f'tff_robust imports these without declaring them in setup.py\'s '
      f'install_requires: {missing}')


def test_wheel_holds_tff_robust_only(tmp_path):
  source = tmp_path / 'source'
  source.mkdir()
  for name in ('setup.py', 'README.md'):
    shutil.copy(ROOT / name, source / name)
  for package in ('tff_robust', 'baselines', 'tasks'):
    shutil.copytree(ROOT / package, source / package,
                    ignore=shutil.ignore_patterns('__pycache__'))
  result = subprocess.run(
      [sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation',
       '--disable-pip-version-check', '-q', '-w', str(tmp_path / 'dist'), str(source)],
      capture_output=True, text=True, timeout=300, check=False,
      env={k: v for k, v in os.environ.items() if k != 'TFF_ROBUST_EXPERIMENTS'})
  assert result.returncode == 0, result.stderr
  wheel, = (tmp_path / 'dist').glob('*.whl')
  with zipfile.ZipFile(wheel) as archive:
    names = archive.namelist()
  top_level = {n.split('/')[0] for n in names if not n.split('/')[0].endswith(
      ('.dist-info', '.data'))}
  assert top_level == {'tff_robust'}
  assert not any(n.endswith('entry_points.txt') for n in names)


@pytest.mark.slow  # Runs the binaries.
@pytest.mark.parametrize('script', ['tff_robust_train', 'tff_robust_sweep'])
def test_console_scripts_of_the_development_install_run(script):
  """scripts/setup.sh installs the experiment side into .venv with its console scripts
  (the environment this suite runs in on CI)."""
  path = pathlib.Path(sys.executable).parent / script
  if pathlib.Path(sys.prefix).resolve() != (ROOT / '.venv').resolve():
    pytest.skip('not running in the repository\'s .venv')
  # From another directory: the script must not rely on the repository being the cwd.
  result = subprocess.run([str(path), '--helpfull'], capture_output=True, text=True,
                          timeout=120, check=False, cwd='/')
  # The shared flag groups are listed under the binary that uses them.
  binary = script.removeprefix('tff_robust_')
  assert f'tasks.binaries.{binary}:' in result.stdout, result.stderr[-2000:]
  assert '--aggregator' in result.stdout
