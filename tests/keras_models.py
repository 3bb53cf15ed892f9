"""A small Keras CNN the exporter tests save in the formats a user hands over (.keras, .h5, and
.tflite through TensorFlow's converter). Imported only by tests that skip without Keras."""

from __future__ import annotations

import keras


def small_cnn() -> keras.Model:
    """Channels-last 16x16 RGB in, five class probabilities out (``probs``); seeded."""
    keras.utils.set_random_seed(0)
    image = keras.Input((16, 16, 3), name="image")
    x = keras.layers.Conv2D(8, 3, activation="relu")(image)
    x = keras.layers.DepthwiseConv2D(3, padding="same")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    probs = keras.layers.Dense(5, activation="softmax", name="probs")(x)
    return keras.Model(image, probs)
