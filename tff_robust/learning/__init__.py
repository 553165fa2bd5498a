"""Learning processes: the drop-in RFA processes and the personalization client.

  processes           build_robust_federated_aggregation_process,
                      build_one_step_robust_federated_aggregation_process,
                      build_process_with_aggregator
  personalization     PersonalizationClient (Ditto, personalized RFA)
"""
