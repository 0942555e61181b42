#!/usr/bin/env python3
"""Reference values of the compare metrics, produced by msprobe's own code.

Writes ``tests/data/compare/goldens.json``, which ``tests/test_compare_metrics.py``
checks ``dumpdb.compare.metrics.tensor_metrics`` against (to 1e-6).

Pairs are real tensors of ``tests/data`` (see :func:`pair_specs`):

* msprobe ``tensor_mix``: every step0 tensor against the same tensor of step1 (the
  model after one optimiser step: different real tensors of equal shape); every fourth
  float tensor against a deterministically perturbed copy of itself; up to two pairs of
  different step0 tensors per shape; three tensors cast to bfloat16 / float16 against
  themselves (dtype mismatch) and against a copy with zeros in the bench (eps rule);
* MindSpore ``d1_compare_fp32_iter0`` (target) vs ``d2_compare_fp16_bf16_iter0``
  (bench): every output of the same op name and shape (fc2 runs in fp16 there);
* MindSpore ``e1_nan_inf_overflow``: every sixth tensor of iteration 0 against the same
  tensor of iteration 1, the 0-d loss (inf, then NaN), and ApplyMomentum input.0 vs
  output.0 of iteration 1 (real NaN/Inf at equal or different positions).

How: this script (dumpdb's venv: torch + dumpdb's ``.npy`` reader) loads each pair,
applies the recipe, saves the arrays to a temporary ``.npz`` and runs a helper in a
*separate* venv where ``pip install mindstudio-probe`` (26.2.0) lives. The helper calls

* msprobe: ``ValidateTensor().check_tensor`` then ``compare_ops_apply`` with the
  six built-in columns (``msprobe/core/compare/npy_compare.py``), exactly what
  ``msprobe compare`` runs per tensor pair after reading it; values as msprobe writes
  them (12 decimals, cosine > 0.9999 rounded to 6);
* msaccucmp: ``alg_<Name>.compare`` of ``msprobe/msaccucmp/algorithm_manager/
  builtin_algorithm`` on the flattened arrays cast to float32, as
  ``AlgorithmManager.compare`` does, with ``cmp_utils.utils.format_value`` replaced by
  ``float`` so the unrounded value is kept (msaccucmp prints 6 decimals); and the same
  functions on float64 inputs (``*_f64``) to separate formula from float32 rounding.

Every value is stored with 12 significant digits.

bfloat16 arrays go to msprobe as float32 (what msprobe's torch reader does with
bfloat16; numpy has no bfloat16). msprobe's readers also ``np.squeeze`` every tensor;
the helper does not, so the arrays are the ones dumpdb compares.

Usage (a separate venv with mindstudio-probe; torch is not needed there)::

    python3 -m venv /tmp/msprobe-venv
    /tmp/msprobe-venv/bin/pip install mindstudio-probe==26.2.0
    /tmp/venv/bin/python scripts/make_metric_goldens.py \\
        --msprobe-python /tmp/msprobe-venv/bin/python

The recipes and loaders are imported by the test, so inputs are rebuilt identically
(their CRC32s are stored and checked).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import zlib
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
OUT = DATA / "compare" / "goldens.json"
MSPROBE_STEP0 = "tests/data/msprobe/tensor_mix/dump/step0/proc17296/dump_tensor_data"
MS_D1 = "tests/data/mindspore/d1_compare_fp32_iter0/rank_0/LeNet5/0/0"
MS_D2 = "tests/data/mindspore/d2_compare_fp16_bf16_iter0/rank_0/LeNet5/0/0"
MS_E1 = "tests/data/mindspore/e1_nan_inf_overflow/rank_0/LeNet5/0"

# MindSpore file name: {op_type}.{op_name}.{task}.{stream}.{timestamp}.{io}.{slot}.{format}.{dtype}.npy
_MS_NAME = re.compile(r"^(?P<op>.+)\.\d+\.\d+\.\d+\.(?P<io>input|output)\.(?P<slot>\d+)\.[^.]+\.[^.]+\.npy$")


# ----------------------------------------------------------------------------- inputs

def load(path: str) -> np.ndarray:
    """A tensor file of tests/data as numpy: .pt with torch, .npy with dumpdb's reader
    (bfloat16 ``'<E2'`` files, Float16-named float32 payloads)."""
    p = ROOT / path
    if p.suffix == ".pt":
        import torch

        t = torch.load(p, weights_only=True, map_location="cpu")
        if t.dtype == torch.bfloat16:
            import ml_dtypes

            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()
    from dumpdb.npy import read_npy

    return read_npy(str(p)).array


def derive(a: np.ndarray, recipe: dict | None) -> np.ndarray:
    """Apply a recipe to a loaded tensor (deterministic, numpy only)."""
    if not recipe:
        return a
    kind = recipe["kind"]
    if kind == "perturb":
        # x * (1 + scale * sin(0.37 i + phase)): relative errors spread over [0, scale]
        x = a.astype(np.float64).reshape(-1)
        i = np.arange(x.size, dtype=np.float64)
        y = x * (1.0 + recipe["scale"] * np.sin(0.37 * i + recipe.get("phase", 0.0)))
        every = recipe.get("zero_every")
        if every:
            y[::every] = 0.0
        return y.astype(a.dtype).reshape(a.shape)
    if kind == "cast":
        import ml_dtypes

        dt = np.dtype(ml_dtypes.bfloat16) if recipe["dtype"] == "bfloat16" else np.dtype(recipe["dtype"])
        return a.astype(dt)
    raise ValueError(f"unknown recipe {recipe!r}")


def side_array(side: dict) -> np.ndarray:
    return derive(load(side["path"]), side.get("recipe"))


def crc(a: np.ndarray) -> str:
    return f"{zlib.crc32(np.ascontiguousarray(a).tobytes()):08x}"


def _ms_key(name: str):
    m = _MS_NAME.match(name)
    return (m["op"], m["io"], int(m["slot"])) if m else None


def _ms_files(rel_dir: str) -> dict:
    out = {}
    for p in sorted((ROOT / rel_dir).glob("*.npy")):
        k = _ms_key(p.name)
        if k:
            out[k] = f"{rel_dir}/{p.name}"
    return out


def pair_specs() -> list[dict]:
    specs: list[dict] = []

    def add(kind, tpath, bpath, trec=None, brec=None):
        specs.append({"id": f"{len(specs)}:{kind}", "target": {"path": tpath, "recipe": trec},
                      "bench": {"path": bpath, "recipe": brec}})

    # msprobe tensor_mix
    step0 = sorted((ROOT / MSPROBE_STEP0).glob("*.pt"))
    by_shape = defaultdict(list)
    for n, p in enumerate(step0):
        rel0 = f"{MSPROBE_STEP0}/{p.name}"
        rel1 = rel0.replace("/step0/", "/step1/")
        a = load(rel0)
        add("msprobe:step0-vs-step1", rel0, rel1)
        if a.dtype.kind == "f":
            by_shape[(a.shape, a.dtype.str)].append(rel0)
        if a.dtype.kind == "f" and n % 4 == 0:
            add("msprobe:perturbed", rel0, rel0, {"kind": "perturb", "scale": 4e-3, "phase": 0.3})
    for (_shape, _), paths in sorted(by_shape.items(), key=lambda kv: str(kv[0])):
        for p, q in list(zip(paths, paths[1:]))[:2]:
            add("msprobe:same-shape", p, q)
    picks = [f"{MSPROBE_STEP0}/Functional.conv2d.0.forward.output.0.pt",
             f"{MSPROBE_STEP0}/Functional.linear.0.forward.input.1.pt",
             f"{MSPROBE_STEP0}/Module.mlp.1.GELU.forward.0.output.0.pt"]
    for p in picks:
        add("msprobe:bf16-vs-fp32", p, p, {"kind": "cast", "dtype": "bfloat16"})
        add("msprobe:fp16-vs-fp32", p, p, {"kind": "cast", "dtype": "float16"})
        add("msprobe:bench-zeros", p, p, None,
            {"kind": "perturb", "scale": 1e-3, "phase": 1.1, "zero_every": 7})

    # MindSpore d1 (fp32) vs d2 (fp16/bf16)
    d1, d2 = _ms_files(MS_D1), _ms_files(MS_D2)
    for k in sorted(d1):
        if k in d2 and load(d1[k]).shape == load(d2[k]).shape:
            add("mindspore:d1-vs-d2", d1[k], d2[k])

    # MindSpore e1: real NaN/Inf (every sixth tensor of iteration 0 vs 1, and the loss)
    it0, it1 = _ms_files(f"{MS_E1}/0"), _ms_files(f"{MS_E1}/1")
    for n, k in enumerate(sorted(it0)):
        if (n % 6 == 0 or k[0].startswith("SparseSoftmax")) and k in it1 \
                and load(it0[k]).shape == load(it1[k]).shape:
            add("mindspore:e1-it0-vs-it1", it0[k], it1[k])
    for k in sorted(it1):
        if k[0].startswith("ApplyMomentum") and k[1:] == ("input", 0) and (k[0], "output", 0) in it1:
            add("mindspore:e1-it1-input-vs-output", it1[k], it1[(k[0], "output", 0)])
    return specs


# ----------------------------------------------------------------------------- helper

HELPER = r'''
import json, sys, os, warnings
import numpy as np
warnings.simplefilter("ignore", RuntimeWarning)   # msaccucmp's float32 overflows on e1
import msprobe
from msprobe.core.common.const import CompareConst
from msprobe.core.compare.npy_compare import CompareResult, ValidateTensor, compare_ops_apply

sys.path.insert(0, os.path.join(os.path.dirname(msprobe.__file__), "msaccucmp"))
from cmp_utils import utils as cmp_utils_utils
cmp_utils_utils.format_value = float          # keep msaccucmp's unrounded value
from algorithm_manager.algorithm_parameter import AlgorithmParameter
from algorithm_manager.builtin_algorithm import (
    alg_MeanAbsoluteError, alg_RootMeanSquareError, alg_RelativeEuclideanDistance,
    alg_AccumulatedRelativeError, alg_MeanRelativeError, alg_KullbackLeiblerDivergence)

MSPROBE = {CompareConst.COSINE: "cosine", CompareConst.EUC_DIST: "euc_dist",
           CompareConst.MAX_ABS_ERR: "max_abs_err", CompareConst.MAX_RELATIVE_ERR: "max_rel_err",
           CompareConst.ONE_THOUSANDTH_ERR_RATIO: "one_thousandth_err_ratio",
           CompareConst.FIVE_THOUSANDTHS_ERR_RATIO: "five_thousandths_err_ratio"}
MSACCUCMP = {"mean_abs_err": alg_MeanAbsoluteError, "rmse": alg_RootMeanSquareError,
             "rel_euc_dist": alg_RelativeEuclideanDistance,
             "accumulated_rel_err": alg_AccumulatedRelativeError, "mean_rel_err": alg_MeanRelativeError,
             "kl_divergence": alg_KullbackLeiblerDivergence}

def value(v):
    if isinstance(v, str):
        return v                               # 'unsupported', 'Nan', 'N/A', ...
    return float("%.12g" % v)                  # 12 significant digits: ample for a 1e-6 check

def msaccucmp(x, y, dtype):
    args = AlgorithmParameter()
    args.my_output_dump_file, args.ground_truth_dump_file = "target", "bench"
    x = np.array(x).reshape(-1).astype(dtype)
    y = np.array(y).reshape(-1).astype(dtype)
    out = []
    np.seterr(divide="ignore", invalid="ignore")   # as AlgorithmManager.compare
    for name, mod in MSACCUCMP.items():
        r, _msg = mod.compare(x, y, args)
        out.append(value(r))
    return out

npz = np.load(sys.argv[1])
specs = json.load(open(sys.argv[2]))
results = {}
for i, spec in enumerate(specs):
    n, b = npz[f"t{i}"].copy(), npz[f"b{i}"].copy()
    checked = ValidateTensor().check_tensor(CompareResult(n, b, False, ""))
    vals, err = compare_ops_apply(checked.n_value, checked.b_value, checked.error_flag, checked.err_msg,
                                  column_names=list(MSPROBE))
    entry = {"msprobe": [value(v) for v in vals], "msprobe_err_msg": err}
    if not checked.error_flag:
        # after ValidateTensor: NaN/Inf at equal positions are already 0 in n/b
        entry["msaccucmp"] = msaccucmp(checked.n_value, checked.b_value, "float32")
        entry["msaccucmp_f64"] = msaccucmp(checked.n_value, checked.b_value, "float64")
    results[spec["id"]] = entry
json.dump({"msprobe_columns": list(MSPROBE.values()), "msaccucmp_columns": list(MSACCUCMP),
           "results": results}, open(sys.argv[3], "w"))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--msprobe-python", default="/tmp/msprobe-venv/bin/python",
                    help="python of a venv with mindstudio-probe installed")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    specs = pair_specs()
    arrays = {}
    for i, spec in enumerate(specs):
        for key, side in (("t", spec["target"]), ("b", spec["bench"])):
            a = side_array(side)
            side["dtype"] = str(a.dtype)
            side["shape"] = list(a.shape)
            side["crc32"] = crc(a)
            # numpy has no bfloat16: msprobe's torch reader hands it float32 too
            arrays[f"{key}{i}"] = a.astype(np.float32) if a.dtype.kind == "V" else a
    with tempfile.TemporaryDirectory() as tmp:
        npz, spec_file, res_file = Path(tmp, "pairs.npz"), Path(tmp, "specs.json"), Path(tmp, "res.json")
        np.savez(npz, **arrays)
        spec_file.write_text(json.dumps(specs))
        subprocess.run([args.msprobe_python, "-c", HELPER, str(npz), str(spec_file), str(res_file)],
                       check=True, stdout=subprocess.DEVNULL)
        res = json.loads(res_file.read_text())
    version = subprocess.run([args.msprobe_python, "-m", "pip", "show", "mindstudio-probe"],
                             capture_output=True, text=True).stdout
    version = next((ln.split(":", 1)[1].strip() for ln in version.splitlines() if ln.startswith("Version:")),
                   None)
    files = sorted({spec[side]["path"] for spec in specs for side in ("target", "bench")})
    index = {f: i for i, f in enumerate(files)}
    dirs = sorted({str(Path(f).parent) for f in files})
    messages: list[str] = []
    pairs = []
    for spec in specs:
        entry = {"id": spec["id"]}
        for side in ("target", "bench"):
            s = spec[side]
            entry[side] = {"file": index[s["path"]], "recipe": s["recipe"], "dtype": s["dtype"],
                           "shape": s["shape"], "crc32": s["crc32"]}
        r = dict(res["results"][spec["id"]])
        msg = r.pop("msprobe_err_msg")
        if msg not in messages:
            messages.append(msg)
        entry.update(r, msprobe_err_msg=messages.index(msg))
        pairs.append(entry)
    doc = {
        "about": "Reference metric values computed by mindstudio-probe's own functions on real tensor "
                 "pairs; regenerate with scripts/make_metric_goldens.py (see its docstring). "
                 "'file' indexes 'files' ([index in 'dirs', file name]; dirs relative to the repository root); 'recipe' is applied "
                 "by make_metric_goldens.derive; 'msprobe' lists msprobe's values (as it writes them) in "
                 "'msprobe_columns' order, 'msaccucmp' the msaccucmp functions' unrounded values on float32 "
                 "inputs (as msaccucmp runs) and 'msaccucmp_f64' on float64 inputs, in 'msaccucmp_columns' "
                 "order; 12 significant digits; 'msprobe_err_msg' indexes 'messages' (msprobe's Err_message).",
        "mindstudio_probe_version": version,
        "msprobe_columns": res["msprobe_columns"],
        "msaccucmp_columns": res["msaccucmp_columns"],
        "dirs": dirs,
        "files": [[dirs.index(str(Path(f).parent)), Path(f).name] for f in files],
        "messages": messages,
        "pairs": pairs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, separators=(",", ":"), allow_nan=True) + "\n")
    print(f"{len(pairs)} pairs -> {args.out.relative_to(ROOT)} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    sys.exit(main())
