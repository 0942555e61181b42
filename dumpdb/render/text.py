"""The command line's reports as lines of text for people (the CLI prints them, styled).

Every function takes what the API returned (an ``IngestReport``, a compare summary and
first-divergence dict, ``Archive.show``'s dict, ``Archive.ranks``' rows, a ``GcReport``, a
``VerifyReport``...) and returns text; nothing here reads an archive or prints. Standard
library only: the CLI imports it at start-up cost zero for the commands that do not use it.
Byte counts are shown in decimal units (``human``: 1 KB = 1000 B).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any


def human(n: float | None) -> str:
    """A byte count in B / KB / MB / GB / TB (decimal, two decimals above bytes); None -> '-'."""
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return str(n)


def shown(value: Any) -> str:
    """A value in a message: absent -> '-', never 'None'; floats to 6 significant digits."""
    if value is None:
        return "-"
    return f"{value:.6g}" if isinstance(value, float) else str(value)



# -- ingest --------------------------------------------------------------------------------------
def ingest_text(r: Any) -> str:
    """An ``IngestReport`` as the three lines ``dumpdb ingest`` prints on stderr."""
    ratio = f"{r.ratio:.2f}x" if r.ratio else "-"
    changed = r.tensors_replaced - r.payloads_filled
    replaced = (f"{changed} replaced (changed files), " if changed else "") + \
        (f"{r.payloads_filled} statistics-only filled in with their payloads, " if r.payloads_filled else "")
    return (f"run {r.run} ({r.layout}) -> {r.archive}\n"
            f"  tensors: {r.tensors_added} added, {replaced}{r.tensors_skipped} already there, "
            f"{r.deduplicated} deduplicated, {r.statistics_only} statistics-only, {len(r.errors)} failed\n"
            f"  bytes read {human(r.bytes_read)}, payload {human(r.bytes_in)}, stored {human(r.bytes_stored)}, "
            f"ratio {ratio}, {r.seconds:.1f} s")


# -- runs, show ----------------------------------------------------------------------------------
RUNS_COLUMNS = ["run", "state", "tensors", "stored", "stats-only", "pruned", "failed", "payload", "ingested",
                "layout", "framework", "source"]


def runs_row(r: dict[str, Any]) -> tuple:
    """One row of ``Archive.runs()`` (as a dict) as ``dumpdb runs`` shows it (:data:`RUNS_COLUMNS`)."""
    fw = " ".join(x for x in (r["framework"], r["framework_version"]) if x)
    started = r["ingest_started"]
    pruned = f"{r['pruned']} ({r['pruned_at']:%Y-%m-%d %H:%M})" if r["pruned"] else 0
    return (r["run"], r["state"], r["tensors"], r["stored"], r["statistics_only"], pruned, r["failed"],
            human(r["bytes_in"]), started.strftime("%Y-%m-%d %H:%M") if started else None, r["layout"],
            fw or None, r["source_path"])


def _span(values: Sequence[Any]) -> str:
    if not values:
        return "-"
    if len(values) > 12:
        return f"{len(values)} ({values[0]}..{values[-1]})"
    return ", ".join(str(v) for v in values)


def show_fields(info: dict[str, Any], complete: str | None) -> list[tuple[str, str | None]]:
    """``Archive.show``'s dict as (field, value) lines; ``complete``: the command that
    completes an interrupted run (None when it is not interrupted)."""
    started = info.get("ingest_started")
    ratio = f"{info['ratio']:.2f}x" if info["ratio"] else "-"
    state = info["state"] + (f"; complete it with: {complete}" if complete else "")
    pruned = ""
    if info["pruned"]:
        first, last = info["pruned_first"], info["pruned_last"]
        when, until = f"{first:%Y-%m-%d %H:%M}", f"{last:%Y-%m-%d %H:%M}"
        pruned = f" (pruned {when}" + (f" to {until})" if until != when else ")")
    stored = (f"{info['stored']} = {info['payloads_stored']} payloads stored by this run + {info['deduplicated']} "
              f"deduplicated ({info['distinct_payloads']} distinct payloads)")
    reclaim = (f", {human(info['bytes_reclaimable'])} of it unused until 'dumpdb gc'"
               if info["bytes_reclaimable"] else "")
    framework = (info["framework"], info["framework_version"], info["device_target"])
    return [
        ("run", info["run"]), ("status", state), ("source", info["source_path"]),
        ("layout", info["layout"]),
        ("framework", " ".join(str(x) for x in framework if x) or "-"),
        ("ingested", f"{started:%Y-%m-%d %H:%M:%S} by dumpdb {info['dumpdb_version']}" if started else "-"),
        ("ranks", _span(info["ranks"])), ("graphs", _span(info["graphs"])),
        ("iterations", _span(info["iterations"])),
        ("tensors", f"{info['tensors']} = {info['stored']} stored + {info['statistics_only']} statistics-only + "
                    f"{info['pruned']} pruned{pruned}"),
        ("stored", stored),
        ("failed", f"{info['failed']} files (not ingested: see ingest_errors)"),
        ("bytes in", human(info["bytes_in"]) + " (payloads of the stored tensors)"
         + (f", {human(info['bytes_pruned'])} pruned" if info["pruned"] else "")),
        ("bytes stored", human(info["bytes_stored"]) + reclaim), ("ratio", ratio),
    ]


# -- compare, first-divergence -------------------------------------------------------------------
def compare_summary_lines(sm: dict[str, Any]) -> list[str]:
    """The head of ``dumpdb compare``'s answer: counts, strategies, the first difference."""
    noise = f", {sm['noise']} noise" if sm.get("rules") != "msprobe" and sm.get("noise") else ""
    lines = [f"compare {sm['compare_id'] or '(not stored)'}: {sm['target']} vs {sm['bench']} ({sm['mode']}): "
             f"{sm['pairs']} pairs: {sm['pass']} pass, {sm['warning']} warning, {sm['error']} error{noise}; "
             f"unmatched {sm['unmatched_target']} target, {sm['unmatched_bench']} bench"]
    strategies = ", ".join(f"{k} {v}" for k, v in sm["strategies"].items() if v)
    lines.append(f"  matched by {strategies or '-'}")
    diff = sm.get("first_difference")
    if diff is None:
        lines.append("  every pair is identical")
    else:
        lines.append(f"  first difference: iteration {shown(diff['iteration'])}, position {shown(diff['position'])}: "
                     f"{diff['target_name']} {diff['io']}.{diff['slot']} (max_abs_err {shown(diff['max_abs_err'])}, "
                     f"cosine {shown(diff['cosine'])}, {shown(diff['target_dtype'])} vs {shown(diff['bench_dtype'])}, "
                     f"{diff['result']})")
    return lines


