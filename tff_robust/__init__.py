"""tff_robust: robust aggregation for TensorFlow Federated.

Aggregation factories (plug into `model_aggregator=` of any TFF learning builder):
  GeometricMedianFactory, one_step_geometric_median_factory  (RFA)
  GammaMeanFactory                                           (γ-mean)
  GradientMaskedAveragingFactory                             (GMA)
  SecureCenteredClippingFactory                (centered clipping)
  DifferentiallyPrivateWeightedMeanFactory                   (DP inner mean)
  NonfiniteFilteringFactory               (drops NaN/Inf clients in front of any of them)
  WeightCappingFactory            (caps client weights at a multiple of their median)
  TrustRegionFactory        (bounds the aggregate's norm by the recent rounds')
Every factory is weighted and unweighted (`create(value_type)`: weight 1 per client),
so it also plugs into `build_unweighted_fed_avg`; `unweighted(f)` does the same for any
other weighted factory. `original_rfa` takes the original TFF RFA's arguments
(google-research/federated `robust_aggregation`) with their original meaning.
Personalization (client side: Ditto, personalized RFA): PersonalizationClient.
Learning processes (drop-in for `tff.learning.algorithms.build_weighted_fed_avg`):
  build_robust_federated_aggregation_process, build_one_step_robust_federated_aggregation_process,
  build_process_with_aggregator.
Sub-packages (importing the package imports nothing: every name loads its module on
first use):
  aggregators   the factories above and their building blocks
  iterative     iterative secure aggregates: their steps, defined once, and the
                inner mean every pass calls
  learning      the learning processes and the personalization client
  distributed   execution on TFF workers (`distributed_execution`, `LocalWorkers`,
                secured workers; the learning processes run there as written, their
                aggregation one pass per computation; `passwise`: any factory one
                computation per pass, `runtime.worker_binaries_stopped()`)
  common        argument and type checks, numerics, the weighted-and-unweighted base
`tff_robust.passwise`, `tff_robust.runtime` and `tff_robust.original_rfa` are short
names of `distributed.passwise`, `distributed.runtime` and `aggregators.original_rfa`.
"""

import importlib

# Public name → the module that defines it. Nothing is imported here: every name (and
# every submodule, e.g. `tff_robust.distributed`) is loaded on first use, so that
# `import tff_robust` costs nothing and `python -m tff_robust.distributed --port=N` (a
# worker) starts without TensorFlow and finds its own module not yet imported.
_EXPORTS = {
    'GeometricMedianFactory': 'aggregators.geometric_median',
    'one_step_geometric_median_factory': 'aggregators.geometric_median',
    'GammaMeanFactory': 'aggregators.gamma_mean',
    'GradientMaskedAveragingFactory': 'aggregators.gradient_masking',
    'SecureCenteredClippingFactory': 'aggregators.centered_clipping',
    'DifferentiallyPrivateWeightedMeanFactory': 'aggregators.privacy',
    'NonfiniteFilteringFactory': 'aggregators.nonfinite',
    'WeightCappingFactory': 'aggregators.weight_cap',
    'TrustRegionFactory': 'aggregators.trust_region',
    'build_robust_federated_aggregation_process': 'learning.processes',
    'build_one_step_robust_federated_aggregation_process': 'learning.processes',
    'build_process_with_aggregator': 'learning.processes',
    'PersonalizationClient': 'learning.personalization',
    'unweighted': 'common.weighted_or_unweighted',
}
# The sub-packages, and short names of three of their modules (the same objects).
_SUBMODULES = {
    'aggregators': 'aggregators',
    'common': 'common',
    'distributed': 'distributed',
    'iterative': 'iterative',
    'learning': 'learning',
    'original_rfa': 'aggregators.original_rfa',
    'passwise': 'distributed.passwise',
    'runtime': 'distributed.runtime',
}
__all__ = sorted(_EXPORTS) + sorted(_SUBMODULES)


def __getattr__(name):
  if name in _EXPORTS:
    value = getattr(importlib.import_module(f'{__name__}.{_EXPORTS[name]}'), name)
    globals()[name] = value
    return value
  if name in _SUBMODULES:
    return importlib.import_module(f'{__name__}.{_SUBMODULES[name]}')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return sorted(set(globals()) | set(__all__))
