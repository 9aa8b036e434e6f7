"""ResNets (He et al. 2016, torchvision's v1.5 layout: the stride sits in the 3x3 conv) and
MobileNetV2 (Sandler et al. 2018: inverted residuals, depthwise 3x3 convs, relu6).

Batch norm is at inference (running mean and variance as constants). Conv weights are
He-scaled; each residual branch's last batch norm has a smaller scale, as the zero-gamma
initialization does in spirit, so activations stay of order one through the residual adds.
"""

from __future__ import annotations

import math

import numpy as np

from hexir.errors import ModelError
from hexir.frontend.weights import Weights
from hexir.ir.graph import Graph, Value
from hexir.ops.builder import GraphBuilder

# depth -> (blocks per stage, bottleneck blocks)
RESNET_DEPTHS: dict[int, tuple[tuple[int, ...], bool]] = {
    18: ((2, 2, 2, 2), False),
    34: ((3, 4, 6, 3), False),
    50: ((3, 4, 6, 3), True),
    101: ((3, 4, 23, 3), True),
    152: ((3, 8, 36, 3), True),
}


def resnet(
    depth: int = 18,
    *,
    batch: int = 1,
    image: int = 224,
    width: int = 64,
    classes: int = 1000,
    seed: int = 0,
) -> Graph:
    """ResNet-`depth` on `image` [batch, 3, image, image] -> `logits` [batch, classes].

    `resnet(18)` is the zoo's `resnet18`; small `image` and `width` give the same structure
    at test size (`resnet(18, image=32, width=8, classes=10)`).
    """
    if depth not in RESNET_DEPTHS:
        known = ", ".join(map(str, RESNET_DEPTHS))
        raise ModelError(f"no ResNet of depth {depth}; the depths are {known}")
    stages, bottleneck = RESNET_DEPTHS[depth]
    b = GraphBuilder(f"resnet{depth}")
    w = Weights(b, seed)
    x = b.input("image", (batch, 3, image, image))
    x = b.relu(_conv_bn(b, w, "conv1", x, 3, width, kernel=7, stride=2))
    x = b.max_pool2d(x, kernel=3, stride=2, padding=1)
    channels = width
    for stage, blocks in enumerate(stages):
        planes = width * 2**stage
        for i in range(blocks):
            stride = 2 if stage > 0 and i == 0 else 1
            block = _bottleneck if bottleneck else _basic
            x, channels = block(b, w, f"layer{stage + 1}.{i}", x, channels, planes, stride)
    x = b.reshape(b.global_avg_pool2d(x), (batch, channels))
    weight, bias = w.dense("fc", channels, classes)
    return b.build(b.bias_add(b.dense(x, weight), bias, name="logits"))


