"""Where the honest clients are does not matter to the default geometric median.

Properties of the default `GeometricMedianFactory` (and its gathered twin) against the
float64 exact geometric median: translation and rotation equivariance, breakdown for
ρ ≤ 0.4 at several geometries and shifts of the honest clients, and a majority
client. One-step RFA is anchored at the current model by definition: its properties
are rotation and scale equivariance about zero and a ball it cannot leave.

Distances are in honest RMS spreads s (the root mean square distance of the honest
clients to their mean).
"""

from absl.testing import parameterized
import numpy as np
import tensorflow_federated as tff

from baselines import geometric_median as gathered
from tasks import references
from tests.helpers import aggregator_cases as cases
import tff_robust

FACTORIES = dict(
    gm=tff_robust.GeometricMedianFactory,
    gathered=gathered.GatheredGeometricMedianFactory,
    one_step=tff_robust.one_step_geometric_median_factory,
)
_PROCESSES = {}


def run(factory, points, alphas=None):
  """The result (float64) and measurements of the default `FACTORIES[factory]` on
  float32 client vectors."""
  alphas = np.ones(len(points)) if alphas is None else np.asarray(alphas)
  key = (factory, points.shape[1])
  if key not in _PROCESSES:
    _PROCESSES[key] = FACTORIES[factory]().create(
        tff.TensorType(np.float32, [points.shape[1]]), tff.TensorType(np.float32))
  process = _PROCESSES[key]
  output = cases.fast_next(process)(process.initialize(),
                                    [p.astype(np.float32) for p in points],
                                    [np.float32(a) for a in alphas])
  return np.asarray(output.result, np.float64), output.measurements


def spread(honest):
  return np.sqrt(np.mean(np.sum((honest - honest.mean(axis=0)) ** 2, axis=1)))


def unit(dimension, axis):
  return np.eye(dimension)[axis]


def corrupted_clients(kind, honest, count, rng):
  """`count` corrupted clients of a geometry, placed relative to the honest ones."""
  center, s, dimension = honest.mean(axis=0), spread(honest), honest.shape[1]
  if kind == 'zero':  # Free riders: the zero update, wherever the honest clients are.
    return np.zeros((count, dimension))
  if kind == 'far_point':  # One point 100 s away, orthogonal to the shift.
    return np.tile(center + 100 * s * unit(dimension, 1), (count, 1))
  if kind == 'near_cloud':  # A cloud 10 s away.
    return center + 10 * s * unit(dimension, 1) + rng.standard_normal((count, dimension))
  if kind == 'huge':
    return np.tile(center + 1e30 * unit(dimension, 1), (count, 1))
  if kind == 'opposite':  # −5 × the honest clients' own updates.
    return -5.0 * honest[:count]
  raise ValueError(kind)


def breakdown_case(kind, rho, shift, dimension, num_clients=50, seed=0):
  """(points, honest mean, s): honest N(shift·s·e₀, I), ρ of the clients corrupted."""
  rng = np.random.default_rng(seed)
  num_corrupted = int(round(rho * num_clients))
  honest = rng.standard_normal((num_clients - num_corrupted, dimension))
  honest += shift * spread(honest) * unit(dimension, 0)
  points = np.vstack([honest, corrupted_clients(kind, honest, num_corrupted, rng)])
  return points, honest.mean(axis=0), spread(honest)


def equivariance_case(dimension, seed):
  """16 honest N(0, I) clients and 4 in a cloud 10 s away."""
  rng = np.random.default_rng(seed)
  honest = rng.standard_normal((16, dimension))
  return np.vstack([honest, corrupted_clients('near_cloud', honest, 4, rng)]), spread(
      honest)


def random_rotation(dimension, seed):
  q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((dimension,) * 2))
  return q * np.sign(np.diag(r))


class TranslationTest(parameterized.TestCase):

  @parameterized.product(factory=['gm', 'gathered'], dimension=[10, 100],
                         shift=['every_coordinate_1e3', 'direction_10s',
                                'direction_300s'])
  def test_shifting_every_client_shifts_the_result(self, factory, dimension, shift):
    points, s = equivariance_case(dimension, seed=dimension)
    if shift == 'every_coordinate_1e3':
      offset = np.full(dimension, 1e3)
    else:
      direction = np.random.default_rng(1).standard_normal(dimension)
      offset = float(shift[len('direction_'):-1]) * s * direction / np.linalg.norm(
          direction)
    result, _ = run(factory, points)
    shifted, _ = run(factory, points + offset)
    self.assertLess(np.linalg.norm(shifted - offset - result) / s, 1e-3)


class RotationTest(parameterized.TestCase):

  @parameterized.product(factory=['gm', 'gathered', 'one_step'], dimension=[10, 50])
  def test_rotating_every_client_rotates_the_result(self, factory, dimension):
    points, s = equivariance_case(dimension, seed=3)
    points = points + 5 * s * unit(dimension, 0)  # Away from the rotation's center.
    rotation = random_rotation(dimension, seed=dimension)
    result, _ = run(factory, points)
    rotated, _ = run(factory, points @ rotation.T)
    self.assertLess(np.linalg.norm(rotated - rotation @ result) / s, 1e-3)


