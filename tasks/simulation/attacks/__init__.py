"""Corruption models of the simulation harness (RFA paper D.2.1, plus stronger attacks).

Nothing here is used inside a `tff_robust` aggregation factory: the harness picks the
corrupted set once per run (`select_corrupted_clients`), lets corrupted clients train
on poisoned data (a *data attack*, declared by the task in `Task.data_attacks`) or
replaces their updates after local training (an *update attack*, a class registered
by name), and always evaluates on clean data.

  base         `UpdateAttack`, `register`, `UPDATE_ATTACKS`, `build_update_attack`,
               `known_attacks`, `select_corrupted_clients`, flattening of updates
  search       the adaptive attacks' searches (`search_gamma`, `line_maximize`) and
               the aggregators they expect by name (`NUMPY_AGGREGATORS`, the numpy
               references of `tasks.references`)
  <attack>     one module per attack, or per family (`min_max` holds Min-Max and
               Min-Sum, `optimal` the optimal ALIE and IPM, `extreme_norms` the zero,
               tiny and far updates, `faults` the NaN and Inf faults, `weights`
               the weight attacks: a corrupted client's reported weight)

Every update attack has one contract: parameters in the constructor, and
`attack(updates, weights, corrupted, rng)` returns the round's updates with the
corrupted clients' ones replaced. Subclasses only write `malicious_rows`, which sees
the round's honestly computed updates as one float64 matrix (a row per client, the
model flattened). Adding an attack is one module with one `@base.register('name')`
class and its import line below; it is then known to the binaries' flags and in the
leaderboard's default grid (`tasks.simulation.leaderboard`, unless excluded there with
a reason).

Importing this package (or any module of it) registers every attack: the imports
below run first, in the order of `UPDATE_ATTACKS` (the binaries' help and the
leaderboard's attack columns); a module missing from them is still imported, after
them (tests/tasks/simulation/test_attacks.py fails until it is listed). Every name of
the former single module `attacks.py` is importable from here.
"""

import importlib
import pkgutil

from tasks.simulation.attacks import base
from tasks.simulation.attacks import search
from tasks.simulation.attacks.base import build_update_attack
from tasks.simulation.attacks.base import flatten_updates
from tasks.simulation.attacks.base import honest_rows
from tasks.simulation.attacks.base import known_attacks
from tasks.simulation.attacks.base import NO_ATTACK
from tasks.simulation.attacks.base import register
from tasks.simulation.attacks.base import select_corrupted_clients
from tasks.simulation.attacks.base import unflatten_update
from tasks.simulation.attacks.base import unit_directions
from tasks.simulation.attacks.base import UPDATE_ATTACKS
from tasks.simulation.attacks.base import UpdateAttack
from tasks.simulation.attacks.search import line_maximize
from tasks.simulation.attacks.search import MAX_SEARCH_ITERATIONS
from tasks.simulation.attacks.search import NUMPY_AGGREGATORS
from tasks.simulation.attacks.search import PERTURBATIONS
from tasks.simulation.attacks.search import perturbation_vector
from tasks.simulation.attacks.search import search_gamma

# The attack modules, in the order of `UPDATE_ATTACKS`.
# pylint: disable=g-bad-import-order
from tasks.simulation.attacks import gaussian
from tasks.simulation.attacks import omniscient
from tasks.simulation.attacks import sign_flip
from tasks.simulation.attacks import alie
from tasks.simulation.attacks import ipm
from tasks.simulation.attacks import extreme_norms
from tasks.simulation.attacks import random_gaussian
from tasks.simulation.attacks import min_max
from tasks.simulation.attacks import mimic
from tasks.simulation.attacks import optimal
from tasks.simulation.attacks import model_replacement
from tasks.simulation.attacks import faults
from tasks.simulation.attacks import weights
# pylint: enable=g-bad-import-order

# A module added to the package but not above still registers its attacks.
for _module in pkgutil.iter_modules(__path__):
  importlib.import_module(f'{__name__}.{_module.name}')
del _module

# The attack classes, as the former single module had them.
from tasks.simulation.attacks.alie import ALittleIsEnough  # pylint: disable=g-import-not-at-top
from tasks.simulation.attacks.extreme_norms import FarUpdate
from tasks.simulation.attacks.extreme_norms import TinyUpdate
from tasks.simulation.attacks.extreme_norms import ZeroUpdate
from tasks.simulation.attacks.faults import InfFault
from tasks.simulation.attacks.faults import NaNFault
from tasks.simulation.attacks.gaussian import GaussianNoise
from tasks.simulation.attacks.ipm import InnerProductManipulation
from tasks.simulation.attacks.mimic import Mimic
from tasks.simulation.attacks.mimic import mimicked_client
from tasks.simulation.attacks.min_max import MinMax
from tasks.simulation.attacks.min_max import MinSum
from tasks.simulation.attacks.model_replacement import ModelReplacement
from tasks.simulation.attacks.omniscient import Omniscient
from tasks.simulation.attacks.optimal import OptimalALittleIsEnough
from tasks.simulation.attacks.optimal import OptimalInnerProductManipulation
from tasks.simulation.attacks.random_gaussian import RandomGaussian
from tasks.simulation.attacks.sign_flip import SignFlip
from tasks.simulation.attacks.weights import AdaptiveWeight
from tasks.simulation.attacks.weights import WeightInflation
