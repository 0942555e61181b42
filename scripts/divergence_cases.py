"""Models, injected changes and the msprobe worker of ``scripts/divergence_eval.py``.

Three small architectures, one training step each (forward, loss, backward, an
explicit gradient all-reduce across ranks, SGD):

* ``cnn``: 3 blocks ``conv2d -> group_norm -> relu -> x*alpha``, adaptive pool, linear head;
* ``transformer``: a pre-LN decoder (token + position embedding, blocks of
  ``layer_norm -> q/k/v linear -> matmul*scale -> causal masked_fill -> softmax -> matmul ->
  o linear -> x*alpha -> residual add``, ``layer_norm -> fc1 -> gelu -> fc2 -> x*alpha ->
  residual add``), final norm, LM head;
* ``mlp``: an input linear, blocks of ``layer_norm -> fc1 -> gelu -> fc2 -> x*alpha ->
  residual add``, final norm, head.

Layers (linear, layer_norm, group_norm, conv, embedding) are nn modules called as
modules (msprobe's mix level records them, with their parameters); everything else is
an explicit ``torch`` / ``F`` call, so that a variant changes exactly one op (or, for a
rewrite, replaces one op by an equivalent sequence). The
``x*alpha`` op (alpha 1.0 in a clean run) is the site of the ``scale`` and ``overflow``
kinds.

A :class:`Variant` says what the target run changes (kind, block, magnitude, corrupted
rank). Where the change lands the model *probes* the output of the op that should be
named (the changed op, or for a parameter or input its first consumer): the worker
writes each probe's statistics (max, min, L2 norm, shape, dtype) next to the dump, and
``divergence_eval.py`` finds the msprobe record holding exactly that tensor in the
target dump, which gives the op name to expect whatever counters msprobe assigned.

Run as a worker (one process per rank): ``python divergence_cases.py SPEC.json``; the
parent sets ``RANK``/``WORLD_SIZE``/``MASTER_PORT``. Needs torch and mindstudio-probe.
"""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field

ARCHS = ("cnn", "transformer", "mlp")
MODEL_VERSION = 2  # part of every dump's cache key: bump when a model or variant changes what it dumps

# kinds of target run, what they change and which architectures have the site
CHANGED_KINDS = {
    "scale": "the x*alpha op of one block multiplies by 1+m instead of 1",
    "eps": "the epsilon of one block's norm (layer_norm / group_norm) is m instead of 1e-5",
    "act": "one block's activation swapped (gelu -> tanh-gelu / silu / relu; relu -> leaky_relu / gelu)",
    "residual": "one block's residual add dropped (x = f(x) instead of x + f(x))",
    "mask": "one block's causal mask off by one (the diagonal shifted)",
    "weight": "one block's fc1 / conv weight scaled by 1+m (on the corrupted rank)",
    "input": "the input perturbed on the corrupted rank (noise of relative size m; a token changed)",
    "overflow": "fp16: one block's x*alpha multiplies by 6e4, the output overflows to inf",
    "softmax_scale": "one block's attention score scale multiplied by 1+m",
    "lr": "the SGD learning rate multiplied by 1+m (optimizer phase)",
}
REWRITE_KINDS = {
    "rw_layernorm": "one block's layer_norm computed by hand (mean, var, sub, rsqrt, mul, add)",
    "rw_gelu": "one block's gelu computed by hand (0.5*x*(1+erf(x/sqrt 2)))",
    "rw_act": "one block's relu computed as clamp(min=0)",
    "rw_softmax": "one block's softmax computed by hand (max, sub, exp, sum, div)",
    "rw_linear": "one block's F.linear as matmul + add (3-D) or addmm (2-D)",
    "rw_reshape": "an extra reshape / view pair on one block's activations",
    "rw_noop": "ops that change nothing added in one block (x*1, +0, contiguous())",
}
CLEAN_KINDS = {
    "rerun": "the same config and seed run twice",
    "amp": "bf16 / fp16 autocast against fp32, no change",
}
SITES = {
    "cnn": {"scale", "eps", "act", "weight", "input", "lr",
            "rw_act", "rw_linear", "rw_reshape", "rw_noop"},
    "transformer": {"scale", "eps", "act", "residual", "mask", "weight", "input", "overflow", "softmax_scale", "lr",
                    "rw_layernorm", "rw_gelu", "rw_softmax", "rw_linear", "rw_reshape", "rw_noop"},
    "mlp": {"scale", "eps", "act", "residual", "weight", "input", "overflow", "lr",
            "rw_layernorm", "rw_gelu", "rw_linear", "rw_reshape", "rw_noop"},
}
# kinds whose magnitude is continuous (chosen as a multiple of the clean noise at the op)
CONTINUOUS = {"scale", "weight", "input", "softmax_scale", "lr"}
EXPECTED_PHASE = {k: "optimizer" if k == "lr" else "forward" for k in CHANGED_KINDS}

