"""One owner per run directory: a second process is refused naming the owner's pid,
and an owner killed by SIGKILL leaves no stale lock."""

import fcntl
import os
import signal

import pytest

from tasks.simulation import run_lock
from tests.helpers import processes

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def test_a_second_owner_is_refused_naming_the_directory_and_the_pid(tmp_path):
  directory = str(tmp_path / 'run')
  with processes.run_owner(directory, _REPO) as owner:
    with pytest.raises(run_lock.RunLockedError) as raised:
      with run_lock.owned(directory):
        pass
  assert raised.value.owner == owner.pid
  message = str(raised.value)
  assert message.startswith(f'{directory}: process {owner.pid} is running')
  assert '\n' not in message


def test_a_killed_owner_leaves_no_stale_lock(tmp_path):
  directory = str(tmp_path / 'run')
  with processes.run_owner(directory, _REPO) as owner:
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    with run_lock.owned(directory):
      assert run_lock.owner(directory) == os.getpid()


def test_the_owner_may_enter_again(tmp_path):
  directory = str(tmp_path / 'run')
  with run_lock.owned(directory):
    with run_lock.owned(os.path.join(str(tmp_path), '.', 'run')):
      pass
    # Still owned after the inner block: another open of the file cannot lock it.
    with open(os.path.join(directory, run_lock.LOCK_FILE)) as f:
      with pytest.raises(BlockingIOError):
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.mark.parametrize('inside', [False, True], ids=['is_a_file', 'under_a_file'])
def test_a_run_directory_that_is_a_file_is_named_in_one_line(tmp_path, inside):
  path = tmp_path / 'run'
  path.write_text('not a run')
  directory = str(path / 'sub' if inside else path)
  with pytest.raises(run_lock.RunDirectoryError) as raised:
    with run_lock.owned(directory):
      pass
  message = str(raised.value)
  assert message.startswith(f'{directory}: ')
  assert ('cannot be created' if inside else 'is a file, not a directory') in message
  assert 'Move it away' in message and '\n' not in message
  assert path.read_text() == 'not a run'
