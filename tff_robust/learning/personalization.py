"""Client-side personalization: Ditto and personalized RFA (RFA paper Algorithm 4).

Both methods keep *personal parameters* on each device next to the shared model w that
the server trains. This module holds only what runs on one client, in plain TensorFlow,
so it can be deployed as it is; the simulation harness
(`tasks.simulation.client_work`) and any production loop call it per client and send
only the shared update on to an aggregator (`tff_robust.GeometricMedianFactory` or any
`tff.aggregators` factory).

**Personal parameters never leave the client.** Every method here returns the personal
parameters separately from the shared update: the caller stores them on the device (in
simulation: a per-client store) and must never aggregate, log or upload them. The only
value meant for the server is `shared_delta`, which has the shape of the global model
and goes through the (robust, secure-aggregation compatible) aggregator like any FedAvg
update.

Methods:
  * Ditto (Li et al., ICML 2021; slides Algorithm 1). The global model is trained by any
    solver: here `local_sgd`, FedAvg's client update, gives Δ_k = w_k − w. Each selected
    client also runs s steps of
        v_k ← v_k − η (∇F_k(v_k) + λ (v_k − w)),
    i.e. SGD on h_k(v_k; w) = F_k(v_k) + λ/2 ‖v_k − w‖² (`ditto_personal_update`).
    λ = 0 is pure local training; λ → ∞ pins v_k to w.
  * Personalized RFA (RFA paper Section 4.2, Algorithm 4, residual learning). The model
    of device i is w + u_i. A selected device first takes τ SGD steps on u with w fixed,
    u ← u − γ ∇f(w + u; z), then τ steps on w with the new u fixed,
    w ← w − γ ∇f(w + u_i^new; z̃), and sends Δw = w_τ − w
    (`personalized_rfa_update`). Because ∇_u f(w + u) = ∇_w f(w + u) = ∇f(θ) at
    θ = w + u, both phases are SGD on θ: the first τ steps are credited to u, the last τ
    to w. The implementation uses this: u^new = θ_τ − w and Δw = θ_2τ − θ_τ.

Parameters are lists of numpy arrays in the order of `keras_model.trainable_variables`
("weights" below). Non-trainable variables (none in the RFA tasks) are not personalized.
Optimization is plain SGD, as in both papers. One Keras model and one traced
`tf.function` serve every client and every call: only variable values change.
"""

import dataclasses
from typing import Callable, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from tff_robust.common import arguments

Weights = list[np.ndarray]
LossFn = Union[tf.keras.losses.Loss, Callable[[], tf.keras.losses.Loss]]


@dataclasses.dataclass
class TrainingStats:
  """What one local pass saw.

  Attributes:
    loss: Mean training loss over the examples of the pass (before each step's update;
      the regularizer of Ditto excluded). NaN if the dataset was empty.
    num_examples: Examples seen (summed over steps; repeats count again).
    num_steps: SGD steps taken (batches).
  """
  loss: float
  num_examples: int
  num_steps: int


@dataclasses.dataclass
class LocalUpdate:
  """The shared-model update of one client: the only value that leaves the device.

  Attributes:
    shared_delta: w_client − w, to be aggregated.
    stats: The local pass over the shared model.
  """
  shared_delta: Weights
  stats: TrainingStats


@dataclasses.dataclass
class DittoPersonalUpdate:
  """Ditto's new personal model v_k (stays on the device)."""
  personal_weights: Weights
  stats: TrainingStats


@dataclasses.dataclass
class PersonalizedRfaUpdate:
  """Algorithm 4's outputs: the shared update (sent) and the new u_i (kept on device).

  Attributes:
    shared_delta: Δw = w_τ − w, to be aggregated (by the geometric median in RFA).
    personal_offset: u_i^new = u_τ; the device's model is w + u_i. Never sent.
    personal_stats: The τ steps on u (w fixed).
    shared_stats: The τ steps on w (u_i^new fixed).
  """
  shared_delta: Weights
  personal_offset: Weights
  personal_stats: TrainingStats
  shared_stats: TrainingStats