class BreakdownTest(parameterized.TestCase):
  """For ρ ≤ 0.4 the default ends within 2× the exact median's distance to the honest
  mean plus 0.1 s, wherever the honest clients are."""

  @parameterized.product(kind=['zero', 'far_point', 'near_cloud', 'huge', 'opposite'],
                         rho=[0.1, 0.25, 0.4], shift=[0, 10, 100],
                         dimension=[10, 200])
  def test_as_close_as_the_exact_median(self, kind, rho, shift, dimension):
    points, honest_mean, s = breakdown_case(kind, rho, shift, dimension)
    exact = references.exact_geometric_median(points, np.ones(len(points)))
    bound = 2 * np.linalg.norm(exact - honest_mean) / s + 0.1
    result, _ = run('gm', points)
    self.assertLess(np.linalg.norm(result - honest_mean) / s, bound)

  @parameterized.parameters('zero', 'far_point', 'huge')
  def test_the_gathered_twin_too(self, kind):
    points, honest_mean, s = breakdown_case(kind, 0.4, 100, 10)
    exact = references.exact_geometric_median(points, np.ones(len(points)))
    result, _ = run('gathered', points)
    self.assertLess(np.linalg.norm(result - honest_mean) / s,
                    2 * np.linalg.norm(exact - honest_mean) / s + 0.1)

  @parameterized.product(kind=['zero', 'far_point', 'opposite'], rho=[0.1, 0.4],
                         shift=[0, 100])
  def test_skewed_weights(self, kind, rho, shift):
    # Log-normal example counts; ρ of the clients (not of the weight) corrupted.
    points, honest_mean, s = breakdown_case(kind, rho, shift, 10, seed=4)
    alphas = np.exp(np.random.default_rng(5).normal(0.0, 0.5, len(points)))
    num_honest = len(points) - int(round(rho * len(points)))
    honest_mean = np.average(points[:num_honest], axis=0, weights=alphas[:num_honest])
    exact = references.exact_geometric_median(points, alphas)
    result, _ = run('gm', points, alphas)
    self.assertLess(np.linalg.norm(result - honest_mean) / s,
                    2 * np.linalg.norm(exact - honest_mean) / s + 0.1)


class MajorityClientTest(parameterized.TestCase):
  """A client holding more than half of the weight is the weighted median."""

  @parameterized.product(factory=['gm', 'gathered'], shift=[0, 10, 1000],
                         share=[0.55, 0.6, 0.9])
  def test_the_result_is_that_client(self, factory, shift, share):
    rng = np.random.default_rng(6)
    others = rng.standard_normal((20, 10))
    s = spread(others)
    majority = others.mean(axis=0) + 5 * s * unit(10, 0)
    points = np.vstack([others, majority]) + shift * s * unit(10, 2)
    alphas = np.r_[np.full(20, (1 - share) / 20), share]
    result, _ = run(factory, points, alphas)
    self.assertLess(np.linalg.norm(result - points[-1]) / s, 0.1)


class OneStepGuaranteeTest(parameterized.TestCase):
  """One-step RFA is a weighted mean with weights α_i / max(ν, ‖w_i‖): a client's term
  β_i·w_i has norm at most α_i, so it is equivariant to rotations and scalings about
  the current model (zero), and the result never leaves the ball of radius
  max(max_honest ‖w_i‖, ν) / (1 − ρ) about it, ρ the corrupted share of the weight,
  wherever the corrupted clients are."""

  @parameterized.product(scale=[1e-6, 3.0, 1e6])
  def test_scaling_scales_the_result(self, scale):
    points, _ = equivariance_case(10, seed=7)
    points = points + 4.0
    result, _ = run('one_step', points)
    scaled, _ = run('one_step', scale * points)
    # Exact unless a client crosses the relative ν's bucket edge (powers of 2).
    np.testing.assert_allclose(scaled, scale * result, rtol=1e-4, atol=0)

  @parameterized.product(kind=['zero', 'far_point', 'near_cloud', 'huge', 'opposite'],
                         rho=[0.1, 0.25, 0.4], shift=[0, 10, 100])
  def test_the_result_stays_in_the_honest_ball(self, kind, rho, shift):
    points, _, _ = breakdown_case(kind, rho, shift, 10)
    num_honest = len(points) - int(round(rho * len(points)))
    result, measurements = run('one_step', points)
    radius = max(np.max(np.linalg.norm(points[:num_honest], axis=1)),
                 float(measurements['nu'][0])) / (1 - rho)
    self.assertLessEqual(np.linalg.norm(result), radius * (1 + 1e-6))


if __name__ == '__main__':
  parameterized.absltest.main()
