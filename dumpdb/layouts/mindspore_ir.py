"""MindSpore graph files of a synchronous dump: IR text and execution orders.

Sources: seed 001 (同步Dump数据对象目录, 同步Dump数据分析样例) and the corpus
README (mindspore-cpu, "Layout" and "Things that differ from the docs").

* ``graphs/ms_output_trace_code_graph_{graph_id}.ir``: one node per
  ``%N(name) = OpType(...)`` line, followed by ``: (inputs) -> (outputs)`` type
  lines, ``# Fullname with scope: (...)`` (older IR: ``: full_name_with_scope:``,
  and r1.2's bare ``: (Default/...)`` line, seed 000)
  and ``# In file path:line.../code/`` source trace lines.
* ``execution_order/ms_execution_order_graph_{g}.csv``: a header, then one full
  scope name per kernel.
* ``execution_order/ms_global_execution_order_graph_{g}.csv``: the iterations
  graph g ran (only those dumped), one per line, no header.

Tensor files name ops by scope with ``/`` replaced by ``_``, which is not
reversible, and their ``-opN`` numbers can differ from the IR's (corpus README,
item 1). :func:`link_scopes` therefore matches, it does not reverse.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from dumpdb.dumpio import looks_binary, read_dump_text
from dumpdb.errors import DumpFileError

_NODE_RE = re.compile(r"^\s*%(\d+)\(([^)]*)\)\s*=\s*([^(\s]+)\(")
_BARE_NODE_RE = re.compile(r"^  ([A-Z][A-Za-z0-9_]*)\(%")  # e.g. "  Return(%26)": no id
# Every regex here runs on dump text (a line can be megabytes long): each is linear in the
# line, none backtracks over it twice (issue 30, item 9: "%para1_" + "a:<" * n was quadratic
# with "(\S+?):\s*<(.*)>", a 1.2 MB line parsed for minutes). What a greedy tail used to
# match is found with str methods instead (_param, _scope).
_PARAM_RE = re.compile(r"^%para\d+_(\S+?):\s*<")  # then the types up to the last '>' (_param)
_REF_KEY_RE = re.compile(r"ref_key=([^,>]+)")
_SCOPE_HEAD_RE = re.compile(r"#\s*Fullname with scope:\s*\(|:\s*full_name_with_scope:\s*\(")  # ... ")" at the end
# MindSpore r1.2 (seed 000) writes the scope as a bare ": (Default/...)" line under the node.
_BARE_SCOPE_RE = re.compile(r"^:\s*\(([^()<>\s/]*/[^()<>\s]*)\)$")  # the first '/' only: no backtracking
_TRACE_RE = re.compile(r"#\s*In file\s+(.*)$")
_TRACE_PARTS_RE = re.compile(
    r"^(?P<file>.+?)(?::(?P<line>\d+)(?P<range>~\d+)?(?:,\s*[\d~]+)?|\((?P<line2>\d+)\))/(?P<code>.*?)/?$")
_TYPE_ITEM_RE = re.compile(r"<([^<>]*)>")
_TENSOR_ITEM_RE = re.compile(r"^(?:Ref\[)?Tensor\[(\w+)\]\]?,\s*\(([\d,\s]*)\)")
_OP_NUMBER_RE = re.compile(r"-op(\d+)$")
_SITE_PACKAGES = ("site-packages", "dist-packages")
_GARBLED_RE = re.compile("[\x00-\x1f\x7f\ufffd]")  # control characters, DEL, U+FFFD (garbled_scope)


def _param(line: str) -> tuple[str, str] | None:
    """(name, types) of a ``%paraN_name: <types>`` line, as ``^%para\\d+_(\\S+?):\\s*<(.*)>``
    would give them, in linear time: the name up to the first ``:`` followed by ``<``, the
    types up to the line's last ``>``."""
    m = _PARAM_RE.match(line)
    if m is None:
        return None
    close = line.rfind(">")
    if close < m.end():
        return None
    return m.group(1), line[m.end():close]


def _scope(stripped: str) -> str | None:
    """The scope of a ``# Fullname with scope: (...)`` (or ``: full_name_with_scope: (...)``)
    line (``stripped``: no surrounding blanks), linear in the line: from the first such head
    to the line's final ``)``."""
    if not stripped.endswith(")"):
        return None
    m = _SCOPE_HEAD_RE.search(stripped)
    if m is None or m.end() > len(stripped) - 1:
        return None
    return stripped[m.end():-1]


def _parse_types(text: str) -> tuple[list, list]:
    """Shapes and dtypes of a ``(<Tensor[Float32], (4, 1)>, ...)`` list."""
    shapes, dtypes = [], []
    for item in _TYPE_ITEM_RE.findall(text):
        m = _TENSOR_ITEM_RE.match(item)
        if m:
            digits = [d for d in m.group(2).replace(" ", "").split(",") if d]
            shapes.append([int(d) for d in digits] if all(len(d) <= 18 for d in digits) else None)
            dtypes.append(m.group(1))
        else:
            shapes.append(None)
            dtypes.append(re.split(r"[\[,\s]", item, maxsplit=1)[0])
    return shapes, dtypes


