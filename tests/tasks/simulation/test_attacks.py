"""Corruption models: corrupted-set selection, the tasks' data attacks, update attacks
against plain-numpy formulas."""

import ast
import collections
import importlib
import inspect
import pathlib
import pkgutil
import sys

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tasks import references
from tasks.builders import emnist
from tasks.builders import sent140
from tasks.builders import shakespeare
from tasks.simulation import attacks


def _structure(rng, dtype=np.float64):
  return collections.OrderedDict(
      dense=[rng.normal(size=(3, 2)).astype(dtype), rng.normal(size=(2,)).astype(dtype)],
      scale=rng.normal(size=()).astype(dtype))


def _weighted_mean(updates, weights):
  flats = [np.concatenate([np.ravel(t) for t in tf.nest.flatten(u)]) for u in updates]
  return np.tensordot(np.asarray(weights, np.float64), np.stack(flats), axes=1) / np.sum(
      weights)


def _flat(update):
  return np.concatenate([np.ravel(t) for t in tf.nest.flatten(update)])


class SelectCorruptedClientsTest(parameterized.TestCase):

  def test_zero_rho_is_empty(self):
    self.assertEqual(attacks.select_corrupted_clients({'a': 1.0, 'b': 2.0}, 0.0, 3),
                     frozenset())

  @parameterized.parameters((0.25, 3), (0.3, 4), (0.5, 6), (0.05, 1), (1.0, 10))
  def test_equal_weights_count(self, rho, expected):
    weights = {f'c{i}': 1.0 for i in range(10)}
    self.assertLen(attacks.select_corrupted_clients(weights, rho, seed=7), expected)

  @parameterized.parameters(0.1, 0.2, 0.35, 0.5)
  def test_weight_just_exceeds_rho(self, rho):
    rng = np.random.default_rng(0)
    weights = {f'c{i}': float(w) for i, w in enumerate(rng.integers(1, 100, 50))}
    total = sum(weights.values())
    chosen = attacks.select_corrupted_clients(weights, rho, seed=1)
    share = sum(weights[c] for c in chosen) / total
    self.assertGreater(share, rho)
    # Without the heaviest member the share is at most rho, so a fortiori without the
    # last one added.
    self.assertLessEqual(share - max(weights[c] for c in chosen) / total, rho)

  def test_same_seed_same_set(self):
    weights = {f'c{i}': float(i + 1) for i in range(30)}
    first = attacks.select_corrupted_clients(weights, 0.3, seed=5)
    reordered = dict(reversed(list(weights.items())))
    self.assertEqual(first, attacks.select_corrupted_clients(reordered, 0.3, seed=5))
    self.assertNotEqual(first, attacks.select_corrupted_clients(weights, 0.3, seed=6))

  def test_bad_rho(self):
    with self.assertRaisesRegex(ValueError, 'rho'):
      attacks.select_corrupted_clients({'a': 1.0}, 1.5, 0)


class DataPoisoningTest(tf.test.TestCase):

  def test_emnist_negative_image(self):
    x = np.linspace(0.0, 1.0, 28 * 28, dtype=np.float32).reshape(28, 28)
    (px, py), = emnist.poison(tf.data.Dataset.from_tensors((x, np.int32(7))))
    self.assertAllClose(px, 1.0 - x)
    self.assertEqual(py, 7)

  def test_sent140_label_flip(self):
    x = np.ones((3, 50), np.float32)
    y = np.array([0, 1, 1], np.int32)
    poisoned = list(sent140.poison(tf.data.Dataset.from_tensor_slices((x, y))))
    self.assertEqual([int(p[1]) for p in poisoned], [1, 0, 0])
    self.assertAllEqual(poisoned[0][0], x[0])

  def test_shakespeare_figure_7(self):
    # Figure 7 draws 10-character windows: the example predicting the "m" of "median"
    # becomes x̃ = "edian's ro" reversed = "or s'naide" with the label "m" unchanged.
    text = "the geometric median's robustness"
    ids = shakespeare.char_ids(text)
    width = 10
    view = np.lib.stride_tricks.sliding_window_view(ids, width + 1).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((view[:, :width], view[:, width]))
    m = text.index('median')
    clean = list(dataset)[m - width]
    self.assertAllEqual(clean[0], shakespeare.char_ids('geometric '))
    self.assertEqual(clean[1], shakespeare.char_ids('m')[0])
    poisoned = list(shakespeare.poison(dataset))[m]
    self.assertAllEqual(poisoned[0], shakespeare.char_ids("or s'naide"))
    self.assertEqual(poisoned[1], shakespeare.char_ids('m')[0])

  def test_shakespeare_poisoned_windows_are_reversed_text(self):
    ids = shakespeare.char_ids('To be, or not to be, that is the Question: Whether')
    starts = np.arange(len(ids) - shakespeare.WINDOW)
    x, y = shakespeare.windows(ids, starts)
    poisoned = list(shakespeare.poison(tf.data.Dataset.from_tensor_slices((x, y))))
    rx, ry = shakespeare.windows(ids[::-1].copy(), starts)
    self.assertLen(poisoned, len(rx))
    for (px, py), ex, ey in zip(poisoned, rx[::-1], ry[::-1]):
      self.assertAllEqual(px, ex)
      self.assertEqual(py, ey)


class CorruptUpdatesTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(0)
    self.updates = [_structure(rng) for _ in range(6)]
    self.weights = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0])
    self.corrupted = np.array([False, True, False, False, True, False])

  def _corrupt(self, attack, **params):
    return attacks.build_update_attack(attack, **params)(
        self.updates, self.weights, self.corrupted, np.random.default_rng(1))

  def test_omniscient_negates_weighted_mean(self):
    clean = _weighted_mean(self.updates, self.weights)
    attacked = _weighted_mean(self._corrupt('omniscient'), self.weights)
    np.testing.assert_allclose(attacked, -clean, rtol=1e-12, atol=1e-12)

  def test_omniscient_float32(self):
    rng = np.random.default_rng(2)
    updates = [_structure(rng, np.float32) for _ in range(5)]
    weights = np.array([10.0, 20.0, 5.0, 7.0, 1.0])
    corrupted = np.array([True, False, False, True, False])
    attacked = attacks.Omniscient()(updates, weights, corrupted, np.random.default_rng(0))
    self.assertEqual(attacked[0]['dense'][0].dtype, np.float32)
    np.testing.assert_allclose(_weighted_mean(attacked, weights),
                               -_weighted_mean(updates, weights), rtol=1e-5, atol=1e-6)

  def test_alie_formula(self):
    honest = np.stack([_flat(u) for u, c in zip(self.updates, self.corrupted) if not c])
    expected = honest.mean(axis=0) - 1.5 * honest.std(axis=0)
    attacked = self._corrupt('alie', z=1.5)
    for update, is_corrupted in zip(attacked, self.corrupted):
      if is_corrupted:
        np.testing.assert_allclose(_flat(update), expected, rtol=1e-12)

  def test_zero_update_sends_zeros(self):
    attacked = self._corrupt('zero_update')
    for update, original, is_corrupted in zip(attacked, self.updates, self.corrupted):
      expected = np.zeros_like(_flat(original)) if is_corrupted else _flat(original)
      np.testing.assert_array_equal(_flat(update), expected)

  @parameterized.parameters(1e-3, 0.5)
  def test_tiny_update_is_its_direction_at_epsilon_times_the_honest_norm(self, eps):
    honest = np.stack([_flat(u) for u, c in zip(self.updates, self.corrupted) if not c])
    scale = eps * np.median(np.linalg.norm(honest, axis=1))
    attacked = self._corrupt('tiny_update', epsilon=eps)
    for i in np.flatnonzero(self.corrupted):
      own = _flat(self.updates[i])
      np.testing.assert_allclose(_flat(attacked[i]), scale * own / np.linalg.norm(own),
                                 rtol=1e-6)

  @parameterized.parameters('tiny_update', 'far_update')
  def test_a_zero_update_is_sent_along_the_all_ones_direction(self, attack):
    rows = np.zeros((3, 4), np.float32)
    rows[1:] = 1.0
    sent = attacks.build_update_attack(attack).malicious_rows(
        rows, np.ones(3), np.array([True, False, False]), np.random.default_rng(0))
    self.assertTrue(np.all(sent > 0))
    row = sent[0].astype(np.float64)
    np.testing.assert_allclose(row / np.linalg.norm(row), np.full(4, 0.5),
                               rtol=1e-6)

  def test_far_update_is_its_direction_at_the_given_norm(self):
    attacked = self._corrupt('far_update', norm=1e30)
    for i in np.flatnonzero(self.corrupted):
      own = _flat(self.updates[i]).astype(np.float64)
      sent = _flat(attacked[i]).astype(np.float64)
      np.testing.assert_allclose(sent, 1e30 * own / np.linalg.norm(own), rtol=1e-6)

  def test_ipm_formula(self):
    honest = np.stack([_flat(u) for u, c in zip(self.updates, self.corrupted) if not c])
    attacked = self._corrupt('ipm', epsilon=0.5)
    np.testing.assert_allclose(_flat(attacked[1]), -0.5 * honest.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(
        _flat(self._corrupt('ipm')[4]),
        -0.1 * honest.mean(axis=0), rtol=1e-12)  # The default ε.

  def test_honest_untouched_and_structure_kept(self):
    for attack in attacks.UPDATE_ATTACKS:
      attacked = self._corrupt(attack)
      for original, new, is_corrupted in zip(self.updates, attacked, self.corrupted):
        tf.nest.assert_same_structure(original, new)
        if not is_corrupted:
          np.testing.assert_array_equal(_flat(original), _flat(new))

  def test_sign_flip_nan_inf(self):
    np.testing.assert_array_equal(_flat(self._corrupt('sign_flip')[1]),
                                  -_flat(self.updates[1]))
    self.assertTrue(np.isnan(_flat(self._corrupt('nan')[4])).all())
    self.assertTrue(np.isposinf(_flat(self._corrupt('inf')[4])).all())

  def test_gaussian_adds_noise_of_update_scale(self):
    rng = np.random.default_rng(3)
    big = [collections.OrderedDict(w=rng.normal(0.0, 2.0, size=(20000,)))]
    attacked = attacks.GaussianNoise()(big, np.ones(1), np.array([True]),
                                       np.random.default_rng(4))
    noise = attacked[0]['w'] - big[0]['w']
    self.assertAlmostEqual(noise.std(), big[0]['w'].std(), delta=0.05)
    self.assertAlmostEqual(noise.mean(), 0.0, delta=0.05)

  def test_random_gaussian_replaces_the_update(self):
    attacked = self._corrupt('random_gaussian', sigma=3.0)
    sent = np.concatenate([_flat(attacked[i]) for i in (1, 4)])
    expected = np.random.default_rng(1).normal(0.0, 3.0, (2, sent.size // 2)).ravel()
    np.testing.assert_array_equal(sent, expected)
    np.testing.assert_array_equal(_flat(attacked[0]), _flat(self.updates[0]))

  def test_no_corrupted_client_is_identity(self):
    untouched = attacks.Omniscient()(self.updates, self.weights, np.zeros(6, bool),
                                     np.random.default_rng(0))
    self.assertIs(untouched[0], self.updates[0])

  def test_names_and_parameters(self):
    self.assertEqual(attacks.known_attacks(('data',))[:3], ('none', 'data', 'gaussian'))
    self.assertIsNone(attacks.build_update_attack('data'))
    self.assertIsNone(attacks.build_update_attack('none'))
    with self.assertRaisesRegex(ValueError, "Unknown parameters \\['eps'\\].*'epsilon'"):
      attacks.build_update_attack('ipm', eps=1.0)
    with self.assertRaisesRegex(ValueError, 'z must be a finite number'):
      attacks.build_update_attack('alie', z=float('inf'))
    with self.assertRaisesRegex(ValueError, 'takes no parameters'):
      attacks.build_update_attack('data', z=1.0)
    self.assertEqual(repr(attacks.build_update_attack('alie', z=2)),
                     'ALittleIsEnough(z=2.0)')


# ---- adaptive attacks against closed forms and plain-numpy references ----------------


def np_std_direction(honest, kind):
  mean = honest.mean(axis=0)
  if kind == 'std':
    return -np.sqrt(((honest - mean) ** 2).mean(axis=0))
  if kind == 'unit_vector':
    return -mean / np.sqrt(np.sum(mean ** 2))
  return -np.sign(mean)


def np_largest_root(a, b, c):
  """The largest γ with a γ² + 2 b γ + c ≤ 0 (a > 0, c ≤ 0)."""
  return (-b + np.sqrt(b * b - a * c)) / a


def np_min_max_gamma(honest, p):
  """γ* of Min-Max in closed form: ‖μ + γp − x_i‖² ≤ D is a quadratic in γ for every
  honest i; the largest feasible γ is the smallest of their largest roots."""
  h = len(honest)
  bound = max(np.sum((honest[i] - honest[j]) ** 2) for i in range(h) for j in range(h))
  mean = honest.mean(axis=0)
  roots = [np_largest_root(p @ p, (mean - x) @ p, np.sum((mean - x) ** 2) - bound)
           for x in honest]
  return min(roots)


def np_min_sum_gamma(honest, p, bound='max'):
  """γ* of Min-Sum: Σ_i ‖μ + γp − x_i‖² ≤ S is one quadratic in γ."""
  h = len(honest)
  scores = [sum(np.sum((honest[i] - honest[j]) ** 2) for j in range(h))
            for i in range(h)]
  mean = honest.mean(axis=0)
  return np_largest_root(h * (p @ p), np.sum((mean - honest) @ p),
                         np.sum((mean - honest) ** 2) - (max if bound == 'max' else
                                                         min)(scores))


def np_line_maximize(f, evals, x, delta, ratio):
  """ByzFL's LineMaximize, transcribed: expansion by doubling, then contraction."""
  history = [(x, f(x))]
  best = history[0]
  prop = x
  for _ in range(evals - 1):
    prop = best[0] + delta
    history.append((prop, f(prop)))
    if history[-1][1] > best[1]:
      best, delta = history[-1], 2 * delta
    else:
      delta = ratio * delta
      break
  while len(history) < evals:
    if prop < best[0]:
      prop = prop + delta
    else:
      new = prop - delta
      while new < 0:
        new = (new + prop) / 2
      prop = new
    history.append((prop, f(prop)))
    if history[-1][1] > best[1]:
      best = history[-1]
    delta = ratio * delta
  return best[0]


def _matrices():
  """(updates, weights, corrupted) cases: random, a huge honest outlier, heavy ties,
  few clients in a high dimension."""
  rng = np.random.default_rng(11)
  random = rng.normal(size=(10, 9))
  outlier = random.copy()
  outlier[6, 4] = 1e4
  ties = rng.integers(-2, 3, size=(10, 9)).astype(np.float64)
  ties[:5] = ties[5]
  wide = rng.normal(0.5, 2.0, size=(5, 400))
  corrupted = np.zeros(10, bool)
  corrupted[[1, 4, 8]] = True
  return dict(
      random=(random, rng.uniform(0.5, 3.0, 10), corrupted),
      huge_honest_outlier=(outlier, np.ones(10), corrupted),
      ties=(ties, np.ones(10), corrupted),
      wide=(wide, np.arange(1.0, 6.0), np.array([True, False, False, False, False])))


MATRICES = _matrices()


class LineMaximizeTest(parameterized.TestCase):
  """Call sequences worked out by hand from ByzFL's `LineMaximize`, so that a reading
  shared by `attacks.line_maximize` and its transcription above would still fail."""

  @parameterized.named_parameters(
      # Two doublings, then contraction from above halving down towards the best, 3.
      ('expand_then_contract', lambda x: -(x - 3.0) ** 2, 8, 1.0, 0.5,
       [0.0, 1.0, 3.0, 7.0, 5.0, 4.0, 3.5, 3.25], 3.0),
      # ratio 0.8: the contraction steps past the best (1.24 < 3) and back up by +δ,
      # finding 2.96032, closer to the peak at 2.6.
      ('overshoot_and_back', lambda x: -(x - 2.6) ** 2, 9, 1.0, 0.8,
       [0.0, 1.0, 3.0, 7.0, 3.8, 1.24, 3.288, 1.6496, 2.96032], 2.96032),
      # A negative proposal is halved back towards the last one until it is ≥ 0:
      # 1 − 3 = −2 → −0.5 → 0.25; then 0.25 − 9 → ... → 0.109375.
      ('negative_proposals_halved', lambda x: -x, 4, 1.0, 3.0,
       [0.0, 1.0, 0.25, 0.109375], 0.0),
  )
  def test_proposals(self, objective, evaluations, delta, ratio, calls, best):
    seen = []

    def recorded(x):
      seen.append(x)
      return objective(x)

    found = attacks.line_maximize(recorded, evaluations, 0.0, delta, ratio)
    np.testing.assert_allclose(seen, calls, rtol=1e-12)
    self.assertAlmostEqual(found, best, places=12)
    self.assertAlmostEqual(np_line_maximize(objective, evaluations, 0.0, delta, ratio),
                           best, places=12)


class AdaptiveUpdateAttacksTest(parameterized.TestCase):

  def _rows(self, attack, case, **params):
    updates, weights, corrupted = MATRICES[case]
    rows = attacks.build_update_attack(attack, **params).malicious_rows(
        updates, weights, corrupted, np.random.default_rng(0))
    return np.broadcast_to(rows, (corrupted.sum(), updates.shape[1]))[0]

  @parameterized.product(case=list(MATRICES), perturbation=['std', 'unit_vector', 'sign'],
                         attack=['min_max', 'min_sum'])
  def test_shejwalkar_gamma_is_the_closed_form_boundary(self, case, perturbation, attack):
    updates, _, corrupted = MATRICES[case]
    honest = updates[~corrupted]
    p = np_std_direction(honest, perturbation)
    gamma = (np_min_max_gamma if attack == 'min_max' else np_min_sum_gamma)(honest, p)
    # The search covers [0, 2 gamma_init): start it where the boundary is inside (up
    # to γ = 8.6e3 for an honest outlier far along the unit vector, where the default
    # gamma_init = 10 of the authors' code stops the attack below 20).
    gamma_init = max(10.0, 0.75 * gamma)
    row = self._rows(attack, case, perturbation=perturbation, gamma_init=gamma_init,
                     threshold=1e-9)
    np.testing.assert_allclose(row, honest.mean(axis=0) + gamma * p, rtol=1e-5,
                               atol=1e-5)

  @parameterized.parameters('max', 'min')
  def test_min_sum_bound_and_default_threshold(self, bound):
    updates, _, corrupted = MATRICES['random']
    honest = updates[~corrupted]
    p = np_std_direction(honest, 'std')
    gamma = np_min_sum_gamma(honest, p, bound)
    row = self._rows('min_sum', 'random', bound=bound)
    found = np.mean((row - honest.mean(axis=0)) / p)
    # Feasible, and within the search's resolution (a few τ = 1e-5) of the boundary.
    self.assertBetween(gamma - found, 0.0, 4e-5)

  def test_min_max_stays_within_the_honest_diameter(self):
    updates, _, corrupted = MATRICES['random']
    honest = updates[~corrupted]
    row = self._rows('min_max', 'random')
    diameter = max(np.sum((a - b) ** 2) for a in honest for b in honest)
    farthest = max(np.sum((row - x) ** 2) for x in honest)
    self.assertLessEqual(farthest, diameter)
    self.assertGreater(farthest, diameter * (1 - 1e-4))  # It uses the whole budget.

  @parameterized.parameters(*MATRICES)
  def test_mimic_copies_the_client_along_the_top_eigenvector(self, case):
    updates, _, corrupted = MATRICES[case]
    honest = updates[~corrupted]
    centred = honest - honest.mean(axis=0)
    values, vectors = np.linalg.eigh(centred.T @ centred)  # The covariance (× h).
    chosen = np.argmax(np.abs(centred @ vectors[:, np.argmax(values)]))
    np.testing.assert_array_equal(self._rows('mimic', case), honest[chosen])

  def test_mimic_of_identical_honest_clients_is_the_first(self):
    updates = np.tile(np.arange(4.0), (5, 1))
    updates[0] = 100.0
    rows = attacks.Mimic().malicious_rows(updates, np.ones(5),
                                          np.array([True, False, False, True, False]),
                                          np.random.default_rng(0))
    np.testing.assert_array_equal(rows, np.arange(4.0))

  @parameterized.parameters('optimal_alie', 'optimal_ipm')
  def test_optimal_against_the_mean_keeps_doubling(self, attack):
    # With equal weights the mean moves linearly away from μ as z (ε) grows: every
    # expansion step improves, so the factor after E calls is δ(2^(E−1) − 1).
    updates, _, corrupted = MATRICES['huge_honest_outlier']
    honest = updates[~corrupted]
    row = self._rows(attack, 'huge_honest_outlier', aggregator='mean', evaluations=6,
                     delta=0.5)
    factor = 0.5 * (2 ** 5 - 1)
    expected = (honest.mean(axis=0) - factor * honest.std(axis=0)
                if attack == 'optimal_alie' else -factor * honest.mean(axis=0))
    np.testing.assert_allclose(row, expected, rtol=1e-12)

  @parameterized.product(case=list(MATRICES), attack=['optimal_alie', 'optimal_ipm'])
  def test_optimal_against_the_median_matches_the_line_search(self, case, attack):
    updates, weights, corrupted = MATRICES[case]
    honest = updates[~corrupted]
    mean, std = honest.mean(axis=0), honest.std(axis=0)

    def candidate(x):
      return mean - x * std if attack == 'optimal_alie' else -x * mean

    def damage(x):
      rows = updates.copy()
      rows[corrupted] = candidate(x)
      return np.linalg.norm(references.coordinate_median(rows, weights) - mean)

    expected = candidate(np_line_maximize(damage, 16, 0.0, 1.0, 0.8))
    np.testing.assert_allclose(self._rows(attack, case), expected, rtol=1e-12)

  def test_optimal_ipm_cannot_move_a_median_of_identical_clients(self):
    # A minority cannot move the median off identical honest clients: no factor
    # improves on the start, which is kept.
    updates = np.tile(np.array([1.0, -2.0, 3.0]), (5, 1))
    rows = attacks.OptimalInnerProductManipulation(start=2.0).malicious_rows(
        updates, np.ones(5), np.array([True, True, False, False, False]),
        np.random.default_rng(0))
    np.testing.assert_array_equal(rows, -2.0 * np.array([1.0, -2.0, 3.0]))

  def test_optimal_takes_an_aggregator_function(self):
    calls = []

    def first_row(rows, weights):
      calls.append(len(weights))
      return rows[0]  # Client 0 is honest: nothing the attacker sends moves it.

    updates, weights, corrupted = MATRICES['random']
    row = attacks.OptimalALittleIsEnough(aggregator=first_row, evaluations=5).malicious_rows(
        updates, weights, corrupted, np.random.default_rng(0))
    self.assertEqual(calls, [10] * 5)
    np.testing.assert_array_equal(row, updates[~corrupted].mean(axis=0))

  @parameterized.parameters(*MATRICES)
  def test_model_replacement_replaces_the_weighted_mean(self, case):
    updates, weights, corrupted = MATRICES[case]
    row = self._rows('model_replacement', case)
    honest_mean = np.average(updates[~corrupted], axis=0, weights=weights[~corrupted])
    # The round's weighted mean becomes the target −μ_α plus the honest clients'
    # share.
    np.testing.assert_allclose(
        row, -weights.sum() / weights[corrupted].sum() * honest_mean, rtol=1e-12)

  def test_model_replacement_with_target_and_boost(self):
    target = np.linspace(-1.0, 1.0, 9)
    np.testing.assert_allclose(
        self._rows('model_replacement', 'random', boost=3.0, target_update=target),
        3.0 * target, rtol=1e-15)
    with self.assertRaisesRegex(ValueError, 'target_update has 4 components'):
      self._rows('model_replacement', 'random', target_update=np.ones(4))

  def test_adaptive_attacks_keep_structure_through_the_harness(self):
    rng = np.random.default_rng(5)
    updates = [_structure(rng, np.float32) for _ in range(6)]
    corrupted = np.array([True, False, False, True, False, False])
    honest = np.stack([_flat(u) for u, c in zip(updates, corrupted) if not c])
    attacked = attacks.build_update_attack('min_max', threshold=1e-9)(
        updates, np.ones(6), corrupted, rng)
    p = np_std_direction(honest.astype(np.float64), 'std')
    expected = honest.mean(axis=0) + np_min_max_gamma(honest.astype(np.float64), p) * p
    self.assertEqual(attacked[0]['dense'][0].dtype, np.float32)
    np.testing.assert_allclose(_flat(attacked[3]), expected, rtol=1e-5, atol=1e-5)

  @parameterized.parameters(
      ('min_max', dict(perturbation='noise'), 'perturbation must be one of'),
      ('min_max', dict(gamma_init=0.0), 'gamma_init must be a finite number > 0'),
      ('min_sum', dict(threshold=-1.0), 'threshold must be a finite number > 0'),
      ('min_sum', dict(bound='median'), 'bound must be one of max, min'),
      ('optimal_alie', dict(aggregator='krum'), 'aggregator must be one of'),
      ('optimal_ipm', dict(evaluations=0), 'evaluations must be an integer'),
      ('optimal_ipm', dict(ratio=0.5), r'ratio must be in \(0.5, 1\)'),
      ('optimal_alie', dict(start=-1.0), 'start must be a finite number >= 0'),
      ('model_replacement', dict(boost=0.0), 'boost must be a finite number > 0'),
      ('model_replacement', dict(target_update=[[1.0]]), 'target_update must be'))
  def test_bad_parameters_are_named(self, attack, params, message):
    with self.assertRaisesRegex(ValueError, message):
      attacks.build_update_attack(attack, **params)

  @parameterized.parameters(
      ('alie', dict(z='1.0'), 'z must be a number'),
      ('optimal_ipm', dict(evaluations=8.0), 'evaluations must be an integer'),
      ('min_max', dict(gamma_init=True), 'gamma_init must be a number'))
  def test_parameters_of_the_wrong_type_are_named(self, attack, params, message):
    with self.assertRaisesRegex(TypeError, f'The attack parameter {message}'):
      attacks.build_update_attack(attack, **params)


# What every update attack sent from these inputs before `attacks.py` became a package
# (recorded from that module): the split must not change a single row.
_UPDATES = np.array([[1.029, 1.642, 1.147, -0.973], [-1.393, 0.067, 0.861, 0.509],
                     [1.81, 0.751, 0.64, -0.731], [-1.108, 1.484, 0.049, 0.812],
                     [-1.376, -0.436, -1.291, -0.776], [0.903, -1.481, -0.534, 0.164]])
_WEIGHTS = np.array([2.0, 1.0, 3.0, 1.0, 2.0, 4.0])
_CORRUPTED = np.array([False, True, False, True, False, False])
_RECORDED_ROWS = {
    'gaussian': [[-1.3919444925762592, 0.3233323757412709, 0.6257817325350948,
                  -0.255153746858785],
                 [-1.5458271176937348, 0.5290898383958335, 0.10691553148286956,
                  2.1025658273793053]],
    'omniscient': [[-7.097499999999998, 0.4835000000000004, 0.048999999999999544,
                    4.3745]] * 2,
    'sign_flip': [[1.393, -0.067, -0.861, -0.509], [1.108, -1.484, -0.049, -0.812]],
    'alie': [[-0.5963801496784092, -1.0628394561022239, -0.9682341915254717,
              -1.0175196688861288]] * 2,
    'ipm': [[-0.05915000000000001, -0.011899999999999994, 0.0009500000000000009,
             0.0579]] * 2,
    'zero_update': [[0.0, 0.0, 0.0, 0.0]] * 2,
    'tiny_update': [[-0.001734340706731943, 8.34176793618379e-05, 0.0010719794317991405,
                     0.0006337253551518729],
                    [-0.0011704173328194608, 0.0015675986659784112,
                     5.176033331060792e-05, 0.0008577426662900742]],
    'far_update': [[-8.116772969347861e+29, 3.9039755128952386e+28,
                    5.016899875526567e+29, 2.965856023975636e+29],
                   [-5.477592570485359e+29, 7.336414598014686e+29,
                    2.4224010465142836e+28, 4.0142645913665274e+29]],
    'random_gaussian': [[0.0012301533574825742, 0.2987455375084699, -0.2741378553622176,
                         -0.8905918387572742],
                        [-0.45467078517172255, -0.9916465549964624,
                         0.060143602597438485, 1.3402152455545335]],
    'min_max': [[-0.7289508804942645, -1.1947360287024995, -1.0752315956517122,
                 -1.0664596844231335]] * 2,
    'min_sum': [[-0.8610186255594853, -1.3261321733714575, -1.1818230416203779,
                 -1.115214016964356]] * 2,
    'mimic': [[-1.376, -0.436, -1.291, -0.776]] * 2,
    'optimal_alie': [[-2.972140449035228, -3.426518368306672, -2.885702574576415,
                      -1.8945590066583862]] * 2,
    'optimal_ipm': [[-75.1205, -15.112999999999992, 1.206500000000001, 73.533]] * 2,
    'model_replacement': [[-4.9329090909090905, 0.7439545454545456, 0.2978181818181818,
                           2.975227272727273]] * 2,
    'nan': [[np.nan] * 4] * 2,
    'inf': [[np.inf] * 4] * 2,
    # IPM at ε = 10: −10 × the honest mean.
    'weight_inflation': [[-5.915000000000001, -1.1899999999999994, 0.09500000000000009,
                          5.79]] * 2,
    'adaptive_weight': [[-5.915000000000001, -1.1899999999999994, 0.09500000000000009,
                         5.79]] * 2,
}


class RecordedRowsTest(parameterized.TestCase):

  @parameterized.parameters(*_RECORDED_ROWS)
  def test_rows_are_the_recorded_ones(self, name):
    rows = attacks.build_update_attack(name).malicious_rows(
        _UPDATES, _WEIGHTS, _CORRUPTED, np.random.default_rng(7))
    np.testing.assert_allclose(np.broadcast_to(rows, (2, 4)), _RECORDED_ROWS[name],
                               rtol=1e-12, atol=0.0)

  def test_every_attack_is_recorded_in_registration_order(self):
    # The order is the leaderboard's attack columns (and the binaries' help).
    self.assertEqual(list(attacks.UPDATE_ATTACKS), list(_RECORDED_ROWS))


class WeightAttacksTest(parameterized.TestCase):
  """A corrupted client reports its weight: `reported_weights`, `attack_round`."""

  def test_update_attacks_report_the_true_weights(self):
    for name in attacks.UPDATE_ATTACKS:
      if name in ('weight_inflation', 'adaptive_weight'):
        continue
      np.testing.assert_array_equal(
          attacks.build_update_attack(name).reported_weights(_WEIGHTS, _CORRUPTED),
          _WEIGHTS, name)

  @parameterized.parameters(1.0, 19.0, 1e4)
  def test_inflation_multiplies_the_corrupted_weights_only(self, factor):
    reported = attacks.build_update_attack(
        'weight_inflation', factor=factor).reported_weights(_WEIGHTS, _CORRUPTED)
    np.testing.assert_array_equal(reported,
                                  np.where(_CORRUPTED, factor * _WEIGHTS, _WEIGHTS))

  @parameterized.parameters((0.5, 4.0), (0.25, 1.0), (0.9, 2.5))
  def test_adaptive_claims_the_cap_with_every_attacker_high(self, quantile, multiple):
    rng = np.random.default_rng(3)
    weights = rng.integers(10, 201, size=20).astype(np.float64)
    corrupted = np.zeros(20, bool)
    corrupted[[2, 5, 11]] = True
    reported = attacks.build_update_attack(
        'adaptive_weight', quantile=quantile, multiple=multiple).reported_weights(
            weights, corrupted)
    np.testing.assert_array_equal(reported[~corrupted], weights[~corrupted])
    claims = reported[corrupted]
    self.assertLen(set(claims), 1)
    # The largest weight the cap lets through: claiming it, no attacker is capped,
    # and claiming more (up to float32's largest) gains nothing.
    np.testing.assert_array_equal(
        references.capped_weights(reported, quantile, multiple)[corrupted], claims)
    more = np.where(corrupted, np.finfo(np.float32).max, weights)
    self.assertLessEqual(
        references.capped_weights(more, quantile, multiple)[corrupted].max(), claims[0])

  def test_attack_round_sends_the_updates_and_the_reported_weights(self):
    attack = attacks.build_update_attack('weight_inflation', factor=100.0,
                                         update_attack='sign_flip')
    updates = [{'w': row.copy()} for row in _UPDATES]
    sent, reported = attack.attack_round(updates, _WEIGHTS, _CORRUPTED,
                                         np.random.default_rng(0))
    np.testing.assert_array_equal(reported, np.where(_CORRUPTED, 100 * _WEIGHTS,
                                                     _WEIGHTS))
    np.testing.assert_array_equal(sent[1]['w'], -_UPDATES[1])
    np.testing.assert_array_equal(sent[0]['w'], _UPDATES[0])

  def test_a_weight_attack_may_not_change_honest_weights(self):
    class Cheating(attacks.UpdateAttack):
      def malicious_rows(self, updates, weights, corrupted, rng):
        return updates[corrupted]

      def reported_weights(self, weights, corrupted):
        return 2 * np.asarray(weights)

    with self.assertRaisesRegex(ValueError, 'honest'):
      Cheating().attack_round(list(_UPDATES), _WEIGHTS, _CORRUPTED,
                              np.random.default_rng(0))

  @parameterized.named_parameters(
      ('weight_attack_as_update', 'weight_inflation',
       {'update_attack': 'adaptive_weight'}),
      ('unknown_update', 'weight_inflation', {'update_attack': 'nope'}),
      ('factor', 'weight_inflation', {'factor': -1.0}),
      ('quantile', 'adaptive_weight', {'quantile': 1.0}))
  def test_bad_parameters(self, name, params):
    with self.assertRaises(ValueError):
      attacks.build_update_attack(name, **params)


_PACKAGE = pathlib.Path(attacks.__file__).parent
_SHARED_MODULES = ('base', 'search')


class PackageTest(parameterized.TestCase):
  """One module per attack (or family), every one registered by importing the
  package, and every name of the former single module still importable."""

  def test_init_imports_every_attack_module_explicitly(self):
    # The explicit imports fix the registration order; a module left to the
    # catch-all import would register after them, unordered.
    tree = ast.parse((_PACKAGE / '__init__.py').read_text(encoding='utf-8'))
    imported = [alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                and node.module == 'tasks.simulation.attacks' for alias in node.names]
    modules = {m.name for m in pkgutil.iter_modules([str(_PACKAGE)])}
    self.assertCountEqual(imported, modules)

  @parameterized.parameters(*[m.name for m in pkgutil.iter_modules([str(_PACKAGE)])])
  def test_importing_any_module_first_registers_every_attack_in_order(self, first):
    # As in a fresh interpreter: the package's modules are imported anew (the ones
    # the other tests use are put back afterwards).
    prefix = 'tasks.simulation.attacks'
    saved = {k: v for k, v in sys.modules.items()
             if k == prefix or k.startswith(prefix + '.')}
    parent = sys.modules['tasks.simulation']
    try:
      for key in saved:
        del sys.modules[key]
      importlib.import_module(f'{prefix}.{first}')
      self.assertEqual(list(sys.modules[prefix].UPDATE_ATTACKS),
                       list(attacks.UPDATE_ATTACKS))
    finally:
      for key in [k for k in sys.modules if k == prefix or k.startswith(prefix + '.')]:
        del sys.modules[key]
      sys.modules.update(saved)
      parent.attacks = attacks

  def test_every_attack_class_is_registered(self):
    found, pending = set(), [attacks.UpdateAttack]
    while pending:
      cls = pending.pop()
      pending.extend(cls.__subclasses__())
      if cls.__module__.startswith('tasks.simulation.attacks') and not (
          inspect.isabstract(cls)):
        found.add(cls)
    self.assertEqual(found, set(attacks.UPDATE_ATTACKS.values()))
    self.assertLen(found, 19)

  def test_each_attack_module_defines_attacks_and_imports_no_other_attack(self):
    for info in pkgutil.iter_modules([str(_PACKAGE)]):
      if info.name in _SHARED_MODULES:
        continue
      module = getattr(attacks, info.name)
      self.assertTrue(any(cls.__module__ == module.__name__
                          for cls in attacks.UPDATE_ATTACKS.values()), info.name)
      tree = ast.parse(pathlib.Path(module.__file__).read_text(encoding='utf-8'))
      own = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module == 'tasks.simulation.attacks' for alias in node.names}
      self.assertContainsSubset(own, _SHARED_MODULES, info.name)

  @parameterized.parameters(
      'NO_ATTACK', 'UPDATE_ATTACKS', 'register', 'UpdateAttack', 'build_update_attack',
      'known_attacks', 'select_corrupted_clients', 'flatten_updates',
      'unflatten_update', 'honest_rows', 'unit_directions', 'PERTURBATIONS',
      'MAX_SEARCH_ITERATIONS', 'perturbation_vector', 'search_gamma', 'line_maximize',
      'NUMPY_AGGREGATORS', 'mimicked_client', 'GaussianNoise', 'Omniscient',
      'SignFlip', 'ALittleIsEnough', 'InnerProductManipulation', 'ZeroUpdate',
      'TinyUpdate', 'FarUpdate', 'RandomGaussian', 'MinMax', 'MinSum', 'Mimic',
      'OptimalALittleIsEnough', 'OptimalInnerProductManipulation',
      'ModelReplacement', 'NaNFault', 'InfFault', 'WeightInflation', 'AdaptiveWeight')
  def test_names_of_the_former_module(self, name):
    self.assertTrue(hasattr(attacks, name))

  def test_the_attacks_expect_the_numpy_references_by_name(self):
    self.assertEqual(attacks.NUMPY_AGGREGATORS, {
        'mean': references.weighted_mean, 'median': references.coordinate_median})


class LabelFlipTest(tf.test.TestCase):

  def test_emnist_flips_digits_and_keeps_letters(self):
    x = np.random.default_rng(0).uniform(size=(13, 28, 28)).astype(np.float32)
    y = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 35, 61], np.int32)
    poisoned = list(emnist.DATA_ATTACKS['label_flip'](
        tf.data.Dataset.from_tensor_slices((x, y))))
    self.assertEqual([int(p[1]) for p in poisoned],
                     [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 10, 35, 61])
    for (px, _), ex in zip(poisoned, x):
      self.assertAllEqual(px, ex)

  def test_sent140_label_flip_is_its_data_attack(self):
    self.assertIs(sent140.DATA_ATTACKS['label_flip'], sent140.poison)
    self.assertNotIn('label_flip', shakespeare.DATA_ATTACKS)


if __name__ == '__main__':
  tf.test.main()