def unmatched_line(names: list[dict[str, Any]]) -> str:
    """The unmatched tensors of a compare (``side``, ``name``, ``io``, ``slot``), the first 12."""
    return f"unmatched ({len(names)}): " + ", ".join(
        f"{u['side']}:{u['name']}.{u['io']}.{u['slot']}" for u in names[:12]) + (" ..." if len(names) > 12 else "")


def divergence_lines(fd: dict[str, Any] | None, summary: dict[str, Any] | None = None) -> list[str]:
    """A first-divergence report (``CompareOutcome.first_divergence``) as lines; None: the
    line saying nothing departs (per the summary's rules). The metrics shown are the
    registry's ``cli`` ones (:mod:`dumpdb.compare.registry`), each in its ``display`` format."""
    from dumpdb.compare import registry

    if fd is None:
        if summary is not None and summary.get("rules") == "precision":
            dtype = summary.get("precision_dtype") or "the dtypes'"
            return [f"no departure beyond {dtype} precision"]
        return ["no divergence: no pair fails the rule"]
    where = f"{fd['code_file']}:{fd['code_line']}  {fd['code_text']}" if fd.get("code_file") else "-"
    cli_metrics = [m for m in registry.metrics() if m.cli]
    metric = ", ".join(f"{m.name} {format(fd[m.name], m.display)}" for m in cli_metrics
                       if isinstance(fd.get(m.name), float))
    rank = "" if fd.get("rank") is None else f"rank {fd['rank']}, "
    phase = f" ({fd['phase']})" if fd.get("phase") else ""
    lines = [f"first divergence: {rank}iteration {shown(fd['iteration'])}, position {shown(fd['position'])}: "
             f"{shown(fd['op_type'])} {fd['io']}.{shown(fd['slot'])}{phase}",
             f"  op      {fd['target_name']}"
             + (f"  (scalar arguments: {fd['arg_diff']})" if fd.get("arg_diff") else "")]
    if fd.get("origin_op"):
        lines.append(f"  origin  {fd['origin_op']} (an op only the target has, produced this input)")
    lines += [f"  scope   {fd['scope_name'] or '-'}"]
    if fd.get("container"):
        lines.append(f"  within  {fd['container']}")
    lines += [f"  source  {where}",
              f"  metrics {metric or '-'}  ({fd['err_message'] or fd['result']})"]
    for label in ("inputs", "outputs"):
        for e in fd.get(label) or []:
            err = "n/a" if e["scaled_err"] is None else f"{e['scaled_err']:.3g}"
            ratio = "" if e["ratio"] is None else f" = {e['ratio']:.3g} x floor"
            lines.append(f"  {e['io']}.{shown(e['slot']):<6} error {err}{ratio} ({e['target_dtype']} vs "
                         f"{e['bench_dtype']}, {e['result']})")
    if fd["path"]:
        lines.append("  path    " + "\n          ".join(fd["path"]))
    phases = fd.get("phases") or {}
    if phases:
        lines.append("  per phase (first departure of each):")
        lines += [f"    {name:<9} {brief_line(phases[name])}" for name in ("forward", "backward", "optimizer")
                  if name in phases]
    ranks = fd.get("ranks") or []
    if len(ranks) > 1:
        lines.append("  per rank (in the order they departed):")
        lines += [f"    rank {shown(b['rank']):<4} {brief_line(b)}" for b in ranks]
    if fd.get("sides"):
        lines.append(f"  note    {fd['sides']}")
    return lines


