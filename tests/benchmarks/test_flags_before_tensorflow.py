"""Every benchmark program with flags refuses an unknown flag before it imports
TensorFlow (checked in its own `sys.modules`, not by its time)."""

import pathlib

import pytest

from tests.helpers import processes

# Starts subprocesses (the benchmarks): not in the `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

_BENCHMARKS = pathlib.Path(processes.REPOSITORY) / 'benchmarks'
# Programs whose flags need TensorFlow, with the reason.
_IMPORTING_TENSORFLOW = {
    'gm_start_study': "--starts' choices are the geometric median factory's "
                      'INITIAL_POINTS',
}
_PROGRAMS = sorted(
    path.stem for path in _BENCHMARKS.glob('*.py')
    if "if __name__ == '__main__':" in path.read_text(encoding='utf-8')
    and path.stem not in _IMPORTING_TENSORFLOW)


def test_the_programs_are_found():
  assert {'round_time', 'aggregator_memory_time', 'personalization'} <= set(_PROGRAMS)


@pytest.mark.parametrize('name', _PROGRAMS)
def test_an_unknown_flag_is_refused_before_tensorflow(name):
  result = processes.run_watching_imports(f'benchmarks.{name}', '--no_such_flag=1')
  assert result.returncode in (1, 2), result.stderr[-2000:]  # absl 1, argparse 2.
  assert 'no_such_flag' in result.stderr, result.stderr[-2000:]
  assert result.stderr.splitlines()[-1] == 'IMPORTED', result.stderr[-2000:]
