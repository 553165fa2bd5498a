"""The main job's README update: only the marked section changes."""

from tasks import main_job


def test_update_readme_replaces_only_the_marked_section(tmp_path):
  readme = tmp_path / 'README.md'
  readme.write_text(f'intro\n{main_job.README_BEGIN}\nold table\n'
                    f'{main_job.README_END}\noutro\n', encoding='utf-8')
  main_job.update_readme(str(readme), '| new | table |\n')
  assert readme.read_text(encoding='utf-8') == (
      f'intro\n{main_job.README_BEGIN}\n| new | table |\n{main_job.README_END}\noutro\n')


def test_update_readme_without_markers_leaves_the_file_alone(tmp_path):
  readme = tmp_path / 'README.md'
  readme.write_text('no markers here\n', encoding='utf-8')
  main_job.update_readme(str(readme), 'table')
  assert readme.read_text(encoding='utf-8') == 'no markers here\n'
