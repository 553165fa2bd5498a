"""Cells and pages of the benchmarks' markdown tables."""

from typing import Sequence

import numpy as np


def accuracy_cell(values: Sequence[float]) -> str:
  """Accuracies (fractions) as a percentage cell: one value, or the mean [min, max]
  over several; empty for none."""
  values = [100 * v for v in values]
  if not values:
    return ''
  if len(values) == 1:
    return f'{values[0]:.1f}'
  return f'{np.mean(values):.1f} [{min(values):.1f}, {max(values):.1f}]'


def print_and_write(text: str, path: str) -> None:
  """Prints a page and, if `path` is not empty, writes it there."""
  print(text)
  if path:
    with open(path, 'w', encoding='utf-8') as f:
      f.write(text)
