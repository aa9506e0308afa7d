"""The engine's models in plain PyTorch, for bench/train_torch.py (timing) and
kernels/tests/fixtures/make_fixtures.py (reference outputs): the same architectures, parameter
names and flat order as tandem-kernels' models (torchvision's ResNet and VGG, nanoGPT's GPT).

- ResNet: CIFAR stem (3×3, stages 16/32/64 of basic blocks) or ImageNet stem (7×7/2, 3×3/2 max
  pooling, 4 stages; basic or bottleneck blocks), projection shortcuts, global average pooling.
- VGG: 3×3 convolutions with ReLU, 2×2 max pooling, three dense layers, no dropout.
- GPT: token and position embeddings, pre-LN blocks (causal self-attention, tanh-GELU MLP), final
  layer norm, lm_head tied to the token embedding.
- LeNet: the trainer's CNN (5×5 convolutions, 2×2 max pooling, dense layers).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# --- ResNet (torchvision's names; CIFAR and ImageNet stems) ---------------------------------------
class Basic(nn.Module):
    expansion = 1

    def __init__(self, cin, width, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.downsample = None
        if stride != 1 or cin != width:
            self.downsample = nn.Sequential(nn.Conv2d(cin, width, 1, stride, bias=False), nn.BatchNorm2d(width))

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, width, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, 4 * width, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(4 * width)
        self.downsample = None
        if stride != 1 or cin != 4 * width:
            self.downsample = nn.Sequential(nn.Conv2d(cin, 4 * width, 1, stride, bias=False), nn.BatchNorm2d(4 * width))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    def __init__(self, depth, family, width, channels, classes):
        super().__init__()
        if family == "ImageNet":
            stages, block = {18: ([2, 2, 2, 2], Basic), 34: ([3, 4, 6, 3], Basic), 50: ([3, 4, 6, 3], Bottleneck)}[depth]
            self.conv1 = nn.Conv2d(channels, width, 7, 2, 3, bias=False)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
        else:
            stages, block = [(depth - 2) // 6] * 3, Basic
            self.conv1 = nn.Conv2d(channels, width, 3, 1, 1, bias=False)
            self.maxpool = None
        self.bn1 = nn.BatchNorm2d(width)
        cin = width
        for i, n in enumerate(stages):
            blocks = []
            for j in range(n):
                blocks.append(block(cin, width << i, 2 if i > 0 and j == 0 else 1))
                cin = (width << i) * block.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.stages = len(stages)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        if self.maxpool is not None:
            x = self.maxpool(x)
        for i in range(self.stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(x.mean((2, 3)))


# --- VGG (torchvision's names, no dropout) ---------------------------------------------------------
class Vgg(nn.Module):
    def __init__(self, layers, width, hidden, channels, hw, classes):
        super().__init__()
        mods, c, size = [], channels, hw
        for v in layers:
            if v == "M":
                mods.append(nn.MaxPool2d(2, 2))
                size //= 2
            else:
                mods += [nn.Conv2d(c, v * width, 3, padding=1), nn.ReLU()]
                c = v * width
        self.features = nn.Sequential(*mods)
        self.classifier = nn.Sequential(
            nn.Linear(c * size * size, hidden), nn.ReLU(), nn.Dropout(0.0),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(0.0),
            nn.Linear(hidden, classes),
        )

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


# --- GPT (nanoGPT's names, tanh GELU, tied lm_head) -------------------------------------------------
class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class Mlp(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = Mlp(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, vocab, context, layers, heads, width):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        # GPT-2's (nanoGPT's) initialisation, as the engine's: std 0.02, the residual projections
        # 0.02/√(2·layers), biases zero (PyTorch's default N(0, 1) embeddings would start the tied
        # logits at a loss of ~40).
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class LeNet(nn.Module):
    def __init__(self, channels=(16, 32), hidden=128, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels[0], 5, padding=2)
        self.conv2 = nn.Conv2d(channels[0], channels[1], 5, padding=2)
        self.fc1 = nn.Linear(channels[1] * 7 * 7, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def mlp(features=784, hidden=(256, 128), classes=10):
    layers, width = [], features
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, classes))


VGG_A = [1, "M", 2, "M", 4, 4, "M", 8, 8, "M", 8, 8, "M"]
VGG_16 = [1, 1, "M", 2, 2, "M", 4, 4, 4, "M", 8, 8, 8, "M", 8, 8, 8, "M"]
