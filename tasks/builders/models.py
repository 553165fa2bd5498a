"""The RFA paper's models (Appendix D.1), as Keras models that output logits."""

import tensorflow as tf

EMNIST_SHAPE = (28, 28)
SHAKESPEARE_WINDOW = 20
SHAKESPEARE_CLASSES = 53
GLOVE_DIM = 50


def emnist_linear(num_classes: int = 62) -> tf.keras.Model:
  """Softmax regression: one weight image w_l (plus bias) per class."""
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=EMNIST_SHAPE),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(num_classes),
  ])


def _emnist_convnet(filters: tuple[int, int], hidden: int,
                    num_classes: int) -> tf.keras.Model:
  """conv 5×5, pool, conv 5×5, pool, FC `hidden`, FC classes; 'same' padding as in
  the LEAF / FedAvg ConvNet the paper cites, so the hidden layer sees 7×7 maps."""
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=EMNIST_SHAPE),
      tf.keras.layers.Reshape(EMNIST_SHAPE + (1,)),
      tf.keras.layers.Conv2D(filters[0], 5, padding='same', activation='relu'),
      tf.keras.layers.MaxPool2D(2, strides=2),
      tf.keras.layers.Conv2D(filters[1], 5, padding='same', activation='relu'),
      tf.keras.layers.MaxPool2D(2, strides=2),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(hidden, activation='relu'),
      tf.keras.layers.Dense(num_classes),
  ])


def emnist_cnn(num_classes: int = 62) -> tf.keras.Model:
  """The paper's ConvNet: conv32 5×5, pool, conv64 5×5, pool, FC 2048, FC classes."""
  return _emnist_convnet((32, 64), 2048, num_classes)


def emnist_small_cnn(num_classes: int = 62) -> tf.keras.Model:
  """The ConvNet's shape at a size that runs here: conv16, conv32, FC 128 (0.2M
  parameters instead of 6.6M; the 2048-unit hidden layer is what makes the paper's
  ConvNet take ~20 s a round on 2 CPU cores)."""
  return _emnist_convnet((16, 32), 128, num_classes)


def shakespeare_lstm(embedding_dim: int = 8) -> tf.keras.Model:
  """20 character ids → embedding → LSTM(128) → 53 next-character logits.

  A learned 8-d embedding replaces the paper's one-hot input (as in TFF's Shakespeare
  baseline); it is a linear map of the one-hot vector, so the model class is the same.
  """
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(SHAKESPEARE_WINDOW,), dtype=tf.int32),
      tf.keras.layers.Embedding(SHAKESPEARE_CLASSES, embedding_dim),
      tf.keras.layers.LSTM(128),
      tf.keras.layers.Dense(SHAKESPEARE_CLASSES),
  ])


def sent140_linear() -> tf.keras.Model:
  """Linear model on the 50-d average GloVe vector, with 2 logits.

  Softmax over 2 logits is binary logistic regression on their difference, and keeps
  every task on sparse categorical cross-entropy and accuracy.
  """
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(GLOVE_DIM,)),
      tf.keras.layers.Dense(2),
  ])


def loss_fn() -> tf.keras.losses.Loss:
  """Multinomial logistic loss on logits (all three tasks)."""
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
