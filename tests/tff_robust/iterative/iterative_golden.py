"""Golden outputs of the iterative secure aggregates, fused and pass by pass.

For every configuration (the registry's geometric median, one-step RFA, γ-means and
secure centered clipping, and variants of their starts, smoothing, freezing, reports,
inner means and weights), every value type (float32, float64, mixed) and every input
(ordinary clients with outliers, a NaN client, a far client), two `next` calls (the
state carried, other clients in the second) are run with `factory.create(...)` and
with `tff_robust.distributed.passwise.PasswiseFactory(factory).create(...)`, and everything they
return (results, measurements, states, with the structure's names and containers) is
flattened into one dict of arrays.

    python -m tests.tff_robust.iterative.iterative_golden record DIRECTORY [CONFIG ...]
    python -m tests.tff_robust.iterative.iterative_golden compare DIRECTORY [CONFIG ...]

`record` writes one `CONFIG.npz` per configuration; `compare` is bit for bit (same
keys, dtypes, shapes and bytes); `test_iterative_golden`
runs the registry's configurations against the committed file with a tolerance.
"""

import collections
import contextlib
import pathlib
import signal
import sys

import numpy as np
import tensorflow_federated as tff

from tasks import registry
from tests.helpers import aggregator_cases
import tff_robust
from tff_robust.aggregators import nonfinite
from tff_robust.distributed import passwise
from tff_robust.distributed import runtime


def _filtered(factory):
  return nonfinite.NonfiniteFilteringFactory(factory)


def _secure_mean():
  return tff.aggregators.MeanFactory(
      value_sum_factory=tff.aggregators.SecureSumFactory(1e4),
      weight_sum_factory=tff.aggregators.SecureSumFactory(1e4), no_nan_division=True)


def _dp_mean():
  return tff_robust.DifferentiallyPrivateWeightedMeanFactory(noise_multiplier=0.0,
                                                             clip=1e6)


# The registry's aggregators of the family, with its defaults and wrapper.
REGISTRY = {
    name: (lambda name=name: registry.aggregator_from_name(name))
    for name in ('gm', 'one_step_gm', 'gamma_mean', 'gamma_mean_diagonal',
                 'secure_centered_clipping')
}

GM = tff_robust.GeometricMedianFactory
GAMMA = tff_robust.GammaMeanFactory
CC = tff_robust.SecureCenteredClippingFactory

VARIANTS = {
    'gm_mean': lambda: _filtered(GM(initial_point='mean')),
    'gm_previous': lambda: _filtered(GM(initial_point='previous')),
    'gm_absolute': lambda: _filtered(GM(nu=1e-6)),
    'gm_previous_absolute': lambda: _filtered(GM(nu=1e-6, initial_point='previous')),
    'gm_freezes': lambda: _filtered(GM(num_communication_passes=4, nu=1e-6,
                                       tolerance=0.5)),
    'gm_relative_freezes': lambda: _filtered(GM(num_communication_passes=5,
                                                relative_nu=0.2, tolerance=0.2)),
    'gm_mean_one_pass': lambda: _filtered(GM(num_communication_passes=1,
                                             initial_point='mean')),
    'gm_mean_one_pass_absolute': lambda: _filtered(GM(
        num_communication_passes=1, initial_point='mean', nu=1e-6)),
    'gm_mean_absolute_tolerance0': lambda: _filtered(GM(
        initial_point='mean', nu=1e-4, tolerance=0.0)),
    'gm_no_reports': lambda: _filtered(GM(report_max_effective_weight=False,
                                          report_objective=False)),
    'gm_no_objective_two_passes': lambda: _filtered(GM(num_communication_passes=2,
                                                       report_objective=False)),
    'gm_dp_inner': lambda: _filtered(GM(inner_mean_factory=_dp_mean())),
    'gm_float64_inner': lambda: _filtered(GM(
        inner_mean_factory=tff_robust.iterative.iterative_mean.Float64MeanFactory())),
    'gm_unfiltered': lambda: GM(),
    'one_step_absolute_no_objective': lambda: _filtered(
        tff_robust.one_step_geometric_median_factory(nu=1e-6, report_objective=False)),
    'original_rfa': lambda: _filtered(tff_robust.aggregators.original_rfa.RobustWeiszfeldFactory()),
    'gamma_from_gm': lambda: _filtered(GAMMA(initial_point='geometric_median')),
    'gamma_diagonal_from_gm': lambda: _filtered(GAMMA(
        gamma=0.5, covariance='diagonal', initial_point='geometric_median')),
    'gamma_from_absolute_gm_two_iterations': lambda: _filtered(GAMMA(
        num_iterations=2, initial_point='geometric_median',
        geometric_median_factory=GM(num_communication_passes=2, nu=1e-6,
                                    initial_point='previous'))),
    'gamma_absolute': lambda: _filtered(GAMMA(gamma=0.5, gamma_scale='absolute')),
    'gamma_absolute_diagonal': lambda: _filtered(GAMMA(
        gamma=0.5, gamma_scale='absolute', covariance='diagonal')),
    'gamma_per_dimension': lambda: _filtered(GAMMA(gamma_per_dimension=2.0)),
    'gamma_dp_inner': lambda: _filtered(GAMMA(inner_mean_factory=_dp_mean())),
    'cc_mean': lambda: _filtered(CC(clip_radius=5.0, num_iterations=2,
                                    initial_point='mean')),
    'cc_zero': lambda: _filtered(CC(clip_radius=5.0, num_iterations=1,
                                    initial_point='zero')),
    'cc_previous_radius5': lambda: _filtered(CC(clip_radius=5.0)),
    'cc_dp_inner': lambda: _filtered(CC(inner_mean_factory=_dp_mean())),
}

