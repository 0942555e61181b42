"""MindSpore 2.x synchronous dump with ``saved_data: "statistic"`` (layout ``statistic-only``).

Source: seed 001 (Dump功能调试, 同步Dump): ``saved_data`` "statistic" means
"只Dump张量的统计信息" (only tensor statistics are dumped), and
"只当`saved_data`为"statistic"或者"full"时，才会生成`statistic.csv`，当`saved_data`为
"tensor"或者"full"时，才会生成 ... `.npy` 命名的完整张量信息"::

    {path}/rank_{rank_id}/
        .dump_metadata/
        {net_name}/{graph_id}/{iteration_id}/statistic.csv     (no .npy tensor files)
        graphs/, execution_order/

The tree is the ``mindspore-sync`` one, read by :class:`MindSporeSync`, whose
scan already turns statistic.csv rows without a tensor file into
statistics-only entries (``path`` None, ``tensor_key`` = csv + row identity,
``shape``/``dtype`` from the csv). Only detection is new: a ``mindspore-sync``
tree with at least one ``statistic.csv`` and no ``.npy`` file at all (any tensor
file, including ``constants/`` and ``mapping.csv`` hashed names, makes it a
``mindspore-sync`` dump, ``saved_data`` "tensor" or "full"). This layout must
be tried before ``mindspore-sync``.

On CPU, MindSpore refuses ``saved_data`` "statistic" (corpus mindspore-cpu
README, case b_statistic), so there is no real example; the reader follows the
seed and the column names of reference formats.md 3.1.
"""

from __future__ import annotations

import os
from pathlib import Path

from dumpdb.layouts.base import DumpScan, register
from dumpdb.layouts.mindspore_sync import RANK_DIR_RE, MindSporeSync, find_dump_roots


@register
class StatisticOnly(MindSporeSync):
    name = "statistic-only"
    description = ("MindSpore 2.x synchronous dump with saved_data \"statistic\": "
                   "rank_{id}/{net}/{graph}/{iteration}/statistic.csv and no tensor files")
    document = "seed 001 (Dump功能调试: saved_data statistic, statistic.csv)"
    priority = 10  # a mindspore-sync tree without tensor files

    def detect(self, root: Path) -> bool:
        root = Path(root)
        if not super().detect(root):
            return False
        found_csv = False
        for dump_root in find_dump_roots(root):
            rank_dirs = [dump_root] if RANK_DIR_RE.match(dump_root.name) else sorted(
                dump_root / e for e in os.listdir(dump_root) if RANK_DIR_RE.match(e))
            for rank_dir in rank_dirs:
                for net_dir in self._net_dirs(rank_dir):
                    for _dirpath, _dirnames, filenames in os.walk(net_dir):
                        for f in filenames:
                            if f.endswith(".npy"):
                                return False
                            if f == "statistic.csv":
                                found_csv = True
        return found_csv

    def scan(self, root: Path) -> DumpScan:
        scan = super().scan(root)
        scan.layout = self.name
        return scan
