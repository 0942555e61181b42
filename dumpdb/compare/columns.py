"""Column helpers of the compare engine (issue 13: no Python object per pair on the bulk paths).

The engine keeps the compared pairs as Arrow columns from selection to stored result:
:class:`Shapes` turns a ``list<int64>`` shape column into a padded numpy matrix (element
counts, equality, the Python list text messages print), :func:`execution_order` sorts
pairs by the target's execution order without a tuple per row, :func:`group_codes`
numbers the distinct combinations of some key columns (NULL equal to NULL, as a Python
dict keyed by tuples groups them), :func:`join_messages` is the engine's ``"; "`` join of
messages over whole columns, and :class:`ResultColumns` collects the computed metric
columns of all pairs (float64 values plus a validity mask: NULL is not NaN).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Shapes", "ResultColumns", "execution_order", "execution_keys", "string_codes", "group_codes", "ints",
           "floats", "filled", "strings", "join_messages", "truthy", "IO_ORDER", "ORDER_KEYS", "run_order", "run_ranks",
           "FORWARD", "BACKWARD", "OPTIMIZER", "PHASES", "phases", "containers", "collectives", "keys", "Texts",
           "nonempty", "replaced", "unique_keys"]

# The target columns execution_order reads.
ORDER_KEYS = ("iteration", "rank", "graph_id", "position", "timestamp", "call_index", "io", "slot", "tensor_id")
# Sort rank of the io values in execution order (inputs before outputs); others 9.
IO_ORDER = {"input": 0, "parameter": 1, "output": 2, "parameter_grad": 3}
_NULL = np.iinfo(np.int64).min  # stands for NULL in grouping keys (no real id, count or time is this)


def _array(col) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def ints(col, fill: int) -> np.ndarray:
    """An integer Arrow column as int64 numpy, NULL -> ``fill``."""
    arr = _array(col)
    if pa.types.is_null(arr.type):
        return np.full(len(arr), fill, np.int64)
    return pc.fill_null(pc.cast(arr, pa.int64()), fill).to_numpy(zero_copy_only=False)


def floats(col) -> tuple[np.ndarray, np.ndarray]:
    """(values float64 with NaN for NULL, valid mask) of a numeric Arrow column."""
    arr = _array(col)
    if pa.types.is_null(arr.type):
        return np.full(len(arr), np.nan), np.zeros(len(arr), bool)
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    values = pc.fill_null(pc.cast(arr, pa.float64()), np.nan).to_numpy(zero_copy_only=False)
    return values, valid


def strings(col) -> np.ndarray:
    """A string (or other) Arrow column as a numpy object array (None for NULL); equal
    values share one Python object (decoded once through a dictionary)."""
    arr = _array(col)
    if pa.types.is_null(arr.type) or arr.null_count == len(arr):
        return np.full(len(arr), None, dtype=object)
    if not pa.types.is_floating(arr.type) and _constant(arr):  # equal floats may differ (0.0, -0.0)
        return filled(len(arr), arr[0].as_py())
    enc = pc.dictionary_encode(arr)
    values = np.empty(len(enc.dictionary) + 1, dtype=object)
    values[:-1] = enc.dictionary.to_pylist()
    return values[pc.fill_null(enc.indices, len(enc.dictionary)).to_numpy(zero_copy_only=False)]


def _constant(arr: pa.Array) -> bool:
    """Every element the same value, none NULL (a dtype column, most often): compared to
    the first by an Arrow kernel, a pass far cheaper than hashing every element. Checked
    only when the first and last elements are equal."""
    n = len(arr)
    if not n or arr.null_count or arr[0] != arr[n - 1]:
        return False
    return bool(pc.all(pc.equal(arr, arr[0])).as_py())


def filled(n: int, value: object) -> np.ndarray:
    """An object array of ``n`` references to the one object ``value``. (``np.full(n, "text",
    dtype=object)`` makes a new ``str`` per element, through a unicode array: 32 MB for
    500,000 rows instead of 4 MB.)"""
    out = np.empty(n, dtype=object)
    out.fill(value)
    return out


def truthy(values: np.ndarray) -> np.ndarray:
    """bool(v) of each element of an object array (None and "" are False)."""
    out = np.zeros(values.size, bool)
    # bool() only where not None (most messages are None): half the CPU on 500,000 rows
    at = np.flatnonzero(np.not_equal(values, np.array(None, dtype=object)).astype(bool))
    if at.size:
        out[at] = np.frompyfunc(bool, 1, 1)(values[at]).astype(bool)
    return out


class Shapes:
    """A ``list<int64>`` shape column as numpy: ``valid`` (not NULL), ``ndim``, ``dims``
    (n x max ndim, padded with -1) and ``size`` (element count; 1 for a 0-d shape, 0 where
    NULL)."""

    def __init__(self, col) -> None:
        arr = _array(col)
        n = len(arr)
        self._equal: tuple[Shapes, np.ndarray] | None = None  # the last equal(): (other, rows)
        if pa.types.is_null(arr.type):
            self.valid = np.zeros(n, bool)
            self.ndim = np.zeros(n, np.int64)
            self.dims = np.full((n, 0), -1, np.int64)
        else:
            self.valid = arr.is_valid().to_numpy(zero_copy_only=False)
            self.ndim = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
            flat = pc.list_flatten(arr).to_numpy(zero_copy_only=False).astype(np.int64)
            width = int(self.ndim.max()) if n else 0
            if n and flat.size == n * width and not arr.null_count and bool((self.ndim == width).all()):
                self.dims = flat.reshape(n, width)  # every shape of one rank: the values as they lie
            else:
                self.dims = np.full((n, width), -1, np.int64)
                starts = np.zeros(n, np.int64)
                np.cumsum(self.ndim[:-1], out=starts[1:])
                for d in range(width):
                    has = self.ndim > d
                    self.dims[has, d] = flat[starts[has] + d]
        # the product of the dims (padding counts 1), a column at a time: numpy's prod along
        # the short axis of an n x ndim matrix is several times slower (the same integers)
        size = np.ones(n, np.int64)
        for d in range(self.dims.shape[1]):
            size *= np.where(self.dims[:, d] < 0, 1, self.dims[:, d])
        self.size = np.where(self.valid, size, 0)

    def equal(self, other: Shapes) -> np.ndarray:
        """Both shapes known and the same, per row (a new array each call; computed once per
        ``other``: the verdicts and two precision rules ask for the same pair)."""
        known = self._equal
        if known is not None and known[0] is other:
            return known[1].copy()
        out = self._equal_rows(other)
        self._equal = (other, out)
        return out.copy()

    def _equal_rows(self, other: Shapes) -> np.ndarray:
        out = self.valid & other.valid & (self.ndim == other.ndim)
        # column by column (a padding column holds -1 on the narrower side)
        for d in range(max(self.dims.shape[1], other.dims.shape[1])):
            a = self.dims[:, d] if d < self.dims.shape[1] else -1
            b = other.dims[:, d] if d < other.dims.shape[1] else -1
            out &= a == b
        return out

    def shape(self, i: int) -> tuple[int, ...] | None:
        """Row ``i`` as a tuple (None where NULL)."""
        return tuple(self.dims[i, : self.ndim[i]].tolist()) if self.valid[i] else None

    def text(self, i: int) -> str:
        """Row ``i`` as the Python list prints (``[2, 3]``; ``None``), as messages show shapes."""
        s = self.shape(i)
        return "None" if s is None else str(list(s))


def group_codes(keys: Iterable[np.ndarray]) -> np.ndarray:
    """One int64 code per row, equal for rows equal in every key column (int64 arrays,
    NULL already mapped to a value of its own); codes number the distinct keys in sorted
    order, 0 upwards."""
    cols = list(keys)
    n = len(cols[0]) if cols else 0
    if n == 0:
        return np.zeros(0, np.int64)
    cols = [c for c in cols if c.min() != c.max()]  # a key of one value numbers nothing
    if not cols:
        return np.zeros(n, np.int64)
    order = np.lexsort(cols[::-1])
    change = np.zeros(n, bool)
    change[0] = True
    for c in cols:
        v = c[order]
        change[1:] |= v[1:] != v[:-1]
    codes = np.empty(n, np.int64)
    codes[order] = np.cumsum(change) - 1
    return codes


def unique_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, inverse) of an integer array, as ``np.unique(keys, return_index=True,
    return_inverse=True)`` gives them (the distinct keys numbered in ascending order, each
    one's first row): by a table over the keys' range where that range is narrow (no sort),
    by np.unique otherwise."""
    n = len(keys)
    if n and keys.dtype.kind in "iu":
        lo, hi = int(keys.min()), int(keys.max())
        if lo == hi:  # one key (one dtype combination, one op): the first row, every row 0
            return np.zeros(1, np.int64), np.zeros(n, np.int64)
        if hi - lo < max(4 * n, 1 << 16):
            # unsigned keys less their minimum fit (every key >= lo); signed ones in int64
            at = (keys - keys.dtype.type(lo)).astype(np.intp) if keys.dtype.kind == "u" else \
                keys.astype(np.int64) - lo
            seen = np.zeros(hi - lo + 1, bool)
            seen[at] = True
            rank = np.cumsum(seen) - 1
            inverse = rank[at]
            first = np.full(int(rank[-1]) + 1, n, np.int64)
            np.minimum.at(first, inverse, np.arange(n))
            return first, inverse
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