def alignment_lines(summary: dict[str, Any] | None) -> list[str]:
    """Re-aligned pairs, suspected mispairs and scalar-argument differences of a compare summary."""
    if not summary:
        return []
    lines = []
    if summary.get("realigned"):
        lines.append(f"alignment: {summary['realigned']} pairs re-aligned by sequence and content "
                     "(name counters shifted or a name pair did not fit)")
    suspects = summary.get("suspected_mispairs") or []
    if suspects:
        lines.append(f"suspected mispairs ({len(suspects)}): a same-type, same-shape bench tensor fits far better")
        lines += [f"  {s['target']} -> {s['bench']} (distance {s['distance']:.3g}; {s['better_bench']}: "
                  f"{s['better_distance']:.3g})" for s in suspects[:10]]
        if len(suspects) > 10:
            lines.append(f"  ... {len(suspects) - 10} more")
    diffs = summary.get("arg_diffs") or []
    if diffs:
        lines.append(f"scalar arguments differ ({len(diffs)} ops):")
        lines += [f"  {d['target']}: {d['arg_diff']}" for d in diffs[:10]]
        if len(diffs) > 10:
            lines.append(f"  ... {len(diffs) - 10} more")
    return lines


def brief_line(b: dict[str, Any]) -> str:
    """One departing op of a first-divergence report's per-phase / per-rank lists."""
    return (f"iteration {shown(b['iteration'])}, position {shown(b['position'])}: {b['target_name']} "
            f"{b['io']}.{shown(b['slot'])} ({b['reason'] or b['result']})")


