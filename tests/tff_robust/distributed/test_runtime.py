"""tff_robust.distributed.runtime: importing the package changes nothing; the explicit
`worker_binaries_stopped()` leaves no TFF worker_binary behind; `reap` reports what
`subprocess.Popen` would."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.helpers import processes
from tff_robust.distributed import runtime

# Starts subprocesses (programs that import TensorFlow): not in the
# `pytest -m "not slow"` tier.
pytestmark = pytest.mark.slow

RUN_A_COMPUTATION = textwrap.dedent('''
    import numpy as np
    import tensorflow_federated as tff
    import tff_robust
    from tff_robust.distributed import runtime

    def compute():
      process = tff_robust.GeometricMedianFactory().create(
          tff.TensorType(np.float32, [2]), tff.TensorType(np.float32))
      process.next(process.initialize(), [np.ones(2, np.float32)], [1.0])
      print('WORKERS', *runtime.worker_binaries(), flush=True)
''')


def _python(program, **kwargs):
  return subprocess.run([sys.executable, '-c', program], capture_output=True, text=True,
                        timeout=120, env=processes.quiet_env(), **kwargs)


# One program imports the package and the modules that load TFF, and reports what
# the three tests below check (one TensorFlow import, not one a test).
IMPORTING = textwrap.dedent('''
    import atexit, signal
    def mine(signum, frame): pass
    signal.signal(signal.SIGTERM, mine)
    import tensorflow_federated  # Registers exit hooks of its own.
    before = atexit._ncallbacks()
    import tff_robust
    print('KEPT', signal.getsignal(signal.SIGTERM) is mine, atexit._ncallbacks() == before)
    print('LISTED', set(dir(tff_robust)) >= {'distributed', 'passwise',
                                             'GeometricMedianFactory'})
    print('LOADED', tff_robust.distributed.LocalWorkers.__module__,
          tff_robust.passwise.PasswiseFactory.__module__)
    import tff_robust.distributed.distributed_context
    import tff_robust.learning.processes
    import tff_robust.aggregators.geometric_median
    import tasks.builders.task
''')


@pytest.fixture(scope='module')
def importing():
  return _python(IMPORTING, cwd=processes.REPOSITORY)


def _reported(result, key):
  for line in result.stdout.splitlines():
    if line.startswith(key + ' '):
      return line.split()[1:]
  raise AssertionError(f'the program reported no {key} line:\n{result.stderr[-3000:]}')


def test_import_leaves_signal_handlers_and_exit_hooks_alone(importing):
  assert _reported(importing, 'KEPT') == ['True', 'True'], importing.stderr


def test_importing_the_modules_prints_nothing_at_exit(importing):
  # TFF's finalizer of its idle local worker manager ran late in the teardown, where
  # `subprocess` is None: "Exception ignored ... 'NoneType' object has no attribute
  # 'Popen'" at exit.
  assert importing.returncode == 0, importing.stderr[-3000:]
  assert 'Exception ignored' not in importing.stderr, importing.stderr


def test_lazily_loaded_modules_are_package_attributes(importing):
  assert _reported(importing, 'LISTED') == ['True'], importing.stderr
  assert _reported(importing, 'LOADED') == ['tff_robust.distributed.local_workers',
                                            'tff_robust.distributed.passwise']


def test_default_sigterm_handler_stays_default_after_import():
  result = _python('import signal, tff_robust\n'
                   'print(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)',
                   check=True)
  assert result.stdout.split()[-1] == 'True', result.stderr


def test_the_worker_module_is_not_imported_before_it_runs_as_main():
  # `python -m tff_robust.distributed` imports the package first; were the package to
  # import the module too, runpy would warn that it runs a module already loaded.
  result = subprocess.run(
      [sys.executable, '-W', 'default', '-m', 'tff_robust.distributed', '--help'],
      capture_output=True, text=True, timeout=120,
      env=dict(processes.quiet_env(), PYTHONWARNINGS='default'))
  assert '--helpfull' in result.stdout  # The worker_binary's own help: it ran.
  assert 'RuntimeWarning' not in result.stderr, result.stderr


def test_workers_stop_when_the_block_ends():
  # Through a pipe, as in `python x.py | tail`: an orphaned worker would hold it open
  # and run() would only return at the timeout.
  result = _python(RUN_A_COMPUTATION + textwrap.dedent('''
      import signal
      with runtime.worker_binaries_stopped():
        compute()
      print('HANDLER_RESTORED', signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
  '''), check=True)
  workers = processes.reported_workers(result.stdout)
  assert workers, 'the computation should have started a worker_binary'
  assert not processes.running(workers)
  assert 'HANDLER_RESTORED True' in result.stdout
  assert 'Exception ignored' not in result.stderr, result.stderr


def test_workers_stop_when_the_program_is_terminated_inside_the_block():
  program = RUN_A_COMPUTATION + textwrap.dedent('''
      import time
      with runtime.worker_binaries_stopped():
        compute()
        time.sleep(600)
  ''')
  child = subprocess.Popen([sys.executable, '-c', program], stdout=subprocess.PIPE,
                           text=True, env=processes.quiet_env())
  try:
    line = ''
    while not line.startswith('WORKERS'):
      line = child.stdout.readline()
      assert line, 'the child ended before reporting its workers'
    workers = processes.reported_workers(line)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=60) == 128 + signal.SIGTERM
  finally:
    if child.poll() is None:
      child.kill()
  assert workers
  assert not processes.running(workers)


def _start_and_report_workers(program):
  child = subprocess.Popen([sys.executable, '-c', program], stdout=subprocess.PIPE,
                           text=True, env=processes.quiet_env())
  line = ''
  while not line.startswith('WORKERS'):
    line = child.stdout.readline()
    assert line, 'the child ended before reporting its workers'
  return child, processes.reported_workers(line)


def _wait_until_stopped(pids, timeout=20.0):
  deadline = time.monotonic() + timeout
  while processes.running(pids) and time.monotonic() < deadline:
    time.sleep(0.05)
  return processes.running(pids)


def test_workers_stop_when_the_program_is_killed_inside_the_block():
  child, workers = _start_and_report_workers(RUN_A_COMPUTATION + textwrap.dedent('''
      import time
      with runtime.worker_binaries_stopped(even_when_killed=True):
        compute()
        time.sleep(600)
  '''))
  try:
    assert workers
    child.kill()  # SIGKILL: the program itself runs no code any more.
    child.wait(timeout=60)
    assert not _wait_until_stopped(workers)
  finally:
    for pid in processes.running(workers):  # Only if the guardian failed.
      os.kill(pid, signal.SIGKILL)
    if child.poll() is None:
      child.kill()


def test_the_guardian_ends_with_the_block_and_leaves_the_environment_as_found():
  result = _python(RUN_A_COMPUTATION + textwrap.dedent('''
      import os
      from tff_robust.distributed import worker_guardian

      def command_line(pid):
        try:
          with open(f'/proc/{pid}/cmdline', 'rb') as f:
            return f.read()
        except OSError:  # Ended meanwhile.
          return b''

      import time

      with runtime.worker_binaries_stopped(even_when_killed=True):
        token = os.environ[worker_guardian.ENVIRONMENT_VARIABLE].encode()
        # The guardian may not have exec'd yet on a busy machine: its command line is
        # still this program's until then.
        deadline = time.monotonic() + 60
        guardians = []
        while not guardians and time.monotonic() < deadline:
          guardians = [int(p) for p in os.listdir('/proc') if p.isdigit()
                       and worker_guardian.__file__.encode() in command_line(p)
                       and token in command_line(p)]
          time.sleep(0.05)
        compute()
      print('GUARDIANS', *guardians)
      print('ENVIRONMENT', worker_guardian.ENVIRONMENT_VARIABLE in os.environ)
  '''), check=True)
  guardians = [int(p) for p in next(
      l for l in result.stdout.splitlines() if l.startswith('GUARDIANS')).split()[1:]]
  assert len(guardians) == 1, result.stdout
  assert not processes.running(guardians)
  assert not processes.running(processes.reported_workers(result.stdout))
  assert 'ENVIRONMENT False' in result.stdout


@pytest.mark.parametrize('program, code', [
    ('import sys; sys.exit(3)', 3),
    ('import os, signal; os.kill(os.getpid(), signal.SIGKILL)', -signal.SIGKILL),
])
def test_reap_reports_the_exit_code_popen_would(program, code):
  child = subprocess.Popen([sys.executable, '-c', program])
  assert runtime.reap(child.pid) == (True, code)
  assert runtime.reap(child.pid) == (True, None)  # Reaped: no status left to read.
  child.returncode = code  # What Popen would have read.


def test_reap_gives_up_at_the_deadline_and_leaves_the_child_to_a_later_call():
  child = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'],
                           stdin=subprocess.PIPE)
  try:
    assert runtime.reap(child.pid, time.monotonic()) == (False, None)
  finally:
    child.stdin.close()  # It ends now, and a later reap finds its status.
  assert runtime.reap(child.pid) == (True, 0)
  child.returncode = 0


ONE_LINE_SWAP = re.compile(r'## The one-line swap\n\n```python\n(.*?)```', re.DOTALL)


def test_the_readmes_one_line_swap_leaves_no_worker_behind():
  with open(os.path.join(processes.REPOSITORY, 'README.md'), encoding='utf-8') as f:
    snippet = ONE_LINE_SWAP.search(f.read()).group(1)
  prelude = textwrap.dedent('''
      import numpy as np
      import tensorflow as tf
      from tff_robust.distributed import runtime

      def model_fn():
        keras_model = tf.keras.Sequential([
            tf.keras.layers.InputLayer(input_shape=(2,)), tf.keras.layers.Dense(2)])
        return tff.learning.models.from_keras_model(
            keras_model, input_spec=(tf.TensorSpec([None, 2], tf.float32),
                                     tf.TensorSpec([None], tf.int32)),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

      client_datasets = [tf.data.Dataset.from_tensor_slices(
          (np.ones((4, 2), np.float32), np.zeros(4, np.int32))).batch(2)] * 3
      num_rounds = 1
  ''')
  after = textwrap.dedent('''
      print('LEFT', *runtime.worker_binaries(), flush=True)
      process.next(state, client_datasets)  # Outside the block: a worker stays.
      print('WORKERS', *runtime.worker_binaries(), flush=True)
      with runtime.worker_binaries_stopped():
        pass
  ''')
  result = _python('import tensorflow_federated as tff\n' + prelude + snippet + after,
                   check=True)
  left = next(line for line in result.stdout.splitlines() if line.startswith('LEFT'))
  assert left.split()[1:] == [], result.stdout
  assert processes.reported_workers(result.stdout), 'the check must see a worker'
