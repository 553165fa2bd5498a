"""tff_robust: robust aggregation for TensorFlow Federated.

Importing the package also makes sure no TFF `worker_binary` outlives the interpreter
(see `tff_robust.runtime`).
"""

from tff_robust import runtime
from tff_robust.geometric_median import GeometricMedianFactory
from tff_robust.geometric_median import one_step_geometric_median_factory
from tff_robust.learning import build_one_step_robust_federated_aggregation_process
from tff_robust.learning import build_process_with_aggregator
from tff_robust.learning import build_robust_federated_aggregation_process
from tff_robust.privacy import DifferentiallyPrivateWeightedMeanFactory
