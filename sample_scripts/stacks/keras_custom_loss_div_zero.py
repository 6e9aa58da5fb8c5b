# Daily sales forecaster in Keras 3 (torch backend) trained with model.fit and a custom
# percentage-error loss. Some store-days had no sales (target 0): |y - y_hat| / |y| divides
# by zero and the loss is inf from the first batch that holds one.
import os

os.environ["KERAS_BACKEND"] = "torch"

import keras
import numpy as np
from keras import ops

keras.utils.set_random_seed(0)


def mape_loss(y_true, y_pred):
    return 100.0 * ops.mean(ops.abs(y_true - y_pred) / ops.abs(y_true), axis=-1)


rng = np.random.default_rng(0)
n = 512
features = rng.normal(size=(n, 6)).astype("float32")
sales = np.maximum(0.0, 20 + features @ rng.normal(scale=4.0, size=6)).round()
sales[rng.choice(n, size=8, replace=False)] = 0.0  # closed for inventory
sales = sales.astype("float32")[:, None]

model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=mape_loss)
history = model.fit(features, sales, batch_size=64, epochs=5, verbose=0)
for epoch, loss in enumerate(history.history["loss"]):
    print(f"epoch {epoch} loss {loss:.4f}")
