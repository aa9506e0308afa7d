"""The same training step as bench/train.rs in PyTorch on CPU: MLP [256,128] and LeNet-style CNN
(conv5x5 pad 2 -> ReLU -> maxpool2, twice; dense 128), batch 64, SGD momentum 0.9, synthetic
MNIST-shaped data. Prints one JSON object per model."""
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
threads = int(sys.argv[2]) if len(sys.argv) > 2 else torch.get_num_threads()
torch.set_num_threads(threads)
torch.manual_seed(1)
batch = 64


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = x.view(-1, 1, 28, 28)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


models = {
    "mlp": nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)),
    "cnn": Cnn(),
}
n = batch * 50
data = torch.rand(n, 784)
labels = torch.randint(0, 10, (n,))
for name, model in models.items():
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    warmup = steps // 10 + 5
    total = 0.0
    for i in range(warmup + steps):
        j = (i * batch) % (n - batch)
        t0 = time.perf_counter()
        x, y = data[j : j + batch], labels[j : j + batch]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if i >= warmup:
            total += time.perf_counter() - t0
    print(json.dumps({
        "impl": "pytorch",
        "version": torch.__version__,
        "model": name,
        "batch": batch,
        "steps": steps,
        "threads": torch.get_num_threads(),
        "samples_per_second": steps * batch / total,
        "ms_per_step": total / steps * 1e3,
    }), flush=True)
