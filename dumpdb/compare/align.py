"""Pairing the tensors of a *target* selection with those of a *bench* selection.

:func:`align` takes two Arrow tables of ``tensors`` rows (plus ``position``, the op's place
in ``execution_order``, joined by the caller) and returns an :class:`Alignment`: one row per
pair (each tensor used at most once, with the strategy that matched it) and every tensor
that found no partner. Pure functions: no archive I/O. The exact strategy and the content
check run vectorised (joint integer keys in numpy, msprobe call names parsed by Arrow's RE2
over the whole column, statistics and forms as arrays); the other strategies use dicts over
column lists made on first use, and the sequence alignment runs only on the ops left
unpaired or taken back. Cost: ``scripts/bench_align.py`` (docs/alignment.md).

Strategies
----------
Applied one after the other, each only to the tensors still unmatched; ``strategies``
chooses which run (default all, :data:`STRATEGIES`). An explicit ``mapping`` runs **first**
whenever it is given, before ``exact``: what the user wrote wins over what dumpdb infers.
So the order is ``mapping`` (if a mapping is given), ``exact``, ``normalized``, ``sequence``,
``order``.

``group_by`` columns (e.g. ``('iteration', 'rank')``) must be equal within a pair; NULL
equals NULL.

All key-based strategies (mapping, exact, normalized) use one pairing rule: the tensors of
each side that share a key are put in execution order (below) and the k-th target tensor
pairs with the k-th bench tensor **only if both sides hold the same number** of them.
Otherwise none of them is paired by that strategy and a later one may try: dumpdb never
guesses across unequal counts (msprobe's documented pitfall: "the same API called a
different number of times -> cannot compare or compares the wrong API").

``mapping``
    User mapping ``target name -> bench name`` (:func:`load_mapping`). For each target
    tensor, the first of these that names a remaining bench tensor is used:

    1. the tensor's msprobe *data name* (``{op}.input.0``, ``{op}.output.1``,
       ``{op}.parameters.weight``, ``{op}.weight`` for a parameter gradient; MindSpore:
       ``{op}.{io}.{slot}``) is a key: msprobe's data mapping, one tensor to one tensor;
    2. the op name (then the IR scope name) is a key: same io/slot/arg on the bench side;
    3. the op name with every key that matches whole ``.``/``/``-separated segments replaced
       (leftmost, longest first): msprobe API mapping ``Functional.abs -> Torch.abs``
       (prefix), cell mapping ``fc2.Dense -> fc2.Linear`` inside
       ``Cell.fc2.Dense.forward.0``, layer mapping ``qkv_proj -> query_key_value``, a
       MindSpore scope prefix ``.../fc2-Dense -> .../fc3-Dense``. A rewritten name starting
       with ``Cell.`` also tries ``Module.`` and vice versa (msprobe's MindSpore names start
       with ``Cell.``, PyTorch's with ``Module.``: cross-framework compare).

``exact``
    Same ``(op_name, io, slot, slot_path, arg_name)``; NULLs compare equal. Names ending in a
    MindSpore ``-opN`` counter must also have the same element count (the counter is per
    graph: in another graph the same name can be another op).

``normalized``
    Same :func:`normalize_name` of the op's IR scope name (its file-name op name when there is
    none) + io + slot + slot_path + arg_name. Then, for msprobe names only, the call index is
    dropped **when that makes the match unique**: among the remaining tensors of a group,
    exactly one target call and one bench call of ``Functional.relu.*.forward`` (say
    ``.3.`` and ``.2.``, because the bench ran one relu fewer before) pair leaf by leaf;
    with two or more calls on either side nothing is paired here.

``sequence``
    Sequence alignment of the remaining *ops* of each group and graph, in execution order
    (:func:`dumpdb.compare.sequence.diff`: patience/histogram diff, O(n log n)), so ops
    inserted or removed on one side (AMP's casts and reshapes, a split op) leave the rest
    paired where ``order`` refuses unequal counts. An op's token (:func:`sequence_key`) is
    its op type, its normalised scope without AMP wrapper cells (``net-_OutputTo32/_backbone-LM``
    is ``net-LM``, ``norm1-_OutputTo16/_backbone-LayerNorm`` is ``norm1-LayerNorm``, parameter
    ``net._backbone.x`` is ``net.x``; msprobe names without their call index) and its outputs'
    element counts (invariant under reshapes). Cast-only ops (MindSpore ``Cast``, msprobe
    ``to``/``float``/``half``/``type_as``... calls) are transparent: left out of the
    sequence. The pairs made before (the name pairs the content check kept) are anchors:
    the longest chain of them running forward on both sides cuts each side into stretches,
    and the diff first pairs ops only within one stretch, then by token alone over what is
    left (an op the other graph schedules elsewhere). Ops the diff leaves out whose token
    occurs equally often among the leftovers of both sides (parameters dumped in another
    order) are paired too. Ops sharing one token (the q/k/v reshapes of one attention) are
    re-paired by their catalog statistics (L2 norm, mean, min, max) with the ``-opN``
    counter and pairing across stretches as weak hints, since the other graph may run them
    in another order. Within a pair of ops, tensors pair by (io, slot, slot_path, arg_name).
    Measured on real fp16 (O2) vs fp32 MindSpore Transformer dumps (tests/data/transformer):
    every fp32 tensor paired, every pair of the same op type, none with a worse partner than
    a brute-force search by cosine would find.

Content check (before ``sequence``, when it is among the strategies)
    Every ``exact`` / ``normalized`` pair is checked against what it holds: a name family
    (:func:`family`: msprobe names without their call index, MindSpore names without
    ``-opN``) holding another number of ops on the two sides, or a pair whose dtype class,
    shape or statistics (:func:`stat_distance` > ``LOOKS_WRONG``) look wrong while a bench
    tensor of the same kind nearby fits ``FAR_BETTER`` times better (within ``FITS``) and
    whose call fits the target's call better as a unit (:func:`_call_prefers`), has
    its family's name pairs taken back; ``sequence`` pairs them again, content breaking ties
    (and moving a gap among ops of one token to where content puts it). ``realigned`` marks
    the pairs that changed partner; ``Alignment.suspects`` lists final pairs that still look
    wrong (the same test; mapping pairs are not doubted). Real cases and thresholds:
    docs/alignment.md.

``order``
    Within each ``(op_type, io, slot)`` (plus ``arg_name``, ``slot_path`` and ``direction``,
    which tell msprobe's weight from bias, nested leaves apart and forward from backward;
    all NULL for MindSpore) of a group, the k-th remaining target tensor pairs with the k-th
    remaining bench tensor, only when both sides have the same count. Rows with NULL op_type
    are not paired by order.

Execution order: ``position`` (``execution_order``), then ``timestamp``, then ``tensor_id``,
NULLs last. When a side holds several iterations, ranks or graphs not named in
``group_by``, those come first in the sort key, so each keeps its own order. msprobe rows
have neither position nor timestamp: their ``tensor_id`` follows ``dump.json``.

Normalisation rules (:func:`normalize_name`), each from real dumps
-------------------------------------------------------------------
1. Trailing ``-op<N>`` is dropped. MindSpore numbers ops by a counter that differs
   (a) between file names and the IR: ``a_tensor_all_eval`` file
   ``..._relu-ReLU_ReLU-op4`` is IR ``.../relu-ReLU/ReLU-op0``, and d1/d2 backward files
   ``...Grad_Conv2D_Conv2DBackpropFilter-op0`` are IR ``...Conv2DBackpropFilter-op1``;
   (b) between graphs: the eval graph's files continue a per-process counter
   (``Conv2D-op1``, ``ReLU-op4..7``, ``MaxPool-op2..3``) where the training graph's d1 files
   say ``Conv2D-op0``, ``ReLU-op0..3``, ``MaxPool-op0..1``; (c) for the Cast ops the CPU
   backend inserts in d2, file ``..._backbone-LeNet5_Cast-op0`` is IR
   ``.../_backbone-LeNet5/Cast-op4`` (the IR counts the other Casts of that scope too).
   Several ops then share a normalised name (4 ``.../relu-ReLU/ReLU``); they pair in
   execution order when the counts agree (the corpus README's advice: scope without
   ``-opN`` + rank within the graph).
2. ``/`` is the same as ``_``: file names replace every ``/`` of the scope by ``_``
   (``Default/network-WithLossCell/_backbone-LeNet5/conv1-Conv2d/Conv2D-op0`` ->
   ``Default_network-WithLossCell__backbone-LeNet5_conv1-Conv2d_Conv2D-op0``), also for the
   ``Gradients/Default/...`` backward scopes (``Gradients_Default_...``). That is the only
   ``Gradients/``/``Default/`` difference in the real data: among the 110 distinct op names of
   the whole MindSpore CPU corpus (file names and execution-order scopes, every case), none
   differs from another only by a leading ``Gradients/`` or ``Default/``, so those prefixes
   are **kept**: they are what tells a backward op from a forward one.
3. ``.`` (and ``\\``, space) is the same as ``_`` for non-msprobe names: Parameter files
   are named with ``.`` -> ``_`` (IR ``moments.fc1.weight``, file ``moments_fc1_weight``), and
   CANN file names replace ``.``, ``/``, ``\\`` and space by ``_`` (reference formats.md
   3.1).
4. msprobe names keep their ``.`` structure; a PyTorch DDP wrapper's ``module.`` right after
   ``Module.`` is dropped: the 2-rank gloo run (tests/data/msprobe/statistics_mix_2rank_gloo)
   names ``Module.module.conv.Conv2d.forward.0`` what the single-process runs (tensor_mix,
   statistics_mix_md5)
   names ``Module.conv.Conv2d.forward.0``.

Mapping files: see :func:`load_mapping`.
"""

from __future__ import annotations

import csv
import functools
import io as _io
import math
import re
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dumpdb.compare.choices import STRATEGIES
from dumpdb.compare.sequence import diff, longest_chain

if TYPE_CHECKING:  # imported where used: a compare without a YAML mapping file never reads YAML
    import yaml

__all__ = ["STRATEGIES", "Alignment", "align", "load_mapping", "normalize_name"]

_COLUMNS = ("tensor_id", "op_type", "op_name", "scope_name", "io", "slot", "arg_name", "slot_path",
            "direction", "iteration", "rank", "graph_id", "timestamp", "position", "shape", "l2norm", "mean",
            "min", "max", "dtype")

PAIRS_SCHEMA = pa.schema([("target_tensor_id", pa.int64()), ("bench_tensor_id", pa.int64()),
                          ("match_strategy", pa.string()), ("realigned", pa.bool_())])
