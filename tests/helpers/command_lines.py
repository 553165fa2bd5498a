"""Runs one binary on several command lines in one new Python process.

The bad-flag tests check what a user sees: the exit status, the stderr line naming the
flag and its fix, no traceback, nothing trained. Each command line in a process of its
own costs a TensorFlow import (~5 CPU-seconds) for a check that takes milliseconds, so
`run_each` starts one process per binary, which imports it once and runs its entry
point (`exit_status.run`, as `python -m` does) for each command line in turn, with
absl's flags reset in between and file descriptors 1 and 2 going to the command
line's own files.

  results = command_lines.run_each('tasks.binaries.sweep', [['--seeds=-1'], ...])
  results[0].returncode, results[0].stderr
"""

import contextlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import traceback

from absl import flags
from absl.testing import flagsaver

from tests.helpers import processes


def run_each(module: str, command_lines: list[list[str]], cwd: str = processes.REPOSITORY,
             env=None, timeout: float = 900) -> list[subprocess.CompletedProcess]:
  """Runs `python -m module *line` for each line of `command_lines`, all in one new
  process; returns one `CompletedProcess` (returncode, stdout, stderr) per line."""
  with tempfile.TemporaryDirectory() as directory:
    request = os.path.join(directory, 'request.json')
    with open(request, 'w', encoding='utf-8') as f:
      json.dump(dict(module=module, command_lines=command_lines, directory=directory), f)
    child = subprocess.run([sys.executable, '-m', 'tests.helpers.command_lines', request],
                           cwd=cwd, env=env or processes.quiet_env(), capture_output=True,
                           text=True, timeout=timeout)
    assert child.returncode == 0, f'the runner of {module} failed:\n{child.stderr[-3000:]}'
    results = []
    for i, line in enumerate(command_lines):
      with open(os.path.join(directory, f'{i}.json'), encoding='utf-8') as f:
        returncode = json.load(f)
      results.append(subprocess.CompletedProcess(
          [module, *line], returncode, _read(directory, f'{i}.out'),
          _read(directory, f'{i}.err')))
    return results


def _read(directory: str, name: str) -> str:
  with open(os.path.join(directory, name), encoding='utf-8', errors='replace') as f:
    return f.read()


@contextlib.contextmanager
def _descriptors_to(out_path: str, err_path: str):
  """Sends file descriptors 1 and 2 (so also TensorFlow's C++ logs) to the files."""
  sys.stdout.flush()
  sys.stderr.flush()
  saved = os.dup(1), os.dup(2)
  with open(out_path, 'wb') as out, open(err_path, 'wb') as err:
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    try:
      yield
    finally:
      sys.stdout.flush()
      sys.stderr.flush()
      os.dup2(saved[0], 1)
      os.dup2(saved[1], 2)
      for descriptor in saved:
        os.close(descriptor)


def _exit_status(code) -> int:
  """The status `sys.exit(code)` gives a process."""
  if code is None:
    return 0
  if isinstance(code, int):
    return code
  print(code, file=sys.stderr)
  return 1


def _run_line(entry_point, module: str, line: list[str]) -> int:
  with flagsaver.flagsaver():
    flags.FLAGS.unparse_flags()
    sys.argv = [module, *line]
    try:
      entry_point()
    except SystemExit as e:
      return _exit_status(e.code)
    except BaseException:  # pylint: disable=broad-except
      traceback.print_exc()  # As Python prints an uncaught exception.
      return 1
    return 0


def _main(request_path: str) -> None:
  with open(request_path, encoding='utf-8') as f:
    request = json.load(f)
  binary = importlib.import_module(request['module'])
  from tasks.binaries import exit_status  # pylint: disable=g-import-not-at-top
  entry_point = getattr(binary, 'run', None) or (lambda: exit_status.run(binary.main))
  directory = request['directory']
  for i, line in enumerate(request['command_lines']):
    with _descriptors_to(os.path.join(directory, f'{i}.out'),
                         os.path.join(directory, f'{i}.err')):
      returncode = _run_line(entry_point, request['module'], line)
    with open(os.path.join(directory, f'{i}.json'), 'w', encoding='utf-8') as f:
      json.dump(returncode, f)


if __name__ == '__main__':
  _main(sys.argv[1])
