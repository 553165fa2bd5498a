"""Test-suite wide set-up: quiet TensorFlow, and no worker_binary left behind."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import pytest  # pylint: disable=g-import-not-at-top

from tff_robust import runtime  # pylint: disable=g-import-not-at-top


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  runtime.stop_worker_binaries()
