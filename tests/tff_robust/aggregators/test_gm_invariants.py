"""Invariants of the default geometric median and one-step RFA, against float64 numpy.

No single client pins the estimate (a free rider's zero update, a tiny update, a
client sending exactly an iterate), the result scales with the updates, extreme
clients keep their tiny weight, float64 stays float64, and every path (the single
computation, pass by pass, gathered at the server) gives the same answer.
"""

from absl.testing import parameterized
import numpy as np
import tensorflow_federated as tff

from baselines import geometric_median as gathered
from tasks import references
import tff_robust
from tff_robust.distributed import passwise

NUM_HONEST = 19


def honest_updates(dimension, kind, seed=0):
  rng = np.random.default_rng(seed)
  if kind == 'agreeing':  # The issue's: each coordinate 1 + 0.5·N(0, 1).
    return 1.0 + 0.5 * rng.standard_normal((NUM_HONEST, dimension))
  return rng.standard_normal((NUM_HONEST, dimension))


def with_client(honest, client):
  if client == 'zero':
    extra = np.zeros(honest.shape[1])
  elif client == 'tiny':  # Norm 1e-3 × the honest scale.
    extra = 1e-3 * honest[0]
  elif client == 'far':
    extra = np.full(honest.shape[1], 1e30)
  elif client.startswith('iterate'):  # The default's iterate k without it (1: the
    # mean, 2: the trimmed mean).
    passes = int(client[len('iterate'):])
    extra = references.geometric_median(honest, np.ones(NUM_HONEST), passes)
  else:
    raise ValueError(client)
  return np.vstack([honest, extra[np.newaxis]])


FACTORIES = dict(
    gm=tff_robust.GeometricMedianFactory,
    one_step=tff_robust.one_step_geometric_median_factory,
    gathered=gathered.GatheredGeometricMedianFactory,
)
_PROCESSES = {}


def process(factory, dimension, dtype=np.float32, path='fused', **kwargs):
  """The process of `FACTORIES[factory](**kwargs)` for vectors of `dimension`
  (`path` 'passwise': pass by pass), created once per arguments: tracing one costs
  about a second, and the tests share them."""
  key = (factory, dimension, np.dtype(dtype).name, path, tuple(sorted(kwargs.items())))
  if key not in _PROCESSES:
    built = FACTORIES[factory](**kwargs)
    value_type = tff.TensorType(dtype, [dimension])
    weight_type = tff.TensorType(np.float32)
    if path == 'passwise':
      built = passwise.PasswiseFactory(built)
    _PROCESSES[key] = built.create(value_type, weight_type)
  return _PROCESSES[key]


def run(factory, points, alphas=None, dtype=np.float32, path='fused', calls=1,
        **kwargs):
  """The result and measurements of the `calls`-th `next` on the same clients, of the
  process of `FACTORIES[factory](**kwargs)`."""
  alphas = np.ones(len(points)) if alphas is None else alphas
  process_ = process(factory, points.shape[1], dtype, path, **kwargs)
  state = process_.initialize()
  for _ in range(calls):
    output = process_.next(state, [p.astype(dtype) for p in points],
                           [np.float32(a) for a in alphas])
    state = output.state
  return np.asarray(output.result), output.measurements


def relative_distance(actual, expected):
  return np.linalg.norm(actual - expected) / np.linalg.norm(expected)


CLIENTS = ['zero', 'tiny', 'iterate1', 'iterate2']


