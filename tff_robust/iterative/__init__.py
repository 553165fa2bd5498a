"""Iterative secure aggregates: sequences of secure weighted means, defined once.

  iterative_steps     the step protocol (`IterativeSteps`), its two drivers (one
                      computation: `fused_process`; one per pass: `PassByPass`) and the
                      base `IterativeAggregationFactory`
  iterative_mean      the inner weighted mean every pass calls, and the shared steps
  contributions       what each client contributes to a pass's aggregations and the
                      bound an honest client meets (checked by a range-checking
                      secure aggregation; the simulation's protocol attacks' seam)

`tff_robust.distributed.passwise` runs any of them one computation per pass, what TFF
workers can run.
"""