SUSPECTS_SCHEMA = pa.schema([("target_tensor_id", pa.int64()), ("bench_tensor_id", pa.int64()),
                             ("better_bench_tensor_id", pa.int64()), ("distance", pa.float64()),
                             ("better_distance", pa.float64())])
UNMATCHED_SCHEMA = pa.schema([("tensor_id", pa.int64()), ("name", pa.string()), ("io", pa.string()),
                              ("slot", pa.int32())])


@dataclass
class Alignment:
    """Result of :func:`align`. ``pairs``: ``target_tensor_id``, ``bench_tensor_id``,
    ``match_strategy``, ``realigned`` (bool: a name pair the content check took back and
    the sequence alignment paired otherwise) in the target's execution order;
    ``unmatched_target`` / ``unmatched_bench``: ``tensor_id``, ``name`` (op name as
    dumped), ``io``, ``slot``; ``suspects``: pairs that still look wrong while a bench
    tensor of the same op type, leaf, dtype class and shape fits far better
    (:data:`SUSPECTS_SCHEMA`, statistics distances of :func:`stat_distance`)."""

    pairs: pa.Table
    unmatched_target: pa.Table
    unmatched_bench: pa.Table
    suspects: pa.Table = field(default_factory=SUSPECTS_SCHEMA.empty_table)

    def counts(self) -> dict[str, int]:
        """Pairs per strategy (every strategy listed, 0 when unused) and unmatched per side."""
        out = {s: 0 for s in STRATEGIES}
        for s in self.pairs.column("match_strategy").to_pylist():
            out[s] += 1
        out["unmatched_target"] = self.unmatched_target.num_rows
        out["unmatched_bench"] = self.unmatched_bench.num_rows
        return out


# --------------------------------------------------------------------------- names

_OP_COUNTER = re.compile(r"-op\d+$")
_SEPARATORS = re.compile(r"[/\\. ]")
_DDP_PREFIX = "Module.module."


def _msprobe(name: str) -> dict | None:
    """parse_record_key for names that look like msprobe record keys, else None."""
    return _record_key_parser()(name) if "." in name else None


@functools.cache
def _record_key_parser():
    """dumpdb.layouts.msprobe.parse_record_key, imported on first use (importing the
    layouts imports every layout module: a compare whose names are all msprobe API keys
    or MindSpore names never needs it)."""
    from dumpdb.layouts.msprobe import parse_record_key

    return parse_record_key


def normalize_name(name: str) -> str:
    """The name under which target and bench ops are compared by the ``normalized`` strategy.

    MindSpore / CANN names: trailing ``-opN`` dropped, ``/``, ``\\``, ``.`` and space become
    ``_``. msprobe record keys: unchanged except a DDP ``Module.module.`` -> ``Module.``.
    The module docstring gives the real example behind each rule.
    """
    parsed = _msprobe(name)
    if parsed is not None:
        # Module.module.{path}.{Class}.{kind}.{index}: keep at least Module.{Class}.{kind}.{index}
        if parsed["kind"] != "api" and name.startswith(_DDP_PREFIX) and name.count(".") >= 4:
            return "Module." + name[len(_DDP_PREFIX):]
        return name
    return _SEPARATORS.sub("_", _OP_COUNTER.sub("", name))


def _without_call_index(name: str) -> str | None:
    """msprobe key with its call index replaced by ``*``; None for other names."""
    parsed = _msprobe(name)
    if parsed is None:
        return None
    parts = name.split(".")
    if parsed["kind"] == "api":
        parts[-2] = "*"
    else:
        parts[-1] = "*"
    return ".".join(parts)


def _data_name(op: str, io: str | None, slot, slot_path: str | None, arg_name: str | None) -> str:
    """msprobe's tensor (data) name of a row, as its data mapping writes it."""
    if io == "parameter_grad" and arg_name is not None:
        tail = (slot_path or "").split(".", 1)[1] if "." in (slot_path or "") else ""
        return f"{op}.{arg_name}" + ("" if tail in ("", "0") else f".{tail}")
    if io == "parameter":
        return f"{op}.parameters.{slot_path or arg_name}"
    leaf = slot_path if slot_path is not None else (str(slot) if slot is not None else arg_name)
    return f"{op}.{io}" + (f".{leaf}" if leaf is not None else "")


# --------------------------------------------------------------------------- sides


class _Side:
    """Column lists of one side, its group keys, execution-order keys and free flags."""

    # one Python list per column of _COLUMNS (set in __init__)
    tensor_id: list
    op_type: list
    op_name: list
    scope_name: list
    io: list
    slot: list
    arg_name: list
    slot_path: list
    direction: list
    iteration: list
    rank: list
    graph_id: list
    timestamp: list
    position: list
    shape: list
    l2norm: list
    mean: list
    min: list
    max: list
    dtype: list
    leafs: list  # (io, slot, slot_path, arg_name) per row
    api_tok: list | None = None  # _api_tokens()
    sizes: list  # element count per row, None for a NULL shape (_size_list)

    def __init__(self, table: pa.Table, group_by: Sequence[str], label: str):
        if not isinstance(table, pa.Table):
            raise TypeError(f"{label} must be a pyarrow.Table, not {type(table).__name__}")
        names = set(table.column_names)
        if "tensor_id" not in names:
            raise ValueError(f"{label} has no tensor_id column")
        missing = [c for c in group_by if c not in names]
        if missing:
            raise ValueError(f"group_by column(s) {', '.join(missing)} not in {label}")
        self.n = n = table.num_rows
        self.table, self.column_names, self.group_by = table, names, group_by
        # self.tensor_id, self.op_name, ...: one Python list per column, made on first use
        # (__getattr__): the vectorised exact pairing and content check read Arrow columns
        ids = table.column("tensor_id")
        if ids.null_count:
            raise ValueError(f"{label} has NULL tensor_id values")
        if pc.count_distinct(ids).as_py() != n:
            raise ValueError(f"{label} lists a tensor_id more than once")
        if group_by:
            gcols = [[_hashable(v) for v in table.column(c).to_pylist()] for c in group_by]
            self.group = list(zip(*gcols))
        else:
            self.group = [()] * n
        # Execution order as a rank per row; blocks of iteration/rank/graph first (constant
        # when grouped by), then position, timestamp, tensor_id; NULLs last.
        order_cols = [c for c in ("iteration", "rank", "graph_id", "position", "timestamp", "tensor_id")
                      if c in names]
        perm = pc.sort_indices(table.select(order_cols),  # NULLs sort last (Arrow's default)
                               sort_keys=[(c, "ascending") for c in order_cols]).to_numpy()
        self.okey_np = np.empty(n, np.int64)
        self.okey_np[perm] = np.arange(n)
        self.okey = self.okey_np.tolist()
        self.free = [True] * n
        self.content: _Content | None = None  # the content check's view of this side (_content)

    def __getattr__(self, c: str):
        if c in _COLUMNS:  # one Python list per column, on first use
            v = self.table.column(c).to_pylist() if c in self.column_names else [None] * self.n
        elif c == "leafs":
            v = list(zip(self.io, self.slot, self.slot_path, self.arg_name))
        elif c == "sizes":
            v = _size_list(self)
        else:
            raise AttributeError(c)
        setattr(self, c, v)
        return v

    def arrow(self, c: str) -> pa.ChunkedArray | pa.Array:
        """Column ``c`` as Arrow (all NULL when the table has none)."""
        return self.table.column(c) if c in self.column_names else pa.nulls(self.n)

    def first(self, *cols: str) -> pa.Array | pa.ChunkedArray:
        """The first non-NULL of string columns ``cols`` per row (Arrow), NULL where none."""
        have = [self.table.column(c) for c in cols
                if c in self.column_names and not pa.types.is_null(self.table.column(c).type)]
        if not have:
            return pa.nulls(self.n, pa.string())
        return have[0] if len(have) == 1 else pc.coalesce(*[h.cast(have[0].type) for h in have])

    def free_rows(self) -> Iterable[int]:
        return compress(range(self.n), self.free)

    def name(self, i: int) -> str | None:
        return self.op_name[i] if self.op_name[i] is not None else self.scope_name[i]


def _hashable(v):
    return tuple(_hashable(x) for x in v) if isinstance(v, list) else v


class _Pairing:
    def __init__(self, target: _Side, bench: _Side):
        self.t, self.b = target, bench
        self.pairs: list[tuple[int, int, str]] = []

    def add(self, ti: int, bi: int, strategy: str) -> None:
        self.t.free[ti] = False
        self.b.free[bi] = False
        self.pairs.append((ti, bi, strategy))

    def buckets(self, tb: Mapping, bb: Mapping, strategy: str) -> None:
        """Pair bucket by bucket, k-th with k-th in execution order, equal counts only."""
        t, b = self.t, self.b
        for key, tis in tb.items():
            bis = bb.get(key)
            if not bis:
                continue
            tis = [i for i in tis if t.free[i]]
            bis = [i for i in dict.fromkeys(bis) if b.free[i]]
            if not tis or len(tis) != len(bis):
                continue
            tis.sort(key=t.okey.__getitem__)
            bis.sort(key=b.okey.__getitem__)
            for ti, bi in zip(tis, bis):
                self.add(ti, bi, strategy)


def _index(side: _Side, keyfunc) -> dict:
    out: dict = defaultdict(list)
    for i in side.free_rows():
        key = keyfunc(i)
        if key is not None:
            out[key].append(i)
    return out


# --------------------------------------------------------------------------- strategies


def _exact(p: _Pairing) -> None:
    # A MindSpore '-opN' name is a per-graph counter: the same name in another graph can be
    # another op (fp16 vs fp32: 'Default/network-LossCell/Reshape-op0' reshapes the logits in
    # one, the labels in the other). Such names also need the same element count.
    codes = _exact_codes(p)
    if codes is not None:  # vectorised: the same keys as key() below, as joint integer codes
        _pair_codes(p, *codes, "exact")
        return

    def key(s: _Side):
        def f(i):
            name = s.op_name[i]
            size = None
            if name is not None and s.shape[i] is not None and _OP_COUNTER.search(name):
                size = _prod(s.shape[i])
            return (s.group[i], name, size) + s.leafs[i]
        return f

    p.buckets(_index(p.t, key(p.t)), _index(p.b, key(p.b)), "exact")


# Python's '\\d' in a str pattern is any Unicode decimal digit (\\p{Nd} in RE2); its '$'
# also matches before a final newline
_OP_COUNTER_RE2 = r"-op\p{Nd}+(\n?)$"


