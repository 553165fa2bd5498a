"""The leaderboard: worst case over attacks per aggregator, ranking, table, heatmap."""

import math
import os
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from baselines import coordinatewise
from baselines import wrappers
from tasks import registry
from tasks.simulation import attacks
from tasks.simulation import leaderboard


def _row(aggregator, attack, rho, accuracy):
  return dict(aggregator=aggregator, attack=attack, rho=rho,
              final_accuracy_mean=accuracy, final_accuracy_min=accuracy,
              final_accuracy_max=accuracy, num_seeds=1, num_diverged=0,
              secure_average_calls_per_round=1.0)


# Two attacks at two corruption levels; the sweep repeats the clean cell per attack.
_SUMMARY = [
    _row('mean', 'alie', 0.0, 0.90), _row('mean', 'alie', 0.1, 0.50),
    _row('mean', 'alie', 0.25, 0.20), _row('mean', 'ipm', 0.0, 0.90),
    _row('mean', 'ipm', 0.1, 0.60), _row('mean', 'ipm', 0.25, 0.10),
    _row('gm', 'alie', 0.0, 0.88), _row('gm', 'alie', 0.1, 0.80),
    _row('gm', 'alie', 0.25, 0.70), _row('gm', 'ipm', 0.0, 0.88),
    _row('gm', 'ipm', 0.1, 0.85), _row('gm', 'ipm', 0.25, 0.75),
]


class WorstCasesTest(parameterized.TestCase):

  def test_worst_attack_per_rho_and_ranking(self):
    rows = leaderboard.worst_cases(_SUMMARY)
    self.assertEqual([r['aggregator'] for r in rows], ['gm', 'mean'])
    gm, mean = rows
    self.assertEqual(gm['clean'], 0.88)
    self.assertEqual((gm['worst_rho0.1'], gm['worst_attack_rho0.1']), (0.80, 'alie'))
    self.assertEqual((gm['worst_rho0.25'], gm['worst_attack_rho0.25']), (0.70, 'alie'))
    self.assertEqual((mean['worst_rho0.1'], mean['worst_attack_rho0.1']), (0.50, 'alie'))
    self.assertEqual((mean['worst_rho0.25'], mean['worst_attack_rho0.25']), (0.10, 'ipm'))

  def test_a_missing_cell_makes_the_worst_case_unknown_and_ranks_last(self):
    summary = [dict(r) for r in _SUMMARY]
    for row in summary:
      if row['aggregator'] == 'gm' and row['attack'] == 'ipm' and row['rho'] == 0.25:
        row['final_accuracy_mean'] = math.nan
    rows = leaderboard.worst_cases(summary)
    self.assertEqual([r['aggregator'] for r in rows], ['mean', 'gm'])
    self.assertTrue(math.isnan(rows[1]['worst_rho0.25']))
    self.assertIn('| 2 | gm | 88.0 | 80.0 (alie) | n/a (alie) |',
                  leaderboard.markdown_table(rows))

  def test_markdown_table(self):
    table = leaderboard.markdown_table(leaderboard.worst_cases(_SUMMARY))
    self.assertEqual(table.splitlines(), [
        '| rank | aggregator | clean | worst case ρ=0.1 | worst case ρ=0.25 |',
        '|---:|---|---:|---:|---:|',
        '| 1 | gm | 88.0 | 80.0 (alie) | 70.0 (alie) |',
        '| 2 | mean | 90.0 | 50.0 (alie) | 10.0 (ipm) |',
    ])

  def test_several_seeds_show_their_range_and_divergences(self):
    summary = [dict(r) for r in _SUMMARY]
    for row in summary:
      if row['aggregator'] == 'gm':
        row.update(num_seeds=3, final_accuracy_min=row['final_accuracy_mean'] - 0.05,
                   final_accuracy_max=row['final_accuracy_mean'] + 0.02)
        if row['attack'] == 'alie' and row['rho'] == 0.25:
          row['num_diverged'] = 1
    gm_line = leaderboard.markdown_table(leaderboard.worst_cases(summary)).splitlines()[2]
    self.assertEqual(gm_line, '| 1 | gm | 88.0 [83.0, 90.0] | 80.0 [75.0, 82.0] (alie) '
                              '| 70.0 [65.0, 72.0] (1 diverged) (alie) |')

  def test_heatmap_is_written(self):
    path = os.path.join(tempfile.mkdtemp(), 'heatmap.png')
    leaderboard.plot_heatmap(_SUMMARY, leaderboard.worst_cases(_SUMMARY), path, 'test')
    self.assertGreater(os.path.getsize(path), 5000)