# Run in TFF's test context (secure sums as plain sums), float32 and float64 only (TFF's
# SecureSumFactory takes one dtype).
SECURE = {
    'gm_secure_inner': lambda: _filtered(GM(inner_mean_factory=_secure_mean())),
    'gamma_secure_inner': lambda: _filtered(GAMMA(inner_mean_factory=_secure_mean())),
    'cc_secure_inner': lambda: _filtered(CC(clip_radius=5.0, initial_point='mean',
                                            inner_mean_factory=_secure_mean())),
}

CONFIGS = {**REGISTRY, **VARIANTS, **SECURE}

DTYPES = {
    'float32': (np.float32, np.float32),
    'float64': (np.float64, np.float64),
    'mixed': (np.float32, np.float64),
}
INPUTS = ('normal', 'nan', 'far')
NUM_CLIENTS = 7


def value_type(dtype_name):
  kernel, bias = DTYPES[dtype_name]
  return tff.types.to_type(collections.OrderedDict(
      kernel=tff.TensorType(kernel, [3, 2]), bias=tff.TensorType(bias, [2])))


def clients(dtype_name, kind, call):
  """(values, weights) of `call` (0 or 1) for the input `kind`."""
  rng = np.random.default_rng(100 * INPUTS.index(kind) + call)
  matrix = rng.normal(size=(NUM_CLIENTS, 8))
  matrix[:2] += 20.0  # Outliers, so the robust passes move.
  if kind == 'nan':
    matrix[-1, 0] = np.nan
  elif kind == 'far':
    matrix[-1] = 1e30
  weights = [np.float32(w) for w in rng.integers(1, 20, NUM_CLIENTS)]
  kernel, bias = DTYPES[dtype_name]
  values = [collections.OrderedDict(kernel=row[:6].reshape(3, 2).astype(kernel),
                                    bias=row[6:].astype(bias)) for row in matrix]
  return values, weights


def flatten(value, path=''):
  """{path: array} of a nested output; containers are named in the path (so a change
  of container, of names or of order shows), empty ones get an entry of their own."""
  if isinstance(value, tff.templates.MeasuredProcessOutput):
    value = collections.OrderedDict(state=value.state, result=value.result,
                                    measurements=value.measurements)
  if isinstance(value, tff.structure.Struct):
    items = [(f's{i}:{name}', v) for i, (name, v) in
             enumerate(tff.structure.iter_elements(value))]
    kind = 'struct'
  elif isinstance(value, dict):
    items = [(f'{type(value).__name__}:{k}', v) for k, v in value.items()]
    kind = type(value).__name__
  elif isinstance(value, (list, tuple)):
    items = [(f'{type(value).__name__}:{i}', v) for i, v in enumerate(value)]
    kind = type(value).__name__
  else:
    return {path: np.asarray(value)}
  if not items:
    return {f'{path}/<empty {kind}>': np.zeros([0])}
  flat = {}
  for key, v in items:
    flat.update(flatten(v, f'{path}/{key}'))
  return flat


