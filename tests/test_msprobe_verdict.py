"""The msprobe CSV's Result and Err_message cells come from the one home of msprobe's
checkers, :mod:`dumpdb.compare.verdict` (issue 26, deliver item 8): on generated records
whose cells hit every checker and every cell form msprobe writes (``N/A``, ``Nan``, `` inf``,
percentages, non-tensor arguments, ignored APIs), :func:`dumpdb.render.msprobe_rows._judge`
writes what msprobe's checkers, applied to the cells record by record
(``msprobe_verdict_reference.py``), write. The real msprobe CSVs (tests/data/msprobe_oracle)
are checked byte for byte in test_msprobe_dropin.py."""

from __future__ import annotations

import copy
import json
import random

import msprobe_verdict_reference as reference
import pytest

from dumpdb.render.msprobe_rows import _judge

APIS = ("Functional.linear", "Tensor.__add__", "Torch.to", "Tensor.empty_like", "Distributed._all_gather_base",
        "Module.fc1.Linear")
DTYPES = ("torch.float32", "torch.bfloat16", "<class 'int'>", "<class 'float'>", "N/A")
SHAPES = ("[2, 3]", "[]", "[3]", "N/A")
RG = ("True", "False", "N/A", "")
SUMS = (1.0, 0.5, -2.0, 3, True, " inf", " -inf", "Nan", "None", "N/A", "1.5")
METRICS = (1.0, 0.999999, 0.95, 0.85, 0.5, 0.05, 0.0, "unsupported", "shape unmatched", "Nan", " inf")
REL = ("0", "12.5%", "0.01%", "0.2%", "80%", "2000%", "inf", "-inf", "Nan", "N/A", "Diff", "nan%")
MD5 = ("0a1b2c3d", "ffff0000", "N/A", "Nan", "")


def _records(mode: str, seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    out = []
    for k in range(60):
        api = rng.choice(APIS)
        key = f"{api}.{k}.forward"
        rows = []
        ios = ["input"] * rng.randrange(0, 4) + ["output"] * rng.randrange(0, 3)
        for j, io in enumerate(ios or ["output"]):
            name = f"{key}.{io}.{j}"
            bench = rng.random() < 0.8
            r = {"npu_name": name, "bench_name": (rng.choice((name, "qkv_proj." + name)) if bench else "N/A"),
                 "npu_dtype": rng.choice(DTYPES), "npu_shape": rng.choice(SHAPES), "npu_rg": rng.choice(RG),
                 "npu_sum": [rng.choice(SUMS) for _ in range(4)], "result": "pass", "msgs": [],
                 "stack": "N/A", "data_name": "['-1', '-1']"}
            same = rng.random() < 0.6  # most pairs agree, so the whole-op checkers fire too
            r["bench_dtype"] = r["npu_dtype"] if same else rng.choice(DTYPES)
            r["bench_shape"] = r["npu_shape"] if same else rng.choice(SHAPES)
            r["bench_rg"] = r["npu_rg"] if same else rng.choice(RG)
            r["bench_sum"] = list(r["npu_sum"]) if same else [rng.choice(SUMS) for _ in range(4)]
            if not bench:
                r.update(bench_dtype="N/A", bench_shape="N/A", bench_rg="N/A", bench_sum=["N/A"] * 4)
            r["cosine"], r["one_k"] = rng.choice(METRICS), rng.choice(METRICS)
            r["norm_rel"] = rng.choice(REL)
            r["md5"] = (rng.choice(MD5), rng.choice(MD5))
            r["cells"] = [name]
            rows.append(r)
        out.append(rows)
    return out


@pytest.mark.parametrize("mode", ["tensor", "statistics", "md5"])
def test_csv_verdicts_are_msprobe_checkers_on_the_cells(mode):
    fired = set()
    for seed in range(4):
        records = _records(mode, seed)
        expected = copy.deepcopy(records)
        for rows in expected:
            reference.judge(mode, rows)
        rows = [r for rec in records for r in rec]
        _judge(mode, rows, [k for k, rec in enumerate(records) for _ in rec])
        want = [r["cells"] for rec in expected for r in rec]
        assert [r["cells"] for r in rows] == want
        fired |= {m for cells in want for m in json.loads(cells[2])}
    # the generated cells reach every checker of the mode
    need = {"tensor": 7, "statistics": 7, "md5": 2}[mode]
    assert len(fired) == need, sorted(fired)