def _encode(t_col, b_col) -> tuple[np.ndarray, np.ndarray] | None:
    """Joint integer codes of one key column of both sides (equal values, NULL with NULL,
    get equal codes), or None when the column's values are not plain scalars (lists, or
    floats, whose NaN Python's dict would keep apart)."""
    t_arr = t_col.combine_chunks() if isinstance(t_col, pa.ChunkedArray) else t_col
    b_arr = b_col.combine_chunks() if isinstance(b_col, pa.ChunkedArray) else b_col
    types = {a.type for a in (t_arr, b_arr) if not pa.types.is_null(a.type)}
    if len(types) > 1:
        if not all(pa.types.is_integer(x) for x in types):
            return None
        t_arr, b_arr = t_arr.cast(pa.int64()), b_arr.cast(pa.int64())
        types = {pa.int64()}
    typ = types.pop() if types else pa.null()
    if not (pa.types.is_null(typ) or pa.types.is_integer(typ) or pa.types.is_string(typ)
            or pa.types.is_large_string(typ) or pa.types.is_boolean(typ)):
        return None
    if pa.types.is_null(typ):
        return np.zeros(len(t_arr), np.int64), np.zeros(len(b_arr), np.int64)
    both = pa.concat_arrays([t_arr.cast(typ), b_arr.cast(typ)])
    codes = pc.dictionary_encode(both, null_encoding="encode").indices.to_numpy().astype(np.int64)
    return codes[:len(t_arr)], codes[len(t_arr):]


