"""tff_robust: robust aggregation for TensorFlow Federated.

Aggregation factories (plug into `model_aggregator=` of any TFF learning builder):
  GeometricMedianFactory, one_step_geometric_median_factory  (RFA)
  GammaMeanFactory                                           (γ-mean)
  GradientMaskedAveragingFactory                             (GMA)
  SecureCenteredClippingFactory                (centered clipping)
  DifferentiallyPrivateWeightedMeanFactory                   (DP inner mean)
  NonfiniteFilteringFactory               (drops NaN/Inf clients in front of any of them)
Every factory is weighted and unweighted (`create(value_type)`: weight 1 per client),
so it also plugs into `build_unweighted_fed_avg`; `unweighted(f)` does the same for any
other weighted factory. `original_rfa` takes the original TFF RFA's arguments
(google-research/federated `robust_aggregation`) with their original meaning.
Personalization (client side: Ditto, personalized RFA): PersonalizationClient.
Learning processes (drop-in for `tff.learning.algorithms.build_weighted_fed_avg`):
  build_robust_federated_aggregation_process, build_one_step_robust_federated_aggregation_process,
  build_process_with_aggregator.
Runtime: `runtime.worker_binaries_stopped()` stops TFF's worker_binary processes
when a program is done (importing the package has no side effects and imports nothing:
every name loads its module on first use);
`distributed` spreads clients over several worker_binary processes (the learning
processes above run there as written, their aggregation one pass per computation) and
`passwise` drives any aggregation process there one secure average per computation.
"""

import importlib
import importlib.util

# Public name → the module that defines it. Nothing is imported here: every name (and
# every submodule, e.g. `tff_robust.distributed`) is loaded on first use, so that
# `import tff_robust` costs nothing and `python -m tff_robust.distributed --port=N` (a
# worker) starts without TensorFlow and finds its own module not yet imported.
_EXPORTS = {
    'GeometricMedianFactory': 'geometric_median',
    'one_step_geometric_median_factory': 'geometric_median',
    'GammaMeanFactory': 'gamma_mean',
    'GradientMaskedAveragingFactory': 'gradient_masking',
    'SecureCenteredClippingFactory': 'centered_clipping',
    'DifferentiallyPrivateWeightedMeanFactory': 'privacy',
    'NonfiniteFilteringFactory': 'nonfinite',
    'build_robust_federated_aggregation_process': 'learning',
    'build_one_step_robust_federated_aggregation_process': 'learning',
    'build_process_with_aggregator': 'learning',
    'PersonalizationClient': 'personalization',
    'unweighted': 'unit_weights',
}
_SUBMODULES = ('distributed', 'original_rfa', 'passwise', 'runtime')
__all__ = sorted(_EXPORTS) + list(_SUBMODULES)


def __getattr__(name):
  if name in _EXPORTS:
    value = getattr(importlib.import_module(f'{__name__}.{_EXPORTS[name]}'), name)
    globals()[name] = value
    return value
  # Any submodule, as when the package imported them all.
  if not name.startswith('_') and importlib.util.find_spec(f'{__name__}.{name}'):
    return importlib.import_module(f'{__name__}.{name}')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return sorted(set(globals()) | set(__all__))