def string_codes(col) -> np.ndarray:
    """Codes of a string column's values (NULL its own code), for :func:`group_codes`:
    each value's place among the distinct values in order of first appearance (NULL:
    the int64 minimum)."""
    arr = _array(col)
    if arr.null_count == len(arr):
        return np.full(len(arr), _NULL, np.int64)
    if _constant(arr):
        return np.zeros(len(arr), np.int64)
    enc = pc.dictionary_encode(arr)
    return ints(enc.indices, _NULL)


def _int64(col) -> np.ndarray:
    """An int64 column without NULL as numpy, without a copy where it is one chunk."""
    if isinstance(col, pa.ChunkedArray):
        return np.asarray(col.to_numpy(), np.int64)
    return np.asarray(col.to_numpy(zero_copy_only=False), np.int64)


def row_positions(ids, wanted) -> np.ndarray:
    """Row of ``ids`` (a side's ``tensor_id``: int64 Arrow column, unique, no NULL, in any
    order) holding each of ``wanted`` (ids taken from that side), as int64; the one lookup
    of a pair's rows (compare engine, stats_pairs, align_sql). By the cheapest rule that
    holds: the rows in place when ``wanted`` is ``ids``; a binary search when the ids
    ascend; a table from id to row when they span at most four times their number (one
    ingest numbers a run's tensors from a sequence: 0.01 s of CPU on 500,000 ids against
    0.2 s for a hash); else a hash lookup (``pc.index_in``). Raises ValueError for an id
    not in ``ids``."""
    have, want = _int64(ids), _int64(wanted)
    if want.size == 0:
        return np.zeros(0, np.int64)
    if want.size == have.size and np.array_equal(want, have):  # the side's ids in place (positional pairs)
        return np.arange(have.size, dtype=np.int64)
    if have.size and bool((have[1:] > have[:-1]).all()):  # ascending
        at = np.minimum(np.searchsorted(have, want), have.size - 1).astype(np.int64)
        if not np.array_equal(have[at], want):
            raise ValueError("an id is not among the rows")
        return at
    lowest = int(have.min()) if have.size else 0
    span = int(have.max()) - lowest + 1 if have.size else 0
    if 0 < span <= 4 * have.size + 1024:
        row = np.full(span, -1, np.int64)
        row[have - lowest] = np.arange(have.size, dtype=np.int64)
        offset = want - lowest
        if int(offset.min()) < 0 or int(offset.max()) >= span or int(row[offset].min()) < 0:
            raise ValueError("an id is not among the rows")
        return row[offset]
    found = pc.index_in(_array(wanted), value_set=_array(ids))
    if found.null_count:
        raise ValueError("an id is not among the rows")
    return found.to_numpy().astype(np.int64, copy=False)


