"""The suite's warning filters (tests/conftest.py): a DeprecationWarning raised from
the project's own modules fails the test, as it will fail the code on a later Python."""

import warnings

import pytest


@pytest.mark.parametrize('module', ['tff_robust.distributed.runtime', 'baselines.krum',
                                    'tasks.simulation.loop', 'benchmarks.round_time'])
def test_a_deprecation_warning_of_the_project_is_an_error(module):
  with pytest.raises(DeprecationWarning):
    warnings.warn_explicit('deprecated', DeprecationWarning, 'x.py', 1, module=module)


@pytest.mark.parametrize('module', ['keras.src.backend', 'tasks_elsewhere'])
def test_a_deprecation_warning_of_another_module_is_not(module):
  with pytest.warns(DeprecationWarning):
    warnings.warn_explicit('deprecated', DeprecationWarning, 'x.py', 1, module=module)
