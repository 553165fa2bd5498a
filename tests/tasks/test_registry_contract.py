"""TFF's own aggregation-factory contract (the checks of TFF's `mean_test.py`) for every
aggregator of the registry and every other factory of `tff_robust`: type signatures of
`initialize`/`next` weighted and unweighted, float32 / float64 / mixed-precision
structures, zero weights, and TypeError for types a factory cannot aggregate.

Creating a process traces it and its first run compiles it (~1 s together), so the
matrix is split by what differs between factories:
*   every factory is held to the contract weighted, at one structure `FACTORY_DTYPE` (a
    float32 and a float64 tensor side by side: a factory that takes one tensor's dtype
    for the whole structure fails there);
*   the full matrix of structures × weighted/unweighted runs once per code path whose
    handling of dtypes differs (`CODE_PATHS`: the iterative secure aggregates, the
    gathering baselines, the wrappers), on one factory each. The unweighted mode is one
    code path, `WeightedOrUnweightedFactory.create` (the weighted process with unit
    weights), and every factory is checked to use it.
Each process is created once per (factory, structure, mode) and shared by the tests.
Each factory's float64 accuracy is tested beside it (tests/tff_robust, tests/baselines).
"""

import collections

from absl.testing import parameterized
import numpy as np
import tensorflow_federated as tff

from baselines import arc
from tasks import registry
import tff_robust
from tff_robust.iterative import iterative_mean
from tff_robust.aggregators import original_rfa
from tff_robust.common import weighted_or_unweighted

NUM_CLIENTS = 8  # Krum's default f = floor(0.25 n) = 2 needs n > 6.


def _structure(kernel_dtype, bias_dtype):
  return tff.types.to_type(collections.OrderedDict(
      kernel=tff.TensorType(kernel_dtype, [3, 2]),
      bias=tff.TensorType(bias_dtype, [2])))


VALUE_TYPES = collections.OrderedDict(
    float32=_structure(np.float32, np.float32),
    float64=_structure(np.float64, np.float64),
    mixed=_structure(np.float32, np.float64),
)
FLOAT32 = tff.TensorType(np.float32)
# The structure every factory is held to the contract at.
FACTORY_DTYPE = 'mixed'

# Every factory under test, built without arguments beyond what a name needs.
FACTORIES = collections.OrderedDict(
    [(name, lambda name=name: registry.aggregator_from_name(name))
     for name in registry.known_aggregators()] + [
         # Buckets of 2: 8 clients are 4 bucket means, too few for the default f = 1.
         ('bucketing+krum', lambda: registry.aggregator_from_name(
             'bucketing+krum', num_byzantine=0)),
         ('nnm+median', lambda: registry.aggregator_from_name(
             'nnm+median', wrapper_args={'nnm': {'num_byzantine': 1}})),
         # 'gm' inside bucketing is the gathering 'gathered_gm'.
         ('bucketing+gm', lambda: registry.aggregator_from_name('bucketing+gm')),
         ('dp_mean', lambda: tff_robust.DifferentiallyPrivateWeightedMeanFactory(
             noise_multiplier=0.0, clip=1e6)),
         ('float32_mean', iterative_mean.Float32MeanFactory),
         ('float64_mean', iterative_mean.Float64MeanFactory),
         ('original_rfa', original_rfa.RobustWeiszfeldFactory),
         ('gm_unfiltered', tff_robust.GeometricMedianFactory),
         ('gamma_mean_unfiltered', tff_robust.GammaMeanFactory),
         ('gma_unfiltered', tff_robust.GradientMaskedAveragingFactory),
         ('secure_centered_clipping_unfiltered',
          tff_robust.SecureCenteredClippingFactory),
         ('arc+krum', lambda: registry.aggregator_from_name('arc+krum')),
         ('arc_unfiltered', lambda: arc.AdaptiveRobustClippingFactory(
             tff_robust.GeometricMedianFactory(), num_byzantine=1)),
     ])
# Gathering aggregators need clients of weight > 0 (Krum's n > 2f + 2): with every
# weight zero they fail, loudly, instead of returning a value.
NEED_CLIENTS = ('krum', 'multi_krum', 'bucketing+krum', 'arc+krum')

