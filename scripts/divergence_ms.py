"""MindSpore 2.10 CPU dumps for ``divergence_eval.py``: the shared corpus training scripts
(``ms_lenet_train.py``, ``ms_transformer_train.py``; not edited) run one step with a
synchronous e2e tensor dump, optionally with one parameter scaled before training.

usage: MSPY divergence_ms.py OUT_DIR --arch lenet|transformer [--fp16] [--seed N]
                             [--scale NAME_SUFFIX=FACTOR] [--tools DIR]

``--fp16``: the script's own fp16 option (LeNet: fc2 in float16; Transformer: AMP O2).
``--scale``: the trainable parameter whose name ends with NAME_SUFFIX is multiplied by
FACTOR right after the network is built; its shape, max, min and L2 norm go to
``OUT_DIR/probes.rank0.json`` (the harness finds its first consumer in the dump by them).
The dump is ``OUT_DIR/dump/rank_0/<net>/0/0/*.npy`` (iteration 0).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

TOOLS = "/work/shared/corpus/tools"
# a small Transformer: one step dumps in seconds
TRANSFORMER_ARGS = ["--steps", "1", "--batch", "2", "--seq", "8", "--width", "32", "--layers", "2", "--heads", "2",
                    "--vocab", "64"]
LENET_ARGS = ["--steps", "1", "--batch", "2"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--arch", choices=["lenet", "transformer"], required=True)
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scale", default=None, help="NAME_SUFFIX=FACTOR")
    ap.add_argument("--tools", default=TOOLS, help="directory of the shared corpus training scripts")
    a = ap.parse_args()
    out = os.path.abspath(a.out_dir)
    os.makedirs(out, exist_ok=True)
    net_name = "LeNet5" if a.arch == "lenet" else "TransformerLM"
    cfg = {"common_dump_settings": {"op_debug_mode": 0, "dump_mode": 0, "path": os.path.join(out, "dump"),
                                    "net_name": net_name, "iteration": "all", "saved_data": "tensor",
                                    "input_output": 0, "kernels": [], "support_device": [0, 1, 2, 3, 4, 5, 6, 7]},
           "e2e_dump_settings": {"enable": True, "trans_flag": True}}
    cfg_path = os.path.join(out, "data_dump.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)
    os.environ["MINDSPORE_DUMP_CONFIG"] = cfg_path  # read when the first graph compiles
    sys.path.insert(0, a.tools)
    import numpy as np

    if a.arch == "lenet":
        import ms_lenet_train as script

        cls_name, args = "LeNet5", LENET_ARGS
    else:
        import ms_transformer_train as script

        cls_name, args = "LM", TRANSFORMER_ARGS
    probes = []
    if a.scale:
        suffix, factor = a.scale.split("=")
        cls = getattr(script, cls_name)
        init = cls.__init__

        def scaled_init(self, *args, **kwargs):
            init(self, *args, **kwargs)
            for p in self.trainable_params():
                if p.name.endswith(suffix):
                    value = p.asnumpy() * np.float32(factor)
                    p.set_data(script.ms.Tensor(value))
                    probes.append({"tag": "weight:first-consumer", "param": p.name, "shape": list(value.shape),
                                   "dtype": str(value.dtype), "max": float(value.max()), "min": float(value.min()),
                                   "norm": float(np.linalg.norm(value.astype(np.float64)))})
                    break
            else:
                raise SystemExit(f"--scale: no trainable parameter ends with {suffix!r}")

        cls.__init__ = scaled_init
    sys.argv = [script.__file__, *args, "--seed", str(a.seed), *(["--fp16"] if a.fp16 else [])]
    script.main()
    with open(os.path.join(out, "probes.rank0.json"), "w") as f:
        json.dump({"rank": 0, "probes": probes, "calibration": {}, "mag": float(a.scale.split("=")[1]) - 1
                   if a.scale else 0.0}, f, indent=1)


if __name__ == "__main__":
    main()
