"""Calibrate the precision rules' growth allowances from clean pairs (issue 26).

usage: python scripts/calibrate_precision.py [--pair TARGET_DUMP BENCH_DUMP]... [--archive-pair ARCHIVE TARGET BENCH]...
                                              [--out dumpdb/compare/precision_growth.json] [--safety 2] [--min 2]
                                              [--min-samples 3]

Every pair must be *clean*: the same program, only rounding differs (a rerun, AMP/O2 against
fp32). Each pair is compared with the default rules but no table (every op type judged with
the fixed growth), and for every output row that departs (error > margin x floor), is no
noise, no module/cell record and has no structural reason, the growth its op needed is
recorded: ``(err_out - margin * floor_out) / err_in`` (``err_in``: its op's largest input
error, as the rules read it). Per key ``op_type|direction|dtype`` (``precision.growth_key``)
the allowance is ``safety x`` the largest growth seen (a margin for the unseen tail), at
least ``--min`` and at most the rules' default growth; keys with fewer than
``--min-samples`` observations get no entry (the default applies). The table is written as
JSON: the allowance of each key with its sample count, largest, median and 90th percentile
growth, and the pairs it came from. docs/precision.md describes the data it was made from.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

import dumpdb
from dumpdb.compare import engine
from dumpdb.compare.columns import containers
from dumpdb.compare.precision import ERROR, NOISE, PrecisionRules, growth_key


def observations(archive, target: str, bench: str, rules: PrecisionRules) -> dict[str, list[float]]:
    """growth key -> the growth each departing output of a clean compare needed."""
    seen: list = []
    judge = engine.judge_precision_columns

    def capture(c, r):  # keep what the rules saw
        out, first = judge(c, r)
        seen.append((c, dict(out)))  # the engine pops columns off it as it builds the results
        return out, first

    engine.judge_precision_columns = capture
    try:
        outcome = engine.compare(dumpdb.open(archive), target, bench, store_results=False, precision=rules)
    finally:
        engine.judge_precision_columns = judge
    if outcome.first_divergence is not None:
        print(f"  note: {target} vs {bench} departs at {outcome.first_divergence['target_name']} "
              "(a clean pair should not; its observations are kept)")
    c, out = seen[-1]
    err, floor, wi = out["scaled_err"], out["precision_floor"], out["inputs_error"]
    ratio = out["precision_ratio"]
    ok = out["scaled_err_valid"] & out["precision_floor_valid"] & out["precision_ratio_valid"]
    with np.errstate(all="ignore"):
        use = ok & c.output & (ratio > rules.margin) & (wi > 0) & np.isfinite(err) \
            & (out["precision_result"] != NOISE) & ~containers(c.op_type, c.target_name) \
            & np.array([r is None or not str(r).startswith(("shapes", "dtypes", "nan", "overflow"))
                        for r in out["precision_reason"].tolist()]) & np.isfinite(wi)
        need = (err - rules.margin * floor) / wi
    found: dict[str, list[float]] = defaultdict(list)
    for i in np.flatnonzero(use).tolist():
        found[growth_key(c.op_type[i], out["phase"][i], out["precision_dtype"][i])].append(float(need[i]))
    errors = int(np.count_nonzero(out["precision_result"] == ERROR))
    print(f"  {target} vs {bench}: {c.output.sum()} outputs, {sum(map(len, found.values()))} observations, "
          f"{errors} error rows with the fixed growth")
    return found


def table(found: dict[str, list[float]], safety: float, low: float, high: float, min_samples: int) -> dict:
    out = {}
    for key in sorted(found):
        v = np.array(found[key])
        entry = {"n": int(v.size), "max": round(float(v.max()), 4), "p50": round(float(np.median(v)), 4),
                 "p90": round(float(np.quantile(v, 0.9)), 4)}
        if v.size >= min_samples:
            entry["allowance"] = round(float(min(high, max(low, safety * v.max()))), 3)
            out[key] = entry
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", nargs=2, action="append", default=[], metavar=("TARGET_DUMP", "BENCH_DUMP"),
                    help="two dump directories of a clean pair (ingested into a temporary archive)")
    ap.add_argument("--archive-pair", nargs=3, action="append", default=[], metavar=("ARCHIVE", "TARGET", "BENCH"),
                    help="a clean pair already in an archive (run selections)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "dumpdb/compare/precision_growth.json"))
    ap.add_argument("--safety", type=float, default=2.0, help="allowance = safety x the largest clean growth")
    ap.add_argument("--min", type=float, default=2.0, help="smallest allowance")
    ap.add_argument("--min-samples", type=int, default=3, help="fewer observations of a key: no entry")
    args = ap.parse_args()
    rules = PrecisionRules(table={})
    found: dict[str, list[float]] = defaultdict(list)
    sources = []
    with tempfile.TemporaryDirectory(prefix="calibrate-") as tmp:
        for k, (t, b) in enumerate(args.pair):
            archive = Path(tmp) / f"pair{k}.dumpdb"
            for path, run in ((t, "target"), (b, "bench")):
                dumpdb.ingest(path, archive=archive, run=run)
            args.archive_pair.append((str(archive), "target", "bench"))
            sources.append(f"{Path(t).name} vs {Path(b).name}")
        for k, (archive, t, b) in enumerate(args.archive_pair):
            if k >= len(args.pair):
                sources.append(f"{Path(archive).name}: {t} vs {b}")
            for key, values in observations(archive, t, b, rules).items():
                found[key].extend(values)
    growth = table(found, args.safety, args.min, rules.growth, args.min_samples)
    doc = {"about": "precision growth allowances per op_type|direction|dtype, from clean pairs "
                    "(scripts/calibrate_precision.py; docs/precision.md)",
           "rule": {"safety": args.safety, "min": args.min, "max": rules.growth, "min_samples": args.min_samples,
                    "margin": rules.margin},
           "sources": sources, "growth": growth}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(growth)} allowances written to {args.out}")


if __name__ == "__main__":
    main()
