"""The secure-compatible aggregation factories and their building blocks.

  geometric_median    GeometricMedianFactory, one_step_geometric_median_factory (RFA)
  gamma_mean          GammaMeanFactory (γ-mean)
  gradient_masking    GradientMaskedAveragingFactory (GMA)
  centered_clipping   SecureCenteredClippingFactory
  privacy             DifferentiallyPrivateWeightedMeanFactory (a DP inner mean) and
                      SIDE_CHANNELS (what reaches the server un-noised beside it)
  accounting          ε(δ) of a run with the DP inner mean (dp_accounting)
  nonfinite           NonfiniteFilteringFactory (drops NaN/Inf clients and unusable
                      weights: negative, subnormal, non-finite)
  weight_cap          WeightCappingFactory (caps client weights at a multiple of their
                      median, from one secure sum)
  trust_region        TrustRegionFactory (the aggregate's norm at most a multiple of
                      the recent rounds' median, server-side)
  original_rfa        the original TFF RFA's entry points, with their meaning
  robust_scale        the clients' typical distance behind the GM's relative ν, and
                      the trimmed start's radius histogram
"""
