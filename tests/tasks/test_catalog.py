"""tasks.catalog: the names the binaries' flags take before TensorFlow is imported
are the ones the modules importing it implement."""

import pytest

from tasks import builders
from tasks import catalog
from tasks.builders import emnist
from tasks.builders import sent140
from tasks.builders import shakespeare
from tasks.simulation import client_work
from tasks.simulation.attacks import weights
from tff_robust.aggregators import weight_cap

_TASK_MODULES = {'emnist': emnist, 'shakespeare': shakespeare, 'sent140': sent140}


@pytest.mark.parametrize('task', sorted(catalog.TASKS))
def test_every_built_in_task_implements_its_names(task):
  module, spec = _TASK_MODULES[task], catalog.TASKS[task]
  assert module.MODELS == spec['models']
  assert module.SOURCES == spec['sources']
  assert tuple(module.DATA_ATTACKS) == spec['data_attacks']
  assert builders.known_tasks()[task] == spec


def test_the_catalog_lists_every_built_in_task():
  assert set(catalog.TASKS) == set(_TASK_MODULES)


def test_the_client_works_are_the_catalogs():
  assert tuple(client_work.CLIENT_WORKS) == catalog.CLIENT_WORKS


def test_the_adaptive_weight_attack_defaults_to_the_weight_caps_defaults():
  attack = weights.AdaptiveWeight()
  assert (attack.quantile, attack.multiple) == (weight_cap.DEFAULT_QUANTILE,
                                                weight_cap.DEFAULT_MULTIPLE)


def test_task_errors_are_one_class():
  assert builders.TaskError is catalog.TaskError is builders.task.TaskError
