"""No TFF worker_binary outlives a Python process that imported tff_robust."""

import os
import signal
import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent('''
    import numpy as np
    import tensorflow_federated as tff
    import tff_robust
    from tff_robust import runtime

    process = tff_robust.GeometricMedianFactory().create(
        tff.TensorType(np.float32, [2]), tff.TensorType(np.float32))
    process.next(process.initialize(), [np.ones(2, np.float32)], [1.0])
    print('WORKERS', *runtime.worker_binaries())
''')


def is_running(pid: int) -> bool:
  try:
    with open(f'/proc/{pid}/stat', 'rb') as f:
      return f.read().rsplit(b')', 1)[1].split()[0] != b'Z'
  except OSError:
    return False


def test_worker_binary_stops_with_the_interpreter():
  # Through a pipe, as in `python x.py | tail`: an orphaned worker would hold it open
  # and communicate() would only return at the timeout.
  result = subprocess.run(
      [sys.executable, '-c', PROGRAM], capture_output=True, text=True, timeout=120,
      check=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
  line = next(l for l in result.stdout.splitlines() if l.startswith('WORKERS'))
  workers = [int(pid) for pid in line.split()[1:]]
  assert workers, 'the computation should have started a worker_binary'
  assert not [pid for pid in workers if is_running(pid)]
  assert 'Exception ignored' not in result.stderr, result.stderr


def test_worker_binary_stops_when_the_interpreter_is_terminated():
  program = PROGRAM + "import sys, time\nsys.stdout.flush()\ntime.sleep(600)\n"
  child = subprocess.Popen(
      [sys.executable, '-c', program], stdout=subprocess.PIPE, text=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
  try:
    line = ''
    while not line.startswith('WORKERS'):
      line = child.stdout.readline()
      assert line, 'the child ended before reporting its workers'
    workers = [int(pid) for pid in line.split()[1:]]
    child.send_signal(signal.SIGTERM)
    child.wait(timeout=60)
  finally:
    if child.poll() is None:
      child.kill()
  assert workers
  assert not [pid for pid in workers if is_running(pid)]