SIZES = {
    # blocks, width, sequence / image side, batch
    "small": {"blocks": 4, "d": 32, "heads": 2, "T": 8, "B": 2, "vocab": 48, "side": 8, "classes": 5},
    "tiny": {"blocks": 2, "d": 8, "heads": 2, "T": 4, "B": 2, "vocab": 12, "side": 4, "classes": 3},
}


@dataclass
class Variant:
    """What the target run changes. ``kind`` one of CHANGED_KINDS / REWRITE_KINDS or
    ``clean``; ``block`` the block index (depth); ``mag`` the magnitude (meaning per kind);
    ``option`` a discrete choice (activation name, rewrite form, site); ``rank`` the
    corrupted rank (the change applies on that rank only); ``identity``: probe the site
    but change nothing (the clean values the calibration measures against)."""

    kind: str = "clean"
    block: int = -1
    mag: float = 0.0
    option: str = ""
    rank: int = 0
    identity: bool = False

    def at(self, kind: str, block: int, rank: int) -> bool:
        return self.kind == kind and self.block == block and self.rank == rank

    def changes(self, kind: str, block: int, rank: int) -> bool:
        return self.at(kind, block, rank) and not self.identity


@dataclass
class Spec:
    """One msprobe dump: the config and the variant (the cache key of a dump is this)."""

    arch: str
    level: str  # L1 | mix | L1all (L1 with risk_level ALL)
    precision: str  # fp32 | bf16 | fp16
    world: int
    seed: int
    size: str = "small"
    variant: Variant = field(default_factory=Variant)
    rerun: int = 0  # a second run of the same config (clean rerun pairs)
    version: int = MODEL_VERSION

    def key(self) -> str:
        d = asdict(self)
        return json.dumps(d, sort_keys=True)


# -- models (torch imported lazily: the planner and evaluator do not need it) -----------------

def _torch():
    import torch
    import torch.nn.functional as F  # noqa: N812

    return torch, F


class Probe:
    """Collects the tensors that should be named (on the corrupted rank only).
    ``pending``: a tag waiting for the next norm op (the first consumer of a block
    output whose residual add was dropped)."""

    def __init__(self):
        self.items: list[tuple[str, object]] = []
        self.pending: str | None = None

    def __call__(self, tag: str, t):
        self.items.append((tag, t.detach().clone()))
        return t


