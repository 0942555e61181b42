"""A small ResNet trained a few steps in MindSpore GRAPH mode on CPU: a real conv-net dump to benchmark on.

Residual blocks (Conv2d 3x3 - BatchNorm2d - ReLU - Conv2d 3x3 - BatchNorm2d, identity or 1x1-conv shortcut),
64x64 random images, batch 16, Momentum SGD: the conv-net tensor population of issue 29 (float32 activations
of 16 x 64 x 64 x 64 = 4 Mi elements, 16.8 MB, batch-norm statistics and momentum moments), beside the
Transformer of the corpus tools' ``ms_transformer_train.py``. The dump is switched on from outside with
MINDSPORE_DUMP_CONFIG (``scripts/make_resnet_dump.sh`` writes it). Data: numpy random (fixed seed), so every
run with the same arguments dumps the same shapes.

Usage: python ms_resnet_train.py [--steps 1 --batch 16 --size 64 --width 64 --blocks 2,2,2] [--fp16] [--seed 1]
Size with the defaults: about 2.5-3 GB per step (fp32).
"""
import argparse

import mindspore as ms
import numpy as np
from mindspore import nn, ops


class Block(nn.Cell):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, pad_mode="same", has_bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, pad_mode="same", has_bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.SequentialCell([nn.Conv2d(cin, cout, 1, stride=stride, has_bias=False),
                                           nn.BatchNorm2d(cout)])

    def construct(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        s = x if self.down is None else self.down(x)
        return self.relu(y + s)


class ResNet(nn.Cell):
    def __init__(self, width, blocks, classes=10):
        super().__init__()
        self.stem = nn.SequentialCell([nn.Conv2d(3, width, 3, pad_mode="same", has_bias=False),
                                       nn.BatchNorm2d(width), nn.ReLU()])
        layers = []
        cin = width
        for stage, n in enumerate(blocks):
            cout = width * 2 ** stage
            for k in range(n):
                layers.append(Block(cin, cout, 2 if (k == 0 and stage > 0) else 1))
                cin = cout
        self.layers = nn.SequentialCell(layers)
        self.pool = ops.ReduceMean(keep_dims=False)
        self.head = nn.Dense(cin, classes)

    def construct(self, x):
        return self.head(self.pool(self.layers(self.stem(x)), (2, 3)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--blocks", default="2,2,2")
    p.add_argument("--fp16", action="store_true", help="auto mixed precision O2 (float16 compute)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    net = ResNet(a.width, [int(n) for n in a.blocks.split(",")])
    if a.fp16:
        net = ms.amp.auto_mixed_precision(net, "O2")
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    train = nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)
    train.set_train()
    for step in range(a.steps):
        images = rng.standard_normal((a.batch, 3, a.size, a.size)).astype(np.float32)
        labels = rng.integers(0, 10, size=(a.batch,)).astype(np.int32)
        print("step", step, float(train(ms.Tensor(images), ms.Tensor(labels)).asnumpy()), flush=True)


if __name__ == "__main__":
    main()
