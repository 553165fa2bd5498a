"""`--helpshort` of a binary lists every flag of ours it takes (those `flag_groups` and
`parallel_runs` define for it too) and none of absl's, which `--helpfull` adds."""

import re
import subprocess
import sys

import pytest

from tests.helpers import processes

# Starts subprocesses (the binaries): not in the `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

_FLAG = re.compile(r'^  (?:-.,)?--(?:\[no\])?(\w+)')
_SECTION = re.compile(r'^(absl\.\w+|\S+\.py):$')
# A flag of each group the binary takes.
_OURS = {
    'tasks.binaries.train': ('task', 'rounds', 'aggregator', 'rho', 'workers'),
    'tasks.binaries.sweep': ('task', 'aggregators', 'rhos', 'parallel_runs'),
    'tasks.binaries.main_job': ('task', 'aggregators', 'parallel_runs'),
    'tasks.binaries.leaderboard': ('task', 'aggregators', 'parallel_runs'),
}


def _sections(module, which) -> dict[str, set[str]]:
  """{section of the help ('absl.app', the binary's path): its flags}."""
  result = subprocess.run([sys.executable, '-m', module, which], cwd=processes.REPOSITORY,
                          env=processes.quiet_env(), capture_output=True, text=True,
                          timeout=300)
  sections, current = {}, None
  for line in result.stdout.splitlines():
    if _SECTION.match(line):
      current = sections.setdefault(_SECTION.match(line).group(1), set())
    elif current is not None and _FLAG.match(line):
      current.add(_FLAG.match(line).group(1))
  return sections


@pytest.mark.parametrize('module', sorted(_OURS))
def test_helpshort_lists_our_flags_and_helpfull_adds_only_absls(module):
  path = module.replace('.', '/') + '.py'
  short, full = _sections(module, '--helpshort'), _sections(module, '--helpfull')
  [(section, ours)] = short.items()
  assert section.endswith(path), short
  assert set(_OURS[module]) <= ours
  others = {name for name in full if name != section}
  assert others == {'absl.app', 'absl.logging', 'absl.flags'}, full.keys()
  assert full[section] == ours