def _parse_trace(line: str) -> tuple[dict, bool] | None:
    """(file, line, is_range, code) of a ``# In file`` trace, and whether the file is the
    user's own code (not site-packages), or None."""
    m = _TRACE_PARTS_RE.match(line.strip())
    if not m:
        return None
    number = m.group("line") or m.group("line2")
    file = m.group("file")
    frame = {
        "file": file,
        # beyond 19 digits: out of any column's range (the scan reports it), and int()
        # of thousands of digits raises
        "line": (int(number) if len(number) <= 19 else 1 << 63) if number else None,
        "is_range": bool(m.group("range")),
        "code": m.group("code").strip(),
    }
    return frame, not any(s in file for s in _SITE_PACKAGES)


def _user_frame(trace: list[str], parsed_lines: dict[str, tuple[dict, bool] | None]) -> dict | None:
    """The innermost source line in the user's own code.

    Frames inside site-packages/dist-packages (MindSpore's nn layers) are
    skipped, and a frame whose line is a range (``79~97``: a whole ``def``) is
    less specific than a single line. ``parsed_lines``: :func:`_parse_trace` of the lines
    met so far in this file (the nodes of one layer repeat the same traces: a Transformer
    IR has 13,061 trace lines, a few hundred distinct; the dicts are shared, read only).
    """
    frames = []
    for line in trace:
        if line in parsed_lines:
            p = parsed_lines[line]
        else:
            p = parsed_lines[line] = _parse_trace(line)
        if p:
            frames.append(p)
    parsed = [p for p, _ in frames]
    user = [p for p, mine in frames if mine]
    for candidates in (
        [p for p in user if not p["is_range"]],
        user,
        parsed,
    ):
        if candidates:
            return candidates[-1]
    return None


_SCALAR_RE = re.compile(r"^(Bool|[IUF](?:8|16|32|64)|BF16)\((.*)\)$")


def _split_args(text: str) -> list[str]:
    """Top-level comma-separated arguments of a node's argument list (``text`` starts right
    after the opening parenthesis; stops at its closing one)."""
    out, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            if depth == 0:
                out.append(text[start:i].strip())
                return out
            depth -= 1
        elif c == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    return out


def scalar_args(text: str) -> str | None:
    """The constant scalar arguments of an IR node line, by position, as JSON
    ``{"input.N": value}`` (``I64(-1)`` -> -1, ``F32(1e-05)`` -> 1e-05, ``Bool(1)`` -> true);
    None when there is none. ``text``: the line after ``= OpType(``. Source: MindSpore 2.10
    IR text (tests/data/transformer, ``PrimFunc_LayerNorm(%53, %54, %55, I64(-1), I64(-1),
    F32(1e-05))``)."""
    import json

    out: dict = {}
    for i, arg in enumerate(_split_args(text)):
        m = _SCALAR_RE.match(arg)
        if not m:
            continue
        kind, value = m.groups()
        try:
            out[f"input.{i}"] = bool(int(value)) if kind == "Bool" else float(value) if kind[0] in "FB" else int(value)
        except ValueError:
            out[f"input.{i}"] = value
    return json.dumps(out) if out else None


def parse_ir(path: Path) -> tuple[list[dict], list[str]]:
    """Nodes and parameter names of one ``.ir`` file.

    Returns (nodes, params): each node a dict with ``node``, ``ir_op_type``,
    ``op_type`` (``PrimFunc_`` prefix removed), ``scope_name``, input/output
    shapes and dtypes, ``code_file``/``code_line``/``code_text`` (user frame)
    and ``code_trace`` (all ``# In file`` lines); params are the parameter names
    (``ref_key``, e.g. ``fc1.weight``). Raises :class:`~dumpdb.errors.DumpFileError`
    for a FIFO/device, an unreadable file or one that is binary data, not IR text.
    """
    nodes: list[dict] = []
    params: list[str] = []
    current: dict | None = None
    type_lines = 0
    text = read_dump_text(path, str(path))  # regular file, bounded (dumpdb.dumpio)
    if looks_binary(text):
        raise DumpFileError(f"{path}: not a MindSpore IR text file (binary data)")
    for line in text.splitlines():
        pm = _param(line) if line.startswith("%para") else None
        if pm:
            ref = _REF_KEY_RE.search(pm[1])
            params.append(ref.group(1).strip() if ref else pm[0])
            continue
        nm = _NODE_RE.match(line)
        bare = None if nm else _BARE_NODE_RE.match(line)
        op = nm.group(3) if nm else bare.group(1) if bare else None
        if op is not None:
            current = {
                "node": f"%{nm.group(1)}" if nm else None,
                "ir_op_type": op,
                "op_type": op.removeprefix("PrimFunc_"),
                "scalar_args": scalar_args(line[nm.end():]) if nm else None,
                "scope_name": None,
                "input_shapes": None, "input_dtypes": None,
                "output_shapes": None, "output_dtypes": None,
                "code_trace": [],
            }
            nodes.append(current)
            type_lines = 0
            continue
        if current is None:
            continue
        stripped = line.strip()
        scope = _scope(stripped)
        if scope is not None:
            current["scope_name"] = scope or None
            continue
        bare = _BARE_SCOPE_RE.match(stripped)
        if bare and current["scope_name"] is None:
            current["scope_name"] = bare.group(1)
            continue
        tm = _TRACE_RE.match(stripped)
        if tm:
            current["code_trace"].append(tm.group(1))
            continue
        if stripped.startswith(": (") and "->" in stripped and type_lines == 0:
            # First type line: host-side types (the second, if any, is device-side).
            left, _, right = stripped[2:].partition("->")
            current["input_shapes"], current["input_dtypes"] = _parse_types(left)
            current["output_shapes"], current["output_dtypes"] = _parse_types(right)
            type_lines += 1
        elif stripped.startswith(": ("):
            type_lines += 1
        elif stripped.startswith("}") or stripped.startswith("subgraph") or not stripped:
            current = None
    parsed_lines: dict[str, tuple[dict, bool] | None] = {}
    for node in nodes:
        frame = _user_frame(node["code_trace"], parsed_lines)
        node["code_file"] = frame["file"] if frame else None
        node["code_line"] = frame["line"] if frame else None
        node["code_text"] = frame["code"] if frame else None
    return nodes, params


