"""HTML report of the analysis across ranks (``dumpdb ranks RUN --html``).

Self-contained like the compare and scan reports (:mod:`dumpdb.render.report`, whose page,
table and escaping helpers it uses): the rank groups (:func:`dumpdb.checks.ranks.rank_groups`),
each odd rank with the op where it departs, and the ranks in the order they went bad
(:func:`dumpdb.checks.ranks.first_bad_across_ranks`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

from dumpdb.render.report import badges, esc, has_values, page, table_block, write_atomic


def _rank(rank) -> str:
    return "proc (no rank)" if rank is None else f"rank {rank}"


def write_ranks_report(path: str | os.PathLike[str], *, run: str, groups: pa.Table, first_bad: pa.Table) -> Path:
    """Write the HTML report of ``run``'s ranks; returns the path written.

    ``groups``: :func:`~dumpdb.checks.ranks.rank_groups` rows; ``first_bad``:
    :func:`~dumpdb.checks.ranks.first_bad_across_ranks` rows (either may be empty).
    """
    rows = groups.to_pylist()
    n_groups = len({r["group"] for r in rows})
    summary_badges = [("b-pass" if n_groups <= 1 else "b-error", f"{len(rows)} ranks, {n_groups} group(s)"),
                      ("b-error" if first_bad.num_rows else "b-pass", f"{first_bad.num_rows} rank(s) with NaN/Inf")]
    items = []
    for r in rows:
        if r["reference"]:
            continue
        where = (f" — {esc(r['first_diff_code_file'])}:{r['first_diff_code_line']} "
                 f"<code>{esc(r['first_diff_code_text'])}</code>" if r["first_diff_code_file"] else "")
        items.append(f"<li><b>{esc(_rank(r['rank']))}</b> departs from {esc(_rank(r['reference_rank']))} "
                     f"({esc(r['departs_at'])}) at iteration {esc(r['first_diff_iteration'])}, position "
                     f"{esc(r['first_diff_position'])}: <code>{esc(r['first_diff_op'])} "
                     f"{esc(r['first_diff_io'])}.{esc(r['first_diff_slot'])}</code>{where}</li>")
    verdict = ("<p>Every rank agrees (one group).</p>" if not items
               else "<ul>" + "".join(items) + "</ul>")
    body = ['<h2 id="odd">Ranks that depart</h2>', verdict]
    if first_bad.num_rows:
        f = first_bad.to_pylist()[0]
        body.append(f'<h2 id="bad">First rank with NaN/Inf</h2><p><b>{esc(_rank(f["rank"]))}</b>, iteration '
                    f'{esc(f["iteration"])}, position {esc(f["position"])}: <code>{esc(f["op_name"])} '
                    f'{esc(f["io"])}.{esc(f["slot"])}</code></p>')
        body.append(table_block("first-bad", first_bad, [c for c in first_bad.column_names
                                                          if has_values(first_bad, c)], empty="No NaN/Inf."))
    cols = [c for c in groups.column_names if c not in ("data_fingerprint", "sequence_fingerprint")
            and has_values(groups, c)]
    body += ['<h2 id="groups">Ranks</h2>', table_block("ranks", groups, cols, empty="No ranks.")]
    nav = [("odd", "departures"), ("bad", "NaN/Inf"), ("groups", "ranks")]
    return write_atomic(path, page(f"dumpdb ranks: {run}", badges(summary_badges), nav, "".join(body)))