# -- ranks, scan ---------------------------------------------------------------------------------
def rank_label(rank: int | None) -> str:
    """``rank N``, or ``proc (no rank)`` for a dump without a rank (a ``proc<PID>`` directory)."""
    return "proc (no rank)" if rank is None else f"rank {rank}"


def ranks_lines(run: str, rows: list[dict[str, Any]]) -> list[str]:
    """``Archive.ranks`` rows (as dicts) as one line per group: who is in it, where it departs."""
    groups: dict[Any, dict[str, Any]] = {}
    for r in rows:
        groups.setdefault(r["group"], r)
    seq = len({r["sequence_group"] for r in rows})
    lines = [f"{run}: {len(rows)} rank(s), {len(groups)} data group(s), {seq} op-sequence group(s)"]
    for g, r in groups.items():
        shared = sum(x["shared_bytes"] for x in rows if x["group"] == g)
        payload = sum(x["payload_bytes"] for x in rows if x["group"] == g)
        share = f", {shared / payload:.0%} of payload bytes shared with other ranks" if payload else ""
        label = ", ".join(rank_label(k) for k in r["group_ranks"])
        if r["reference"]:
            lines.append(f"  group {g} (reference): {label}{share}")
        else:
            where = (f" ({r['first_diff_code_file']}:{r['first_diff_code_line']} {r['first_diff_code_text']})"
                     if r["first_diff_code_file"] else "")
            lines.append(f"  group {g}: {label} departs from {rank_label(r['reference_rank'])} "
                         f"({r['departs_at']}) at iteration {r['first_diff_iteration']}, position "
                         f"{r['first_diff_position']}: {r['first_diff_op']} {r['first_diff_io']}.{r['first_diff_slot']}"
                         f"{where}{share}")
    return lines


def first_bad_line(f: dict[str, Any]) -> str:
    """The first row of ``Archive.first_bad_rank`` (as a dict) as one line."""
    where = f"{f['code_file']}:{f['code_line']} {f['code_text']}" if f["code_file"] else "no source line recorded"
    return (f"first bad rank: {rank_label(f['rank'])}, iteration {f['iteration']}, position "
            f"{f['position']}: {f['op_name']} {f['io']}.{f['slot']} ({where})")


# -- archival ------------------------------------------------------------------------------------
def gc_line(report: Any) -> str:
    """A ``GcReport`` as ``dumpdb gc``'s one line."""
    return (f"reclaimed {human(report.reclaimed)} ({human(report.bytes_before)} -> {human(report.bytes_after)}): "
            f"{report.arrays_deleted} arrays deleted, {report.packs_compacted} packs compacted, "
            f"{report.blobs_dropped} payloads dropped, {report.orphans_deleted + report.temp_files_deleted} "
            f"crash leftovers removed")


def verify_lines(report: Any, run: str | None, again: str) -> list[tuple[str, str | None]]:
    """A ``VerifyReport`` as (line, style) pairs, the verdict last (``ok: ...`` green or
    ``damaged: ...`` red); ``again``: the verify command, for the orphans' hint."""
    out: list[tuple[str, str | None]] = [(f"catalog: {problem}", "red") for problem in report.catalog_problems]
    if report.repaired:
        out.append((f"repaired: removed {report.repaired} orphan arrays and temp files", None))
    if report.orphans:
        out.append((f"orphans: {len(report.orphans)} store files nothing references "
                    f"({human(sum(o.bytes for o in report.orphans))}); '{again} --repair' removes those "
                    f"older than --grace", None))
    scope = f"run {run}" if run else "archive"
    checked = (f"{report.blobs_checked} of {report.blobs_total} payloads ({human(report.bytes_checked)}), "
               f"{report.shards_checked} shard checksums, {report.tensors_checked} tensor references, catalog")
    unchecked = []
    if report.tensors_pruned:
        unchecked.append(f"{report.tensors_pruned} tensors pruned (payloads dropped, last on "
                         f"{report.pruned_last:%Y-%m-%d %H:%M}: not checked)")
    if report.tensors_statistics_only:
        unchecked.append(f"{report.tensors_statistics_only} statistics-only (no payload dumped)")
    tail = f"; {', '.join(unchecked)}" if unchecked else ""
    if report.ok:
        out.append((f"ok: {scope}: {checked}: all as recorded{tail}", "green"))
        return out
    out += [(f"damaged shard {array_path}: {reason}", "red") for array_path, reason in report.damaged_shards.items()]
    out.append((f"damaged: {scope}: {len(report.damaged)} payloads ({report.blobs_checked} checked, "
                f"of {report.blobs_total} in scope; {report.tensors_checked} tensor references), "
                f"{len(report.damaged_shards)} shards, {len(report.catalog_problems)} catalog problems; "
                f"{report.damaged_tensors.num_rows} tensors affected{tail}", "red"))
    return out


