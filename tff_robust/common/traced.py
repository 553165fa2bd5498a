"""Builders of TFF TensorFlow computations, traced once per process for each list of
arguments.

Tracing a `tff.tensorflow.computation` builds its TensorFlow graph in Python; an
aggregation process holds dozens of them, most depending only on the value type and a
few constants. A builder wrapped by `once` returns the computations it returned before
for equal arguments, so a process created again (another factory instance, a sweep's
next cell, a test) reuses them, and TFF's compiler, which caches by a computation's
proto, finds the composed computation already compiled.

A wrapped builder must depend on nothing but its arguments, and they must be hashable
(TFF types compare their Python containers too, so an `OrderedDict` type and a `list`
type of the same fields are different keys; arguments of different Python types, such
as `1` and `True`, are different keys too): a module constant that a caller may change
belongs among the arguments.
"""

import functools

# Per builder: far more than the distinct value types and constants of one program.
MAX_ENTRIES = 256


def once(builder):
  """`builder`, returning its earlier result for arguments equal to earlier ones
  (a least-recently-used cache of `MAX_ENTRIES`)."""
  return functools.lru_cache(maxsize=MAX_ENTRIES, typed=True)(builder)