def run_config(name, drivers=('fused', 'passwise', 'unweighted'), dtypes=tuple(DTYPES)):
  """{key: array} of every input, and of `drivers` and `dtypes`, of configuration
  `name`; keys are 'name|dtype|driver|input|call/path'."""
  secure = name in SECURE
  context = aggregator_cases.secure_sum_context() if secure else contextlib.nullcontext()
  with context:
    out = {}
    for dtype_name in dtypes:
      if secure and dtype_name == 'mixed':
        continue
      vtype = value_type(dtype_name)
      for driver in drivers:
        factory = CONFIGS[name]()
        if driver == 'fused':
          process = factory.create(vtype, tff.TensorType(np.float32))
        elif driver == 'passwise':
          process = passwise.PasswiseFactory(factory).create(
              vtype, tff.TensorType(np.float32))
        else:
          process = factory.create(vtype)
        for kind in INPUTS:
          state = process.initialize()
          out.update(flatten(state, f'{name}|{dtype_name}|{driver}|{kind}|init'))
          for call in range(2):
            values, weights = clients(dtype_name, kind, call)
            if driver == 'unweighted':
              output = process.next(state, values)
            else:
              output = process.next(state, values, weights)
            out.update(flatten(output, f'{name}|{dtype_name}|{driver}|{kind}|{call}'))
            state = output.state
    return out


def differences(expected, actual, exact=True, rtol=1e-6):
  """Human-readable differences between two flattened outputs."""
  problems = []
  missing = sorted(set(expected) - set(actual))
  extra = sorted(set(actual) - set(expected))
  problems += [f'missing {k}' for k in missing] + [f'extra {k}' for k in extra]
  for key in sorted(set(expected) & set(actual)):
    e, a = expected[key], actual[key]
    if e.dtype != a.dtype or e.shape != a.shape:
      problems.append(f'{key}: {e.dtype}{e.shape} != {a.dtype}{a.shape}')
    elif exact:
      if e.tobytes() != a.tobytes():
        problems.append(f'{key}: {e!r} != {a!r}')
    elif e.dtype.kind == 'f':
      scale = max(np.linalg.norm(np.nan_to_num(e.astype(np.float64))), 1e-30)
      if (not np.array_equal(np.isnan(e), np.isnan(a)) or
          np.linalg.norm(np.nan_to_num(a.astype(np.float64) - e)) > rtol * scale):
        problems.append(f'{key}: {e!r} != {a!r}')
    elif not np.array_equal(e, a):
      problems.append(f'{key}: {e!r} != {a!r}')
  return problems


def to_json(outputs) -> dict:
  """{key: [dtype, shape, values]} (values as Python floats or ints, NaN as 'nan')."""
  def plain(x):
    x = x.item()
    return 'nan' if isinstance(x, float) and np.isnan(x) else x
  return {key: [str(value.dtype), list(value.shape),
                [plain(x) for x in np.ravel(value)]]
          for key, value in outputs.items()}


def from_json(entries) -> dict:
  return {key: np.array([np.nan if x == 'nan' else x for x in values],
                        dtype).reshape(shape)
          for key, (dtype, shape, values) in entries.items()}


def main(argv):
  command, directory, names = argv[1], pathlib.Path(argv[2]), argv[3:] or list(CONFIGS)
  if command == 'record':
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
      print('recording', name, flush=True)
      np.savez_compressed(directory / f'{name}.npz', **run_config(name))
  elif command == 'compare':
    failed = False
    for name in names:
      problems = differences(dict(np.load(directory / f'{name}.npz')), run_config(name))
      print(name, 'OK' if not problems else f'{len(problems)} differences', flush=True)
      for problem in problems[:20]:
        print('   ', problem)
      failed = failed or bool(problems)
    sys.exit(1 if failed else 0)
  else:
    raise SystemExit(__doc__)


if __name__ == '__main__':
  # Started with SIGINT ignored (a background job), the process would pass that to
  # TFF's worker_binary, and switching to the test context (SECURE) waits forever for
  # the local worker to stop (as in tests/conftest.py).
  signal.signal(signal.SIGINT, signal.default_int_handler)
  with runtime.worker_binaries_stopped():
    main(sys.argv)
