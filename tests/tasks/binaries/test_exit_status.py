"""The interruption line of the binaries (Ctrl-C, SIGTERM): where a rerun resumes from,
read from memory in the signal handler, and the exit status 128 + signal; the copies
of --parallel_runs are interrupted and waited for, also from the handler."""

import contextlib
import io
import os
import signal
import subprocess
import sys
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from tasks.binaries import exit_status

_RERUN = 'rerun the same command to resume'


class _Exited(Exception):
  pass


def _interrupt(signum):
  """The line `exit_status` prints on `signum` and the status it exits with; TFF's
  workers are not stopped and the process does not exit."""
  stderr = io.StringIO()

  def exit_now(status):
    raise _Exited(status)

  with mock.patch.object(exit_status.runtime, 'stop_worker_binaries') as stop, \
      mock.patch.object(exit_status.os, '_exit', exit_now), \
      contextlib.redirect_stderr(stderr):
    try:
      exit_status._exit_on_signal(signum, None)  # pylint: disable=protected-access
    except _Exited as exited:
      status = exited.args[0]
    else:
      raise AssertionError('the handler returned instead of exiting')
  stop.assert_called_once()
  return stderr.getvalue().splitlines()[-1], status


class InterruptionLineTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.enter_context(mock.patch.object(exit_status, '_checkpointed', None))

  @parameterized.named_parameters(
      ('sigint', signal.SIGINT, 130), ('sigterm', signal.SIGTERM, 143))
  def test_says_after_which_round_a_rerun_resumes(self, signum, status):
    exit_status.rounds_checkpointed(0)
    exit_status.rounds_checkpointed(4)
    line, exited_with = _interrupt(signum)
    self.assertEqual(line, f'interrupted after round 3; {_RERUN}')
    self.assertEqual(exited_with, status)

  def test_before_any_checkpoint_says_round_0(self):
    exit_status.rounds_checkpointed(0)
    self.assertEqual(_interrupt(signal.SIGTERM)[0], f'interrupted in round 0; {_RERUN}')

  def test_before_the_run_resumed_says_no_round(self):
    # Nothing read yet (e.g. the data still loading): no guess, and no waiting.
    self.assertEqual(_interrupt(signal.SIGINT)[0], f'interrupted; {_RERUN}')


# A copy: tells its parent it is running (SIGUSR1), then ends by SIGINT.
_COPY = ('import os, signal, time\n'
         'os.kill(os.getppid(), signal.SIGUSR1)\n'
         'time.sleep(600)\n')


class InterruptCopiesTest(absltest.TestCase):

  def test_the_handler_that_interrupted_a_wait_for_a_copy_reaps_it_at_once(self):
    # The binary waits for its copies (`copy.wait()`) when Ctrl-C comes: the handler
    # interrupts them and reaps them itself. With `Popen.wait` there it spun on the
    # lock the interrupted wait holds until its timeout, then gave up on the copy,
    # its status unknown (the timeout here only bounds how long that failure takes).
    statuses = []

    def interrupt(signum, frame):
      del signum, frame
      exit_status.interrupt_copies(signal.SIGINT, timeout=120)
      statuses.append(copy.returncode)

    def signal_back(signum, frame):
      del signum, frame
      os.kill(os.getpid(), signal.SIGINT)  # Handled once `copy.wait()` is running.

    previous = {sig: signal.signal(sig, handler) for sig, handler in
                ((signal.SIGINT, interrupt), (signal.SIGUSR1, signal_back))}
    self.addCleanup(lambda: [signal.signal(s, h) for s, h in previous.items()])
    self.enter_context(mock.patch.object(exit_status, '_COPIES', []))
    copy = subprocess.Popen([sys.executable, '-c', _COPY], stderr=subprocess.DEVNULL)
    self.addCleanup(copy.kill)
    exit_status.interrupt_with_this_binary(copy)
    copy.wait()
    self.assertEqual(statuses, [-signal.SIGINT])


if __name__ == '__main__':
  absltest.main()