class NoSingleClientPinsTheEstimateTest(parameterized.TestCase):

  @parameterized.product(client=CLIENTS, case=[('agreeing', 100), ('normal', 1000)])
  def test_default_gm_is_near_the_median(self, client, case):
    points = with_client(honest_updates(case[1], case[0]), client)
    median = references.exact_geometric_median(points, np.ones(len(points)))
    result, measurements = run('gm', points)
    self.assertLess(relative_distance(result, median), 0.05)
    self.assertLen(measurements['nu'], 1)  # One Weiszfeld step after the start.
    # And it is the numpy Algorithm 2 with the relative ν, to float32 rounding.
    expected = references.geometric_median(points, np.ones(len(points)), 3)
    self.assertLess(relative_distance(result, expected), 1e-5)

  @parameterized.product(client=['zero', 'tiny'], case=[('agreeing', 100),
                                                         ('normal', 1000)])
  def test_one_step_is_not_pulled_to_the_client(self, client, case):
    points = with_client(honest_updates(case[1], case[0]), client)
    median = references.exact_geometric_median(points, np.ones(len(points)))
    result, _ = run('one_step', points)
    self.assertGreater(np.linalg.norm(result), 0.5 * np.linalg.norm(median))
    expected = references.geometric_median(points, np.ones(len(points)), 1,
                                           start='zero')
    self.assertLess(relative_distance(result, expected), 1e-5)

  def test_the_papers_algorithm_2_is_one_argument_away(self):
    points = with_client(honest_updates(100, 'agreeing'), 'zero')
    paper_nu = tff_robust.aggregators.geometric_median.PAPER_NU
    result, measurements = run('gm', points, nu=paper_nu, initial_point='mean')
    np.testing.assert_array_equal(measurements['nu'], [1e-6] * 2)
    expected = references.geometric_median(points, np.ones(len(points)), 3,
                                           nu=paper_nu, start='mean')
    self.assertLess(relative_distance(result, expected), 1e-5)
    # From the zero update the paper's ν lets the free rider pin the estimate.
    pinned, _ = run('gm', points, nu=paper_nu, initial_point='zero')
    median = references.exact_geometric_median(points, np.ones(len(points)))
    self.assertLess(np.linalg.norm(pinned), 1e-2 * np.linalg.norm(median))

  def test_a_far_client_keeps_its_weight(self):
    points = with_client(honest_updates(100, 'agreeing'), 'far')
    median = references.exact_geometric_median(points, np.ones(len(points)))
    result, _ = run('gm', points)
    self.assertLess(relative_distance(result, median), 0.05)
    expected = references.geometric_median(points, np.ones(len(points)), 3)
    self.assertLess(relative_distance(result, expected), 1e-5)


def far_group(far):
  """20 clients: the honest ones agree, `far` send 1e3 × minus the first honest one."""
  honest = honest_updates(100, 'agreeing')[:20 - far]
  return honest, np.vstack([honest, np.tile(-1e3 * honest[:1], (far, 1))])


class FarMajorityTest(parameterized.TestCase):
  """A round of clients sampled at ρ = 0.25 sometimes has a corrupted majority. The
  geometric median's breakdown point is 1/2: below it the far group does not move
  it, above it the median is the far group's. One-step RFA, anchored at the current
  model, moves by a bounded step either way (`tff_robust.aggregators.robust_scale`,
  why the lower tercile)."""

  @parameterized.product(factory=['gm', 'one_step'], far=[6, 9])
  def test_a_far_minority_moves_it_by_about_the_honest_scale(self, factory, far):
    honest, points = far_group(far)
    result, _ = run(factory, points)
    self.assertLess(relative_distance(result, honest.mean(axis=0)), 5.0)
    expected = references.geometric_median(
        points, np.ones(len(points)), 3 if factory == 'gm' else 1,
        start='trimmed' if factory == 'gm' else 'zero')
    self.assertLess(relative_distance(result, expected), 1e-5)

  def test_a_far_majority_owns_the_median(self):
    _, points = far_group(11)
    result, _ = run('gm', points)
    self.assertLess(relative_distance(result, points[-1]), 1e-3)

  def test_a_far_majority_moves_one_step_rfa_by_a_bounded_step(self):
    honest, points = far_group(11)
    result, _ = run('one_step', points)
    self.assertLess(relative_distance(result, honest.mean(axis=0)), 5.0)