def build(arch: str, size: str, variant: Variant, rank: int, probe: Probe):
    """The model of ``arch`` with ``variant`` applied on ``rank`` (weights from the
    current torch seed: the caller seeds)."""
    torch, F = _torch()
    nn = torch.nn
    z = SIZES[size]
    v = variant

    def at(kind, block):
        return v.at(kind, block, rank)

    def chg(kind, block):
        return v.changes(kind, block, rank)

    def linear(x, mod, block, site):
        """The nn.Linear module (F.linear inside), or its rewrite at the chosen block (rw_linear)."""
        if chg("rw_linear", block) and site == "fc1":
            if x.dim() == 2:
                return torch.addmm(mod.bias, x, mod.weight.t())
            return torch.matmul(x, mod.weight.t()) + mod.bias
        y = mod(x)
        if at("weight", block) and site == "fc1":
            probe("weight:first-consumer", y)
        return y

    def norm(x, mod, block):
        """The nn.LayerNorm module (its eps set by the eps kind at build), or by hand (rw_layernorm)."""
        if chg("rw_layernorm", block):
            mean = x.mean(-1, keepdim=True)
            var = ((x - mean) ** 2).mean(-1, keepdim=True)
            return (x - mean) * torch.rsqrt(var + mod.eps) * mod.weight + mod.bias
        y = mod(x)
        if at("eps", block):
            probe("eps:changed-op", y)
        if probe.pending:
            probe(probe.pending, y)
            probe.pending = None
        return y

    def gelu(x, block):
        if at("act", block):
            fn = F.gelu if v.identity else \
                {"tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu, "relu": F.relu}[v.option]
            return probe("act:changed-op", fn(x))
        if chg("rw_gelu", block):
            return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
        return F.gelu(x)

    def scale(x, block):
        alpha = 1.0
        if chg("scale", block):
            alpha = 1.0 + v.mag
        if chg("overflow", block):
            alpha = 6.0e4
        y = x * alpha
        if at("scale", block) or at("overflow", block):
            probe(f"{v.kind}:changed-op", y)
        return y

    def noop(x, block):
        if chg("rw_noop", block):
            x = {"mul1": lambda t: t * 1, "add0": lambda t: t + 0, "contiguous": lambda t: t.contiguous()}[v.option](x)
        if chg("rw_reshape", block):
            shape = x.shape
            x = x.reshape(-1, shape[-1]).view(shape)
        return x

    def residual(x, h, block):
        if at("residual", block):
            probe.pending = "residual:first-consumer"
            if not v.identity:
                return h
        return x + h

    class FFN(nn.Module):
        def __init__(self, d, i):
            super().__init__()
            self.i = i
            self.ln = nn.LayerNorm(d)
            self.fc1 = nn.Linear(d, 2 * d)
            self.fc2 = nn.Linear(2 * d, d)

        def forward(self, x):
            h = norm(x, self.ln, self.i)
            h = gelu(linear(h, self.fc1, self.i, "fc1"), self.i)
            h = noop(h, self.i)
            h = scale(self.fc2(h), self.i)
            return residual(x, h, self.i)

    class Attn(nn.Module):
        def __init__(self, d, heads, i):
            super().__init__()
            self.i, self.h, self.hd = i, heads, d // heads
            self.ln1 = nn.LayerNorm(d)
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

        def forward(self, x):
            B, T, D = x.shape  # noqa: N806
            h = norm(x, self.ln1, -1)  # the eps / rw_layernorm sites are the FFN's norm
            q = self.q(h).view(B, T, self.h, self.hd).transpose(1, 2)
            k = self.k(h).view(B, T, self.h, self.hd).transpose(1, 2)
            vv = self.v(h).view(B, T, self.h, self.hd).transpose(1, 2)
            sc = 1.0 / math.sqrt(self.hd)
            if chg("softmax_scale", self.i):
                sc = sc * (1.0 + v.mag)
            s = torch.matmul(q, k.transpose(-2, -1)) * sc
            if at("softmax_scale", self.i):
                probe("softmax_scale:changed-op", s)
            off = 2 if chg("mask", self.i) else 1
            mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=off)
            s = s.masked_fill(mask, float("-inf"))
            if at("mask", self.i):
                probe("mask:first-consumer", s)
            if chg("rw_softmax", self.i):
                e = torch.exp(s - s.amax(-1, keepdim=True))
                p = e / e.sum(-1, keepdim=True)
            else:
                p = F.softmax(s, dim=-1)
            y = torch.matmul(p, vv).transpose(1, 2).reshape(B, T, D)
            return x + self.o(y)

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            d = z["d"]
            self.emb = nn.Embedding(z["vocab"], d)
            self.pos = nn.Embedding(z["T"], d)
            self.attn = nn.ModuleList(Attn(d, z["heads"], i) for i in range(z["blocks"]))
            self.ffn = nn.ModuleList(FFN(d, i) for i in range(z["blocks"]))
            self.lnf = nn.LayerNorm(d)
            self.head = nn.Linear(d, z["vocab"])

        def forward(self, ids):
            x = self.emb(ids)
            if at("input", 0):
                probe("input:first-consumer", x)
            x = x + self.pos(torch.arange(ids.shape[1]))
            for a, f in zip(self.attn, self.ffn):
                x = f(a(x))
            return self.head(norm(x, self.lnf, -1))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            d = z["d"]
            self.inp = nn.Linear(z["side"] * 2, d)
            self.blocks = nn.ModuleList(FFN(d, i) for i in range(z["blocks"]))
            self.lnf = nn.LayerNorm(d)
            self.head = nn.Linear(d, z["classes"])

        def forward(self, x):
            x = self.inp(x)
            if at("input", 0):
                probe("input:first-consumer", x)
            for b in self.blocks:
                x = b(x)
            return self.head(norm(x, self.lnf, -1))

    class ConvBlock(nn.Module):
        def __init__(self, cin, cout, i):
            super().__init__()
            self.i = i
            self.conv = nn.Conv2d(cin, cout, 3, padding=1)
            self.gn = nn.GroupNorm(2, cout)

        def forward(self, x):
            y = self.conv(x)
            if at("weight", self.i) or (self.i == 0 and at("input", 0)):
                probe(f"{v.kind}:first-consumer", y)
            y = self.gn(y)
            if at("eps", self.i):
                probe("eps:changed-op", y)
            if at("act", self.i):
                fn = F.relu if v.identity else {"leaky": lambda t: F.leaky_relu(t, 0.01), "gelu": F.gelu}[v.option]
                y = probe("act:changed-op", fn(y))
            elif chg("rw_act", self.i):
                y = y.clamp(min=0)
            else:
                y = F.relu(y)
            y = noop(y, self.i)
            return scale(y, self.i)

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            chans = [1, 4, 8, 8, 8, 8][: z["blocks"] + 1]
            self.blocks = nn.ModuleList(ConvBlock(chans[i], chans[i + 1], i) for i in range(z["blocks"]))
            self.fc = nn.Linear(chans[-1] * 4, 16)
            self.head = nn.Linear(16, z["classes"])

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            x = F.adaptive_avg_pool2d(x, 2).flatten(1)
            x = F.relu(self.fc(x))
            if chg("rw_linear", 0):  # the CNN's rewritable linear is its head (block 0)
                return torch.addmm(self.head.bias, x, self.head.weight.t())
            return self.head(x)

    model = {"cnn": CNN, "transformer": Transformer, "mlp": MLP}[arch]()
    if chg("eps", v.block):  # the norm of the block: the FFN's layer_norm, the conv block's group_norm
        blocks = model.blocks if arch != "transformer" else model.ffn
        (blocks[v.block].gn if arch == "cnn" else blocks[v.block].ln).eps = v.mag
    if chg("weight", v.block):
        with torch.no_grad():
            blocks = model.blocks if arch != "transformer" else model.ffn
            w = blocks[v.block].conv.weight if arch == "cnn" else blocks[v.block].fc1.weight
            w.mul_(1.0 + v.mag)
    return model


