"""Float64 value structures aggregated in float64 by GMA, norm clipping, ARC (issue 36,
section 3) and the secure centered clipping: against the independent float64 numpy
references of `tasks.references` to 1e-12, on a dict of two float64 tensors (d = 1000) from 20 clients;
float32 stays float32.

ARC is tested against numpy around the float64 mean; around the geometric median it
is checked to add nothing to the GM's own float64 error (the GM's accuracy is tested
with the GM).
"""

import collections

from absl.testing import parameterized
import numpy as np
import tensorflow_federated as tff

from baselines import arc
from baselines import wrappers
from tasks import references
from tff_robust.iterative import iterative_mean
from tff_robust.aggregators.centered_clipping import SecureCenteredClippingFactory
from tff_robust.aggregators.geometric_median import GeometricMedianFactory
from tff_robust.aggregators.gradient_masking import GradientMaskedAveragingFactory

SHAPES = collections.OrderedDict(a=(600,), b=(20, 20))  # d = 1000 in two tensors
DIMENSION = 1000
NUM_CLIENTS = 20
TAU = 0.4
CLIP_NORM = 30.0  # ordinary clients have norms ~16–63: about half are clipped
NUM_BYZANTINE = 4
FLOAT64_TOLERANCE = 1e-12
FLOAT32_TOLERANCE = 1e-5
WEIGHT_TYPE = tff.TensorType(np.float32)


def value_type(dtype):
  return tff.types.to_type(collections.OrderedDict(
      (name, tff.TensorType(dtype, shape)) for name, shape in SHAPES.items()))


def to_structs(matrix, dtype):
  """One OrderedDict of `SHAPES` per client row, in `dtype`."""
  structs = []
  for row in np.asarray(matrix, dtype):
    splits = np.split(row, np.cumsum([np.prod(s) for s in SHAPES.values()])[:-1])
    structs.append(collections.OrderedDict(
        (name, part.reshape(shape))
        for (name, shape), part in zip(SHAPES.items(), splits)))
  return structs


def to_vector(struct):
  return np.concatenate([np.ravel(struct[name]) for name in SHAPES])


def ordinary_inputs():
  """N(0, 1) updates with per-client scales in [0.5, 2]."""
  rng = np.random.default_rng(0)
  return (rng.normal(size=(NUM_CLIENTS, DIMENSION)) *
          rng.uniform(0.5, 2.0, size=(NUM_CLIENTS, 1)))


def wide_range_inputs():
  """Per-client scales from 1e-100 to 1e100: far outside float32's range."""
  rng = np.random.default_rng(1)
  return (rng.normal(size=(NUM_CLIENTS, DIMENSION)) *
          10.0 ** rng.uniform(-100, 100, size=(NUM_CLIENTS, 1)))


def example_counts():
  """Float32 client weights (exact in float64): example counts 1–50."""
  return np.random.default_rng(2).integers(1, 51, NUM_CLIENTS).astype(np.float64)


INPUTS = collections.OrderedDict(ordinary=ordinary_inputs, wide_range=wide_range_inputs)


# The float64 references of `tasks.references`, at the factories' arguments.
AGGREGATORS = collections.OrderedDict(
    gma=(GradientMaskedAveragingFactory,
         lambda x, w: references.gradient_masked_mean(x, w, TAU)),
    norm_clipping=(lambda: wrappers.norm_clipping_factory(CLIP_NORM),
                   lambda x, w: references.norm_clipping(x, w, CLIP_NORM)),
    arc_mean=(lambda: arc.AdaptiveRobustClippingFactory(
        iterative_mean.Float64MeanFactory(), num_byzantine=NUM_BYZANTINE),
              lambda x, w: references.weighted_mean(
                  references.arc_clipped_rows(x, NUM_BYZANTINE), w)),
    # From zero: stateless, as the others (the 'previous' start keeps the aggregate,
    # of the value's dtype, as its state).
    secure_centered_clipping=(lambda: SecureCenteredClippingFactory(
        clip_radius=CLIP_NORM, initial_point='zero'),
        lambda x, w: references.centered_clipping(x, w, CLIP_NORM, 3,
                                                  np.zeros(x.shape[1]))),
)

_PROCESSES = {}


def process(name, dtype, weight_type=WEIGHT_TYPE):
  """The process of aggregator `name` for `value_type(dtype)`, built once."""
  key = (name, np.dtype(dtype).name, str(weight_type))
  if key not in _PROCESSES:
    _PROCESSES[key] = AGGREGATORS[name][0]().create(value_type(dtype), weight_type)
  return _PROCESSES[key]


def run(proc, x, w, dtype, weight_dtype=np.float32):
  output = proc.next(proc.initialize(), to_structs(x, dtype),
                     [weight_dtype(v) for v in w])
  return output.result, output.measurements


def relative_error(actual, expected):
  return np.linalg.norm(actual - expected) / np.linalg.norm(expected)


