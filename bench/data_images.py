"""Writes the image folder that bench/data.sh times: Fashion-MNIST images (data/fashion-mnist)
upscaled to SIZE x SIZE and coloured (each channel a different tint of the image), saved as JPEG
(quality 90) in <out>/train/<class>/<n>.jpg and <out>/test/<class>/<n>.jpg, so that decoding is
the work of a real JPEG data set of photographs' sizes.

    python bench/data_images.py OUT [--train N] [--test N] [--size S]
"""

import argparse
import gzip
import os
import struct

import numpy as np
from PIL import Image


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    if magic == 2051:
        rows, cols = struct.unpack(">II", data[8:16])
        return np.frombuffer(data, np.uint8, offset=16).reshape(n, rows, cols)
    return np.frombuffer(data, np.uint8, offset=8)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--train", type=int, default=2000)
    p.add_argument("--test", type=int, default=200)
    p.add_argument("--size", type=int, default=160)
    p.add_argument("--data", default="data/fashion-mnist")
    a = p.parse_args()
    images = idx(os.path.join(a.data, "train-images-idx3-ubyte.gz"))
    labels = idx(os.path.join(a.data, "train-labels-idx1-ubyte.gz"))
    tints = np.array([[1.0, 0.6, 0.3], [0.4, 1.0, 0.7], [0.8, 0.5, 1.0]], np.float32)
    for part, start, count in [("train", 0, a.train), ("test", a.train, a.test)]:
        for i in range(start, start + count):
            grey = images[i].astype(np.float32)
            tint = tints[i % 3]
            # A gradient background so that the JPEG has detail in every channel.
            ramp = np.linspace(0, 60, 28, dtype=np.float32)[None, :]
            rgb = np.stack([np.clip(grey * t + ramp * (c + 1) / 3, 0, 255) for c, t in enumerate(tint)], -1)
            img = Image.fromarray(rgb.astype(np.uint8), "RGB").resize((a.size, a.size), Image.BILINEAR)
            folder = os.path.join(a.out, part, f"c{labels[i]}")
            os.makedirs(folder, exist_ok=True)
            img.save(os.path.join(folder, f"{i:06d}.jpg"), quality=90)


if __name__ == "__main__":
    main()