# One factory per code path whose handling of dtypes differs; each runs the full matrix
# of `VALUE_TYPES` × weighted/unweighted.
CODE_PATHS = collections.OrderedDict(
    # tff_robust's iterative secure aggregate: Weiszfeld passes of secure sums, float64
    # β and ν, a float32 inner mean.
    iterative_secure='gm',
    # The gathering baselines: the clients' [n, p] matrix in the structure's widest
    # dtype, unflattened into each tensor's own; a server state of that dtype.
    gathering='centered_clipping',
    # A wrapper around an inner factory (ARC, in the non-finite filter like every
    # registry name): its own float64 norms and per-tensor casts.
    wrapper='arc+krum',
)

_PROCESSES = {}


def process(name, value_type_name, weighted=True):
  key = (name, value_type_name, weighted)
  if key not in _PROCESSES:
    factory = FACTORIES[name]()
    value_type = VALUE_TYPES[value_type_name]
    _PROCESSES[key] = (factory.create(value_type, FLOAT32) if weighted
                       else factory.create(value_type))
  return _PROCESSES[key]


def client_values(value_type_name, seed=0):
  rng = np.random.default_rng(seed)
  value_type = VALUE_TYPES[value_type_name]
  return [collections.OrderedDict(
      kernel=rng.normal(size=(3, 2)).astype(value_type.kernel.dtype),
      bias=rng.normal(size=2).astype(value_type.bias.dtype))
          for _ in range(NUM_CLIENTS)]


def as_vector(value):
  return np.concatenate([np.ravel(value['kernel']), np.ravel(value['bias'])])


def run(proc, values, weights=None):
  state = proc.initialize()
  if weights is None:
    return proc.next(state, values)
  return proc.next(state, values, [np.float32(w) for w in weights])


def _named(names):
  return [(n.replace('+', '_'), n) for n in names]


def _structures():
  """(factory, structure, weighted) of every process under test: each factory at
  FACTORY_DTYPE weighted, each code path's factory at every structure and mode."""
  keys = [(n, FACTORY_DTYPE, True) for n in FACTORIES]
  keys += [(n, t, w) for n in CODE_PATHS.values() for t in VALUE_TYPES
           for w in (True, False) if (n, t, w) not in keys]
  return keys


def _mode(weighted):
  return 'weighted' if weighted else 'unweighted'


def _dtypes(value):
  return [np.asarray(value[k]).dtype for k in ('kernel', 'bias')]


class FactoryKindTest(parameterized.TestCase):

  @parameterized.named_parameters(*_named(FACTORIES))
  def test_is_weighted_and_unweighted(self, name):
    factory = FACTORIES[name]()
    self.assertIsInstance(factory, tff.aggregators.WeightedAggregationFactory)
    self.assertIsInstance(factory, tff.aggregators.UnweightedAggregationFactory)
    self.assertIs(tff_robust.unweighted(factory), factory)
    # Unweighted, it is its weighted process with unit weights (the one code path of
    # the unweighted mode, tested on every structure in `UnweightedTest`).
    self.assertIs(type(factory).create,
                  weighted_or_unweighted.WeightedOrUnweightedFactory.create)


class CodePathTest(parameterized.TestCase):

  @parameterized.named_parameters(*CODE_PATHS.items())
  def test_each_code_path_has_a_factory_of_its_kind(self, name):
    wrappers, base = registry.split_name(name)
    kinds = dict(
        iterative_secure=(not wrappers and not registry.gathers(base) and
                          registry.is_secure_compatible(FACTORIES[name]())),
        gathering=not wrappers and registry.gathers(base),
        wrapper=bool(wrappers))
    path = next(p for p, n in CODE_PATHS.items() if n == name)
    self.assertTrue(kinds[path], (path, name))


