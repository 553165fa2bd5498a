"""The registry's iterative secure aggregates return what they returned before their
steps were defined once (`tff_robust.iterative.iterative_steps`): results, measurements and states
of two calls, float32 and float64, with a NaN client and with a far client, fused and
pass by pass, against `golden/iterative_registry.json`.

The golden file holds the fused outputs of the code before that change (both drivers
were bit-identical then, and are now; written by `write_golden` from
`tests.tff_robust.iterative.iterative_golden`'s recording; the 'gm' entries were
recorded again when its default start became 'trimmed'). Structure, names, dtypes and
shapes must match exactly, values to 1e-6 of each leaf's norm (not bit for bit: other
CPUs may round TensorFlow's kernels differently).
"""

import json
import pathlib

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tests.tff_robust.iterative import iterative_golden

GOLDEN = pathlib.Path(__file__).parent / 'golden' / 'iterative_registry.json'
DTYPES = ('float32', 'float64')
DRIVERS = ('fused', 'passwise')


def _without_driver(outputs, driver):
  return {key.replace(f'|{driver}|', '|'): value for key, value in outputs.items()
          if f'|{driver}|' in key}


def write_golden(recorded_directory):
  """Writes GOLDEN from `iterative_golden record`'s files (the fused outputs)."""
  golden = {}
  for name in iterative_golden.REGISTRY:
    recorded = dict(np.load(pathlib.Path(recorded_directory) / f'{name}.npz'))
    recorded = {k: v for k, v in recorded.items()
                if k.split('|')[1] in DTYPES}
    golden.update(iterative_golden.to_json(_without_driver(recorded, 'fused')))
  GOLDEN.parent.mkdir(exist_ok=True)
  lines = [f'{json.dumps(key)}: {json.dumps(golden[key])}' for key in sorted(golden)]
  GOLDEN.write_text('{\n' + ',\n'.join(lines) + '\n}\n')  # One entry a line.


class GoldenOutputsTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.golden = iterative_golden.from_json(json.loads(GOLDEN.read_text()))

  @parameterized.named_parameters((name, name) for name in iterative_golden.REGISTRY)
  def test_both_drivers_return_the_golden_outputs(self, name):
    outputs = iterative_golden.run_config(name, drivers=DRIVERS, dtypes=DTYPES)
    expected = {k: v for k, v in self.golden.items() if k.startswith(f'{name}|')}
    self.assertNotEmpty(expected)
    for driver in DRIVERS:
      problems = iterative_golden.differences(
          expected, _without_driver(outputs, driver), exact=False)
      self.assertEmpty(problems, f'{driver}: ' + '\n'.join(problems[:20]))


if __name__ == '__main__':
  tf.test.main()
