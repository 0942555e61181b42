"""One real msprobe dump of a small pre-LN Transformer training step, with one injected change
(issue 26 judgment tests; tests/data/msprobe_judge/README.md lists the runs and their options).
usage: make_dump.py OUT_DIR [--level L1|mix] [--variant fp32|bf16|fp16] [--change none|eps|scale|w|act]
  [--block B] [--world N] [--bad-rank R] [--seed S] [--mag M] [--task tensor|statistics] [--dim D] [--layers L] [--seq T]
Run with a Python that has torch 2.13 (CPU) and mindstudio-probe 26.2."""
import argparse
import json
import os
import shutil
import subprocess
import sys

WORKER = r'''
import sys, os, json, math, torch, torch.nn as nn, torch.nn.functional as F
from msprobe.pytorch import PrecisionDebugger, seed_all
opt = json.loads(sys.argv[1])
rank = int(os.environ.get("RANK", "0")); world = opt["world"]
if world > 1:
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=world)
seed_all(opt["seed"], mode=False)
D, H, L, T, B, V = opt["dim"], 4, opt["layers"], opt["seq"], 2, 50
change, cblock, mag = opt["change"], opt["block"], opt["mag"]
class Block(nn.Module):
    def __init__(self, i):
        super().__init__()
        self.i = i
        self.ln1 = nn.LayerNorm(D); self.ln2 = nn.LayerNorm(D)
        self.q = nn.Linear(D, D); self.k = nn.Linear(D, D); self.v = nn.Linear(D, D); self.o = nn.Linear(D, D)
        self.fc1 = nn.Linear(D, 4 * D); self.fc2 = nn.Linear(4 * D, D)
    def forward(self, x):
        bad = self.i == cblock
        eps = 1e-2 if (bad and change == "eps") else 1e-5
        h = F.layer_norm(x, (D,), self.ln1.weight, self.ln1.bias, eps)
        q, k, v = (m(h).view(B, T, H, D // H).transpose(1, 2) for m in (self.q, self.k, self.v))
        scale = (D // H) ** -0.5 * (mag if (bad and change == "scale") else 1.0)
        a = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * scale, dim=-1)
        h = torch.matmul(a, v).transpose(1, 2).reshape(B, T, D)
        x = x + self.o(h)
        h = F.layer_norm(x, (D,), self.ln2.weight, self.ln2.bias, 1e-5)
        h = self.fc1(h)
        h = F.relu(h) if (bad and change == "act") else F.gelu(h)
        return x + self.fc2(h)
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.blocks = nn.ModuleList([Block(i) for i in range(L)])
        self.lnf = nn.LayerNorm(D); self.head = nn.Linear(D, V)
    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks: x = b(x)
        return self.head(self.lnf(x))
net = Net()
if world > 1:
    net = nn.parallel.DistributedDataParallel(net)
if change == "w" and rank == opt["bad_rank"]:  # after DDP's broadcast of rank 0's weights
    with torch.no_grad(): (net.module if world > 1 else net).blocks[cblock].fc1.weight.mul_(mag)
sgd = torch.optim.SGD(net.parameters(), lr=0.1)
dbg = PrecisionDebugger(config_path=opt["cfg"])
g = torch.Generator().manual_seed(42 + rank)
ids = torch.randint(0, V, (B, T), generator=g); y = torch.randint(0, V, (B, T), generator=g)
dbg.start(model=net)
with torch.autocast("cpu", dtype=(torch.float16 if opt["variant"] == "fp16" else torch.bfloat16), enabled=(opt["variant"] in ("bf16", "fp16"))):
    out = net(ids)
loss = F.cross_entropy(out.float().view(-1, V), y.view(-1))
loss.backward()
sgd.step(); sgd.zero_grad()
dbg.stop(); dbg.step()
if world > 1: dist.destroy_process_group()
'''


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--level", default="L1")
    ap.add_argument("--variant", default="fp32")
    ap.add_argument("--change", default="none")
    ap.add_argument("--block", type=int, default=2)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--bad-rank", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--mag", type=float, default=4.0)
    ap.add_argument("--task", default="tensor")
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=8)
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    cfg = {"task": a.task, "dump_path": os.path.join(out, "dump"), "rank": [], "step": [], "level": a.level,
           "async_dump": False, a.task: {"scope": [], "list": [], "data_mode": ["all"]}}
    if a.task == "statistics":
        cfg[a.task]["summary_mode"] = "statistics"
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f)
    worker = os.path.join(out, "_worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    opt = dict(cfg=os.path.join(out, "config.json"), world=a.world, seed=a.seed, change=a.change, block=a.block,
               mag=a.mag, bad_rank=a.bad_rank, variant=a.variant, dim=a.dim, layers=a.layers, seq=a.seq)
    procs = []
    for r in range(a.world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(29600 + a.seed % 100))
        with open(os.path.join(out, f"_log{r}.txt"), "w") as log:
            procs.append(subprocess.Popen([sys.executable, worker, json.dumps(opt)], env=env, stdout=log,
                                          stderr=subprocess.STDOUT))
    print(out, [p.wait() for p in procs])


if __name__ == "__main__":
    main()
