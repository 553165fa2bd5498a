"""The errors of a run's output directory, each a one-line message naming the fix."""


class NonFiniteStateError(RuntimeError):
  """A round produced a non-finite model, non-finite losses or accuracy
  (`metrics_file.FINITE_METRICS`), or too few finite client updates to aggregate;
  the finished rounds are kept."""


class ConfigMismatchError(ValueError):
  """The output directory holds a run with a different configuration.

  The message is one line: the problem, then the fix.

  Attributes:
    problem: What differs (the keys and values, or the rounds).
    fix: What the user can do.
  """

  def __init__(self, problem: str, fix: str):
    self.problem = problem
    self.fix = fix
    super().__init__(f'{problem}. {fix}')


class RunFileError(RuntimeError):
  """A file of a run's output directory is unreadable or inconsistent.

  The message is one line: the file, what is wrong with it and the fix.

  Attributes:
    path: The file or directory.
    problem: What is wrong with it.
    fix: What the user can do.
  """

  def __init__(self, path: str, problem: str, fix: str):
    self.path = path
    self.problem = problem
    self.fix = fix
    super().__init__(f'{path}: {problem}. {fix}')


def one_line(error: BaseException, limit: int = 200) -> str:
  """An exception as a short single line (TF's messages span several lines)."""
  text = ' '.join(str(error).split()) or type(error).__name__
  return text if len(text) <= limit else text[:limit - 1] + '…'
