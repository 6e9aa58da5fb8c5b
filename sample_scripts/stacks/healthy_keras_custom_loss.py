# Healthy: Keras 3 on the torch backend, a small regression MLP trained with model.fit and a
# custom Huber-style loss written with keras.ops.
import os

os.environ["KERAS_BACKEND"] = "torch"

import keras
import numpy as np
from keras import ops

keras.utils.set_random_seed(0)


def smooth_l1(y_true, y_pred):
    err = ops.abs(y_true - y_pred)
    return ops.mean(ops.where(err < 1.0, 0.5 * err**2, err - 0.5), axis=-1)


rng = np.random.default_rng(0)
x = rng.normal(size=(512, 6)).astype("float32")
y = (x @ rng.normal(size=(6, 1)) + 0.1 * rng.normal(size=(512, 1))).astype("float32")

model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=smooth_l1)
history = model.fit(x, y, batch_size=64, epochs=5, verbose=0)
for epoch, loss in enumerate(history.history["loss"]):
    print(f"epoch {epoch} loss {loss:.4f}")
