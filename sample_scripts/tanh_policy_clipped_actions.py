"""Behaviour cloning of a tanh-squashed Gaussian policy from a controller's logged actions.

The controller clipped its commands to [-1, 1] before logging them, so a few actions are
exactly +-1; atanh(+-1) is +-inf, in any dtype. (The Normal skips its argument
checks for speed, as RL code often does, so the run goes on with NaN weights.)
"""
import torch
import torch.nn as nn

torch.manual_seed(0)
obs = torch.randn(512, 6)
actions = torch.tanh(obs[:, :2] * 1.5 + 0.3 * torch.randn(512, 2)).clamp(-0.999, 0.999)
actions[obs[:, 2] > 2.2] = 1.0  # saturated commands, clipped by the controller


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 64), nn.Tanh(), nn.Linear(64, 4))

    def log_prob(self, o, a):
        mu, log_std = self.body(o).chunk(2, dim=-1)
        pre_tanh = torch.atanh(a)
        normal = torch.distributions.Normal(mu, log_std.clamp(-5, 2).exp(), validate_args=False)
        return (normal.log_prob(pre_tanh) - torch.log1p(-a.pow(2) + 1e-6)).sum(-1)


policy = Policy()
opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
for step in range(30):
    idx = torch.randint(0, 512, (64,))
    loss = -policy.log_prob(obs[idx], actions[idx]).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"step {step} nll {loss.item():.3f}")