class ScaleEquivarianceTest(parameterized.TestCase):

  @parameterized.product(scale=[1e-6, 3.7e-3, 1e3, 1e6],
                         factory=['gm', 'one_step'], client=['zero', 'tiny'])
  def test_scaling_every_update_scales_the_result(self, scale, factory, client):
    points = with_client(honest_updates(100, 'agreeing'), client)
    # float64 values: the check is of the algorithm, not of float32 rounding.
    base, _ = run(factory, points, dtype=np.float64)
    scaled, _ = run(factory, scale * points, dtype=np.float64)
    self.assertLess(relative_distance(scaled, scale * base), 1e-5)


  def test_a_client_at_the_histogram_windows_edge_moves_the_result_a_little(self):
    # The documented exception (`tff_robust.aggregators.robust_scale`): a client at 1/20 of the
    # others' norm may cross the fixed grid's window edge when scaled by 1.7.
    points = with_client(honest_updates(100, 'agreeing'), 'tiny')
    points[-1] = 0.05 * points[0]
    for factory, bound in (('gm', 1e-3), ('one_step', 0.05)):
      base, _ = run(factory, points, dtype=np.float64)
      scaled, _ = run(factory, 1.7 * points, dtype=np.float64)
      self.assertLess(relative_distance(scaled, 1.7 * base), bound)


class ExtremeClientsTest(parameterized.TestCase):

  @parameterized.parameters('fused', 'passwise', 'gathered')
  def test_a_client_near_the_float32_limit_keeps_its_weight(self, path):
    # β = 1/‖x‖ of a client at 1e37 in each of 1,000 coordinates is 3e-39, below
    # float32's smallest normal number: a float32 β is flushed to 0.
    honest = honest_updates(1000, 'normal')
    points = np.vstack([honest, np.full((1, 1000), 1e37)])
    expected = references.geometric_median(points, np.ones(len(points)), 3)
    if path == 'gathered':
      result, _ = run('gathered', points)
    else:
      result, _ = run('gm', points, path=path)
    self.assertLess(relative_distance(result, expected), 1e-5)


  @parameterized.parameters('fused', 'gathered')
  def test_float64_models_beyond_the_float32_range_keep_a_robust_scale(self, path):
    # Honest clients at 1e50, one at 1e200: the float64 buckets tell them apart.
    points = 1e50 * with_client(honest_updates(100, 'agreeing'), 'zero')
    points[-1] = 1e200
    result, _ = run('gathered' if path == 'gathered' else 'gm', points, dtype=np.float64)
    expected = references.geometric_median(points, np.ones(len(points)), 3,
                                           float64=True)
    self.assertLess(relative_distance(result, expected), 1e-9)
    honest_median = references.exact_geometric_median(points[:-1],
                                                      np.ones(NUM_HONEST))
    self.assertLess(relative_distance(result, honest_median), 0.1)


class Float64AndPathsTest(parameterized.TestCase):

  @parameterized.product(factory=['gm', 'one_step'], client=['zero', 'far'])
  def test_float64_values_are_aggregated_in_float64(self, factory, client):
    points = with_client(honest_updates(1000, 'agreeing'), client)
    alphas = np.random.default_rng(3).uniform(1, 50, len(points))
    passes, start = (3, 'trimmed') if factory == 'gm' else (1, 'zero')
    result, _ = run(factory, points, alphas, dtype=np.float64)
    self.assertEqual(result.dtype, np.float64)
    expected = references.geometric_median(
        points, alphas.astype(np.float32).astype(np.float64), passes, start=start)
    self.assertLess(relative_distance(result, expected), 1e-12)

  @parameterized.product(path=['passwise', 'gathered'],
                         start=['trimmed', 'zero', 'mean', 'previous'])
  def test_every_path_gives_the_same_answer(self, path, start):
    points = with_client(honest_updates(100, 'agreeing', seed=5), 'zero')
    alphas = np.random.default_rng(4).uniform(1, 50, len(points))
    # Two calls: the warm start's second one starts from the first one's result.
    fused, fused_measurements = run('gm', points, alphas, calls=2, initial_point=start)
    if path == 'gathered':
      other, measurements = run('gathered', points, alphas, calls=2,
                                initial_point=start)
    else:
      other, measurements = run('gm', points, alphas, path='passwise', calls=2,
                                initial_point=start)
    self.assertLess(relative_distance(other, fused), 1e-5)
    np.testing.assert_allclose(measurements['nu'], fused_measurements['nu'], rtol=1e-5)


if __name__ == '__main__':
  import absl.testing.absltest  # pylint: disable=g-import-not-at-top
  absl.testing.absltest.main()
