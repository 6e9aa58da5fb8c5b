# A CUDA run that divides by a per-row spread that is 0 for constant rows: nandoctor must
# name this line on the GPU as on the CPU (device flags read at the boundary, then replay).
import torch

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).cuda()
opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
x = torch.rand(64, 8, device="cuda")
x[7] = 0.5  # a constant row
for step in range(5):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        z = (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)
        loss = net(z).float().pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(step, loss.item())
