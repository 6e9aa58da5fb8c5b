"""Never change the user's numbers: a healthy run ends with bit-identical parameters."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from helpers import once_per_session, run_nandoctor

TRAIN = """\
import sys, torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                      nn.Flatten(), nn.Linear(4 * 8 * 8, 3))
# Regions (torch.nn modules run with the per-op mode off): a Transformer layer with dropout
# and a -inf causal mask, and a layer whose NaN output (from a missing input) is replayed
# and then imputed, so the replay's random draws must leave the script's stream as it was.
encoder = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True)
gappy = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.5))
mask = nn.Transformer.generate_square_subsequent_mask(5)
missing = torch.tensor([[1.0, float("nan"), 2.0], [0.5, 0.5, 0.5]])
opt = torch.optim.AdamW([*model.parameters(), *encoder.parameters()], lr=1e-2)
data = TensorDataset(torch.randn(64, 1, 8, 8), torch.randint(0, 3, (64,)))
for epoch in range(2):
    for x, y in DataLoader(data, batch_size=16, shuffle=True):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        with torch.no_grad():  # (its weights' gradients would hold the NaN)
            seq = torch.nan_to_num(gappy(missing)).reshape(2, 1, 8).repeat(1, 5, 1)
        loss = loss + encoder(seq, src_mask=mask, is_causal=True).pow(2).mean()
        loss.backward()
        opt.step()
torch.save({**model.state_dict(), **{"encoder." + k: v for k, v in encoder.state_dict().items()},
            **{"gappy." + k: v for k, v in gappy.state_dict().items()}}, sys.argv[1])
"""


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> dict:
    """The parameters the script ends with under plain python: one run for every mode (and
    every xdist worker, see helpers.once_per_session)."""

    def run_plain() -> str:  # a real `python`: the reference, nothing of nandoctor's loaded
        folder = tmp_path_factory.mktemp("plain")
        (folder / "train.py").write_text(TRAIN)
        subprocess.run([sys.executable, "train.py", "plain.pt"], cwd=folder, check=True, timeout=180)
        return str(folder / "plain.pt")

    return torch.load(once_per_session(tmp_path_factory, "numbers_unchanged_plain", run_plain))


@pytest.mark.parametrize("mode", ["trace", "watch", "device-flags"])
def test_parameters_are_bit_identical_to_plain_python(tmp_path, script, plain, mode):
    script("train.py", TRAIN)
    if mode == "device-flags":  # trace mode's GPU path (flags read at boundaries), taken on CPU
        script("flags.yaml", "run:\n  device_flags: always\n")
        options = ["--config", "flags.yaml"]
    else:
        options = ["--mode", mode]
    result = run_nandoctor(["run", *options, "train.py", "wrapped.pt"], tmp_path)
    assert result.code == 0, result.stderr
    wrapped = torch.load(tmp_path / "wrapped.pt")
    assert plain.keys() == wrapped.keys()
    for name in plain:
        assert torch.equal(plain[name], wrapped[name]), name
        assert plain[name].numpy().tobytes() == wrapped[name].numpy().tobytes(), name


# A dataset with its own random streams and a counter, whose labels hold NaN for "missing"
# (masked out of the loss): each batch with a NaN is fetched again to look for the op that
# made it, and that must not move the dataset's streams or its count.
OWN_STREAMS = """\
import numpy as np, torch
from torch.utils.data import DataLoader, Dataset

class Jittered(Dataset):
    def __init__(self):
        self.x = np.linspace(-1, 1, 64, dtype=np.float32)
        self.y = (2 * self.x).copy()
        self.y[::5] = np.nan
        self.rng = np.random.default_rng(0)
        self.gen = torch.Generator().manual_seed(0)
        self.served = 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self.served += 1
        noise = float(self.rng.normal(0, 0.1)) + float(torch.rand(1, generator=self.gen)) * 0.1
        return torch.tensor([self.x[i] + noise]), torch.tensor([self.y[i]])

torch.manual_seed(0)
data = Jittered()
w = torch.nn.Linear(1, 1)
opt = torch.optim.SGD(w.parameters(), lr=0.1)
for x, y in DataLoader(data, batch_size=16):
    keep = ~torch.isnan(y)
    loss = ((w(x) - y)[keep] ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"{loss.item():.9f} {data.served}")
"""


@pytest.mark.parametrize("mode", ["trace", "watch"])
def test_fetching_a_batch_again_leaves_the_datasets_own_streams_and_counters_alone(tmp_path, script, mode):
    script("train.py", OWN_STREAMS)
    plain = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    result = run_nandoctor(["run", "--mode", mode, "train.py"], tmp_path)
    assert result.code == 0, result.stderr
    assert result.stdout == plain.stdout