def _combine(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Joint codes of several key columns: equal tuples, equal codes."""
    t, b = parts[0]
    for x, y in parts[1:]:
        both = np.concatenate([t, b]) * (int(max(x.max(initial=0), y.max(initial=0))) + 1) + np.concatenate([x, y])
        _, inv = np.unique(both, return_inverse=True)
        t, b = inv[:len(t)], inv[len(t):]
    return t, b


def _exact_codes(p: _Pairing) -> tuple[np.ndarray, np.ndarray] | None:
    """The exact strategy's keys (group, op_name, element count of an '-opN' name, io, slot,
    slot_path, arg_name) as joint integer codes of both sides, or None where a key column
    holds other than plain scalars (then the Python keys decide)."""
    t, b = p.t, p.b
    parts = []
    for c in ("op_name", "io", "slot", "slot_path", "arg_name"):
        e = _encode(t.arrow(c), b.arrow(c))
        if e is None:
            return None
        parts.append(e)
    for c in t.group_by:
        e = _encode(t.table.column(c), b.table.column(c))
        if e is None:
            return None
        parts.append(e)
    sizes = [_counter_sizes(s) for s in (t, b)]
    if sizes[0] is None or sizes[1] is None:
        return None
    parts.append(_encode(pa.array(sizes[0], pa.int64()), pa.array(sizes[1], pa.int64())))  # type: ignore[arg-type]
    return _combine(parts)


def _counter_sizes(s: _Side) -> np.ndarray | None:
    """Element count of each row whose op_name ends in a MindSpore '-opN' counter and whose
    shape is known; the least int64 elsewhere (None as a key); None for a count beyond
    2**62 (left to the Python keys)."""
    out = np.full(s.n, np.iinfo(np.int64).min, np.int64)
    if "op_name" not in s.column_names or "shape" not in s.column_names or not s.n:
        return out
    hit = pc.fill_null(pc.match_substring_regex(s.arrow("op_name"), _OP_COUNTER_RE2), False)
    hit = pc.and_(hit, pc.is_valid(s.arrow("shape"))).to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(hit)
    if rows.size:
        for k, i in enumerate(rows.tolist()):
            size = _prod(s.shape[i])
            if abs(size) >= 2**62:
                return None
            out[rows[k]] = size
    return out


def _pair_codes(p: _Pairing, tcode: np.ndarray, bcode: np.ndarray, strategy: str) -> None:
    """:meth:`_Pairing.buckets` on joint integer keys: among the free rows, the k-th target
    row of a key (execution order) pairs with the k-th bench row, equal counts only."""
    t, b = p.t, p.b
    tf = np.flatnonzero(np.array(t.free, bool))
    bf = np.flatnonzero(np.array(b.free, bool))
    if not tf.size or not bf.size:
        return
    tc, bc = tcode[tf], bcode[bf]
    k = int(max(tc.max(), bc.max())) + 1
    nt, nb = np.bincount(tc, minlength=k), np.bincount(bc, minlength=k)
    good = (nt == nb) & (nt > 0)
    # buckets() order: keys by their first free target row, rows by execution order
    first = np.full(k, len(t.free), np.int64)
    np.minimum.at(first, tc, tf)
    ts = tf[np.lexsort((t.okey_np[tf], first[tc]))]
    bs = bf[np.lexsort((b.okey_np[bf], first[bc]))]
    ts, bs = ts[good[tcode[ts]]], bs[good[bcode[bs]]]
    tfree, bfree = t.free, b.free
    for ti in ts.tolist():
        tfree[ti] = False
    for bi in bs.tolist():
        bfree[bi] = False
    p.pairs.extend(zip(ts.tolist(), bs.tolist(), [strategy] * len(ts)))


def _normalized(p: _Pairing) -> None:
    cache: dict[str, str] = {}
    for side in (p.t, p.b):  # names without a '.', vectorised
        names = side.first("scope_name", "op_name")
        cache.update((k, v) for k, v in zip(names.to_pylist(), plain_names(names, "normalized")) if v is not _MISSING)

    def norm(name: str | None) -> str | None:
        if name is None:
            return None
        v = cache.get(name)
        if v is None:
            v = cache[name] = normalize_name(name)
        return v

    def key(s: _Side):
        def f(i):
            n = norm(s.scope_name[i] if s.scope_name[i] is not None else s.op_name[i])
            return None if n is None else (s.group[i], n) + s.leafs[i]
        return f

    p.buckets(_index(p.t, key(p.t)), _index(p.b, key(p.b)), "normalized")

    # msprobe: drop the call index when exactly one call remains on each side.
    def calls(s: _Side) -> dict:
        out: dict = defaultdict(lambda: defaultdict(list))
        for i in s.free_rows():
            name = s.op_name[i]
            if name is None or "." not in name:  # not an msprobe key, nor is its normalised name
                continue
            normed = norm(name)  # a str for a str name
            base = _without_call_index(normed) if normed is not None else None
            if base is not None:
                out[(s.group[i], base)][name].append(i)
        return out

    tcalls, bcalls = calls(p.t), calls(p.b)
    for key, tops in tcalls.items():
        bops = bcalls.get(key)
        if bops is None or len(tops) != 1 or len(bops) != 1:
            continue
        (trows,), (brows,) = tops.values(), bops.values()
        tb: dict = defaultdict(list)
        bb: dict = defaultdict(list)
        for i in trows:
            tb[p.t.leafs[i]].append(i)
        for i in brows:
            bb[p.b.leafs[i]].append(i)
        p.buckets(tb, bb, "normalized")


# AMP wrapper cells in MindSpore scopes (after normalize_name: '/' -> '_'): O2's
# auto_mixed_precision wraps the network and its fp32-kept cells, e.g.
# 'net-_OutputTo32/_backbone-LM/...' for 'net-LM/...', 'norm1-_OutputTo16/_backbone-LayerNorm'
# for 'norm1-LayerNorm' (real MindSpore 2.10 dumps, tests/data/transformer).
_AMP_WRAPPER = re.compile(r"-_OutputTo[A-Za-z0-9]*__backbone-")
_AMP_PARAM = re.compile(r"__backbone_")  # parameter names: 'net._backbone.encoder...' for 'net.encoder...'

# Cast-only ops: transparent to the sequence alignment (AMP inserts them on one side).
_CAST_OP_TYPES = frozenset({"Cast"})
_CAST_APIS = frozenset({"to", "float", "half", "bfloat16", "double", "type", "type_as", "_to_copy", "cast"})


def sequence_key(op_type: str | None, name: str | None) -> tuple | None:
    """The token an op is aligned by in the ``sequence`` strategy: (op_type, normalised
    scope without AMP wrappers; msprobe names without their call index), or None for a
    cast-only op (transparent) or a row without a name."""
    if name is None:
        return None
    if op_type in _CAST_OP_TYPES:
        return None
    parsed = _msprobe(name)
    if parsed is not None:
        parts = name.split(".")
        if len(parts) > 1 and parts[1] in _CAST_APIS:
            return None
        base = _without_call_index(normalize_name(name))
        return (op_type, base)
    return (op_type, _AMP_PARAM.sub("_", _AMP_WRAPPER.sub("-", normalize_name(name))))


def _sequence(p: _Pairing) -> None:
    """Sequence alignment per group and graph (module docstring, dumpdb.compare.sequence)."""
    def ops(s: _Side) -> dict:
        by_group: dict = defaultdict(dict)  # (group, graph) -> op name -> [rows]
        for i in s.free_rows():
            name = s.op_name[i] if s.op_name[i] is not None else s.scope_name[i]
            if name is None:
                continue
            by_group[(s.group[i], s.graph_id[i])].setdefault(name, []).append(i)
        return by_group

    def tokens(s: _Side, op_rows: dict) -> tuple[list, list]:
        names, toks = [], []
        api = _api_tokens(s)
        okey = s.okey

        def first(kv) -> int:  # the op's first place in execution order
            return okey[kv[1][0]] if len(kv[1]) == 1 else min(map(okey.__getitem__, kv[1]))

        for name, rows in sorted(op_rows.items(), key=first):
            i = rows[0]
            f = api[i]
            if f is _MISSING:
                tok = sequence_key(s.op_type[i], s.scope_name[i] if s.scope_name[i] is not None else name)
            else:  # an msprobe API key (its family, None for a cast) or a plain name
                tok = None if f is None or s.op_type[i] in _CAST_OP_TYPES else (s.op_type[i], f)
            if tok is not None:
                names.append(name)
                # element counts of the outputs: invariant under the reshapes AMP adds
                toks.append(tok + (_sizes(s, rows),))
        return names, toks

    tops, bops = ops(p.t), ops(p.b)
    anchors = _anchors(p, [k for k in tops if bops.get(k)])
    found = []
    for key, t_ops in tops.items():
        b_ops = bops.get(key)
        if not b_ops:
            continue
        tnames, ttok = tokens(p.t, t_ops)
        bnames, btok = tokens(p.b, b_ops)
        trows_, brows_ = [t_ops[n] for n in tnames], [b_ops[n] for n in bnames]
        tseg, bseg = _segments(p.t, trows_, anchors[key][0]), _segments(p.b, brows_, anchors[key][1])
        # first within the stretches between the pairs kept (the anchors), then what is left
        # by token alone (an op the other graph runs elsewhere)
        matched = diff([(*x, s) for x, s in zip(ttok, tseg)], [(*x, s) for x, s in zip(btok, bseg)])
        matched += _leftover_diff(matched, ttok, btok)
        matched += _moved(matched, ttok, btok)
        ct, cb = _content(p.t), _content(p.b)
        matched = _shift_gaps(matched, ttok, btok,
                              lambda ti, bi: _op_distance(ct, trows_[ti], cb, brows_[bi]))  # noqa: B023
        found.append((t_ops, b_ops, tnames, bnames, ttok, matched, tseg, bseg))
    # Ops sharing a token (the q/k/v reshapes of one attention, say) may run in another order in
    # the other graph: re-pair them by statistics, the -opN counter and the stretch as weak hints.
    for t_ops, b_ops, tnames, bnames, ttok, matched, tseg, bseg in found:
        trows = [t_ops[n] for n in tnames]
        brows = [b_ops[n] for n in bnames]
        for ti, bi in _repair(matched, ttok, _Cost(p.t, trows, tnames, p.b, brows, bnames, tseg, bseg)):
            if len(trows[ti]) == 1 and len(brows[bi]) == 1:  # one tensor each: buckets() in short
                i, j = trows[ti][0], brows[bi][0]
                if p.t.leafs[i] == p.b.leafs[j] and p.t.free[i] and p.b.free[j]:
                    p.add(i, j, "sequence")
                continue
            tb: dict = defaultdict(list)
            bb: dict = defaultdict(list)
            for i in trows[ti]:
                tb[p.t.leafs[i]].append(i)
            for i in brows[bi]:
                bb[p.b.leafs[i]].append(i)
            p.buckets(tb, bb, "sequence")


def _anchors(p: _Pairing, keys: list) -> dict:
    """Per (group, graph) in ``keys``: the execution-order keys (target list, bench list, both
    increasing) of the longest chain of the pairs made before ``sequence`` (names the content
    check kept) that runs forward on both sides. They split each side into stretches: the
    k-th stretch is the ops after the k-th anchor, and an op is first aligned only within its
    stretch. A rewritten softmax or relu leaves its family one call short, and the calls
    of the others look alike in their statistics; the ops kept around them (the matmuls, the
    convolutions) say which layer each call belongs to."""
    want = set(keys)
    by: dict = {k: [] for k in want}
    t, b = p.t, p.b
    tg, bg, tgr = t.graph_id, b.graph_id, t.group
    tok, bok = t.okey, b.okey
    for ti, bi, _ in p.pairs:
        key = (tgr[ti], tg[ti])
        if key in want and tg[ti] == bg[bi]:
            by[key].append((tok[ti], bok[bi]))
    out = {}
    for key, pairs in by.items():
        pairs.sort()
        chain = longest_chain(pairs)
        out[key] = ([x for x, _ in chain], [y for _, y in chain])
    return out


def _segments(s: _Side, rows: list[list[int]], anchor_keys: list[int]) -> list[int]:
    """The stretch (:func:`_anchors`) of each op, by the execution-order key of its first row."""
    okey = s.okey
    return [bisect_right(anchor_keys, min(okey[i] for i in r)) for r in rows]


def _leftover_diff(matched: list[tuple[int, int]], ttok: list, btok: list) -> list[tuple[int, int]]:
    """:func:`diff` by token alone over the ops the first diff left unpaired on both sides."""
    used_t = {ti for ti, _ in matched}
    used_b = {bi for _, bi in matched}
    lt = [i for i in range(len(ttok)) if i not in used_t]
    lb = [j for j in range(len(btok)) if j not in used_b]
    if not lt or not lb:
        return []
    return [(lt[i], lb[j]) for i, j in diff([ttok[i] for i in lt], [btok[j] for j in lb])]


# Weight of a differing -opN counter against the statistics distance (measured on the real
# fp16-vs-fp32 Transformer pair: statistics alone leave 4 of 417 pairs mispaired, the counter
# alone 0, both 0; data flow through content hashes did worse and was dropped).
W_COUNTER = 0.3
# Weight of pairing across a stretch (_anchors): a hint of the same weight as the counter, so
# statistics that tell ops apart still win (a MindSpore fp16 graph schedules its backward
# Transposes around other kernels than the fp32 graph) and ops whose statistics look alike
# (the softmax outputs of all layers) stay in their stretch.
W_STRETCH = 0.3


class _Cost:
    """Cost of pairing the ti-th target op with the bi-th bench op of one window."""

    def __init__(self, t: _Side, trows: list, tnames: list, b: _Side, brows: list, bnames: list,
                 tseg: list | None = None, bseg: list | None = None):
        self.t, self.trows, self.tnames, self.b, self.brows, self.bnames = t, trows, tnames, b, brows, bnames
        self.tseg, self.bseg = tseg, bseg
        self.tcount: list | None = None
        self.bcount: list | None = None

    def __call__(self, ti: int, bi: int) -> float:
        if self.tcount is None or self.bcount is None:  # each name's -opN counter, once per window
            self.tcount, self.bcount = _counters(self.tnames), _counters(self.bnames)
        differ = self.tcount[ti] != self.bcount[bi] if W_COUNTER else False
        apart = self.tseg is not None and self.bseg is not None and self.tseg[ti] != self.bseg[bi]
        return _distance(self.t, self.trows[ti], self.b, self.brows[bi]) + W_COUNTER * differ + W_STRETCH * apart


def _counter(name: str) -> str | None:
    m = _OP_COUNTER.search(name)
    return m.group(0) if m else None


def _counters(names: list[str]) -> list[str | None]:
    """:func:`_counter` of each name (RE2 over the list: the '-opN' before the end or a final newline)."""
    found = pc.extract_regex(pa.array(names, pa.string()), r"(?P<c>-op\p{Nd}+)\n?$")
    return pc.struct_field(found, "c").to_pylist()


def _op_name(s: _Side, i: int) -> str | None:
    return s.op_name[i] if s.op_name[i] is not None else s.scope_name[i]


def _moved(matched: list[tuple[int, int]], ttok: list, btok: list) -> list[tuple[int, int]]:
    """Ops the diff left out whose token occurs equally often among the leftovers of both
    sides: the same ops, run in another place (parameters dumped in another order, a
    transpose scheduled elsewhere). Paired in order here; :func:`_repair` may re-pair them."""
    used_t = {ti for ti, _ in matched}
    used_b = {bi for _, bi in matched}
    left_t: dict = defaultdict(list)
    left_b: dict = defaultdict(list)
    for ti, tok in enumerate(ttok):
        if ti not in used_t:
            left_t[tok].append(ti)
    for bi, tok in enumerate(btok):
        if bi not in used_b:
            left_b[tok].append(bi)
    out: list[tuple[int, int]] = []
    for tok, tis in left_t.items():
        bis = left_b.get(tok, [])
        if len(bis) == len(tis):
            out.extend(zip(tis, bis))
    return out


GAP_WINDOW = 64  # places looked at around a pair for an unpaired op of the same token


def _shift_gaps(matched: list[tuple[int, int]], ttok: list, btok: list, cost) -> list[tuple[int, int]]:
    """Where one side has an extra op among ops of one token (a relu computed another way,
    one call fewer), the diff may put the gap at the wrong op: a pair that looks wrong
    (``cost`` > LOOKS_WRONG, :func:`_op_distance`) moves to an unpaired op of the same token
    between its neighbours' partners that fits far better (below FITS and FAR_BETTER times
    smaller), on either side."""
    out = sorted(matched)
    for side in (1, 0):  # an extra bench op, then an extra target op
        if side == 0:
            out = sorted(out, key=lambda x: x[1])
        used = {x[side] for x in out}
        toks, other = (btok, ttok) if side == 1 else (ttok, btok)
        n = len(toks)
        for k, pair in enumerate(out):
            lo = out[k - 1][side] if k else -1
            hi = out[k + 1][side] if k + 1 < len(out) else n
            cur = pair[side]
            if lo + 1 >= cur and hi <= cur + 1:
                continue  # no unpaired place between the neighbours' partners
            tok = other[pair[1 - side]]
            old = None
            for j in range(max(lo + 1, cur - GAP_WINDOW), min(hi, cur + GAP_WINDOW + 1)):
                if j == cur or j in used or toks[j] != tok:
                    continue
                if old is None:
                    old = cost(*pair)
                    if not old > LOOKS_WRONG:
                        break
                new = cost(pair[0], j) if side == 1 else cost(j, pair[1])
                if new < min(FITS, old / FAR_BETTER):
                    used.discard(cur)
                    used.add(j)
                    out[k] = (pair[0], j) if side == 1 else (j, pair[1])
                    break
    return sorted(out)


def _shared_leaf_distances(ct: _Content, trows: list[int], cb: _Content, brows: list[int]) -> np.ndarray:
    """:func:`stat_distance` of each tensor two op calls share by leaf (io, slot, slot_path,
    arg_name), float64: inf where dtype class or shape differ, NaN where a statistic is not
    finite."""
    bleaf = {cb.s.leafs[j]: j for j in brows}
    tis, bis = [], []
    for i in trows:
        j = bleaf.get(ct.s.leafs[i])
        if j is not None:
            tis.append(i)
            bis.append(j)
    return _distances(ct, cb, tis, bis)


def _op_distance(ct: _Content, trows: list[int], cb: _Content, brows: list[int]) -> float:
    """The largest :func:`stat_distance` over the tensors two ops share by (io, slot,
    slot_path, arg_name); NaN when none is known."""
    d = _shared_leaf_distances(ct, trows, cb, brows)
    d = d[~np.isnan(d)]
    return float(d.max()) if d.size else math.nan


def _api_tokens(s: _Side) -> list:
    """The name part of :func:`sequence_key` of each row's sequence name (scope_name, else
    op_name) for msprobe API keys (:func:`api_families`) and names without a '.'
    (:func:`plain_names`), :data:`_MISSING` for others; once per side."""
    v = s.api_tok
    if v is None:
        names = s.first("scope_name", "op_name")
        v = s.api_tok = api_families(names)
        for i, f in enumerate(plain_names(names, "sequence")):
            if f is not _MISSING:
                v[i] = f
    return v


def _sizes(s: _Side, rows: list[int]) -> tuple:
    size = s.sizes
    if len(rows) == 1:
        i = rows[0]
        return ((s.slot[i], size[i]),) if s.io[i] == "output" else ()
    out = []
    for i in rows:
        if s.io[i] == "output":
            out.append((s.slot[i], size[i]))
    return tuple(sorted(out, key=repr))


def _size_list(s: _Side) -> list:
    """Element count of each row's shape (:func:`_prod`), None where the shape is NULL."""
    prod = _products(s)
    if prod is None:
        return [None if x is None else _prod(x) for x in s.shape]
    return [int(x) if v else None for x, v in zip(prod[0].tolist(), prod[1].tolist())]


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