class TypeSignatureTest(parameterized.TestCase):

  @parameterized.named_parameters(*[
      (f'{n.replace("+", "_")}_{t}_{_mode(w)}', n, t, w) for n, t, w in _structures()])
  def test_type_signatures(self, name, value_type_name, weighted):
    proc = process(name, value_type_name, weighted)
    value_type = VALUE_TYPES[value_type_name]
    self.assertIsInstance(proc, tff.templates.AggregationProcess)
    self.assertEqual(proc.is_weighted, weighted)
    state_type = proc.initialize.type_signature.result
    self.assertIsInstance(state_type, tff.FederatedType)
    self.assertEqual(state_type.placement, tff.SERVER)
    expected_parameter = [state_type, tff.FederatedType(value_type, tff.CLIENTS)]
    if weighted:
      expected_parameter.append(tff.FederatedType(FLOAT32, tff.CLIENTS))
    parameter = proc.next.type_signature.parameter
    self.assertLen(parameter, len(expected_parameter))
    for actual, expected in zip(parameter, expected_parameter):
      self.assertTrue(actual.is_equivalent_to(expected), (actual, expected))
    result = proc.next.type_signature.result
    self.assertTrue(result.state.is_equivalent_to(state_type))
    self.assertTrue(result.result.is_equivalent_to(
        tff.FederatedType(value_type, tff.SERVER)), result.result)
    self.assertEqual(result.measurements.placement, tff.SERVER)


class PrecisionTest(parameterized.TestCase):
  """float64 and mixed-precision structures aggregate to the float32 structure's
  result (same inputs, rounded to float32), in their own dtypes: once per code path;
  every factory keeps each tensor's dtype."""

  @parameterized.named_parameters(*_named(FACTORIES))
  def test_keeps_each_tensors_dtype(self, name):
    value_type = VALUE_TYPES[FACTORY_DTYPE]
    weights = np.arange(1, NUM_CLIENTS + 1)
    result = run(process(name, FACTORY_DTYPE), client_values(FACTORY_DTYPE), weights)
    self.assertEqual(_dtypes(result.result),
                     [value_type.kernel.dtype, value_type.bias.dtype])
    self.assertTrue(np.all(np.isfinite(as_vector(result.result))))

  @parameterized.named_parameters(*[
      (f'{path}_{t}', n, t) for path, n in CODE_PATHS.items()
      for t in ('float64', 'mixed')])
  def test_agrees_with_float32(self, name, value_type_name):
    weights = np.arange(1, NUM_CLIENTS + 1)
    values = client_values(value_type_name)
    values32 = [collections.OrderedDict(
        (k, v.astype(np.float32)) for k, v in value.items()) for value in values]
    expected = run(process(name, 'float32'), values32, weights).result
    actual = run(process(name, value_type_name), values, weights).result
    value_type = VALUE_TYPES[value_type_name]
    self.assertEqual(np.asarray(actual['kernel']).dtype, value_type.kernel.dtype)
    self.assertEqual(np.asarray(actual['bias']).dtype, value_type.bias.dtype)
    np.testing.assert_allclose(as_vector(actual), as_vector(expected),
                               rtol=1e-4, atol=1e-5)


class UnweightedTest(parameterized.TestCase):

  @parameterized.named_parameters(*[
      (f'{path}_{t}', n, t) for path, n in CODE_PATHS.items() for t in VALUE_TYPES])
  def test_unweighted_is_weighted_with_unit_weights(self, name, value_type_name):
    values = client_values(value_type_name, seed=1)
    expected = run(process(name, value_type_name), values, np.ones(NUM_CLIENTS)).result
    actual = run(process(name, value_type_name, weighted=False), values).result
    self.assertEqual(_dtypes(actual), _dtypes(expected))
    np.testing.assert_allclose(as_vector(actual), as_vector(expected), rtol=1e-6,
                               atol=1e-7)

  def test_adapter_makes_tff_mean_unweighted(self):
    factory = tff_robust.unweighted(tff.aggregators.MeanFactory())
    self.assertIsInstance(factory, tff.aggregators.UnweightedAggregationFactory)
    proc = factory.create(VALUE_TYPES['float32'])
    values = client_values('float32', seed=2)
    actual = run(proc, values).result
    np.testing.assert_allclose(as_vector(actual),
                               np.mean([as_vector(v) for v in values], axis=0),
                               rtol=1e-6)

  def test_adapter_keeps_unweighted_factories_and_rejects_others(self):
    factory = tff.aggregators.SumFactory()
    self.assertIs(tff_robust.unweighted(factory), factory)
    with self.assertRaisesRegex(TypeError, 'WeightedAggregationFactory'):
      tff_robust.unweighted('mean')


