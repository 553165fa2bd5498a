"""tff_robust: robust aggregation for TensorFlow Federated.

Importing the package also makes sure no TFF `worker_binary` outlives the interpreter
(see `tff_robust.runtime`).
"""

from tff_robust import runtime
from tff_robust.geometric_median import GeometricMedianFactory
from tff_robust.geometric_median import one_step_geometric_median_factory
