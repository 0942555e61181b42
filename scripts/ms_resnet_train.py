"""A small ResNet trained a few steps in MindSpore GRAPH mode on CPU: the conv-net dump of issue 29.

The population a conv net dumps differs from a Transformer's (few large activations of
float32 NCHW maps, BatchNorm statistics, Conv2D backprop tensors, Momentum state), and the
store's codecs fare differently on it; `scripts/bench_ingest.py --dump`, `bench_store.py`,
`bench_read.py` and `bench_compare.py` measure on it. Dump is switched on from outside with
MINDSPORE_DUMP_CONFIG (`scripts/make_convnet_dump.sh` writes the config and runs this).
Images and labels are random (numpy, fixed seed), so every run with the same arguments dumps
the same shapes; `--seed` changes the data, not the shapes (a second run to compare with).

Network: stem conv 3x3 (3 -> width) + BatchNorm + ReLU, then `--stages` stages of
`--blocks` residual blocks (conv-BN-ReLU-conv-BN + identity, or a 1x1 strided conv + BN
projection when the stage halves the map and doubles the width), global average pooling,
one Dense layer; softmax cross-entropy; Momentum SGD.

Usage: python ms_resnet_train.py [--steps 2 --batch 16 --image 64 --width 32 --stages 3 --blocks 2 --classes 10]
       [--fp16]   (auto mixed precision O2: float16 compute, float32 BatchNorm)
"""
import argparse

import mindspore as ms
import numpy as np
from mindspore import nn, ops


def conv_bn(cin, cout, kernel, stride):
    return nn.SequentialCell([
        nn.Conv2d(cin, cout, kernel, stride=stride, pad_mode="same", has_bias=False),
        nn.BatchNorm2d(cout),
    ])


class Block(nn.Cell):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.a = conv_bn(cin, cout, 3, stride)
        self.b = conv_bn(cout, cout, 3, 1)
        self.relu = nn.ReLU()
        self.project = conv_bn(cin, cout, 1, stride) if (stride != 1 or cin != cout) else None

    def construct(self, x):
        y = self.b(self.relu(self.a(x)))
        short = x if self.project is None else self.project(x)
        return self.relu(y + short)


class ResNet(nn.Cell):
    def __init__(self, width, stages, blocks, classes):
        super().__init__()
        self.stem = nn.SequentialCell([conv_bn(3, width, 3, 1), nn.ReLU()])
        cells, cin = [], width
        for s in range(stages):
            cout = width * 2 ** s
            for b in range(blocks):
                cells.append(Block(cin, cout, 2 if (b == 0 and s > 0) else 1))
                cin = cout
        self.body = nn.SequentialCell(cells)
        self.pool = ops.ReduceMean(keep_dims=False)
        self.head = nn.Dense(cin, classes)

    def construct(self, x):
        return self.head(self.pool(self.body(self.stem(x)), (2, 3)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--image", type=int, default=64)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--stages", type=int, default=3)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--fp16", action="store_true", help="auto mixed precision O2 (float16 compute)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    net = ResNet(a.width, a.stages, a.blocks, a.classes)
    if a.fp16:
        net = ms.amp.auto_mixed_precision(net, "O2")
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    train = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)
    train.set_train()
    for step in range(a.steps):
        images = rng.normal(0, 1, size=(a.batch, 3, a.image, a.image)).astype(np.float32)
        labels = rng.integers(0, a.classes, size=(a.batch,)).astype(np.int32)
        print("step", step, float(train(ms.Tensor(images), ms.Tensor(labels)).asnumpy()), flush=True)


if __name__ == "__main__":
    main()