class ZeroWeightTest(parameterized.TestCase):

  @parameterized.named_parameters(*_named(FACTORIES))
  def test_some_zero_weights_leave_those_clients_out(self, name):
    values = client_values(FACTORY_DTYPE, seed=3)
    weights = np.arange(1, NUM_CLIENTS + 1, dtype=np.float32)
    weights[[2, 5]] = 0.0
    # The zero-weight clients send wild values: they must not matter.
    values[2] = collections.OrderedDict(
        (k, np.full_like(v, 1e6)) for k, v in values[2].items())
    kept = [i for i in range(NUM_CLIENTS) if weights[i] > 0]
    proc = process(name, FACTORY_DTYPE)
    expected = run(proc, [values[i] for i in kept], weights[kept]).result
    actual = run(proc, values, weights).result
    np.testing.assert_allclose(as_vector(actual), as_vector(expected), rtol=1e-5,
                               atol=1e-6)

  @parameterized.named_parameters(*_named(n for n in FACTORIES if n not in NEED_CLIENTS))
  def test_all_zero_weights_give_a_finite_result(self, name):
    output = run(process(name, FACTORY_DTYPE), client_values(FACTORY_DTYPE, seed=4),
                 np.zeros(NUM_CLIENTS))
    self.assertTrue(np.all(np.isfinite(as_vector(output.result))))

  @parameterized.named_parameters(*_named(NEED_CLIENTS))
  def test_all_zero_weights_fail_where_clients_are_needed(self, name):
    with self.assertRaisesRegex(Exception, 'KrumFactory'):
      run(process(name, FACTORY_DTYPE), client_values(FACTORY_DTYPE, seed=4),
          np.zeros(NUM_CLIENTS))


WRONG_VALUE_TYPES = collections.OrderedDict(
    int32=tff.TensorType(np.int32, [3]),
    complex64=tff.TensorType(np.complex64, [3]),
    string=tff.TensorType(np.str_),
    federated=tff.FederatedType(tff.TensorType(np.float32, [3]), tff.CLIENTS),
    numpy_dtype=np.float32,
    mixed_int=tff.types.to_type([np.float32, np.int32]),
)
WRONG_WEIGHT_TYPES = collections.OrderedDict(
    string=tff.TensorType(np.str_),
    boolean=tff.TensorType(np.bool_),
    vector=tff.TensorType(np.float32, [2]),
    structure=tff.types.to_type([np.float32, np.float32]),
    federated=tff.FederatedType(np.float32, tff.CLIENTS),
    numpy_dtype=np.float32,
)


class WrongTypeTest(parameterized.TestCase):

  @parameterized.named_parameters(*[
      (f'{n.replace("+", "_")}_{t}', n, t) for n in FACTORIES for t in WRONG_VALUE_TYPES])
  def test_wrong_value_type_raises_type_error(self, name, type_name):
    factory = FACTORIES[name]()
    with self.assertRaises(TypeError):
      factory.create(WRONG_VALUE_TYPES[type_name], FLOAT32)
    with self.assertRaises(TypeError):
      factory.create(WRONG_VALUE_TYPES[type_name])

  @parameterized.named_parameters(*[
      (f'{n.replace("+", "_")}_{t}', n, t) for n in FACTORIES for t in WRONG_WEIGHT_TYPES])
  def test_wrong_weight_type_raises_type_error(self, name, type_name):
    with self.assertRaises(TypeError):
      FACTORIES[name]().create(VALUE_TYPES['float32'], WRONG_WEIGHT_TYPES[type_name])

  @parameterized.named_parameters(
      ('int32', np.int32), ('int64', np.int64), ('float64', np.float64))
  def test_integer_and_float64_weights_are_accepted_as_tff_does(self, dtype):
    # TFF's MeanFactory multiplies by any real weight; so do the factories here.
    proc = FACTORIES['gm']().create(VALUE_TYPES[FACTORY_DTYPE], tff.TensorType(dtype))
    values = client_values(FACTORY_DTYPE, seed=5)
    weights = np.arange(1, NUM_CLIENTS + 1)
    actual = proc.next(proc.initialize(), values, list(weights.astype(dtype))).result
    expected = run(process('gm', FACTORY_DTYPE), values, weights).result
    np.testing.assert_allclose(as_vector(actual), as_vector(expected), rtol=1e-6)
    unweighted = run(process('gm', FACTORY_DTYPE), values, np.ones(NUM_CLIENTS)).result
    self.assertGreater(np.abs(as_vector(unweighted) - as_vector(expected)).max(), 1e-3)