STATS_REPAIR_MAX = 32  # ops of one token re-paired by statistics (k^2 costs)


def _repair(pairs: list[tuple[int, int]], ttok: list, cost) -> list[tuple[int, int]]:
    """Among the matched ops of one token, pair by the lowest ``cost(ti, bi)``, ties by order
    (greedy assignment over at most STATS_REPAIR_MAX ops per token)."""
    by_tok: dict = defaultdict(list)
    for ti, bi in pairs:
        by_tok[ttok[ti]].append((ti, bi))
    out = []
    for group in by_tok.values():
        if len(group) < 2 or len(group) > STATS_REPAIR_MAX:
            out.extend(group)
            continue
        group.sort()
        tis = [ti for ti, _ in group]
        bis = sorted(bi for _, bi in group)
        if all(cost(ti, bi) == 0 for ti, bi in zip(tis, bis)):
            out.extend(zip(tis, bis))  # the order's pairing is already perfect
            continue
        cand = sorted((cost(ti, bi), abs(x - y), ti, bi)
                      for x, ti in enumerate(tis) for y, bi in enumerate(bis))
        used_t: set = set()
        used_b: set = set()
        for _, _, ti, bi in cand:
            if ti not in used_t and bi not in used_b:
                used_t.add(ti)
                used_b.add(bi)
                out.append((ti, bi))
    return out


def _distance(t: _Side, trows: list[int], b: _Side, brows: list[int]) -> float:
    """Sum over the tensors two ops share by leaf of |x - y| for l2norm, mean, min, max, each
    over the larger L2 norm of the two tensors: a tensor of rounding noise on one side (a
    gradient that is zero in exact arithmetic, L2 norm 1e-12 in fp32 and 3e-6 in fp16) adds
    at most about 1 per statistic instead of 1e6, so it cannot outweigh the ops' other tensors
    (MindSpore fp16 vs fp32 backward Concats and AdamWeightDecays were re-paired by it)."""
    bleaf = {b.leafs[i]: i for i in brows}
    d = 0.0
    for i in trows:
        j = bleaf.get(t.leafs[i])
        if j is None:
            continue
        for x, y in ((t.l2norm[i], b.l2norm[j]), (t.mean[i], b.mean[j]), (t.min[i], b.min[j]),
                     (t.max[i], b.max[j])):
            if x is None or y is None or not (math.isfinite(x) and math.isfinite(y)):
                continue
            scale = max(abs(b.l2norm[j] or 0.0), abs(t.l2norm[i] or 0.0), 1e-30)
            d += abs(x - y) / scale
    return d


# --------------------------------------------------------------------------- content check

# A name pair "looks wrong" when the statistics distance (stat_distance) of its two tensors
# is above LOOKS_WRONG and a bench tensor of the same op type, leaf, dtype class and shape,
# at most NEIGHBOURS places away in that kind's execution order, fits FAR_BETTER times
# better and within FITS (a real change of one op leaves no such partner: the softmax of a
# changed scale, distance 0.80, has a best other partner at 0.15). Clean pairs on real dumps sit far below (fp16 O2 vs
# fp32 MindSpore Transformer, bf16 vs fp32 msprobe: see docs/alignment.md); the crossed
# attention Transposes of the MindSpore Transformer and the counter-shifted msprobe calls
# of a rewritten LayerNorm sit far above with a partner near 0.
LOOKS_WRONG = 0.25
FAR_BETTER = 4.0
FITS = 0.05  # a better partner must also fit: distance at most this (rounding, not another tensor)
NEIGHBOURS = 16
_NAME_STRATEGIES = frozenset({"exact", "normalized"})


def stat_distance(x: tuple, y: tuple) -> float:
    """How far two tensors' catalog statistics are apart, in units of the tensors' size.

    ``x``, ``y``: ``(l2norm, mean, min, max, elements)``. The largest of
    ``|l2norm_x - l2norm_y| / max(l2norm)`` and ``|s_x - s_y| / rms`` for s = mean, min, max,
    where rms = max(l2norm) / sqrt(elements): 0 for equal statistics, about the relative
    error for a pair differing by rounding, order 1 for unrelated tensors. NaN when a
    statistic is missing or not finite (unknown: never "looks wrong"); 1.0 when one tensor
    is all zeros and the other not.
    """
    if any(v is None for v in x) or any(v is None for v in y):
        return math.nan
    if not all(math.isfinite(v) for v in (*x[:4], *y[:4])):
        return math.nan
    l2 = max(abs(x[0]), abs(y[0]))
    if l2 == 0.0:
        return 0.0 if x[1:4] == y[1:4] else 1.0
    rms = l2 / math.sqrt(max(x[4], y[4], 1))
    return max(abs(x[0] - y[0]) / l2, abs(x[1] - y[1]) / rms, abs(x[2] - y[2]) / rms, abs(x[3] - y[3]) / rms)


def dtype_class(dtype: str | None) -> str | None:
    if dtype is None:
        return None
    d = dtype.lower().removeprefix("torch.")
    for prefix, cls in (("float", "f"), ("bfloat", "f"), ("half", "f"), ("double", "f"), ("complex", "c"),
                        ("int", "i"), ("uint", "i"), ("long", "i"), ("bool", "b")):
        if d.startswith(prefix):
            return cls
    return d


class _Content:
    """Per-row statistics (an n x 5 float array: l2norm, mean, min, max, elements; NaN where
    missing), forms (dtype class, shape), kinds (group, graph, op type, leaf, form) and name
    families (group, family) of one side, computed once for the content check."""

    def __init__(self, s: _Side):
        self.s = s
        self.st = np.stack([*(_floats(s, c) for c in ("l2norm", "mean", "min", "max")), _elements(s)], axis=1) \
            if s.n else np.zeros((0, 5))
        self.fkey = _form_keys(s)
        names = s.first("op_name", "scope_name")  # s.name(i)
        fams = _families(s, names)
        self.fam: list = fams  # family() of each row, None for none (_family_codes adds the group)
        self._kinds: dict | None = None
        self._form: list | None = None
        self._calls: dict | None = None  # (group, graph, name) -> rows (call_rows)

    def call_rows(self, i: int) -> list[int]:
        """The rows of row ``i``'s op call: same group, graph and name (op_name, else
        scope_name); just ``[i]`` for a row without a name. Indexed on first use."""
        s = self.s
        if self._calls is None:
            calls: dict = defaultdict(list)
            for j, (g, gr, nm) in enumerate(zip(s.group, s.graph_id, s.first("op_name", "scope_name").to_pylist())):
                if nm is not None:
                    calls[(g, gr, nm)].append(j)
            self._calls = calls
        name = s.name(i)
        return [i] if name is None else self._calls[(s.group[i], s.graph_id[i], name)]

    @property
    def form(self) -> list:
        """(dtype class, shape tuple) per row."""
        if self._form is None:
            s = self.s
            classes = {d: dtype_class(d) for d in set(s.dtype)}
            self._form = [(classes[d], None if sh is None else tuple(sh)) for d, sh in zip(s.dtype, s.shape)]
        return self._form

    def kind(self, i: int) -> tuple:
        s = self.s
        return (s.group[i], s.graph_id[i], s.op_type[i]) + s.leafs[i] + self.form[i]

    def by_kind(self) -> dict:
        """kind -> (rows in execution order, row -> place), built on first use."""
        if self._kinds is None:
            out: dict = defaultdict(list)
            for i in sorted(range(self.s.n), key=self.s.okey.__getitem__):
                out[self.kind(i)].append(i)
            self._kinds = {k: (v, {i: x for x, i in enumerate(v)}) for k, v in out.items()}
        return self._kinds


_MISSING = object()


def _floats(s: _Side, c: str) -> np.ndarray:
    """Column ``c`` as float64, NaN where NULL or missing."""
    if c not in s.column_names:
        return np.full(s.n, math.nan)
    col = s.arrow(c)
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_null(col.type):
        return np.asarray(pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False), np.float64)
    return np.array([math.nan if v is None else v for v in getattr(s, c)], np.float64)


