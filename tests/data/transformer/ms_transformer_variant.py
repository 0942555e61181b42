"""Small Transformer encoder language model trained a few steps in MindSpore GRAPH mode on CPU.

Made for a large *real* dump to benchmark against: attention, LayerNorm, GELU, embeddings, AdamW
(a different operator mix and tensor population from the LeNet corpus cases). Dump is switched on
from outside with MINDSPORE_DUMP_CONFIG (see make_big_dump.sh). Data is random tokens (numpy,
fixed seed), so every run with the same arguments dumps the same shapes.

Variant for dumpdb's compare tests (a copy of shared/corpus/tools/ms_transformer_train.py with
one injected change, --change, applied to one op; see README.md next to this file):
  none      the original network
  ln_eps:L  layer L's norm1 LayerNorm op gets epsilon 0.5 (default 1e-5)
  act:L     layer L's feed-forward activation is gelu(x) * 1.25 (one Mul inserted)
  big       embeddings + positions multiplied by 1e5 (one Mul inserted): float16 overflows (max 65504)
Usage: python ms_transformer_train.py [--steps 3 --batch 4 --seq 128 --width 256 --layers 3 --vocab 2048] [--fp16]
Size with the defaults: 2.2 GB and about 2,300 files per step (6.6 GB, 12 s on 2 cores for 3 steps); it grows
with batch x seq x (width x layers + vocab) for activations and with layers x width^2 for weights, gradients and
AdamW moments. --batch 8 --layers 4 --vocab 4096 gives 4.3 GB per step.
"""
import argparse

import mindspore as ms
import numpy as np
from mindspore import nn, ops


class LM(nn.Cell):
    def __init__(self, vocab, width, layers, heads, seq):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = ms.Parameter(ms.Tensor(np.random.default_rng(0).normal(0, 0.02, (1, seq, width)).astype(np.float32)), name="pos")
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, dropout=0.0,
                                       activation="gelu", batch_first=True),
            num_layers=layers, norm=nn.LayerNorm((width,)))
        self.head = nn.Dense(width, vocab)

    def construct(self, tokens):
        x = self.embed(tokens) + self.pos
        return self.head(self.encoder(x))


class LossCell(nn.Cell):
    def __init__(self, net, vocab):
        super().__init__()
        self.net = net
        self.vocab = vocab
        self.loss = nn.CrossEntropyLoss()

    def construct(self, tokens, labels):
        logits = self.net(tokens)
        return self.loss(ops.reshape(logits, (-1, self.vocab)), ops.reshape(labels, (-1,)))


def scaled_gelu(x):
    return ops.gelu(x) * 1.25


class Big(nn.Cell):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, tokens):
        x = (self.net.embed(tokens) + self.net.pos) * 1.0e5
        return self.net.head(self.net.encoder(x))


def inject(net, change):
    """Apply --change to the LM before mixed precision wraps it."""
    kind, _, layer = change.partition(":")
    if kind == "none":
        return net
    if kind == "ln_eps":
        net.encoder.layers[int(layer)].norm1.layer_norm = ops.LayerNorm(-1, -1, epsilon=0.5)
        return net
    if kind == "act":
        net.encoder.layers[int(layer)].activation = scaled_gelu
        return net
    if kind == "big":
        return Big(net)
    raise SystemExit(f"unknown --change {change}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--fp16", action="store_true", help="auto mixed precision O2 (float16 compute)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--change", default="none", help="none, ln_eps:L, act:L or big (see the docstring)")
    a = p.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    net = inject(LM(a.vocab, a.width, a.layers, a.heads, a.seq), a.change)
    if a.fp16:
        net = ms.amp.auto_mixed_precision(net, "O2")
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-3, weight_decay=0.01)
    train = nn.TrainOneStepCell(LossCell(net, a.vocab), opt)
    train.set_train()
    for step in range(a.steps):
        tokens = rng.integers(0, a.vocab, size=(a.batch, a.seq)).astype(np.int32)
        labels = np.roll(tokens, -1, axis=1)
        print("step", step, float(train(ms.Tensor(tokens), ms.Tensor(labels)).asnumpy()), flush=True)


if __name__ == "__main__":
    main()