def batch(arch: str, size: str, seed: int, rank: int, variant: Variant):
    """(input, labels) of one rank; the ``input`` kind perturbs it on the corrupted rank."""
    torch, _ = _torch()
    z = SIZES[size]
    g = torch.Generator().manual_seed(1000 + 17 * seed + rank)
    change = variant.changes("input", 0, rank)
    if arch == "transformer":
        ids = torch.randint(0, z["vocab"], (z["B"], z["T"]), generator=g)
        y = torch.randint(0, z["vocab"], (z["B"], z["T"]), generator=g)
        if change:  # one token changed (a gross change at the embedding)
            ids = ids.clone()
            at = int(abs(variant.mag)) % z["T"]
            ids[0, at] = (ids[0, at] + 1) % z["vocab"]
        return ids, y.reshape(-1)
    if arch == "mlp":
        x = torch.randn(z["B"] * 2, z["side"] * 2, generator=g)
        y = torch.randint(0, z["classes"], (z["B"] * 2,), generator=g)
    else:
        x = torch.randn(z["B"], 1, z["side"], z["side"], generator=g)
        y = torch.randint(0, z["classes"], (z["B"],), generator=g)
    if change:
        noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(7 + seed))
        x = x + variant.mag * x.std() * noise
    return x, y


def autocast(precision: str):
    torch, _ = _torch()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def forward_loss(arch, model, x, y, precision):
    torch, F = _torch()
    with autocast(precision):
        out = model(x)
    if arch == "transformer":
        out = out.reshape(-1, out.shape[-1])
    return F.cross_entropy(out.float(), y)