def _conv_bn(
    b: GraphBuilder,
    w: Weights,
    name: str,
    x: Value,
    c_in: int,
    c_out: int,
    *,
    kernel: int,
    stride: int = 1,
    last: bool = False,
    groups: int = 1,
) -> Value:
    """conv2d (no bias, 'same' padding, `groups` groups) then batch_norm at inference."""
    # He scale (gain 2) where a relu follows; gain 1 into a residual add, which no relu halves
    gain = 1.0 if last else 2.0
    fan_in = c_in // groups * kernel**2
    weight = w.normal(
        f"{name}.weight", (c_out, c_in // groups, kernel, kernel), math.sqrt(gain / fan_in)
    )
    y = b.conv2d(x, weight, stride=stride, padding=kernel // 2, groups=groups)
    bn = name.replace("conv", "bn").replace("downsample.0", "downsample.1")
    low, high = (0.4, 0.6) if last else (0.8, 1.2)
    scale = w.uniform(f"{bn}.scale", (c_out,), low, high)
    shift = w.normal(f"{bn}.shift", (c_out,), 0.1)
    mean = w.normal(f"{bn}.mean", (c_out,), 0.1)
    var = w.uniform(f"{bn}.var", (c_out,), 0.5, 1.5)
    return b.batch_norm(y, scale, shift, mean, var, epsilon=1e-5)


def _shortcut(
    b: GraphBuilder, w: Weights, name: str, x: Value, c_in: int, c_out: int, stride: int
) -> Value:
    if stride == 1 and c_in == c_out:
        return x
    return _conv_bn(
        b, w, f"{name}.downsample.0", x, c_in, c_out, kernel=1, stride=stride, last=True
    )


def _basic(
    b: GraphBuilder, w: Weights, name: str, x: Value, c_in: int, planes: int, stride: int
) -> tuple[Value, int]:
    y = b.relu(_conv_bn(b, w, f"{name}.conv1", x, c_in, planes, kernel=3, stride=stride))
    y = _conv_bn(b, w, f"{name}.conv2", y, planes, planes, kernel=3, last=True)
    shortcut = _shortcut(b, w, name, x, c_in, planes, stride)
    return b.relu(b.add(y, shortcut)), planes


def _bottleneck(
    b: GraphBuilder, w: Weights, name: str, x: Value, c_in: int, planes: int, stride: int
) -> tuple[Value, int]:
    c_out = planes * 4
    y = b.relu(_conv_bn(b, w, f"{name}.conv1", x, c_in, planes, kernel=1))
    y = b.relu(_conv_bn(b, w, f"{name}.conv2", y, planes, planes, kernel=3, stride=stride))
    y = _conv_bn(b, w, f"{name}.conv3", y, planes, c_out, kernel=1, last=True)
    shortcut = _shortcut(b, w, name, x, c_in, c_out, stride)
    return b.relu(b.add(y, shortcut)), c_out


# MobileNetV2's inverted residual stages: (expansion t, output channels c, blocks n, stride s)
MOBILENET_V2_STAGES = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def mobilenet_v2(
    *, batch: int = 1, image: int = 224, width: float = 1.0, classes: int = 1000, seed: int = 0
) -> Graph:
    """MobileNetV2 on `image` [batch, 3, image, image] -> `logits` [batch, classes]: a 3x3
    stem, 17 inverted residual blocks (1x1 expansion, depthwise 3x3, linear 1x1 projection,
    relu6 between) and a 1x1 conv to 1280 channels before the pool and the classifier.

    `mobilenet_v2()` is the zoo's `mobilenet-v2`; `mobilenet_v2(image=32, width=0.25,
    classes=10)` has the same structure at test size (channels scaled by `width`, at least 8).
    """
    b = GraphBuilder("mobilenet-v2")
    w = Weights(b, seed)
    six = b.constant(np.array(6.0, np.float32), name="six")

    def relu6(v: Value) -> Value:
        return b.minimum(b.relu(v), six)

    def scaled(c: int) -> int:
        return max(8, int(c * width + 4) // 8 * 8)

    x = b.input("image", (batch, 3, image, image))
    channels = scaled(32)
    x = relu6(_conv_bn(b, w, "features.0", x, 3, channels, kernel=3, stride=2))
    index = 1
    for t, c, n, s in MOBILENET_V2_STAGES:
        out = scaled(c)
        for i in range(n):
            name, stride, hidden = f"features.{index}", s if i == 0 else 1, channels * t
            y = x
            if t != 1:
                y = relu6(_conv_bn(b, w, f"{name}.conv.0", y, channels, hidden, kernel=1))
            y = relu6(_conv_bn(b, w, f"{name}.conv.1", y, hidden, hidden, kernel=3,
                               stride=stride, groups=hidden))  # fmt: skip
            y = _conv_bn(b, w, f"{name}.conv.2", y, hidden, out, kernel=1, last=True)
            x = b.add(x, y) if stride == 1 and channels == out else y
            channels, index = out, index + 1
    last = scaled(1280)
    x = relu6(_conv_bn(b, w, f"features.{index}", x, channels, last, kernel=1))
    x = b.reshape(b.global_avg_pool2d(x), (batch, last))
    weight, bias = w.dense("classifier", last, classes)
    return b.build(b.bias_add(b.dense(x, weight), bias, name="logits"))