def import_lines(report: Any) -> list[str]:
    """An ``ImportReport`` as ``dumpdb import``'s lines."""
    lines = []
    if report.runs_imported:
        lines.append(f"imported {', '.join(report.runs_imported)}: {report.tensors} tensors, {report.payloads_added} "
                     f"payloads stored, {report.payloads_present} already in the archive")
    if report.runs_skipped:
        lines.append(f"already in the archive, skipped: {', '.join(report.runs_skipped)}")
    return lines


def migrate_line(applied: Sequence[Any], latest: int) -> str:
    """The migrations applied (``version``, ``name``) as ``dumpdb migrate``'s line."""
    if applied:
        return (f"applied migrations {', '.join(f'{m.version:03d}_{m.name}' for m in applied)}; "
                f"schema version {applied[-1].version}")
    return f"schema is current (version {latest})"


# -- layouts -------------------------------------------------------------------------------------
# The vendor documents behind the layouts' ``document`` notes ("seed NNN" are the copies the
# project keeps of them, which a pip user never sees; issue 30): their public titles and homes.
PUBLIC_DOCUMENTS = {
    "seed 000": "MindSpore r1.2 docs, 'Using Dump in the Graph Mode' (mindspore.cn, gitee.com/mindspore/docs r1.2)",
    "seed 001": "MindSpore docs, 'Dump功能调试' (mindspore.cn tutorials, debug/dump.md)",
    "seed 002": "MindSpore r1.3 docs, 'Using Dump in the Graph Mode' (mindspore.cn)",
    "seed 003": "Ascend CANN TensorFlow adapter docs, 'Dump Data Collection' (support.huaweicloud.com)",
    "seed 004": "TorchAir docs, '算子输入输出dump功能（图模式）' (gitee.com/ascend/torchair)",
}


def public_source(document: str) -> str:
    """A layout's ``document`` note as a user can follow it: each project copy of a vendor
    document ("seed NNN (section)") named by its public title and section; the project's
    own notes ("reference formats.md", "corpus ...": files not in the package) dropped, a
    version they give (``msprobe 26.2.0``) kept."""
    out = []
    for part in (p.strip() for p in re.split(r";(?![^()]*\))", document)):  # not inside "(...)"
        if part.startswith("corpus "):
            continue
        if part.startswith("reference "):
            found = re.search(r"\(([^)]*)\)", part)
            if found:  # e.g. "(msprobe 26.2.0)": the tool and version the format was read from
                out.append(f"{found.group(1)} documentation (its dump file format)")
            continue
        for seed in re.findall(r"seed (\d{3})", part):
            section = re.search(rf"seed {seed}\s*\(([^)]*)\)", part)
            doc = PUBLIC_DOCUMENTS.get(f"seed {seed}", f"seed {seed}")
            out.append(doc + (f", section {section.group(1)}" if section else ""))
        if not re.search(r"seed \d{3}", part):
            out.append(part)
    return "; ".join(dict.fromkeys(out))