class Float64ValuesTest(parameterized.TestCase):

  @parameterized.named_parameters(*[
      dict(testcase_name=f'{name}_{inputs}', name=name, inputs=inputs)
      for name in AGGREGATORS for inputs in INPUTS])
  def test_matches_float64_numpy_reference(self, name, inputs):
    x, w = INPUTS[inputs](), example_counts()
    result, _ = run(process(name, np.float64), x, w, np.float64)
    self.assertEqual({result[k].dtype for k in SHAPES}, {np.dtype(np.float64)})
    self.assertLessEqual(
        relative_error(to_vector(result), AGGREGATORS[name][1](x, w)),
        FLOAT64_TOLERANCE)

  @parameterized.named_parameters(*[(name, name) for name in AGGREGATORS])
  def test_state_and_measurement_types_match_the_float32_process(self, name):
    # Only the value dtype changes: consumers of the measurements (the learning
    # builders, the run files) see the same fields and scalar types either way.
    float32_signature = process(name, np.float32).next.type_signature
    float64_signature = process(name, np.float64).next.type_signature
    self.assertEqual(float64_signature.result.state,
                     float32_signature.result.state)
    self.assertEqual(float64_signature.result.measurements,
                     float32_signature.result.measurements)


class Float32ValuesTest(parameterized.TestCase):

  @parameterized.named_parameters(*[(name, name) for name in AGGREGATORS])
  def test_float32_in_float32_out(self, name):
    x, w = ordinary_inputs(), example_counts()
    result, _ = run(process(name, np.float32), x, w, np.float32)
    self.assertEqual({result[k].dtype for k in SHAPES}, {np.dtype(np.float32)})
    x32 = x.astype(np.float32).astype(np.float64)
    self.assertLessEqual(
        relative_error(to_vector(result), AGGREGATORS[name][1](x32, w)),
        FLOAT32_TOLERANCE)

  def test_norm_clipping_is_tff_clipping_bit_for_bit(self):
    # The float32 path is TFF's own clipping factory, as before float64 got its own.
    tff_clipping = wrappers.NormBoundingFactory(tff.aggregators.clipping_factory(
        CLIP_NORM, iterative_mean.Float64MeanFactory())).create(
            value_type(np.float32), WEIGHT_TYPE)
    x, w = ordinary_inputs(), example_counts()
    result, measurements = run(process('norm_clipping', np.float32), x, w, np.float32)
    expected, expected_measurements = run(tff_clipping, x, w, np.float32)
    for name in SHAPES:
      np.testing.assert_array_equal(result[name], expected[name])
    self.assertEqual(str(measurements), str(expected_measurements))


class Float64MeasurementsTest(parameterized.TestCase):

  @parameterized.named_parameters(*[(inputs, inputs) for inputs in INPUTS])
  def test_gma_fraction_masked_counts_the_float64_mask(self, inputs):
    x = INPUTS[inputs]()
    _, measurements = run(process('gma', np.float64), x, example_counts(), np.float64)
    agreement = np.abs(np.sum(np.sign(x), axis=0)) / len(x)
    self.assertAlmostEqual(measurements['fraction_masked'], np.mean(agreement < TAU),
                           places=6)

  @parameterized.named_parameters(*[(inputs, inputs) for inputs in INPUTS])
  def test_norm_clipping_counts_and_reports_the_bound(self, inputs):
    x = INPUTS[inputs]()
    _, measurements = run(process('norm_clipping', np.float64), x, example_counts(),
                          np.float64)
    self.assertEqual(measurements['clipped_count'],
                     np.sum(np.linalg.norm(x, axis=1) > CLIP_NORM))
    self.assertEqual(measurements['clipping_norm'], np.float32(CLIP_NORM))


class ArcAroundGeometricMedianTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Created once for every input.
    gm = GeometricMedianFactory()
    cls.arc_gm = arc.AdaptiveRobustClippingFactory(
        gm, num_byzantine=NUM_BYZANTINE).create(value_type(np.float64), WEIGHT_TYPE)
    cls.gm = gm.create(value_type(np.float64), WEIGHT_TYPE)

  @parameterized.named_parameters(*[(inputs, inputs) for inputs in INPUTS])
  def test_arc_gm_is_the_gm_of_the_numpy_clipped_updates(self, inputs):
    # No float64 numpy GM here: the library's GM on updates clipped by numpy is the
    # reference, so that only ARC's own rounding is measured.
    x, w = INPUTS[inputs](), example_counts()
    result, _ = run(self.arc_gm, x, w, np.float64)
    expected, _ = run(self.gm, references.arc_clipped_rows(x, NUM_BYZANTINE), w,
                      np.float64)
    self.assertLessEqual(relative_error(to_vector(result), to_vector(expected)),
                         FLOAT64_TOLERANCE)


class ArcFloat64WeightsTest(parameterized.TestCase):

  def test_weight_below_float32_range_is_left_out_of_both_steps(self):
    # ARC, as every iterative aggregate, takes float32 weights: a float64 weight of
    # 1e-50 is 0 there, so the order statistic and the inner mean both leave its
    # client out (the non-finite filter in front drops and counts it). Its client
    # holds the largest norm, so counting it in one step only would move the
    # threshold by one rank.
    x = ordinary_inputs()
    x[0] *= 100.0
    w = example_counts()
    w[0] = 1e-50
    proc = process('arc_mean', np.float64, tff.TensorType(np.float64))
    result, measurements = run(proc, x, w, np.float64, np.float64)
    trace = {}
    clipped = references.arc_clipped_rows(x[1:], NUM_BYZANTINE, trace)
    np.testing.assert_allclose(measurements[arc.THRESHOLD], trace['threshold'],
                               rtol=1e-14)
    self.assertLessEqual(
        relative_error(to_vector(result), references.weighted_mean(clipped, w[1:])),
        FLOAT64_TOLERANCE)


if __name__ == '__main__':
  parameterized.absltest.main()
