"""Cut a MindSpore dump of ms_transformer_variant.py down to the forward pass, in place.

Keeps the tensor files of the forward ops (scope ``Default/network-...`` in ``execution_order``),
the scope-less ``Expand/...`` ops whose output a forward op reads (the injected ``Expand/_Muls/Mul``),
the parameters of the network (not the optimizer's ``adam_m``/``adam_v`` moments), the IR text and
the execution order; drops the backward (``Gradients/...``), the optimizer, the scope-less
``Expand/_MatMulExt`` ops (the attention's BatchMatMuls with their BroadcastTo/Cast, which the
CPU backend interleaves with backward ops: 3-14 MB per dump) and the binary graph ``.pb``. Usage: python prune_forward.py DUMP_DIR
"""
import hashlib
import re
import sys
from pathlib import Path

root = Path(sys.argv[1])
rank = root / "rank_0"
order = (rank / "execution_order" / "ms_execution_order_graph_0.csv").read_text().split()[1:]
last = max(i for i, s in enumerate(order) if s.startswith("Default/network-"))
keep = {re.sub(r"[/\\. ]", "_", s) for s in order if s.startswith("Default/network-")}
files = list((rank / "TransformerLM").rglob("*.npy"))
# Expand/... ops (no scope) of the forward pass: those whose output a forward op reads (the
# injected Mul feeds dense2; the backward's Pow of erf's gradient reads forward outputs but
# feeds no forward op).
forward_in = {hashlib.sha1(f.read_bytes()).digest() for f in files
              if f.name.split(".")[1] in keep and ".input." in f.name}
for s in order[:last]:
    name = re.sub(r"[/\\. ]", "_", s)
    if not s.startswith("Expand/") or s.startswith("Expand/_MatMulExt/"):
        continue
    outs = [f for f in files if f.name.split(".")[1] == name and ".output." in f.name]
    if any(hashlib.sha1(f.read_bytes()).digest() in forward_in for f in outs):
        keep.add(name)
for pb in (rank / "graphs").glob("*.pb"):
    pb.unlink()
removed = kept = 0
for f in (rank / "TransformerLM").rglob("*.npy"):
    op_type, op_name = f.name.split(".")[:2]
    if op_type == "Parameter":
        ok = not op_name.startswith(("adam_", "learning_rate", "global_step", "beta", "eps", "weight_decay"))
    else:
        ok = op_name in keep
    if ok:
        kept += 1
    else:
        f.unlink()
        removed += 1
print(f"{root}: kept {kept}, removed {removed} tensor files")