def dry_probe(spec: Spec, variant: Variant, precision: str, rank: int):
    """The first probe's tensor of a forward run without msprobe, None if no probe fires: what the magnitude calibration and the truth's noise figures use."""
    torch, _ = _torch()
    torch.manual_seed(spec.seed)
    probe = Probe()
    model = build(spec.arch, spec.size, variant, rank, probe)
    x, y = batch(spec.arch, spec.size, spec.seed, rank, variant)
    with torch.no_grad():
        forward_loss(spec.arch, model, x, y, precision)
    return probe.items[0][1] if probe.items else None


def rel(a, b) -> float:
    """||a - b|| / ||b|| over the elements where the two differ or are finite (an
    element infinite on one side only, or a shape change: inf)."""
    torch, _ = _torch()
    if a.shape != b.shape:
        return math.inf
    a, b = a.double(), b.double()
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    fin = torch.isfinite(a) & torch.isfinite(b)
    if bool((~same & ~fin).any()):
        return math.inf
    d = float(torch.linalg.vector_norm(torch.where(fin, a - b, 0.0)))
    n = float(torch.linalg.vector_norm(torch.where(fin, b, 0.0)))
    return d / n if n else (0.0 if d == 0 else math.inf)


FLOOR = {"fp32": 2.0 ** -23, "bf16": 2.0 ** -8, "fp16": 2.0 ** -11}  # one unit in the last place, relative


def floor_of(t) -> float:
    """One ulp (relative) of the dtype the op computed in: what a zero clean noise stands for."""
    return {"bfloat16": FLOOR["bf16"], "float16": FLOOR["fp16"]}.get(str(t.dtype).replace("torch.", ""), FLOOR["fp32"])


def _replace(v: Variant, **kw) -> Variant:
    return Variant(**{**asdict(v), **kw})


def calibrate(spec: Spec, rank: int) -> dict:
    """For a changed variant on its corrupted rank: the clean noise at the probed op
    (``noise_at_op``: target precision, clean, against fp32, clean), the change there
    (``change_at_op``: target precision, changed, against target precision, clean) and
    their ``ratio`` (a zero noise, bit-identical runs, counts as one ulp of the dtype).
    A continuous kind whose ``option`` is ``xR`` has its magnitude chosen here so that the
    change at the op is R times that noise: from the fp32 response to a small change
    (linear in it); the magnitude is written back to the variant."""
    v = spec.variant
    ident = _replace(v, identity=True)
    ref32 = dry_probe(spec, ident, "fp32", rank)
    refp = dry_probe(spec, ident, spec.precision, rank)
    if ref32 is None or refp is None:
        return {"noise_at_op": None, "change_at_op": None, "ratio": None}
    noise = rel(refp, ref32)
    out: dict = {}
    if v.kind in CONTINUOUS and v.option.startswith("x"):
        want = float(v.option[1:])
        unit = rel(dry_probe(spec, _replace(v, mag=1e-3), "fp32", rank), ref32) / 1e-3
        v.mag = want * (noise if noise > 0 else floor_of(refp)) / unit if unit else 1e-3
        out["wanted_ratio"] = want
    changed = dry_probe(spec, v, spec.precision, rank)
    change = rel(changed, refp) if changed is not None else None
    # a clean pair of the same config holds the noise; bit-identical (fp32 against fp32):
    # one ulp of the dtype stands for it
    den = noise if noise > 0 else floor_of(refp)
    ratio = None if change is None else (change / den if math.isfinite(change) else math.inf)
    out.update(noise_at_op=noise, change_at_op=change, mag=v.mag, ratio=ratio)
    return out


# -- the worker: one rank of one dump ---------------------------------------------------------

def spec_of(raw: dict) -> Spec:
    raw = {k: v for k, v in raw.items() if k in Spec.__dataclass_fields__}
    raw["variant"] = Variant(**raw["variant"])
    return Spec(**raw)