def garbled_scope(line: str) -> bool:
    """True if an execution-order line is not a scope name: control characters (NUL...)
    or undecodable bytes, which no MindSpore scope name holds."""
    return _GARBLED_RE.search(line) is not None


def read_execution_order(path: Path) -> list[str]:
    """Scope names of ``ms_execution_order_graph_{g}.csv`` in file order (header dropped).

    Lines are returned as read (see :func:`garbled_scope` to tell binary garbage);
    raises :class:`~dumpdb.errors.DumpFileError` for a FIFO/device or unreadable file.
    """
    lines = [ln.strip() for ln in read_dump_text(path, str(path)).splitlines()]
    if lines and "/" not in lines[0] and not lines[0].startswith("Default"):
        lines = lines[1:]  # header, e.g. NodeExecutionOrder-FullNameWithScope
    return [ln for ln in lines if ln]


def read_global_execution_order(path: Path) -> list[int]:
    """Iterations of ``ms_global_execution_order_graph_{g}.csv`` (non-numbers and
    numbers beyond int64 skipped)."""
    out = []
    for ln in read_dump_text(path, str(path)).split():
        for part in ln.split(","):
            part = part.strip()
            if part.isascii() and part.isdigit() and int(part) < (1 << 63):
                out.append(int(part))
    return out


def _split_op_number(name: str) -> tuple[str, int | None]:
    m = _OP_NUMBER_RE.search(name)
    if not m:
        return name, None
    return name[: m.start()], int(m.group(1))


def link_scopes(op_names: Iterable[str], scopes: Iterable[str]) -> dict[str, str]:
    """Match file op names (``/`` flattened to ``_``) to full scope names.

    Rules, per group of names sharing everything but the trailing ``-opN``:

    1. if every file name of the group flattens exactly to a scope, use those;
    2. else, if the group has as many file names as scopes, pair them in
       ``-opN`` order (the IR and the file names number from different
       counters: corpus README item 1, e.g. eval graph ``ReLU-op4..7`` in
       files vs ``ReLU-op0..3`` in the IR);
    3. else keep the exact matches only.

    A flattened name that two different scopes produce is ambiguous and never
    matched. Returns {op_name: scope_name} for the names matched.
    """
    flat: dict[str, str | None] = {}
    for scope in scopes:
        key = scope.replace("/", "_")
        if key in flat and flat[key] != scope:
            flat[key] = None  # ambiguous
        else:
            flat[key] = scope
    groups_files: dict[str, list[tuple[int | None, str]]] = defaultdict(list)
    for name in set(op_names):
        base, num = _split_op_number(name)
        groups_files[base].append((num, name))
    groups_scopes: dict[str, list[tuple[int | None, str]]] = defaultdict(list)
    for key, flat_scope in flat.items():
        if flat_scope is not None:
            base, num = _split_op_number(key)
            groups_scopes[base].append((num, flat_scope))
    result: dict[str, str] = {}
    for base, files in groups_files.items():
        candidates = groups_scopes.get(base, [])
        exact = {name: found for _, name in files if (found := flat.get(name))}
        if len(exact) == len(files):
            result.update(exact)
        elif len(files) == len(candidates) and all(n is not None for n, _ in files + candidates):
            for (_, name), (_, scope) in zip(sorted(files), sorted(candidates)):
                result[name] = scope
        else:
            result.update(exact)
    return result
