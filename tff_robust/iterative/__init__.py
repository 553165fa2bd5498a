"""Iterative secure aggregates: sequences of secure weighted means, defined once.

  iterative_steps     the step protocol (`IterativeSteps`), its two drivers (one
                      computation: `fused_process`; one per pass: `PassByPass`) and the
                      base `IterativeAggregationFactory`
  iterative_mean      the inner weighted mean every pass calls, and the shared steps

`tff_robust.distributed.passwise` runs any of them one computation per pass, what TFF
workers can run.
"""
