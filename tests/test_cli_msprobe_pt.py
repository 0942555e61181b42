"""An msprobe dump of .pt tensors ingested where PyTorch is missing (issue 16 item 4):
the statistics from dump.json are kept, payloads are marked as not stored, one warning
line says how to get them, exit 0. torch is hidden from a real `python -m dumpdb`
process with `sys.modules['torch'] = None` (what an absent package looks like to import)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import DATA

import dumpdb

ROOT = Path(__file__).resolve().parent.parent
WITHOUT_TORCH = ("import sys, runpy; sys.modules['torch'] = None; sys.argv = ['dumpdb', *sys.argv[1:]]; "
                 "runpy.run_module('dumpdb', run_name='__main__')")


def test_pt_dump_without_torch_keeps_statistics_with_one_warning(tmp_path):
    archive = tmp_path / "a.dumpdb"
    proc = subprocess.run([sys.executable, "-c", WITHOUT_TORCH, "ingest", str(DATA / "msprobe" / "tensor_mix"),
                           "-a", str(archive), "-r", "pt", "-q"],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line.lower()]
    assert len(warnings) == 1, proc.stderr
    assert warnings[0].startswith("warning: ") and "pip install 'dumpdb[torch]'" in warnings[0]
    assert "194 .pt payloads not stored" in warnings[0]
    assert "error" not in proc.stderr and "Traceback" not in proc.stderr
    (total, stored, with_stats, noted, files), = dumpdb.open(archive).sql_rows(
        "SELECT count(*), count(content_hash), count(max), "
        "count(*) FILTER (note LIKE '%needs PyTorch%'), count(*) FILTER (source_file LIKE '%.pt') "
        "FROM tensors WHERE run = 'pt'")[1]
    assert total == 194 and stored == 0  # every tensor kept, no payload claimed
    assert with_stats > 150 and noted == 194 and files == 194
    errors = dumpdb.open(archive).sql_rows("SELECT count(*) FROM ingest_errors")[1][0][0]
    assert errors == 0
