"""benchmarks.gm_start_study: its table and choice of start from sweep summaries, and
the committed page a tiny real study writes."""

import os
import subprocess
import sys
import tempfile

from absl.testing import absltest
import pytest

from benchmarks import gm_start_report
from tests.helpers import processes

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _row(attack, rho, accuracies):
  return dict(attack=attack, rho=rho, num_seeds=len(accuracies), num_diverged=0,
              final_accuracy_mean=sum(accuracies) / len(accuracies),
              final_accuracy_min=min(accuracies), final_accuracy_max=max(accuracies))


def _summary(clean, omniscient, ipm):
  return [_row('none', 0.0, clean), _row('omniscient', 0.25, omniscient),
          _row('ipm', 0.25, ipm)]


class StudyTableTest(absltest.TestCase):

  def test_worst_case_is_the_lowest_attacked_mean_and_the_choice_its_best(self):
    summaries = dict(
        mean=_summary([0.85, 0.86], [0.60, 0.66], [0.81, 0.82]),    # worst 63.0
        zero=_summary([0.85, 0.86], [0.68, 0.70], [0.76, 0.78]),    # worst 69.0
        previous=_summary([0.85, 0.86], [0.67, 0.69], [0.80, 0.81]))  # worst 68.0
    table, decision = gm_start_report.study_table(summaries, clean_margin=0.5)
    lines = table.splitlines()
    self.assertEqual(lines[0], '| initial_point | clean ρ=0 | omniscient ρ=0.25 | '
                     'ipm ρ=0.25 | worst case |')
    self.assertEqual(lines[2], '| mean | 85.5 [85.0, 86.0] | 63.0 [60.0, 66.0] | '
                     '81.5 [81.0, 82.0] | 63.0 |')
    self.assertEqual([line.split(' | ')[-1] for line in lines[2:]],
                     ['63.0 |', '69.0 |', '68.0 |'])
    self.assertIn("'zero' (69.0;", decision)

  def test_a_start_that_loses_too_much_clean_accuracy_is_not_chosen(self):
    summaries = dict(
        mean=_summary([0.85], [0.60], [0.80]),
        zero=_summary([0.84], [0.70], [0.80]))  # Best worst case, 1 point less clean.
    _, decision = gm_start_report.study_table(summaries, clean_margin=0.5)
    self.assertIn("'mean' (60.0;", decision)
    _, decision = gm_start_report.study_table(summaries, clean_margin=2.0)
    self.assertIn("'zero' (70.0;", decision)


  def test_the_default_stays_unless_beaten_by_more_than_the_margin(self):
    summaries = dict(
        zero=_summary([0.85], [0.411], [0.80]),        # worst 41.1
        previous=_summary([0.85], [0.4112], [0.81]))   # worst 41.12: within noise
    _, decision = gm_start_report.study_table(
        summaries, clean_margin=0.5, incumbent='zero', worst_case_margin=0.5)
    self.assertIn("'zero' (41.1;", decision)
    self.assertIn("kept: 'previous' is not better by more than 0.5 points", decision)
    _, decision = gm_start_report.study_table(
        summaries, clean_margin=0.5, incumbent='zero', worst_case_margin=0.0)
    self.assertIn("'previous' (41.1;", decision)
    summaries['previous'] = _summary([0.85], [0.43], [0.81])  # Better by 1.9 points.
    _, decision = gm_start_report.study_table(
        summaries, clean_margin=0.5, incumbent='zero', worst_case_margin=0.5)
    self.assertIn("'previous' (43.0;", decision)


class ResultsPageTest(absltest.TestCase):

  @pytest.mark.slow  # Runs the study's binary.
  def test_page_names_its_command_without_the_output_paths(self):
    with tempfile.TemporaryDirectory() as directory:
      page_path = os.path.join(directory, 'results', 'study.md')
      result = subprocess.run(
          [sys.executable, '-m', 'benchmarks.gm_start_study', '--seeds=0', '--rhos=0',
           '--rounds=1', '--eval_period=1', '--starts=zero',
           f'--output_dir={directory}/runs', f'--results_markdown={page_path}',
           '--noprogress'],
          cwd=_REPO, capture_output=True, text=True, timeout=900,
          env=processes.quiet_env())
      self.assertEqual(result.returncode, 0, result.stderr[-3000:])
      with open(page_path, encoding='utf-8') as f:
        page = f.read()
      with open(os.path.join(directory, 'runs', 'study.md'), encoding='utf-8') as f:
        study = f.read()
    self.assertEqual(page.splitlines()[0], '<!-- Written by `python -m '
                     'benchmarks.gm_start_study --seeds=0 --rhos=0 --rounds=1 '
                     '--eval_period=1 --starts=zero`; rerun it to update. -->')
    self.assertTrue(page.endswith(study))
    self.assertIn('| zero | ', page)


if __name__ == '__main__':
  absltest.main()
