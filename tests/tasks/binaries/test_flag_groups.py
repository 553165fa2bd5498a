"""Parse-time checks of the binaries' shared flags: an output path the binary could not
write (`flag_groups.validate_output_paths`) or an impossible --byzantine_fraction stops
it before training, naming the flag."""

import os
import shutil
import tempfile
from unittest import mock

from absl import flags
from absl.testing import absltest
from absl.testing import parameterized

from baselines import krum
from baselines import nnm
from tasks.binaries import aggregator_flags
from tasks.binaries import flag_groups


class ValidateOutputPathsTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.root = tempfile.mkdtemp(prefix='test_flag_groups_')
    self.addCleanup(shutil.rmtree, self.root)
    self.file = os.path.join(self.root, 'a_file')
    with open(self.file, 'w') as f:
      f.write('x')
    self.flag_values = flags.FlagValues()
    for name in ('out', 'page', 'readme'):
      flags.DEFINE_string(name, '', '', flag_values=self.flag_values)
    flag_groups.validate_output_paths(directories=['out'], files=['page'],
                                      existing_files=['readme'],
                                      flag_values=self.flag_values)

  def _parse(self, **values):
    self.flag_values(['binary'] + [f'--{k}={v.format(root=self.root, file=self.file)}'
                                   for k, v in values.items()])

  @parameterized.named_parameters(
      ('empty_skips_the_output', dict(out='', page='', readme='')),
      ('new_nested_directory', dict(out='{root}/new/deeper')),
      ('existing_directory', dict(out='{root}')),
      ('new_file_in_a_new_directory', dict(page='{root}/new/page.md')),
      ('bare_file_name', dict(page='page.md')),
      ('existing_file_to_edit', dict(readme='{file}')),
  )
  def test_writable_paths_pass(self, values):
    self._parse(**values)

  @parameterized.named_parameters(
      ('directory_is_a_file', dict(out='{file}'), '--out=.*a_file is a file'),
      ('directory_under_a_file', dict(out='{file}/run'), '--out=.*a_file is a file'),
      ('file_under_a_file', dict(page='{file}/page.md'), '--page=.*a_file is a file'),
      # Taken literally, as os.makedirs will: `..` is not folded away.
      ('back_out_of_a_file', dict(out='{file}/../run'), '--out=.*a_file is a file'),
      ('file_is_a_directory', dict(page='{root}'), '--page=.*is a directory'),
      ('edited_file_missing', dict(readme='{root}/none.md'), '--readme=.*no such file'),
  )
  def test_unwritable_paths_are_refused_naming_the_flag(self, values, message):
    with self.assertRaisesRegex(flags.IllegalFlagValueError,
                                message + '.*; pass another path'):
      self._parse(**values)

  @parameterized.named_parameters(
      ('directory_to_create_in', dict(out='{root}/run'),
       '--out=.*/run: .* is not writable'),
      ('new_file_in_a_denied_directory', dict(page='{root}/page.md'),
       '--page=.* is not writable'),
      ('file_to_edit', dict(readme='{file}'), '--readme=.*a_file: is not writable'))
  def test_paths_without_write_permission_are_refused(self, values, message):
    # Permissions are stubbed: as root (CI may be) chmod would not deny anything.
    denied, access = {self.root, self.file}, os.access
    with mock.patch.object(os, 'access',
                           lambda path, mode: path not in denied and access(path, mode)):
      with self.assertRaisesRegex(flags.IllegalFlagValueError, message):
        self._parse(**values)


class ByzantineFractionFlagTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.flag_values = flags.FlagValues()
    aggregator_flags.define_byzantine_fraction_flag(flag_values=self.flag_values)

  @parameterized.named_parameters(('half', '0.5'), ('negative', '-0.1'), ('nan', 'nan'))
  def test_impossible_fractions_are_refused(self, value):
    with self.assertRaisesRegex(flags.IllegalFlagValueError,
                                r'--byzantine_fraction must be in \[0, 0.5\)'):
      self.flag_values(['binary', f'--byzantine_fraction={value}'])

  def test_the_fraction_reaches_an_aggregator_inside_a_wrapper(self):
    self.flag_values(['binary', '--byzantine_fraction=0.1'])
    factory = aggregator_flags.aggregator_from_flag('nnm+krum', self.flag_values)
    wrapped = []
    while not isinstance(factory, krum.KrumFactory):
      wrapped.append(type(factory))
      factory = factory.inner
    self.assertIn(nnm.NearestNeighborMixingFactory, wrapped)
    # The registry's default fraction, 0.25, would give f = 5.
    self.assertEqual(factory.num_byzantine_for(20), 2)


if __name__ == '__main__':
  absltest.main()
