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
when a program is done (importing the package has no side effects);
`distributed` spreads clients over several worker_binary processes and `passwise`
drives RFA, the γ-mean and secure centered clipping there one secure average per
computation.
"""

import importlib

from tff_robust import original_rfa
from tff_robust import runtime
from tff_robust.centered_clipping import SecureCenteredClippingFactory
from tff_robust.gamma_mean import GammaMeanFactory
from tff_robust.geometric_median import GeometricMedianFactory
from tff_robust.geometric_median import one_step_geometric_median_factory
from tff_robust.gradient_masking import GradientMaskedAveragingFactory
from tff_robust.nonfinite import NonfiniteFilteringFactory
from tff_robust.learning import build_one_step_robust_federated_aggregation_process
from tff_robust.learning import build_process_with_aggregator
from tff_robust.learning import build_robust_federated_aggregation_process
from tff_robust.personalization import PersonalizationClient
from tff_robust.privacy import DifferentiallyPrivateWeightedMeanFactory
from tff_robust.unit_weights import unweighted

# Loaded on first use rather than here: `python -m tff_robust.distributed` (a worker)
# must not find its own module already imported by the package.
_LAZY_MODULES = ('distributed', 'passwise')


def __getattr__(name):
  if name in _LAZY_MODULES:
    return importlib.import_module(f'{__name__}.{name}')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return sorted(set(globals()) | set(_LAZY_MODULES))
