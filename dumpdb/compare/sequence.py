"""Sequence alignment of two op sequences: a longest-common-subsequence style diff in
O(n log n) for the usual case, never quadratic on large inputs.

:func:`diff` pairs equal tokens of ``a`` and ``b`` (hashable keys: op type + normalised
scope) in order, so that an op inserted or removed on one side (an AMP cast, an extra
reshape, one op split in two) leaves the rest paired. The method is *patience diff*
(Bram Cohen; as in ``git diff --patience``) generalised like git's *histogram diff*:

1. trim the common prefix and suffix of the window;
2. anchors: the tokens that occur equally often on both sides, the rarest such count
   first (patience's "unique in both" is count 1), k-th occurrence with k-th occurrence;
3. the longest chain of anchors increasing on both sides (longest increasing
   subsequence, O(m log m) with bisect) is kept, and the windows between consecutive
   anchors are aligned the same way (an explicit stack, no recursion limit);
4. a small window (``len(a) * len(b) <= DP_CELLS``) is aligned by the exact LCS dynamic
   programme instead of anchors; a large window with no anchor greedily (each token of ``a`` takes the next
   equal token of ``b`` within ``LOOKAHEAD`` positions), which is linear.

Every level is O(n log n) in its window; windows shrink, so the whole is O(n log n) times
the nesting depth (a few levels on real graphs); ``scripts/bench_align.py`` measures it
(figures in docs/alignment.md).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Hashable, Sequence

__all__ = ["diff", "longest_chain"]

DP_CELLS = 2_500
LOOKAHEAD = 64


def diff(a: Sequence[Hashable], b: Sequence[Hashable]) -> list[tuple[int, int]]:
    """Index pairs ``(i, j)`` with ``a[i] == b[j]``, strictly increasing in both, close to a
    longest common subsequence (exact on windows the DP handles). Unpaired indices are the
    insertions (``a`` only) and deletions (``b`` only)."""
    out: list[tuple[int, int]] = []
    stack = [(0, len(a), 0, len(b))]
    while stack:
        a0, a1, b0, b1 = stack.pop()
        # common prefix / suffix
        while a0 < a1 and b0 < b1 and a[a0] == b[b0]:
            out.append((a0, b0))
            a0 += 1
            b0 += 1
        while a0 < a1 and b0 < b1 and a[a1 - 1] == b[b1 - 1]:
            a1 -= 1
            b1 -= 1
            out.append((a1, b1))
        if a0 == a1 or b0 == b1:
            continue
        if (a1 - a0) * (b1 - b0) <= DP_CELLS:
            out.extend(_dp(a, b, a0, a1, b0, b1))
            continue
        anchors = _anchors(a, b, a0, a1, b0, b1)
        if anchors:
            prev_i, prev_j = a0, b0
            for i, j in anchors:
                stack.append((prev_i, i, prev_j, j))
                out.append((i, j))
                prev_i, prev_j = i + 1, j + 1
            stack.append((prev_i, a1, prev_j, b1))
        else:
            out.extend(_greedy(a, b, a0, a1, b0, b1))
    out.sort()
    return out


def _anchors(a, b, a0, a1, b0, b1) -> list[tuple[int, int]]:
    """Occurrence pairs of the rarest tokens that occur equally often on both sides,
    reduced to their longest chain increasing in both indices."""
    pa: dict = defaultdict(list)
    for i in range(a0, a1):
        pa[a[i]].append(i)
    pb: dict = defaultdict(list)
    for j in range(b0, b1):
        if b[j] in pa:
            pb[b[j]].append(j)
    counts = [len(v) for k, v in pb.items() if len(pa[k]) == len(v)]
    if not counts:
        return []
    rarest = min(counts)
    cand = sorted((i, j) for k, js in pb.items() if len(js) == rarest and len(pa[k]) == rarest
                  for i, j in zip(pa[k], js))
    return _lis(cand)


def longest_chain(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The longest chain of ``pairs`` (sorted by i, distinct i) with j strictly increasing
    (longest increasing subsequence, O(m log m))."""
    return _lis(pairs)


def _lis(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Longest chain of ``pairs`` (sorted by i, distinct i) with j strictly increasing."""
    tails: list[int] = []      # smallest j ending a chain of each length
    tail_idx: list[int] = []
    parent = [-1] * len(pairs)
    for k, (_, j) in enumerate(pairs):
        pos = bisect_left(tails, j)
        if pos == len(tails):
            tails.append(j)
            tail_idx.append(k)
        else:
            tails[pos] = j
            tail_idx[pos] = k
        parent[k] = tail_idx[pos - 1] if pos else -1
    chain = []
    k = tail_idx[-1] if tail_idx else -1
    while k >= 0:
        chain.append(pairs[k])
        k = parent[k]
    return chain[::-1]


def _dp(a, b, a0, a1, b0, b1) -> list[tuple[int, int]]:
    """Exact LCS of a small window (classic dynamic programme)."""
    n, m = a1 - a0, b1 - b0
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        row, nxt = table[i], table[i + 1]
        ai = a[a0 + i]
        for j in range(m - 1, -1, -1):
            row[j] = nxt[j + 1] + 1 if ai == b[b0 + j] else max(nxt[j], row[j + 1])
    out, i, j = [], 0, 0
    while i < n and j < m:
        if a[a0 + i] == b[b0 + j]:
            out.append((a0 + i, b0 + j))
            i += 1
            j += 1
        elif table[i + 1][j] >= table[i][j + 1]:
            i += 1
        else:
            j += 1
    return out


def _greedy(a, b, a0, a1, b0, b1) -> list[tuple[int, int]]:
    """Linear fallback: each a[i] takes the next equal b[j] at most LOOKAHEAD ahead."""
    pos: dict = defaultdict(list)
    for j in range(b0, b1):
        pos[b[j]].append(j)
    out, cur = [], b0
    for i in range(a0, a1):
        js = pos.get(a[i])
        if not js:
            continue
        k = bisect_left(js, cur)
        if k < len(js) and js[k] - cur <= LOOKAHEAD:
            out.append((i, js[k]))
            cur = js[k] + 1
    return out