def _shapes(s: _Side) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(valid, offsets, int64 dims) of the shape column, or None when it is not a list of integers."""
    if "shape" not in s.column_names:
        return np.zeros(s.n, bool), np.zeros(s.n + 1, np.int64), np.zeros(0, np.int64)
    col = s.arrow("shape")
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)) or \
            not pa.types.is_integer(col.type.value_type):
        return None
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    dims = pc.list_flatten(col)
    if dims.null_count:
        return None
    return valid, offsets, dims.to_numpy(zero_copy_only=False).astype(np.int64)


def _products(s: _Side) -> tuple[np.ndarray, np.ndarray] | None:
    """(element count as int64, 1 for a 0-d shape; shape not NULL) per row, or None when
    the shape column is not a list of integers or a count reaches 2**62."""
    sh = _shapes(s)
    if sh is None:
        return None
    valid, offsets, dims = sh
    out = np.ones(s.n, np.int64)
    nonempty = np.flatnonzero(offsets[1:] > offsets[:-1])
    if nonempty.size:
        if np.abs(np.multiply.reduceat(dims.astype(np.float64), offsets[nonempty])).max() >= 2.0**62:
            return None
        out[nonempty] = np.multiply.reduceat(dims, offsets[nonempty])
    return out, valid


def _elements(s: _Side) -> np.ndarray:
    """Element count per row as float64 (1 for an unknown shape), as _prod."""
    prod = _products(s)
    if prod is None:
        return np.array([1 if x is None else _prod(x) for x in s.shape], np.float64)
    return np.where(prod[1], prod[0], 1).astype(np.float64)


def _form_keys(s: _Side) -> np.ndarray:
    """Per row a string standing for (dtype class, shape): equal strings, equal forms."""
    dtypes = s.arrow("dtype")
    classes = {d: dtype_class(d) for d in (pc.unique(dtypes).to_pylist() if s.n else [])}
    cls = [("\x00" if classes[d] is None else classes[d]) for d in s.dtype]
    sh = _shapes(s)
    if sh is None:
        shp = ["\x00" if x is None else ",".join(str(d) for d in x) for x in s.shape]
    else:
        col = s.arrow("shape")
        text = pc.binary_join(pc.cast(col, pa.list_(pa.string())), ",")
        shp = pc.fill_null(text, "\x00").to_pylist()
    return np.array([f"{a}|{b}" for a, b in zip(cls, shp)], object)


def _content(s: _Side) -> _Content:
    if s.content is None:
        s.content = _Content(s)
    return s.content


def family(op_type: str | None, name: str | None) -> str | None:
    """The name family whose members a counter numbers: msprobe names without their call
    index (``Tensor.__add__.*.forward``; a DDP ``Module.module.`` as ``Module.``), MindSpore
    names without ``-opN`` (and ``/``, ``\\``, ``.``, space as ``_``); None for other
    names and for cast-only ops (transparent to the sequence alignment, :func:`sequence_key`)."""
    if name is None or op_type in _CAST_OP_TYPES:
        return None
    parsed = _msprobe(name)
    if parsed is not None:
        parts = (normalize_name(name) if name.startswith(_DDP_PREFIX) else name).split(".")
        if len(parts) > 1 and parts[1] in _CAST_APIS:
            return None
        parts[-2 if parsed["kind"] == "api" else -1] = "*"
        return ".".join(parts)
    m = _OP_COUNTER.search(name)
    return _SEPARATORS.sub("_", name[:m.start()]) if m else None


# msprobe API record keys ('{api}.{N}.{direction}'), the bulk of a dump.json: parse_record_key
# calls them 'api' whatever their prefix, and their family is the key with N as '*' (no DDP
# rewrite: normalize_name leaves API keys alone). The same rules as family(), in RE2 on a
# whole column; every other name goes through family() itself.
_API_KEY_RE2 = r"(?s)^.*\.[0-9]+\.(forward|backward)$"
_API_INDEX_RE2 = r"\.[0-9]+\.(forward|backward)$"
_SECOND_RE2 = r"(?s)^[^.]*\.(?P<api>[^.]*)"


def api_families(names: pa.Array | pa.ChunkedArray) -> list:
    """Per name: the :func:`family` of an msprobe API record key (None for a cast-only API
    such as ``Tensor.to.0.forward``), or :data:`_MISSING` for any other name (and NULL),
    which the caller gives to :func:`family`. Vectorised over the column (Arrow RE2)."""
    if isinstance(names, pa.ChunkedArray):
        names = names.combine_chunks()
    if not len(names) or not (pa.types.is_string(names.type) or pa.types.is_large_string(names.type)):
        return [_MISSING] * len(names)
    api = pc.fill_null(pc.match_substring_regex(names, _API_KEY_RE2), False).to_numpy(zero_copy_only=False)
    if not api.any():
        return [_MISSING] * len(names)
    second = pc.struct_field(pc.extract_regex(names, _SECOND_RE2), "api")
    cast = pc.fill_null(pc.is_in(second, value_set=pa.array(sorted(_CAST_APIS))), False).to_numpy(
        zero_copy_only=False)
    fam = pc.replace_substring_regex(names, _API_INDEX_RE2, r".*.\1").to_pylist()
    return [(None if c else f) if a else _MISSING for a, c, f in zip(api.tolist(), cast.tolist(), fam)]


# Names without a '.' (MindSpore / CANN scopes and file names) are never msprobe record keys:
# normalize_name, family and sequence_key are then regular expressions alone, the same ones
# in RE2 over the whole column (Python's \\d: \\p{Nd}; its '$' also before a final newline)
_SEPARATORS_RE2 = r"[/\\. ]"


def plain_names(names: pa.Array | pa.ChunkedArray, what: str) -> list:
    """Per name without a '.': ``what`` = ``'normalized'`` (:func:`normalize_name`),
    ``'family'`` (:func:`family` for an op type that is not a cast) or ``'sequence'`` (the
    name part of :func:`sequence_key`); :data:`_MISSING` for other names and NULL."""
    if isinstance(names, pa.ChunkedArray):
        names = names.combine_chunks()
    n = len(names)
    if not n or not (pa.types.is_string(names.type) or pa.types.is_large_string(names.type)):
        return [_MISSING] * n
    plain = pc.fill_null(pc.invert(pc.match_substring(names, ".")), False).to_numpy(zero_copy_only=False)
    if not plain.any():
        return [_MISSING] * n
    if what == "family":
        has = pc.fill_null(pc.match_substring_regex(names, _OP_COUNTER_RE2), False).to_numpy(zero_copy_only=False)
        out = pc.replace_substring_regex(pc.replace_substring_regex(names, _OP_COUNTER_RE2, ""), _SEPARATORS_RE2, "_")
        return [(f if h else None) if p else _MISSING for p, h, f in zip(plain.tolist(), has.tolist(), out.to_pylist())]
    out = pc.replace_substring_regex(pc.replace_substring_regex(names, _OP_COUNTER_RE2, r"\1"), _SEPARATORS_RE2, "_")
    if what == "sequence":
        out = pc.replace_substring_regex(pc.replace_substring_regex(out, _AMP_WRAPPER.pattern, "-"),
                                         _AMP_PARAM.pattern, "_")
    return [f if p else _MISSING for p, f in zip(plain.tolist(), out.to_pylist())]


def family_column(op_type: list, names: pa.Array | pa.ChunkedArray) -> list:
    """:func:`family` of each (op type, name): ``op_type`` a list, ``names`` an Arrow string
    column of the same length; msprobe API record keys vectorised (:func:`api_families`)."""
    as_list: list = []  # the names as Python strings only if a name needs family() itself

    def name_of(i: int):
        if not as_list:
            as_list.append(names.to_pylist())
        return as_list[0][i]
    return _family_list(op_type, names, name_of)


def _families(s: _Side, names) -> list:
    """:func:`family` of each row's (op type, name), ``names`` (Arrow) the row's
    :meth:`_Side.name`."""
    return _family_list(s.op_type, names, s.name)


def _family_list(op_type: list, names, name_of) -> list:
    out = api_families(names)
    plain = plain_names(names, "family")
    for i, f in enumerate(plain):
        if f is not _MISSING:
            out[i] = f
    fam_of: dict = {}
    for i, f in enumerate(out):
        if f is _MISSING or op_type[i] in _CAST_OP_TYPES:
            key = (op_type[i], name_of(i))
            f = fam_of.get(key, _MISSING)
            if f is _MISSING:
                f = fam_of[key] = family(*key)
            out[i] = f
    return out


def _distances(ct: _Content, cb: _Content, tis: list[int] | np.ndarray, bis: list[int] | np.ndarray) -> np.ndarray:
    """:func:`stat_distance` of many pairs at once (inf where dtype class or shape differ)."""
    if len(tis) == 0:
        return np.zeros(0)
    x, y = ct.st[tis], cb.st[bis]
    with np.errstate(divide="ignore", invalid="ignore"):
        l2 = np.maximum(np.abs(x[:, 0]), np.abs(y[:, 0]))
        rms = l2 / np.sqrt(np.maximum(np.maximum(x[:, 4], y[:, 4]), 1))
        d = np.maximum.reduce([np.abs(x[:, 0] - y[:, 0]) / l2, np.abs(x[:, 1] - y[:, 1]) / rms,
                               np.abs(x[:, 2] - y[:, 2]) / rms, np.abs(x[:, 3] - y[:, 3]) / rms])
        zero = l2 == 0
        d[zero] = np.where(np.all(x[zero, 1:4] == y[zero, 1:4], axis=1), 0.0, 1.0)
        d[~np.isfinite(x[:, :4]).all(axis=1) | ~np.isfinite(y[:, :4]).all(axis=1)] = math.nan
    d[ct.fkey[tis] != cb.fkey[bis]] = math.inf
    return d


def _better_partner(ct: _Content, cb: _Content, ti: int, bi: int, d: float) -> tuple[int, float, float] | None:
    """(bench row, its distance, the pair's distance ``d``) of a far better partner of target
    row ``ti`` than its bench row ``bi`` (see LOOKS_WRONG), or None."""
    if not d > LOOKS_WRONG:  # NaN (unknown) is not wrong
        return None
    b = cb.s
    found = cb.by_kind().get(ct.kind(ti))
    if found is None:
        return None
    rows, at = found
    k = at.get(bi)
    if k is None:  # the current partner is of another kind: look around the target's place
        k = bisect_left([b.okey[j] for j in rows], b.okey[bi])
    best, best_d = -1, min(FITS, d / FAR_BETTER)
    for j in rows[max(0, k - NEIGHBOURS):k + NEIGHBOURS + 1]:
        if j == bi:
            continue
        dj = stat_distance(tuple(ct.st[ti].tolist()), tuple(cb.st[j].tolist()))
        if dj < best_d:
            best, best_d = j, dj
    return (best, best_d, d) if best >= 0 else None


def _leaves_fitting(ct: _Content, trows: list[int], cb: _Content, brows: list[int]) -> int:
    """How many of the tensors two op calls share by leaf (io, slot, slot_path, arg_name)
    fit: :func:`stat_distance` at most ``FITS``."""
    return int(np.count_nonzero(_shared_leaf_distances(ct, trows, cb, brows) <= FITS))


def _call_prefers(ct: _Content, cb: _Content, ti: int, bi: int, bj: int) -> bool:
    """Is the call of bench row ``bj`` (a far better partner of target row ``ti``,
    :func:`_better_partner`) a better partner of ``ti``'s call than the call of ``bi`` (its
    current partner)? The call as a unit: more of its tensors fit (``FITS``). A tensor
    alone can mislead: MindSpore 2.10 CPU's in-place ``AdamWeightDecay`` dumps output
    buffers it never wrote (reused across calls, precision.py "Not comparable"), so an
    output of one parameter's update may fit another call's output far better, while the
    name pair's var, m, v and gradient inputs fit and the other call's do not. For a call
    of one tensor this is the tensor's own test."""
    trows = ct.call_rows(ti)
    return _leaves_fitting(ct, trows, cb, cb.call_rows(bj)) > _leaves_fitting(ct, trows, cb, cb.call_rows(bi))


