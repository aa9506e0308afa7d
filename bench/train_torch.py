"""The training step of kernels/src/bin/engine_step.rs in PyTorch on CPU: the same models
(bench/torch_models.py), batches and synthetic data shapes, SGD with momentum 0.9, one model at a
time for about S seconds after a warm-up. Prints one JSON object per model with samples/s (tokens/s
for the GPT), the parameter count and the step's breakdown (forward, backward, optimizer).

    python bench/train_torch.py [--models m1,m2] [--threads N] [--seconds S]
"""
import argparse
import json
import os
import sys
import time
import warnings

# torch warns on import when NumPy is absent; the benchmark does not use NumPy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import VGG_A, Gpt, LeNet, ResNet, Vgg, mlp  # noqa: E402

# name: (builder, batch, input shape or ("tokens", context, vocab), classes)
MODELS = {
    "mlp": (lambda: mlp(), 64, (784,), 10),
    "cnn": (lambda: LeNet(), 64, (1, 28, 28), 10),
    "resnet20": (lambda: ResNet(20, "Cifar", 16, 1, 10), 128, (1, 28, 28), 10),
    "resnet18": (lambda: ResNet(18, "ImageNet", 64, 3, 1000), 8, (3, 224, 224), 1000),
    "vgga": (lambda: Vgg(VGG_A, 64, 4096, 3, 224, 1000), 8, (3, 224, 224), 1000),
    "gpt": (lambda: Gpt(65, 128, 4, 4, 128), 16, ("tokens", 128, 65), 65),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        ap.error(f"unknown model {unknown[0]!r}; the models are {', '.join(MODELS)}")
    if args.threads < 1 or not args.seconds > 0:
        ap.error("--threads wants a whole number >= 1 and --seconds a positive number")
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    for name in args.models.split(","):
        build, batch, shape, classes = MODELS[name]
        model = build()
        model.train()
        batches = 4
        if shape[0] == "tokens":
            _, context, vocab = shape
            xs = torch.randint(0, vocab, (batches, batch, context))
            ys = torch.randint(0, vocab, (batches, batch, context))
            per_sample = context
        else:
            xs = torch.rand((batches, batch) + shape)
            ys = torch.randint(0, classes, (batches, batch))
            per_sample = 1
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step(i, times=None):
            x, y = xs[i % batches], ys[i % batches]
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            t3 = time.perf_counter()
            if times is not None:
                for k, d in zip(("forward", "backward", "optimizer"), (t1 - t0, t2 - t1, t3 - t2)):
                    times[k] += d
            return loss.item()

        warm, i = time.perf_counter(), 0
        while i < 2 or (time.perf_counter() - warm < 0.5 and i < 20):
            step(i)
            i += 1
        times = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
        steps, start = 0, time.perf_counter()
        while steps < 3 or time.perf_counter() - start < args.seconds:
            loss = step(i + steps, times)
            steps += 1
        total = sum(times.values())
        record = {
            "impl": "pytorch",
            "version": torch.__version__,
            "model": name,
            "batch": batch,
            "steps": steps,
            "threads": torch.get_num_threads(),
            "parameters": sum(p.numel() for p in model.parameters()),
            "samples_per_second": steps * batch / total,
            "ms_per_step": total / steps * 1e3,
            "breakdown_ms": {k: v / steps * 1e3 for k, v in times.items()},
            "final_loss": loss,
        }
        if per_sample > 1:
            record["tokens_per_second"] = record["samples_per_second"] * per_sample
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
