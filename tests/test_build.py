"""BUILD declares a target for every module and test (it is generated from the tree)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_build_file_is_in_step_with_the_sources():
  result = subprocess.run(
      [sys.executable, str(ROOT / 'scripts' / 'generate_build.py'), '--check'],
      capture_output=True, text=True, timeout=60, check=False)
  assert result.returncode == 0, result.stdout + result.stderr


def test_every_test_file_has_a_py_test_target():
  build = (ROOT / 'BUILD').read_text(encoding='utf-8')
  for path in (ROOT / 'tests').glob('test_*.py'):
    assert f'name = "tests_{path.stem}"' in build, path.name