def _take_back(p: _Pairing) -> dict[int, int]:
    """The content check before the sequence strategy: name pairs of a family whose counts
    differ between the sides, or with a pair that looks wrong while a far better partner
    exists, are taken back (both tensors free again). Returns {target row: its old bench row}."""
    named = [(ti, bi) for ti, bi, s in p.pairs if s in _NAME_STRATEGIES]
    if not named:
        return {}
    ct, cb = _content(p.t), _content(p.b)
    fam_t, fam_b = _family_codes(p)  # -1: no family
    gt, gb = _joint(p, "graph_id")
    # ops per family on each side: distinct (graph_id, name)
    nt, nb = _joint(p, None)
    counts = []
    k = int(max(fam_t.max(initial=-1), fam_b.max(initial=-1))) + 1
    for fam, g, n in ((fam_t, gt, nt), (fam_b, gb, nb)):
        rows = fam >= 0
        fr = fam[rows]
        ng, nn = int(g.max(initial=0)) + 1, int(n.max(initial=0)) + 1
        fg = np.unique(fr * ng + g[rows], return_inverse=True)[1].reshape(-1)  # codes < rows: no overflow
        ops = fr[np.unique(fg * nn + n[rows], return_index=True)[1]]  # the family of each distinct op
        counts.append(np.bincount(ops, minlength=k + 1))
    # only pairs within one graph on both sides: the sequence alignment pairs within a graph
    tis, bis = np.array([x[0] for x in named], np.int64), np.array([x[1] for x in named], np.int64)
    same = gt[tis] == gb[bis]
    tis, bis = tis[same], bis[same]
    f = fam_t[tis]
    has = f >= 0
    suspect = set(np.unique(f[has & (counts[0][np.maximum(f, 0)] != counts[1][np.maximum(f, 0)])]).tolist())
    bench_family = np.full(p.b.n, -1, np.int64)
    bench_family[bis] = f
    dist = _distances(ct, cb, tis.tolist(), bis.tolist())
    for x in np.flatnonzero(has & (dist > LOOKS_WRONG)).tolist():  # in pair order: suspect grows
        ti, bi, fx = int(tis[x]), int(bis[x]), int(f[x])
        if fx in suspect:
            continue
        better = _better_partner(ct, cb, ti, bi, float(dist[x]))
        if better is not None and _call_prefers(ct, cb, ti, bi, better[0]):
            suspect.add(fx)
            other = int(bench_family[better[0]])
            if other >= 0:
                suspect.add(other)
    if not suspect:
        return {}
    old: dict[int, int] = {}
    kept = []
    for ti, bi, strategy in p.pairs:
        if strategy in _NAME_STRATEGIES and int(fam_t[ti]) in suspect and gt[ti] == gb[bi]:
            p.t.free[ti] = p.b.free[bi] = True
            old[ti] = bi
        else:
            kept.append((ti, bi, strategy))
    p.pairs = kept
    return old


def _joint(p: _Pairing, column: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Joint integer codes of both sides' ``column`` (None: the row's name, op_name else
    scope_name): equal values (NULL with NULL), equal codes."""
    t, b = p.t, p.b
    if column is None:
        e = _encode(t.first("op_name", "scope_name"), b.first("op_name", "scope_name"))
    else:
        e = _encode(t.arrow(column), b.arrow(column))
    if e is not None:
        return e
    lists = (t.name(i) for i in range(t.n)), (b.name(i) for i in range(b.n))
    if column is not None:
        lists = getattr(t, column), getattr(b, column)
    return _codes_of(*lists)


def _codes_of(a: Iterable, b: Iterable) -> tuple[np.ndarray, np.ndarray]:
    """Joint integer codes of two sequences of hashable values (a Python dict)."""
    seen: dict = {}
    out = [np.array([seen.setdefault(v, len(seen)) for v in x], np.int64) for x in (a, b)]
    return out[0], out[1]


def _family_codes(p: _Pairing) -> tuple[np.ndarray, np.ndarray]:
    """Joint codes of each row's (group, family) on both sides; -1 where it has no family."""
    ct, cb = _content(p.t), _content(p.b)
    ft = pa.array(ct.fam, pa.string())
    fb = pa.array(cb.fam, pa.string())
    parts = [_encode(ft, fb)]
    for c in p.t.group_by:
        e = _encode(p.t.table.column(c), p.b.table.column(c))
        parts.append(e if e is not None else _codes_of(p.t.group, p.b.group))
    t, b = _combine(parts)  # type: ignore[arg-type]
    t[ft.is_null().to_numpy(zero_copy_only=False)] = -1
    b[fb.is_null().to_numpy(zero_copy_only=False)] = -1
    return t, b


def _suspects(p: _Pairing, tis: np.ndarray, bis: np.ndarray, checked: np.ndarray) -> list[tuple]:
    """Final pairs (rows ``tis``/``bis`` in the target's execution order; ``checked``: not a
    mapping pair, since what the user wrote wins) that look wrong while a far better partner
    exists: (target row, bench row, better bench row, distance, better distance)."""
    ct, cb = _content(p.t), _content(p.b)
    out = []
    tis, bis = tis[checked], bis[checked]
    dist = _distances(ct, cb, tis, bis)
    for k in np.flatnonzero(dist > LOOKS_WRONG).tolist():
        ti, bi = int(tis[k]), int(bis[k])
        better = _better_partner(ct, cb, ti, bi, float(dist[k]))
        if better is not None and _call_prefers(ct, cb, ti, bi, better[0]):
            out.append((ti, bi, better[0], better[2], better[1]))
    return out


def _order(p: _Pairing) -> None:
    def key(s: _Side):
        return lambda i: None if s.op_type[i] is None else (
            s.group[i], s.op_type[i], s.io[i], s.slot[i], s.arg_name[i], s.slot_path[i], s.direction[i])

    p.buckets(_index(p.t, key(p.t)), _index(p.b, key(p.b)), "order")


class _Rewriter:
    """Applies a mapping to a name: whole-name key, else keys matching runs of whole
    ``.``/``/``-separated segments, leftmost and longest first."""

    _SPLIT = re.compile(r"([./])")

    def __init__(self, mapping: Mapping[str, str]):
        self.full = dict(mapping)
        self.runs: dict[tuple[str, ...], str] = {}
        for k, v in mapping.items():
            self.runs[tuple(self._SPLIT.split(k)[0::2])] = v
        self.longest = max((len(k) for k in self.runs), default=0)
        self.first = {k[0] for k in self.runs}  # quick reject: no key starts at any segment
        self._cache: dict[str, str | None] = {}

    def __call__(self, name: str) -> str | None:
        """The rewritten name, or None when no key applies."""
        if name in self._cache:
            return self._cache[name]
        out = self.full.get(name)
        if out is None:
            parts = self._SPLIT.split(name)
            segs, seps = parts[0::2], parts[1::2]
            if not self.first.isdisjoint(segs):
                out = self._runs(segs, seps)
        self._cache[name] = out
        return out

    def _runs(self, segs: list[str], seps: list[str]) -> str | None:
        pieces, i, changed = [], 0, False
        while i < len(segs):
            step, rep = 1, None
            for length in range(min(self.longest, len(segs) - i), 0, -1):
                rep = self.runs.get(tuple(segs[i:i + length]))
                if rep is not None:
                    step, changed = length, True
                    break
            pieces.append(segs[i] if rep is None else rep)
            i += step
            if i < len(segs):
                pieces.append(seps[i - 1])
        return "".join(pieces) if changed else None


def _swap_tag(name: str) -> str | None:
    for a, b in (("Cell.", "Module."), ("Module.", "Cell.")):
        if name.startswith(a):
            return b + name[len(a):]
    return None


def _mapping(p: _Pairing, mapping: Mapping[str, str]) -> None:
    t, b = p.t, p.b
    rewrite = _Rewriter(mapping)
    # Target side first: every bench key each target tensor could mean, in preference order.
    tcands: list[tuple[int, list[tuple]]] = []
    wanted: set[tuple] = set()
    want_leaf = False
    for i in t.free_rows():
        g, leaf = t.group[i], t.leafs[i]
        names = [n for n in dict.fromkeys((t.op_name[i], t.scope_name[i])) if n is not None]
        cands = []
        for name in names:
            bench_leaf = rewrite.full.get(_data_name(name, *leaf))
            if bench_leaf is not None:
                cands.append((g, "leaf", bench_leaf))
                want_leaf = True
        for name in names:
            new = rewrite(name)
            if new is not None:
                cands.append((g, "op", new) + leaf)
                swapped = _swap_tag(new)
                if swapped is not None:
                    cands.append((g, "op", swapped) + leaf)
        if cands:
            tcands.append((i, cands))
            wanted.update(cands)
    if not tcands:
        return
    # Bench side: only the rows some target could mean.
    bindex: dict = defaultdict(list)
    for i in b.free_rows():
        g, leaf = b.group[i], b.leafs[i]
        for name in dict.fromkeys((b.op_name[i], b.scope_name[i])):
            if name is None:
                continue
            key = (g, "op", name) + leaf
            if key in wanted:
                bindex[key].append(i)
            if want_leaf:
                key = (g, "leaf", _data_name(name, *leaf))
                if key in wanted:
                    bindex[key].append(i)
    tb: dict = defaultdict(list)
    for i, cands in tcands:
        for cand in cands:
            if cand in bindex:
                tb[cand].append(i)
                break
    p.buckets(tb, bindex, "mapping")


# --------------------------------------------------------------------------- align


def align(target: pa.Table, bench: pa.Table, *, group_by: Sequence[str] = (),
          mapping: Mapping[str, str] | None = None, strategies: Sequence[str] = STRATEGIES) -> Alignment:
    """Pair target tensors with bench tensors; see the module docstring for the rules.

    ``target`` / ``bench``: tensor rows with ``tensor_id`` (required, unique per side) and any
    of ``op_type, op_name, scope_name, io, slot, arg_name, slot_path, direction, iteration,
    rank, graph_id, timestamp, position`` (a missing column counts as all NULL).
    ``group_by``: columns that must be equal within a pair (both tables must have them).
    ``mapping``: target name -> bench name, applied first (needs ``'mapping'`` in
    ``strategies``). ``strategies``: any of :data:`STRATEGIES`, applied in the given order.
    """
    strategies = list(dict.fromkeys(strategies))
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown strategy {unknown[0]!r}: choose from {', '.join(STRATEGIES)}")
    if mapping and "mapping" not in strategies:
        raise ValueError("a mapping was given but 'mapping' is not among the strategies")
    group_by = tuple(group_by)
    p = _Pairing(_Side(target, group_by, "target"), _Side(bench, group_by, "bench"))

    run = ["mapping"] if mapping and "mapping" in strategies else []
    run += [s for s in strategies if s != "mapping"]
    old: dict[int, int] = {}
    for strategy in run:
        if strategy == "mapping":
            _mapping(p, mapping or {})  # only run with a mapping given
        elif strategy == "exact":
            _exact(p)
        elif strategy == "normalized":
            _normalized(p)
        elif strategy == "sequence":
            old = _take_back(p)  # name pairs the content check doubts go to the sequence alignment
            _sequence(p)
        else:
            _order(p)

    t, b = p.t, p.b
    if p.pairs:
        tis, bis, how = (list(x) for x in zip(*p.pairs))
    else:
        tis, bis, how = [], [], []
    ti, bi = np.array(tis, np.int64), np.array(bis, np.int64)
    order = np.argsort(t.okey_np[ti], kind="stable")  # okey is a permutation: no ties
    ti, bi, strategy_ = ti[order], bi[order], np.array(how, object)[order]
    was = np.full(t.n, -1, np.int64)
    if old:
        was[np.fromiter(old.keys(), np.int64, len(old))] = np.fromiter(old.values(), np.int64, len(old))
    pairs = pa.table([pc.take(_int64(t.table.column("tensor_id")), pa.array(ti)),
                      pc.take(_int64(b.table.column("tensor_id")), pa.array(bi)),
                      pa.array(strategy_, pa.string()),
                      pa.array((was[ti] >= 0) & (was[ti] != bi), pa.bool_())],
                     schema=PAIRS_SCHEMA)
    found = _suspects(p, ti, bi, strategy_ != "mapping")
    suspects = pa.table([pa.array([t.tensor_id[x[0]] for x in found], pa.int64()),
                         pa.array([b.tensor_id[x[1]] for x in found], pa.int64()),
                         pa.array([b.tensor_id[x[2]] for x in found], pa.int64()),
                         pa.array([x[3] for x in found], pa.float64()),
                         pa.array([x[4] for x in found], pa.float64())], schema=SUSPECTS_SCHEMA)
    return Alignment(pairs, _unmatched(t), _unmatched(b), suspects)


