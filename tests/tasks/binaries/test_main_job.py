"""The main job binary end to end on a tiny synthetic configuration, and its README
update: only the marked section changes, only on request, and the committed copies
only with the README's configuration."""

import os

import pytest

from tasks.simulation import sweep_report
from tests.helpers import command_lines

# Starts subprocesses (binaries, benchmarks or worker processes): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
_TINY = ['--data_source=synthetic', '--aggregators=mean,gm', '--attacks=omniscient',
         '--rhos=0,0.2', '--rounds=1', '--clients_per_round=3', '--noprogress',
         '--parallel_runs=1']
# The tiny configuration's protocol line, found in any page it wrote.
_TINY_PROTOCOL = '1 rounds, 3 clients/round'
_COMMITTED = ('README.md', os.path.join('results', 'main_job.md'))


def test_update_marked_section_replaces_only_that_section(tmp_path):
  readme = tmp_path / 'README.md'
  readme.write_text(f'intro\n{sweep_report.README_BEGIN}\nold table\n'
                    f'{sweep_report.README_END}\noutro\n', encoding='utf-8')
  assert sweep_report.update_marked_section(str(readme), '| new | table |\n')
  assert readme.read_text(encoding='utf-8') == (
      f'intro\n{sweep_report.README_BEGIN}\n| new | table |\n{sweep_report.README_END}\noutro\n')


def test_update_marked_section_without_markers_leaves_the_file_alone(tmp_path):
  readme = tmp_path / 'README.md'
  readme.write_text('no markers here\n', encoding='utf-8')
  assert not sweep_report.update_marked_section(str(readme), 'table')
  assert readme.read_text(encoding='utf-8') == 'no markers here\n'


@pytest.fixture(scope='module')
def tiny_runs(tmp_path_factory):
  """The tiny configuration run twice by one process (`command_lines.run_each`):
  with the pages' paths given, and with --output_dir only. Returns each run's
  directory and result."""
  with_pages, alone = (tmp_path_factory.mktemp(name) for name in ('pages', 'alone'))
  readme = with_pages / 'README.md'
  readme.write_text(f'{sweep_report.README_BEGIN}\n{sweep_report.README_END}\n', encoding='utf-8')
  results = command_lines.run_each('tasks.binaries.main_job', [
      [*_TINY, f'--output_dir={with_pages / "runs"}',
       f'--results_markdown={with_pages / "main_job.md"}', f'--readme={readme}'],
      [*_TINY, f'--output_dir={alone / "runs"}'],
  ])
  return dict(pages=(with_pages, results[0]), alone=(alone, results[1]))


def test_main_job_runs_and_writes_its_pages(tiny_runs):
  directory, result = tiny_runs['pages']
  assert result.returncode == 0, result.stderr[-3000:]
  page = (directory / 'main_job.md').read_text(encoding='utf-8')
  assert '| RFA (gm) |' in page and 'omniscient ρ=0.2' in page
  assert page.strip() in (directory / 'README.md').read_text(encoding='utf-8')


def test_main_job_writes_into_its_output_directory_only(tiny_runs):
  directory, result = tiny_runs['alone']
  assert result.returncode == 0, result.stderr[-3000:]
  assert _TINY_PROTOCOL in (directory / 'runs' / 'main_job.md').read_text(
      encoding='utf-8')
  for committed in _COMMITTED:
    with open(os.path.join(_REPO, committed), encoding='utf-8') as f:
      assert _TINY_PROTOCOL not in f.read(), committed


# Command lines that would write the committed copies with another configuration:
# (flags, how the error names the difference).
_NOT_THE_README_CONFIGURATION = [
    (['--update_committed_results', '--rounds=1'], '--rounds=1 (README: 30)'),
    (['--update_committed_results', '--aggregators=mean', '--data_seed=0'],
     '--aggregators=mean (README: mean,gm,one_step_gm,gamma_mean,gma,median)'),
    ([f'--readme={os.path.join(_REPO, "README.md")}', '--seeds=1'],
     '--seeds=1 (README: 0)'),
]


@pytest.fixture(scope='module')
def refused(tmp_path_factory):
  """Each case's result and output directory, all run by one process."""
  root = tmp_path_factory.mktemp('refused')
  lines = [[*flags, f'--output_dir={root / str(i)}']
           for i, (flags, _) in enumerate(_NOT_THE_README_CONFIGURATION)]
  results = command_lines.run_each('tasks.binaries.main_job', lines)
  return [(result, root / str(i)) for i, result in enumerate(results)]


@pytest.mark.parametrize('case', range(len(_NOT_THE_README_CONFIGURATION)),
                         ids=[named for _, named in _NOT_THE_README_CONFIGURATION])
def test_the_committed_copies_take_only_the_readme_configuration(refused, case):
  result, output_dir = refused[case]
  named = _NOT_THE_README_CONFIGURATION[case][1]
  assert result.returncode == 1, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith('ERROR: ')]
  assert len(errors) == 1, result.stderr[-3000:]
  assert named in errors[0] and 'README\'s configuration' in errors[0]
  assert 'data_seed' not in errors[0]  # At its default, though given.
  assert not output_dir.exists()  # Refused before training.
