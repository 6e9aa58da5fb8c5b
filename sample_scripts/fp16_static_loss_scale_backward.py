"""A float16 regressor trained with a static loss scale written by hand (an old fp16
recipe: multiply the loss by 2**16 so small gradients do not underflow, divide the
gradients back before the step) instead of torch.amp.GradScaler, which lowers the scale
when gradients overflow. The forward stays in float16's range; the scaled gradient of the
loss, cast back to float16 for the head's output, does not: the first backward overflows,
every parameter's gradient is NaN or Inf, and the first update ruins the model."""
import torch

torch.manual_seed(0)
LOSS_SCALE = 2.0 ** 16

model = torch.nn.Sequential(
    torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 128),
).half()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(512, 16).half()
y = torch.randn(512, 128).half()

for step in range(20):
    opt.zero_grad()
    pred = model(x)
    loss = ((pred.float() - y.float()) ** 2).sum()
    (loss * LOSS_SCALE).backward()
    for p in model.parameters():
        p.grad /= LOSS_SCALE
    opt.step()
    print(f"step {step}: loss {loss.item():.4f}")