# The grid of the committed leaderboard pages and ledger, as it was listed by hand
# before it was derived from the registries. A new aggregator or attack changes it
# (the pages gain its rows or columns at the next full run): extend it here with it.
_COMMITTED_AGGREGATORS = [
    'mean', 'gm', 'one_step_gm', 'gamma_mean', 'gma', 'median', 'trimmed_mean', 'krum',
    'multi_krum', 'norm_clipping', 'centered_clipping', 'secure_centered_clipping',
    'bucketing+median', 'bucketing+trimmed_mean', 'bucketing+krum',
    'bucketing+multi_krum', 'bucketing+centered_clipping', 'bucketing+gm',
    'nnm+median', 'nnm+trimmed_mean', 'nnm+krum', 'nnm+multi_krum',
    'nnm+centered_clipping', 'nnm+gm',
    'arc+mean', 'arc+gm', 'arc+median', 'arc+krum', 'trust+gm', 'trust+one_step_gm']
_COMMITTED_ATTACKS = [
    'gaussian', 'omniscient', 'sign_flip', 'alie', 'ipm', 'zero_update', 'tiny_update',
    'far_update', 'random_gaussian', 'min_max', 'min_sum', 'mimic', 'optimal_alie',
    'optimal_ipm', 'model_replacement', 'label_flip']


class DefaultGridTest(parameterized.TestCase):

  @parameterized.parameters(*leaderboard.DEFAULT_AGGREGATORS)
  def test_every_default_aggregator_builds(self, name):
    # By name alone, as the binary builds it: wrappers and f from the run's ρ.
    registry.aggregator_from_name(name, assumed_byzantine_fraction=0.25)

  def test_the_derived_grid_is_the_committed_one(self):
    self.assertEqual(leaderboard.DEFAULT_AGGREGATORS, _COMMITTED_AGGREGATORS)
    self.assertEqual(leaderboard.DEFAULT_ATTACKS, _COMMITTED_ATTACKS)

  def test_a_new_aggregator_is_in_the_grid_plain_and_behind_the_wrappers_it_takes(self):
    with mock.patch.dict(registry.AGGREGATORS, {
        'new_gathering': coordinatewise.CoordinateWiseMedianFactory,
        'new_secure': wrappers.mean_factory}):
      grid = leaderboard.default_aggregators()
    new = [name for name in grid if 'new_' in name]
    self.assertEqual(new, ['new_gathering', 'new_secure', 'bucketing+new_gathering',
                           'nnm+new_gathering', 'arc+new_gathering', 'arc+new_secure',
                           'trust+new_gathering', 'trust+new_secure'])
    self.assertEqual([name for name in grid if 'new_' not in name],
                     _COMMITTED_AGGREGATORS)

  def test_a_new_wrapper_is_in_the_grid(self):
    with mock.patch.dict(registry.WRAPPERS, {'new_wrapper': registry.WRAPPERS['arc']}):
      grid = leaderboard.default_aggregators()
    self.assertEqual([name for name in grid if name.startswith('new_wrapper+')],
                     [f'new_wrapper+{name}' for name in registry.known_aggregators()
                      if name not in leaderboard.EXCLUDED_AGGREGATORS])

  def test_a_new_update_attack_is_in_the_grid(self):
    with mock.patch.dict(attacks.UPDATE_ATTACKS, {'new_attack': attacks.SignFlip}):
      grid = leaderboard.default_attacks()
    self.assertEqual(grid, _COMMITTED_ATTACKS[:-1] + ['new_attack', 'label_flip'])

  def test_a_new_data_attack_is_in_the_grid(self):
    with mock.patch.dict(leaderboard.TASK_DATA_ATTACKS, {'new_data': lambda d: d}):
      self.assertEqual(leaderboard.default_attacks(),
                       _COMMITTED_ATTACKS + ['new_data'])

  def test_every_exclusion_is_a_candidate_with_a_reason(self):
    # A stale entry (an aggregator or attack renamed or removed) fails here.
    for excluded, candidates in (
        (leaderboard.EXCLUDED_AGGREGATORS, leaderboard.candidate_aggregators()),
        (leaderboard.EXCLUDED_ATTACKS, leaderboard.candidate_attacks())):
      self.assertContainsSubset(excluded, candidates)
      for name, reason in excluded.items():
        self.assertIsInstance(reason, str, name)
        self.assertGreater(len(reason), 20, name)


if __name__ == '__main__':
  absltest.main()
