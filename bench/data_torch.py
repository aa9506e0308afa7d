"""The anchor of bench/data.sh: PyTorch's DataLoader with torchvision's ImageFolder and the same
transforms as Tandem's pipeline (RandomResizedCrop to SIZE, RandomHorizontalFlip, ToTensor,
Normalize), NUM_WORKERS worker processes of one thread each, batches of BATCH; prints one JSON
line with images/s, timed after the first batch, like `tandem data bench`.

    python bench/data_torch.py ROOT --workers N --batch B --seconds S --size S
"""

import argparse
import json
import time

import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

MEAN = [0.5, 0.5, 0.5]
STD = [0.25, 0.25, 0.25]


def one_thread(_):
    torch.set_num_threads(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--size", type=int, default=96)
    a = p.parse_args()
    torch.set_num_threads(1)
    t = transforms.Compose(
        [
            transforms.RandomResizedCrop(a.size, scale=(0.08, 1.0), ratio=(0.75, 4.0 / 3.0)),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(MEAN, STD),
        ]
    )
    data = datasets.ImageFolder(a.root, transform=t)
    loader = DataLoader(
        data,
        batch_size=a.batch,
        shuffle=True,
        drop_last=True,
        num_workers=a.workers,
        persistent_workers=True,
        prefetch_factor=2,
        worker_init_fn=one_thread,
    )

    def batches():
        while True:
            yield from loader

    it = batches()
    next(it)
    images, start = 0, time.perf_counter()
    while time.perf_counter() - start < a.seconds:
        x, _ = next(it)
        images += x.shape[0]
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "bench": "data",
                "impl": "pytorch",
                "threads": a.workers,
                "batch": a.batch,
                "images": images,
                "seconds": seconds,
                "images_per_second": images / seconds,
                "torch": torch.__version__,
            }
        ),
        flush=True,
    )
    # Persistent workers: leave without waiting for their prefetch.
    import os

    os._exit(0)


if __name__ == "__main__":
    main()
