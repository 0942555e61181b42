"""Real msprobe dumps of a small pre-LN Transformer LM, one variant per run (tests/data/msprobe_rewrite).
usage: python make_dumps.py OUT_DIR CHANGE [LEVEL] [TASK]   (environment TF_D, TF_H, TF_T, TF_BLOCKS: sizes)
CHANGE: none | handln (block 0 ln1 by hand) | eps (block 1 ln1 eps 0.1) | scale (block 1 attention scale 0.25)
        | reshape (an extra reshape) | unfused (block 0 q, k, v as three linears of one weight)"""
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from msprobe.pytorch import PrecisionDebugger, seed_all

out, change = sys.argv[1], sys.argv[2]
level = sys.argv[3] if len(sys.argv) > 3 else "L1"
task = sys.argv[4] if len(sys.argv) > 4 else "tensor"
os.makedirs(out, exist_ok=True)
cfg = {"task": task, "dump_path": os.path.join(out, "dump"), "rank": [], "step": [], "level": level,
       "async_dump": False, task: {"scope": [], "list": [], "data_mode": ["all"]}}
if task == "statistics":
    cfg[task]["summary_mode"] = "statistics"
json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
seed_all(1234, mode=False)
D, H, T = int(os.environ.get("TF_D", 32)), int(os.environ.get("TF_H", 4)), int(os.environ.get("TF_T", 8))
NB = int(os.environ.get("TF_BLOCKS", 3))

def ln(x, m, hand, eps):
    if hand:
        mu = x.mean(-1, keepdim=True)
        xc = x - mu
        var = (xc * xc).mean(-1, keepdim=True)
        return xc / torch.sqrt(var + eps) * m.weight + m.bias
    return F.layer_norm(x, (D,), m.weight, m.bias, eps)

class Block(nn.Module):
    def __init__(self, i):
        super().__init__()
        self.i = i
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
    def forward(self, x):
        B = x.shape[0]
        eps = 0.1 if (change == "eps" and self.i == 1) else 1e-5
        h = ln(x, self.ln1, change == "handln" and self.i == 0, eps)
        if change == "unfused" and self.i == 0:
            w = self.qkv.weight
            b = self.qkv.bias
            q = F.linear(h, w[:D], b[:D])
            k = F.linear(h, w[D:2*D], b[D:2*D])
            v = F.linear(h, w[2*D:], b[2*D:])
        else:
            q, k, v = self.qkv(h).split(D, -1)
        q = q.view(B, T, H, D // H).transpose(1, 2)
        k = k.view(B, T, H, D // H).transpose(1, 2)
        v = v.view(B, T, H, D // H).transpose(1, 2)
        scale = 0.25 if (change == "scale" and self.i == 1) else 1 / math.sqrt(D // H)
        a = torch.softmax(q @ k.transpose(-1, -2) * scale, -1)
        o = (a @ v).transpose(1, 2).reshape(B, T, D)
        if change == "reshape" and self.i == 0:
            o = o.reshape(B * T, D).reshape(B, T, D)
        x = x + self.proj(o)
        h = ln(x, self.ln2, False, 1e-5)
        return x + self.fc2(F.gelu(self.fc1(h)))

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, D)
        self.blocks = nn.ModuleList([Block(i) for i in range(NB)])
        self.head = nn.Linear(D, 50)
    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(x)

net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
dbg = PrecisionDebugger(config_path=os.path.join(out, "config.json"))
g = torch.Generator().manual_seed(42)
idx = torch.randint(0, 50, (2, T), generator=g)
y = torch.randint(0, 50, (2, T), generator=g)
dbg.start(model=net)
loss = F.cross_entropy(net(idx).reshape(-1, 50), y.reshape(-1))
loss.backward()
opt.step()
opt.zero_grad()
dbg.stop()
dbg.step()