def execution_keys(table: pa.Table) -> list[np.ndarray]:
    """Sort keys (int64 arrays, most significant first) of :func:`execution_order`."""
    it, rank, graph = (table.column(c) for c in ("iteration", "rank", "graph_id"))
    ts = ints(table.column("timestamp"), 0)
    graph_code = group_codes([ints(it, _NULL), ints(rank, _NULL), ints(graph, _NULL)])
    starts = np.full(int(graph_code.max()) + 1 if graph_code.size else 0, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(starts, graph_code, ts)
    position = table.column("position")
    io = _array(table.column("io"))
    io_rank = np.full(table.num_rows, 9, np.int64)
    for name, k in IO_ORDER.items():
        io_rank[pc.fill_null(pc.equal(io, name), False).to_numpy(zero_copy_only=False)] = k
    return [ints(it, -1), ints(rank, -1), starts[graph_code], ints(graph, -1),
            (~_array(position).is_valid().to_numpy(zero_copy_only=False)).astype(np.int64), ints(position, 0), ts,
            ints(table.column("call_index"), -1), io_rank, ints(table.column("slot"), -1),
            ints(table.column("tensor_id"), -1)]


def execution_order(table: pa.Table) -> np.ndarray:
    """Permutation sorting ``table`` (catalog ``tensors`` rows with iteration, rank, graph_id,
    position, timestamp, call_index, io, slot, tensor_id) in execution order: iteration,
    rank, then graphs in the order they ran (their first timestamp in that iteration and
    rank), position in the graph (NULLs last), timestamp, call index, inputs before
    outputs, slot, tensor_id (NULL numbers sort as -1, a NULL position or timestamp as 0).
    Stable: rows with equal keys keep their order."""
    if table.num_rows == 0:
        return np.zeros(0, np.int64)
    return np.lexsort(execution_keys(table)[::-1])


def run_order(r: dict) -> tuple:
    """The order ops really ran, as a sort key of one result row (a dict): iteration (NULL
    last), rank, then dump timestamps where the dump has them (MindSpore CPU runs ops in
    another order than ``execution_order`` lists them; NULL last), then the pair order
    (``pair_index``: the target's :func:`execution_order`). :func:`run_ranks` is the same
    order over columns."""
    ts = r.get("timestamp")
    return (r["iteration"] is None, r["iteration"] or 0, r["rank"] or 0, ts is None, ts or 0, r["pair_index"])


def run_ranks(iteration, rank, timestamp) -> np.ndarray:
    """Each row's place (int64, 0 upwards) in :func:`run_order` of rows already in pair
    order; ``iteration``, ``rank``, ``timestamp``: integer Arrow columns (NULL allowed)."""
    n = len(iteration)
    run = np.lexsort((np.arange(n), ints(timestamp, 0), (~_array(timestamp).is_valid().to_numpy(
        zero_copy_only=False)).astype(np.int64), ints(rank, 0), ints(iteration, 0),
        (~_array(iteration).is_valid().to_numpy(zero_copy_only=False)).astype(np.int64)))
    out = np.empty(n, np.int64)
    out[run] = np.arange(n)
    return out


# -- phases and containers: what part of a training step an op belongs to -----------------------

FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"
PHASES = (FORWARD, BACKWARD, OPTIMIZER)
_CONTAINER_PREFIXES = ("Module.", "Cell.")


def _text(values) -> pa.Array:
    """An object array of str / None (or an Arrow string array, as it is) as Arrow strings."""
    return values if isinstance(values, pa.Array) else pa.array(values, pa.string())


def _contains(values, token: str, lower: bool = False, regex: bool = False) -> np.ndarray:
    """``token in v`` per element of an object array of str / None (None: False); with
    ``regex``, ``token`` is an RE2 pattern searched for."""
    if len(values) == 0:
        return np.zeros(0, bool)
    hit = pc.match_substring_regex(_text(values), token, ignore_case=lower) if regex else \
        pc.match_substring(_text(values), token, ignore_case=lower)
    return pc.fill_null(hit, False).to_numpy(zero_copy_only=False)


def containers(op_type, name) -> np.ndarray:
    """Which rows are module/cell records, not ops (bool per row of object arrays): msprobe's
    ``Module.*`` / ``Cell.*`` records of levels L0 and mix (formats.md 1.3, key grammar;
    ``op_type`` = prefix + class there), except their ``parameters_grad`` records (a
    parameter's gradient, held by no op record at those levels)."""
    if len(op_type) == 0:
        return np.zeros(0, bool)
    hit = _per_value(op_type, lambda text: pc.or_(*(pc.starts_with(text, p) for p in _CONTAINER_PREFIXES)))
    if not hit.any():  # no module or cell record (levels L1, MindSpore): the names need no scan
        return hit
    return hit & ~_contains(name, ".parameters_grad.")


# collective communication ops, whose output combines the inputs of every rank of the same
# call: msprobe's torch.distributed records (``Distributed.all_reduce``, ``all_gather``,
# ``reduce_scatter``, ``broadcast``, ``all_to_all``), MindSpore / CANN kernels (``AllReduce``,
# ``HcomAllGather``, ``ReduceScatter``, ``Broadcast``, ``AlltoAll``)
_COLLECTIVE = r"(?i)(^|[._])(hcom)?(all_?reduce|all_?gather\w*|reduce_?scatter\w*|broadcast|all_?to_?all\w*)$"


def collectives(op_type) -> np.ndarray:
    """Which rows are collective communication ops (bool per row of an object array of op
    types): their outputs combine the inputs of every rank's call of the same name."""
    if len(op_type) == 0:
        return np.zeros(0, bool)
    return _per_value(op_type, lambda text: pc.match_substring_regex(text, _COLLECTIVE))


def _per_value(values, test) -> np.ndarray:
    """``test`` (an Arrow kernel's boolean result per element; NULL counts False) of an
    object array of str / None or an Arrow string array, as numpy; of a dictionary array
    (:func:`pc.dictionary_encode`: a few op types) once per distinct value."""
    text = _text(values)
    hit = test(text.dictionary).take(text.indices) if pa.types.is_dictionary(text.type) else test(text)
    return pc.fill_null(hit, False).to_numpy(zero_copy_only=False)


def keys(*columns: np.ndarray, sep: str = "|") -> pa.Array:
    """Per row, the ``sep``-joined text of some object columns of str / None (None written
    ``None``), as an Arrow string array: a lookup key over columns without a Python loop
    per row."""
    return pc.binary_join_element_wise(*(pc.fill_null(_text(c), "None") for c in columns), sep)


def phase_marks(name, scope) -> tuple[np.ndarray, np.ndarray]:
    """What :func:`phases` reads of the texts (bool per row): (a backward record or kernel,
    a scope naming an optimizer). Arrow's text kernels alone: the GIL is free meanwhile."""
    # the two name tests as one scan: ".backward" or ".parameters_grad." anywhere in it
    back = _contains(name, r"\.backward|\.parameters_grad\.", regex=True) | _contains(scope, "Gradients/")
    return back, _contains(scope, "optimizer", lower=True)


def phases(name, scope, where: np.ndarray, run_rank: np.ndarray,
           marks: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """The phase of each row (object array of :data:`PHASES`): ``backward`` for msprobe
    records named ``*.backward*`` or ``*.parameters_grad.*`` (formats.md 1.3) and MindSpore
    kernels in a ``Gradients/`` scope (the autodiff graph's scope); ``optimizer`` for a
    MindSpore scope naming an optimizer (``Default/optimizer-Adam/...``) and for any
    other op that runs (``run_rank``) after the last backward row of its iteration and
    rank (``where``: e.g. msprobe's ``Tensor.add_`` of ``SGD.step``); ``forward`` else.
    ``name``/``scope``: target op and scope names (object arrays of str / None, or Arrow
    string arrays). ``marks``: :func:`phase_marks` of ``name`` and ``scope`` where the caller
    has them."""
    n = len(name)
    back, optimizer = marks if marks is not None else phase_marks(name, scope)
    out = filled(n, FORWARD)
    if n == 0:
        return out
    last = np.full(int(where.max()) + 1, -1, np.int64)
    np.maximum.at(last, where[back], run_rank[back])
    after = (run_rank > last[where]) & (last[where] >= 0)
    out[(after | optimizer) & ~back] = OPTIMIZER
    out[back] = BACKWARD
    return out


def join_messages(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``"; "``.join of the messages of two object arrays, element by element, skipping
    None and empty ones (None when both are): the engine's per-pair join over columns."""
    has_old, has_new = truthy(old), truthy(new)
    # numpy's stub has no None among where's scalars; None is an object array's NULL
    out = np.where(has_new & ~has_old, new, np.where(has_old, old, None))  # type: ignore[call-overload]
    for i in np.flatnonzero(has_old & has_new).tolist():
        out[i] = f"{old[i]}; {new[i]}"
    return out


class ResultColumns:
    """Computed columns of ``n`` pairs: float64 ``values`` with a ``valid`` mask per metric
    name (NULL where invalid; a valid value may be NaN; a column nothing was written to is
    not allocated: all NULL), the ``message`` object array and each pair's ``mode``."""

    def __init__(self, n: int, names: Iterable[str]) -> None:
        self.n = n
        self.names = tuple(names)
        self.values: dict[str, np.ndarray] = {}
        self.valid: dict[str, np.ndarray] = {}
        self.message = np.full(n, None, dtype=object)
        self.mode = np.full(n, None, dtype=object)

    def _column(self, name: str) -> None:
        if name not in self.values:
            self.values[name] = np.full(self.n, np.nan)
            self.valid[name] = np.zeros(self.n, bool)

    def put_row(self, i: int, metrics: Mapping[str, object], message: str | None) -> None:
        """One pair's metrics as a dict (None = NULL; names not collected are ignored)."""
        for k, v in metrics.items():
            if k in self.names and v is not None:
                self._column(k)
                self.values[k][i] = v
                self.valid[k][i] = True
        self.note(np.array([i]), np.array([message], dtype=object))

    def put(self, idx: np.ndarray, name: str, values: np.ndarray, valid: np.ndarray) -> None:
        """Column ``name`` of the pairs ``idx``."""
        self._column(name)
        self.values[name][idx] = values
        self.valid[name][idx] = valid

    def column(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(values, valid) of ``name`` (all NULL when never written)."""
        if name in self.values:
            return self.values[name], self.valid[name]
        return np.full(self.n, np.nan), np.zeros(self.n, bool)

    def note(self, idx: np.ndarray, messages: np.ndarray) -> None:
        """Join ``messages`` (object array, None for none) onto the pairs ``idx``' messages."""
        self.message[idx] = join_messages(self.message[idx], messages)

    def arrow(self, name: str) -> pa.Array:
        """Column ``name`` as Arrow float64 (and dropped here)."""
        if name not in self.values:
            return pa.nulls(self.n, pa.float64())
        values, valid = self.values.pop(name), self.valid.pop(name)
        return pa.array(values, pa.float64(), mask=~valid)


class Texts:
    """A text column of ``n`` rows written in parts, with no Python ``str`` per row (the
    precision reasons: 500,000 mostly distinct texts, each an Arrow element only).

    Each write keeps one Arrow string array (``large_string``) and points its rows at its
    elements: ``codes[i]`` is row ``i``'s element among all parts written so far (part k
    holds the codes from ``starts[k]``), -1 for NULL. Reading some rows (``texts[rows]``)
    takes them from the parts they point into; :meth:`arrow` gives the whole column."""

    def __init__(self, n: int) -> None:
        self.codes = np.full(n, -1, np.int64)
        self._parts: list[pa.Array] = []
        self._starts: list[int] = []
        self._size = 0

    def __len__(self) -> int:
        return len(self.codes)

    def __setitem__(self, rows, values) -> None:
        """Write ``values`` (an Arrow string array, an object array or list of str/None, one
        per row; or one str/None for every row) to ``rows`` (indices, a bool mask or one
        index)."""
        at = np.flatnonzero(rows) if isinstance(rows, np.ndarray) and rows.dtype == bool else np.atleast_1d(rows)
        if values is None:
            self.codes[at] = -1
            return
        if isinstance(values, str):
            arr = pa.array([values], pa.large_string())
            codes = np.zeros(len(at), np.int64)
        else:
            arr = _array(values) if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(
                list(values) if not isinstance(values, np.ndarray) else values, pa.large_string())
            if arr.type != pa.large_string():
                arr = arr.cast(pa.large_string())
            if len(arr) != len(at):
                raise ValueError(f"{len(arr)} texts for {len(at)} rows")
            codes = np.arange(len(arr), dtype=np.int64)
            if arr.null_count:
                codes[~arr.is_valid().to_numpy(zero_copy_only=False)] = -1 - self._size
        if not len(at):
            return
        self.codes[at] = codes + self._size
        self._parts.append(arr)
        self._starts.append(self._size)
        self._size += len(arr)

    def _take(self, codes: np.ndarray) -> pa.Array:
        """The elements ``codes`` point at (NULL where negative), as one ``large_string``
        array. Many rows (the whole column): one take over the parts as the chunks of one
        column (Arrow joins them first). Few rows: each part's rows taken from that part,
        then put in order (joining every part would copy all texts for a few).
        """
        missing = codes < 0
        some = len(codes) - int(np.count_nonzero(missing))
        if not some:
            return pa.nulls(len(codes), pa.large_string())
        if some * 8 >= self._size:
            chunks = pa.chunked_array(self._parts, pa.large_string())
            return chunks.take(pa.array(np.where(missing, 0, codes), pa.int64(), mask=missing)).combine_chunks()
        rows = np.flatnonzero(~missing)
        starts = np.array(self._starts, np.int64)
        part = np.searchsorted(starts, codes[rows], side="right") - 1
        by = np.argsort(part, kind="stable")
        rows, part = rows[by], part[by]
        bounds = np.flatnonzero(np.diff(part)) + 1
        pieces = [self._parts[int(part[lo])].take(pa.array(codes[rows[lo:hi]] - starts[part[lo]], pa.int64()))
                  for lo, hi in zip([0, *bounds.tolist()], [*bounds.tolist(), len(rows)])]
        joined = pieces[0] if len(pieces) == 1 else pa.concat_arrays(pieces)
        at = np.zeros(len(codes), np.int64)
        at[rows] = np.arange(len(rows))
        return joined.take(pa.array(at, pa.int64(), mask=missing))

    def __getitem__(self, rows) -> pa.Array:
        """The texts of ``rows`` (indices or a bool mask) as an Arrow ``large_string`` array."""
        return self._take(self.codes[rows])

    def get(self, i: int) -> str | None:
        """Row ``i``'s text (a Python str; None for NULL)."""
        return self[np.array([i])][0].as_py()

    def present(self) -> np.ndarray:
        """Not NULL, per row."""
        return self.codes >= 0

    def nonempty(self) -> np.ndarray:
        """Neither NULL nor "", per row (as :func:`truthy` of the texts)."""
        if not self._parts:
            return np.zeros(len(self.codes), bool)
        # a length per element of every part, indexed by the codes themselves (no text copied)
        lengths = np.concatenate([pc.binary_length(p).to_numpy(zero_copy_only=False) for p in self._parts])
        present = self.codes >= 0
        return present & (lengths[np.where(present, self.codes, 0)] > 0)

    def arrow(self) -> pa.Array:
        """The column as one Arrow ``string`` array."""
        return self._take(self.codes).cast(pa.string())


def nonempty(texts: pa.Array) -> np.ndarray:
    """bool(text) of each element of an Arrow string array (NULL and "" are False), as numpy."""
    return pc.fill_null(pc.greater(pc.binary_length(texts), 0), False).to_numpy(zero_copy_only=False)


def replaced(texts: pa.Array, rows: np.ndarray, values) -> pa.Array:
    """``texts`` with the ``rows`` (a bool mask) replaced by ``values`` (one str, or an Arrow
    string array of one text per row of the mask), as a new Arrow array of the same type."""
    if isinstance(values, str):
        values = pa.array([values] * int(np.count_nonzero(rows)), texts.type)
    if not len(values):
        return texts
    spread = values.cast(texts.type).take(pa.array(np.maximum(np.cumsum(rows) - 1, 0)))
    return pc.if_else(pa.array(rows, pa.bool_()), spread, texts)
