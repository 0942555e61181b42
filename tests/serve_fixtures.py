"""Archives for the ``dumpdb serve`` tests: the real Transformer pair (tests/data/transformer:
``fp32_ln1`` departs from ``fp32`` at layer 1's norm1 LayerNorm; ``fp16`` is the same model in
mixed precision: no departure, Casts only it has), a real 2-rank msprobe run,
and an msprobe run whose op and run names are hostile (HTML, script, a 10 kB name)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import dumpdb

DATA = Path(__file__).parent / "data"
HOSTILE_OP = ('Functional.<img src=x onerror="window.__pwned=1"><script>window.__pwned=1</script>'
              + "A" * 10_000 + ".0.forward")
HOSTILE_RUN = "<b>run</b><script>window.__pwned=1</script>"


def hostile_dump(out: Path) -> Path:
    """A copy of the msprobe statistics_mix_md5 case with its conv2d API renamed to HOSTILE_OP."""
    shutil.copytree(DATA / "msprobe" / "statistics_mix_md5", out)
    for f in out.rglob("*.json"):
        f.write_text(f.read_text().replace("Functional.conv2d.0.forward", json.dumps(HOSTILE_OP)[1:-1]))
    return out


def build(root: Path) -> Path:
    archive = root / "serve.dumpdb"
    for case in ("fp32_ln1", "fp32", "fp16"):
        assert dumpdb.ingest(DATA / "transformer" / case, archive=archive, run=case).ok
    assert dumpdb.ingest(DATA / "msprobe" / "statistics_mix_2rank_gloo", archive=archive, run="gloo").ok
    assert dumpdb.ingest(hostile_dump(root / "hostile"), archive=archive, run=HOSTILE_RUN).ok
    return archive


_TEMPLATES: dict[Path, Path] = {}


def archive_copy(tmp_path_factory) -> Path:
    """A fresh copy of :func:`build`'s archive, built once per test session (and process)."""
    base = tmp_path_factory.getbasetemp()
    if base not in _TEMPLATES:
        _TEMPLATES[base] = build(tmp_path_factory.mktemp("serve-template"))
    dst = tmp_path_factory.mktemp("serve") / "serve.dumpdb"
    shutil.copytree(_TEMPLATES[base], dst)
    return dst
