"""Checks and numerics every part of tff_robust shares.

  arguments               validation of factory arguments, with errors naming the fix
  type_checks             checks of value and weight types
  numerics                norms and finiteness over structures
  secure_sums             the contexts that run secure sums (TFF's test one)
  teardown                TFF's local worker managers at the interpreter's exit
  weighted_or_unweighted  the weighted-and-unweighted base of every factory;
                          `unweighted()`
"""