class PersonalizationClient:
  """The client computations of Ditto and personalized RFA on one reused Keras model.

  Datasets yield `(x, y)` batches; every batch is one SGD step on the mean batch loss.
  To run exactly s steps, pass e.g. `dataset.repeat().take(s)`. Every update raises a
  TypeError for a learning rate or λ that is not a number, and a ValueError for a
  learning rate that is not finite and > 0 or a λ that is not finite and >= 0.

  Example (one selected Ditto client):

    client = PersonalizationClient(keras_model_fn, loss_fn)
    update = client.local_sgd(w, dataset, learning_rate=0.1)          # → aggregator
    v_k = client.ditto_personal_update(v_k, w, dataset.repeat().take(s),
                                       learning_rate=0.1, lam=1.0).personal_weights
  """

  def __init__(self, keras_model_fn: Callable[[], tf.keras.Model], loss_fn: LossFn):
    """Builds the model once.

    Args:
      keras_model_fn: Builds the (uncompiled) Keras model; it must create its variables
        (e.g. start with an `InputLayer`).
      loss_fn: A Keras loss with the default mean reduction, or a function building one.
    """
    self._model = keras_model_fn()
    self._variables = list(self._model.trainable_variables)
    if not self._variables:
      raise ValueError('The Keras model has no trainable variables; build it with an '
                       'InputLayer (or known input shape) so its variables exist.')
    self._loss = loss_fn if isinstance(loss_fn, tf.keras.losses.Loss) else loss_fn()
    self._sgd = tf.function(self._sgd_loop, reduce_retracing=True)

  @property
  def keras_model(self) -> tf.keras.Model:
    """The reused model (its variables hold the result of the last call)."""
    return self._model

  def initial_weights(self) -> Weights:
    """The model's current trainable values (at construction: Keras's initialization)."""
    return [v.numpy() for v in self._variables]

  def zeros_like_weights(self) -> Weights:
    """Zero parameters: the initial personal offset u of personalized RFA."""
    return [np.zeros(v.shape, v.dtype.as_numpy_dtype) for v in self._variables]

  def local_sgd(self, weights: Sequence[np.ndarray], dataset: tf.data.Dataset,
                learning_rate: float) -> LocalUpdate:
    """FedAvg's client update from `weights` (the global solver of Ditto)."""
    arguments.check_positive_float('learning_rate', learning_rate)
    final, stats = self._run(weights, weights, dataset, learning_rate, 0.0)
    return LocalUpdate(_subtract(final, weights), stats)

  def ditto_personal_update(self, personal_weights: Sequence[np.ndarray],
                            global_weights: Sequence[np.ndarray],
                            dataset: tf.data.Dataset, learning_rate: float,
                            lam: float) -> DittoPersonalUpdate:
    """One step per batch of v ← v − η(∇F_k(v) + λ(v − w)), w = `global_weights`.

    Args:
      personal_weights: v_k (w^t for a device that has none yet).
      global_weights: w^t as broadcast this round (not the device's locally trained w).
      dataset: The s batches of the device.
      learning_rate: η.
      lam: λ ≥ 0. For stability η(L + λ) < 2 (L: smoothness of F_k).
    """
    arguments.check_positive_float('learning_rate', learning_rate)
    arguments.check_nonnegative_float('Ditto lambda', lam)
    final, stats = self._run(personal_weights, global_weights, dataset, learning_rate,
                             lam)
    return DittoPersonalUpdate(final, stats)

  def personalized_rfa_update(self, personal_offset: Sequence[np.ndarray],
                              global_weights: Sequence[np.ndarray],
                              personal_dataset: tf.data.Dataset,
                              shared_dataset: tf.data.Dataset,
                              learning_rate: float,
                              personal_learning_rate: Optional[float] = None
                              ) -> PersonalizedRfaUpdate:
    """RFA paper Algorithm 4 on one device.

    Args:
      personal_offset: u_i (zeros for a device that has none yet).
      global_weights: w^(t).
      personal_dataset: The τ batches z_{i,k} of the u phase.
      shared_dataset: The τ batches z̃_{i,k} of the w phase.
      learning_rate: γ of the w phase.
      personal_learning_rate: γ of the u phase; default `learning_rate` (the paper's).
    """
    if personal_learning_rate is None:
      personal_learning_rate = learning_rate
    arguments.check_positive_float('learning_rate', learning_rate)
    arguments.check_positive_float('personal_learning_rate', personal_learning_rate)
    start = _add(global_weights, personal_offset)
    # u phase: SGD on θ = w + u with w fixed, so u_τ = θ_τ − w.
    theta_u, personal_stats = self._run(start, start, personal_dataset,
                                        personal_learning_rate, 0.0)
    # w phase: SGD on θ = w + u_τ with u_τ fixed, so Δw = θ_2τ − θ_τ.
    theta_w, shared_stats = self._run(theta_u, theta_u, shared_dataset, learning_rate,
                                      0.0)
    return PersonalizedRfaUpdate(
        shared_delta=_subtract(theta_w, theta_u),
        personal_offset=_subtract(theta_u, global_weights),
        personal_stats=personal_stats, shared_stats=shared_stats)

  def _run(self, initial, anchor, dataset, learning_rate, lam):
    """SGD from `initial` with a proximal pull λ toward `anchor`; numpy results."""
    self._check_structure(initial)
    self._check_structure(anchor)
    final, loss_sum, count, steps = self._sgd(
        [tf.convert_to_tensor(w, v.dtype) for w, v in zip(initial, self._variables)],
        [tf.convert_to_tensor(w, v.dtype) for w, v in zip(anchor, self._variables)],
        dataset, tf.constant(learning_rate, tf.float32), tf.constant(lam, tf.float32))
    count = int(count.numpy())
    loss = float(loss_sum.numpy()) / count if count else float('nan')
    return [t.numpy() for t in final], TrainingStats(loss, count, int(steps.numpy()))

  def _sgd_loop(self, initial, anchor, dataset, learning_rate, lam):
    """The traced loop: θ ← θ − lr(∇loss(θ; batch) + λ(θ − anchor)) per batch."""
    for variable, value in zip(self._variables, initial):
      variable.assign(value)
    loss_sum = tf.constant(0.0, tf.float64)
    count = tf.constant(0, tf.int64)
    steps = tf.constant(0, tf.int64)
    for x, y in dataset:
      with tf.GradientTape() as tape:
        loss = self._loss(y, self._model(x, training=True))
      gradients = tape.gradient(loss, self._variables,
                                unconnected_gradients=tf.UnconnectedGradients.ZERO)
      for variable, gradient, center in zip(self._variables, gradients, anchor):
        # Embedding gradients are IndexedSlices; the proximal term is dense anyway.
        gradient = tf.convert_to_tensor(gradient)
        step = gradient + tf.cast(lam, variable.dtype) * (variable - center)
        variable.assign_sub(tf.cast(learning_rate, variable.dtype) * step)
      batch_size = tf.shape(y, out_type=tf.int64)[0]
      loss_sum += tf.cast(loss, tf.float64) * tf.cast(batch_size, tf.float64)
      count += batch_size
      steps += 1
    return [tf.identity(v) for v in self._variables], loss_sum, count, steps

  def _check_structure(self, weights):
    shapes = [tuple(np.shape(w)) for w in weights]
    expected = [tuple(v.shape) for v in self._variables]
    if shapes != expected:
      raise ValueError(f'Weights of shapes {shapes} do not match the model\'s trainable '
                       f'variables {expected}.')


def _add(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> Weights:
  return [np.asarray(x) + np.asarray(y) for x, y in zip(a, b)]


def _subtract(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> Weights:
  return [np.asarray(x) - np.asarray(y) for x, y in zip(a, b)]