def _int64(col) -> pa.Array:
    """A tensor_id column as one int64 Arrow array."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return col.cast(pa.int64())


def _unmatched(s: _Side) -> pa.Table:
    rows = sorted(s.free_rows(), key=s.okey.__getitem__)
    return pa.table([pa.array([s.tensor_id[i] for i in rows], pa.int64()),
                     pa.array([s.name(i) for i in rows], pa.string()),
                     pa.array([s.io[i] for i in rows], pa.string()),
                     pa.array([s.slot[i] for i in rows], pa.int32())], schema=UNMATCHED_SCHEMA)


# --------------------------------------------------------------------------- mapping files

_TARGET_KEYS = ("target", "npu", "npu_name", "npu name", "ms", "ms_api", "source")
_BENCH_KEYS = ("bench", "golden", "bench_name", "bench name", "pt", "pt_api")
_INDEX_KEYS = (("ms_args", "pt_args"), ("ms_outputs", "pt_outputs"))


class _Entries:
    """Collects target -> bench entries; a target given two different bench names is an error."""

    def __init__(self, path: Path):
        self.path = path
        self.map: dict[str, str] = {}  # target name -> bench name
        self.line: dict[str, int] = {}  # target name -> line that mapped it

    def error(self, line: int | None, msg: str) -> ValueError:
        where = f"{self.path}:{line}" if line else str(self.path)
        return ValueError(f"{where}: {msg}")

    def add(self, target: str, bench: str, line: int) -> None:
        if not target or not bench:
            raise self.error(line, "empty target or bench name")
        if "\n" in target or "\n" in bench:
            raise self.error(line, "a name spans several lines")
        old = self.map.get(target)
        if old is not None and old != bench:
            raise self.error(line, f"{target!r} is mapped to {old!r} (line {self.line[target]}) and to {bench!r}")
        self.map[target], self.line[target] = bench, line


def load_mapping(path: str | Path) -> dict[str, str]:
    """Read a mapping file: ``{target name: bench name}``.

    Forms (by extension: ``.csv`` is CSV, anything else is read as YAML, which includes JSON):

    * CSV: two columns ``target,bench``, with that header or none (msprobe-style headers
      ``npu,bench`` / ``NPU Name,Bench Name`` / ``npu,golden`` are also taken as a header);
      blank lines and lines starting with ``#`` are skipped.
    * YAML dict ``target: bench`` with string values. That is the form of msprobe's **cell
      mapping** (``fc2.Dense: fc2.Linear``, or a name fragment:
      ``RowParallelLinear: TERowParallelLinear``) and **data mapping**
      (``Functional.flash_attention_score.4.forward.input.0: NPU.npu_fusion_attention.4.forward.input.0``).
    * msprobe **API mapping**: a document or a list of documents with ``ms_api`` / ``pt_api``
      (``Functional.abs`` -> ``Torch.abs``). ``ms_args``/``pt_args`` and
      ``ms_outputs``/``pt_outputs`` are accepted when both lists are equal (same positions on
      both sides); a list that moves arguments (``ms_args: [0, 2]``, ``pt_args: [0, 1]``) is
      refused, since dumpdb maps names, not argument positions: write one data-mapping line
      per tensor instead.
    * msprobe **layer mapping**: ``LayerClass: {ms_layer: pt_layer}``, flattened to
      ``ms_layer: pt_layer`` (applied as segment renames; the class is not checked, so one
      layer name mapped two ways under two classes is refused).
    * A list of pairs: ``[{target: a, bench: b}, ...]`` (also ``npu``/``bench``,
      ``npu``/``golden``, ``ms``/``pt``) or ``[[a, b], ...]``; a top-level key whose value
      is such a list (e.g. ``api_mapping: [...]``) is read the same way.

    The left side is the target (msprobe: the NPU / MindSpore side), the right the bench.
    Any malformed file raises ``ValueError("<file>:<line>: <reason>")``.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    entries = _Entries(path)
    if path.suffix.lower() == ".csv":
        _read_csv(text, entries)
    else:
        _read_yaml(text, entries)
    if not entries.map:
        raise entries.error(None, "no mapping entries")
    return dict(entries.map)


def _read_csv(text: str, entries: _Entries) -> None:
    first = True
    reader = csv.reader(_io.StringIO(text))
    try:
        for row in reader:
            line = reader.line_num
            if not row or all(not c.strip() for c in row) or row[0].lstrip().startswith("#"):
                continue
            cells = [c.strip() for c in row]
            if len(cells) != 2:
                raise entries.error(line, f"expected 2 columns (target,bench), found {len(cells)}")
            if first and cells[0].lower() in _TARGET_KEYS and cells[1].lower() in _BENCH_KEYS:
                first = False
                continue
            first = False
            entries.add(cells[0], cells[1], line)
    except csv.Error as e:
        raise entries.error(reader.line_num, f"invalid CSV: {e}") from None


def _read_yaml(text: str, entries: _Entries) -> None:
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        reason = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise entries.error(mark.line + 1 if mark else None, f"invalid YAML: {reason}") from None
    if root is None:
        raise entries.error(None, "no mapping entries")
    if isinstance(root, yaml.SequenceNode):
        _yaml_list(root, entries)
    elif isinstance(root, yaml.MappingNode):
        if _is_api_doc(root):
            _yaml_api(root, entries)
        else:
            _yaml_dict(root, entries)
    else:
        raise entries.error(_line(root), "expected a mapping (target: bench) or a list of pairs")


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _scalar(node: yaml.Node, entries: _Entries, what: str) -> str:
    import yaml

    if not isinstance(node, yaml.ScalarNode) or node.tag == "tag:yaml.org,2002:null":
        raise entries.error(_line(node), f"{what} must be a name (a string)")
    return node.value.strip()


def _keys(node: yaml.MappingNode, entries: _Entries) -> dict[str, yaml.Node]:
    out = {}
    for k, v in node.value:
        out[_scalar(k, entries, "a key")] = v
    return out


def _is_api_doc(node: yaml.MappingNode) -> bool:
    import yaml

    return any(isinstance(k, yaml.ScalarNode) and k.value in ("ms_api", "pt_api") for k, _ in node.value)


def _yaml_api(node: yaml.MappingNode, entries: _Entries) -> None:
    doc = _keys(node, entries)
    if "ms_api" not in doc or "pt_api" not in doc:
        raise entries.error(_line(node), "an API mapping needs both ms_api and pt_api")
    for ms_key, pt_key in _INDEX_KEYS:
        ms, pt = doc.get(ms_key), doc.get(pt_key)
        if ms is None and pt is None:
            continue
        ms_list, pt_list = _index_list(ms, entries, ms_key), _index_list(pt, entries, pt_key)
        if ms_list != pt_list:
            line = _line(ms if ms is not None else pt)
            raise entries.error(line, f"{ms_key} {ms_list} / {pt_key} {pt_list} move argument positions, which "
                                      "dumpdb does not map; write one data-mapping line per tensor instead")
    extra = set(doc) - {"ms_api", "pt_api"} - {k for pair in _INDEX_KEYS for k in pair}
    if extra:
        raise entries.error(_line(node), f"unknown key {sorted(extra)[0]!r} in an API mapping")
    entries.add(_scalar(doc["ms_api"], entries, "ms_api"), _scalar(doc["pt_api"], entries, "pt_api"),
                _line(doc["ms_api"]))


def _index_list(node: yaml.Node | None, entries: _Entries, what: str) -> list[int] | None:
    import yaml

    if node is None:
        return None
    if not isinstance(node, yaml.SequenceNode):
        raise entries.error(_line(node), f"{what} must be a list of argument indices")
    out = []
    for item in node.value:
        value = _scalar(item, entries, f"an index of {what}")
        if not value.isdigit():
            raise entries.error(_line(item), f"{what}: {value!r} is not an argument index")
        out.append(int(value))
    return out


def _yaml_dict(node: yaml.MappingNode, entries: _Entries) -> None:
    import yaml

    for k, v in node.value:
        key = _scalar(k, entries, "a key")
        if isinstance(v, yaml.ScalarNode):
            entries.add(key, _scalar(v, entries, f"the bench name of {key!r}"), _line(k))
        elif isinstance(v, yaml.MappingNode):  # layer mapping: LayerClass: {ms_layer: pt_layer}
            for lk, lv in v.value:
                if not isinstance(lv, yaml.ScalarNode):
                    raise entries.error(_line(lk), "a layer mapping entry must be ms_layer: pt_layer")
                entries.add(_scalar(lk, entries, "a layer name"), _scalar(lv, entries, "a layer name"), _line(lk))
        elif isinstance(v, yaml.SequenceNode):  # a section holding a list of pairs
            _yaml_list(v, entries)
        else:
            raise entries.error(_line(v), f"unexpected value for {key!r}")


def _yaml_list(node: yaml.SequenceNode, entries: _Entries) -> None:
    import yaml

    for item in node.value:
        if isinstance(item, yaml.MappingNode):
            if _is_api_doc(item):
                _yaml_api(item, entries)
                continue
            doc = _keys(item, entries)
            lowered = {k.lower(): v for k, v in doc.items()}
            t = next((k for k in _TARGET_KEYS if k in lowered), None)
            b = next((k for k in _BENCH_KEYS if k in lowered), None)
            if t is None or b is None or len(doc) != 2:
                raise entries.error(_line(item), "a list item must be {target: .., bench: ..} "
                                                 "(or npu/bench, npu/golden, ms/pt, ms_api/pt_api)")
            entries.add(_scalar(lowered[t], entries, t), _scalar(lowered[b], entries, b), _line(item))
        elif isinstance(item, yaml.SequenceNode) and len(item.value) == 2:
            entries.add(_scalar(item.value[0], entries, "target"), _scalar(item.value[1], entries, "bench"),
                        _line(item))
        else:
            raise entries.error(_line(item), "a list item must be a {target: .., bench: ..} pair or [target, bench]")