def run_rank(job: dict, rank: int) -> None:
    """One rank of one dump: ``job`` is a :class:`Spec` as a dict plus ``out_dir`` and
    ``port`` (gloo's rendezvous on 127.0.0.1). Writes ``out_dir/dump/`` (msprobe) and
    ``out_dir/probes.rank{R}.json``."""
    out_dir, port = job["out_dir"], job["port"]
    spec = spec_of(job)
    import torch
    from msprobe.pytorch import PrecisionDebugger

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    if spec.world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=spec.world)
    v = spec.variant
    truth: dict = {}
    if v.kind in CHANGED_KINDS and v.kind != "lr" and v.rank == rank:
        truth = calibrate(spec, rank)  # may set v.mag (continuous kinds given as a noise multiple)
    torch.manual_seed(spec.seed)
    probe = Probe()
    model = build(spec.arch, spec.size, v, rank, probe)
    x, y = batch(spec.arch, spec.size, spec.seed, rank, v)
    lr = 0.1 * (1.0 + v.mag) if v.kind == "lr" and v.rank == rank else 0.1
    opt = torch.optim.SGD(model.parameters(), lr=lr, foreach=False)
    cfg = {"task": "tensor", "dump_path": os.path.join(out_dir, "dump"), "rank": [], "step": [],
           "level": "L1" if spec.level == "L1all" else spec.level, "async_dump": False,
           "tensor": {"scope": [], "list": [], "data_mode": ["all"]}}
    if spec.level == "L1all":
        cfg["risk_level"] = "ALL"
    cfg_path = os.path.join(out_dir, f"config.rank{rank}.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)
    dbg = PrecisionDebugger(config_path=cfg_path)
    dbg.start(model=model)
    loss = forward_loss(spec.arch, model, x, y, spec.precision)
    loss.backward()
    if spec.world > 1:
        import torch.distributed as dist

        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad.div_(spec.world)
    before = next(p for p in model.parameters()).detach().clone()
    opt.step()
    if v.kind == "lr" and v.rank == rank:
        # the first parameter's SGD update (Tensor.add_ in the optimizer): its change
        # against the clean learning rate's update from the same gradient
        first = next(p for p in model.parameters())
        probe("lr:first-update", first)
        clean = before + (first.detach() - before) / (1.0 + v.mag)
        truth = {"noise_at_op": None, "change_at_op": rel(first.detach(), clean), "mag": v.mag}
        truth["ratio"] = truth["change_at_op"] / FLOOR["fp32"] if spec.precision == "fp32" else None
    opt.zero_grad()
    dbg.stop()
    dbg.step()
    probes = [{"tag": tag, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
               "max": float(t.float().max()), "min": float(t.float().min()),
               "norm": float(torch.linalg.vector_norm(t.double())),
               "finite": bool(torch.isfinite(t).all())} for tag, t in probe.items]
    with open(os.path.join(out_dir, f"probes.rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "probes": probes, "calibration": truth, "mag": v.mag, "loss": float(loss.detach())}, f,
                  indent=1)
    if spec.world > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


def serve() -> None:
    """A dump server: imports torch and msprobe once (about 25 s on a loaded machine),
    then for each JSON job line on stdin forks one child per rank (msprobe's debugger is
    a per-process singleton: a fresh child each dump) and answers one JSON line
    ``{"out_dir", "rcs", "seconds"}`` on stdout when they end (killed after 300 s)."""
    import signal
    import time
    import traceback

    import torch
    from msprobe.pytorch import PrecisionDebugger  # noqa: F401  (imported once, before the forks)

    torch.set_num_threads(1)
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        os.makedirs(job["out_dir"], exist_ok=True)
        t0 = time.monotonic()
        pids = []
        for r in range(job["world"]):
            pid = os.fork()
            if pid == 0:  # the child: one rank
                code = 1
                try:
                    fd = os.open(os.path.join(job["out_dir"], f"_log_rank{r}.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                    os.dup2(fd, 1)
                    os.dup2(fd, 2)
                    os.environ.update(RANK=str(r), WORLD_SIZE=str(job["world"]), MASTER_ADDR="127.0.0.1",
                                      MASTER_PORT=str(job["port"]))
                    run_rank(job, r)
                    code = 0
                except BaseException:
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            pids.append(pid)
        rcs: dict[int, int] = {}
        while len(rcs) < len(pids):
            for pid in pids:
                if pid in rcs:
                    continue
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    rcs[pid] = os.waitstatus_to_exitcode(status)
            if time.monotonic() - t0 > 300:
                for pid in pids:
                    if pid not in rcs:
                        os.kill(pid, signal.SIGKILL)
                        os.waitpid(pid, 0)
                        rcs[pid] = -9
            time.sleep(0.05)
        out.write(json.dumps({"out_dir": job["out_dir"], "rcs": [rcs[p] for p in pids],
                              "seconds": round(time.monotonic() - t0, 2)}) + "\n")
        out.flush()


if __name__ == "__main__":
    serve()
