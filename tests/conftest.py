"""Test-suite wide set-up: quiet TensorFlow, TFF computations compiled without grappler
(tests/helpers/compilation.py) and with TFF's types deserialized once, a small
gathering queue, deprecations of the project's own code as errors, and no
worker_binary left behind."""

import os
import signal

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# A test process started with SIGINT ignored (a background job of a script, some
# pytest-xdist launches) passes that to the worker_binary children TFF starts, and TFF
# stops its local worker with SIGINT and waits for it: switching execution contexts
# would then wait forever. Children of a handled SIGINT get the default action.
signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # pylint: disable=g-import-not-at-top

from baselines import gather  # pylint: disable=g-import-not-at-top
from tests.helpers import compilation  # pylint: disable=g-import-not-at-top
from tff_robust.common import tff_private  # pylint: disable=g-import-not-at-top
from tff_robust.distributed import runtime  # pylint: disable=g-import-not-at-top

# Before any test builds a context: see tests/helpers/compilation.py.
compilation.use_without_grappler()
# As the binaries do (tasks.binaries.exit_status): TFF returns the same types, sooner.
tff_private.memoize_type_deserialization()
# The gathering queue's capacity changes no result, only how many tensors the
# accumulator's type holds (tests/baselines/test_gather.py holds the rows equal within,
# at and beyond the capacity): 8 slots instead of 128 trace and compile each gathering
# process about 4 times faster, and the tests' rounds of more than 8 clients also take
# the overflow path. Programs the tests start keep the default.
gather.LINEAR_CAPACITY = 8


def pytest_configure(config):
  config.addinivalue_line(
      'markers', 'slow: starts programs that load TensorFlow (binaries, benchmarks, '
      'worker processes) or trains end to end (learning processes, runs with '
      'checkpoints, sweeps, bundled tasks); `pytest -m "not slow"` leaves it out')
  # The project's own code must run under -W error::DeprecationWarning: what warns on
  # this Python fails on a later one (e.g. randrange with a float on 3.12). Warnings
  # raised from dependencies' modules stay warnings.
  config.addinivalue_line(
      'filterwarnings',
      r'error::DeprecationWarning:(tff_robust|baselines|tasks|benchmarks)(\.|$)')
  # pytest-xdist's loadfile hands out the files with the most tests first, so the
  # files of a few long tests (binaries, workers) ran last, on one worker while the
  # other idled. Collection order instead, which `pytest_collection_modifyitems` sets.
  if hasattr(config.option, 'loadscopereorder'):
    config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
  """Files holding a slow test run first: the many short tests then fill the tail."""
  del config
  with_slow = {item.path for item in items if item.get_closest_marker('slow')}
  items.sort(key=lambda item: item.path not in with_slow)


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  runtime.stop_worker_binaries()
