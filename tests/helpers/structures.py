"""Comparing nested results (TFF structures, dicts, lists, attrs classes such as
`LearningProcessOutput`) leaf by leaf, as the distributed tests do: the same names in
the same order, every leaf within a relative tolerance of its norm."""

import numpy as np
import tensorflow_federated as tff

# Results on workers against one process: sums taken in another order across workers
# differ by ~1e-7 relative.
RELATIVE_TOLERANCE = 1e-6


def _elements(structure) -> list:
  return list(tff.structure.to_elements(
      tff.structure.from_container(structure, recursive=True)))


def leaves(structure) -> list[np.ndarray]:
  return [np.asarray(leaf, np.float64) for leaf in tff.structure.flatten(
      tff.structure.from_container(structure, recursive=True))]


def assert_same_structure(actual, expected):
  """The same names at the top level, and the same number of leaves."""
  assert [name for name, _ in _elements(actual)] == [
      name for name, _ in _elements(expected)]
  assert len(leaves(actual)) == len(leaves(expected))


def assert_same(actual, expected, rtol: float = RELATIVE_TOLERANCE):
  """Same structure; every leaf within `rtol` of the expected (relative to its norm),
  or equal to it (an infinite or NaN leaf, e.g. a bound not set yet)."""
  assert_same_structure(actual, expected)
  for a, e in zip(leaves(actual), leaves(expected)):
    assert a.shape == e.shape
    if np.array_equal(a, e, equal_nan=True):
      continue
    assert np.linalg.norm(a - e) <= rtol * max(np.linalg.norm(e), 1e-30), (a, e)
