"""The experiment side of tff_robust; runs from the repository, never deployed.

  tasks.builders     benchmark tasks: data sources, models, `build_task` (RFA paper App. D)
  tasks.simulation   the simulation harness: attacks, the round loop, client-work
                     variants (FedAvg, Ditto, personalized RFA), evaluation, the
                     checkpointed experiment runner and sweeps
  tasks.binaries     absl-flag binaries: train, sweep, main_job
  tasks.registry     every aggregator and pre-aggregation wrapper by name, from
                     `tff_robust` and `baselines`
  tasks.references   plain-numpy references of aggregators (numpy only): what the
                     adaptive attacks expect, and the tests' independent check

Importing this package imports nothing else.
"""
