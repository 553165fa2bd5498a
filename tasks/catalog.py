"""The names the binaries' flags choose from, importable without TensorFlow.

A binary parses and checks its flags before it imports TensorFlow
(`tasks.binaries`), so the names that live in modules importing it are declared here
and read from here by those modules (tests/tasks/test_catalog.py checks that each
implements exactly these):

  TASKS         built-in task → its models, data sources and data attacks
                (`tasks.builders.<task>`: MODELS, SOURCES, DATA_ATTACKS)
  CLIENT_WORKS  what a selected client computes (`tasks.simulation.client_work`)
  TaskError     a task that does not follow the `tasks.builders.Task` protocol, or a
                --task that names none (raised while the flags are checked, too)

The aggregators' and attacks' names come from their registries, which import
TensorFlow only to build (`tasks.registry`, `tasks.simulation.attacks`).
"""

TASKS = {
    'emnist': {'models': ('linear', 'cnn', 'small_cnn'),
               'sources': ('tff', 'bundled', 'synthetic'),
               'data_attacks': ('data', 'label_flip')},
    'shakespeare': {'models': ('lstm',),
                    'sources': ('tff', 'bundled', 'synthetic'),
                    'data_attacks': ('data',)},
    'sent140': {'models': ('linear',),
                'sources': ('leaf', 'csv', 'bundled', 'synthetic'),
                'data_attacks': ('data', 'label_flip')},
}

CLIENT_WORKS = ('fedavg', 'ditto', 'personalized_rfa')


class TaskError(ValueError):
  """A task does not follow the `Task` protocol, or --task does not name one; the
  message names the problem and the fix (one line: the binaries print it as is)."""
