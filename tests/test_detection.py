"""Layout registry and detection at any depth (bounded walk, several dumps listed)."""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import DATA, ms_case
from typer.testing import CliRunner

import dumpdb
import dumpdb.layouts as layouts
from dumpdb.cli import app
from dumpdb.errors import LayoutError
from dumpdb.layouts import LAYOUTS, detect, detect_all, get_layout, locate, register
from dumpdb.layouts.mindspore_sync import MindSporeSync

MSPROBE = DATA / "msprobe" / "tensor_mix"
SYNC = ms_case("c1_inputs_kernels_iter")


def _deep(tmp_path, src, *levels):
    dst = tmp_path.joinpath(*levels)
    shutil.copytree(src, dst)
    return dst


def test_registry_lists_every_layout_once_in_priority_order():
    names = [lay.name for lay in LAYOUTS]
    assert len(names) == len(set(names)) == 11
    assert [lay.priority for lay in LAYOUTS] == sorted(lay.priority for lay in LAYOUTS)
    assert names[0] == "statistic-only" and names[-1] == "msaccucmp-npy"
    for lay in LAYOUTS:
        assert lay.description and lay.document, lay.name
    with pytest.raises(ValueError, match="already registered"):
        register(MindSporeSync)


def test_msprobe_dump_far_below_the_given_directory_is_found(tmp_path):
    # msprobe's own search reaches 3 levels; the dump here is 5 levels further down.
    deep = _deep(tmp_path, MSPROBE, "a", "b", "c", "d", "e", "case")
    assert not get_layout("msprobe").detect(tmp_path)
    found = locate(tmp_path)
    # the shallowest directory msprobe recognises: below the given one, above the dump
    assert found.layout.name == "msprobe" and tmp_path in found.path.parents and found.path in deep.parents
    assert detect(tmp_path).name == "msprobe"
    report = dumpdb.ingest(tmp_path, archive=tmp_path.parent / "arch.dumpdb", run="deep")
    assert report.ok and report.layout == "msprobe" and report.tensors_added > 0
    a = dumpdb.open(tmp_path.parent / "arch.dumpdb")
    assert a.sql("SELECT source_path FROM runs")["source_path"][0].as_py() == str(found.path.resolve())
    files = set(a.sql("SELECT DISTINCT source_file FROM tensors")["source_file"].to_pylist())
    assert files and all((found.path / f.split("#")[0]).is_file() for f in files)


def test_sync_dump_below_its_own_search_depth_is_found(tmp_path):
    _deep(tmp_path, SYNC, "x", "y", "z", "w", "v", "u", "dump")
    assert not MindSporeSync().detect(tmp_path)  # its own search stops 4 levels down
    found = locate(tmp_path)
    assert found.layout.name == "mindspore-sync" and tmp_path in found.path.parents


def test_several_dumps_are_listed_and_refused_until_one_is_chosen(tmp_path):
    _deep(tmp_path, SYNC, "one", "run")
    _deep(tmp_path, MSPROBE, "two", "case")
    with pytest.raises(LayoutError) as err:
        locate(tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and "more than one dump" in msg and "--layout" in msg
    assert "mindspore-sync at one" in msg and "msprobe at two" in msg
    chosen = locate(tmp_path, "msprobe")
    assert chosen.layout.name == "msprobe"
    r = CliRunner().invoke(app, ["ingest", str(tmp_path), "--archive", str(tmp_path.parent / "x.dumpdb")])
    assert r.exit_code == 2 and "mindspore-sync at one" in r.output and "msprobe at two" in r.output
    report = dumpdb.ingest(tmp_path, archive=tmp_path.parent / "x.dumpdb", run="p", layout="msprobe")
    assert report.ok and report.layout == "msprobe"


def test_same_layout_twice_with_layout_given_is_refused_with_the_directories(tmp_path):
    _deep(tmp_path, MSPROBE, "a", "b", "c", "d", "one")
    _deep(tmp_path, MSPROBE, "e", "f", "g", "h", "two")
    with pytest.raises(LayoutError, match=r"2 msprobe dumps \(a/b/c, e/f/g\)"):
        locate(tmp_path, "msprobe")
    assert len(detect_all(tmp_path)) == 2


def test_walk_survives_symlink_loops_and_stops_at_its_bounds(tmp_path, monkeypatch):
    (tmp_path / "a" / "b").mkdir(parents=True)
    os.symlink(tmp_path, tmp_path / "a" / "b" / "loop")
    with pytest.raises(LayoutError, match="not a dump dumpdb recognises"):
        locate(tmp_path)
    # a dump the walk can reach only past its directory budget is not found
    for i in range(6):
        (tmp_path / f"w{i}").mkdir()
    _deep(tmp_path, MSPROBE, "zz", "b", "c", "d", "e", "case")
    assert locate(tmp_path).layout.name == "msprobe"
    monkeypatch.setattr(layouts, "MAX_WALK_DIRS", 5)
    assert detect_all(tmp_path) == []
    monkeypatch.undo()
    monkeypatch.setattr(layouts, "MAX_WALK_DEPTH", 2)
    assert detect_all(tmp_path) == []


def test_layout_given_for_a_directory_that_is_not_that_layout_lets_the_reader_say_why(tmp_path):
    shutil.copytree(SYNC, tmp_path / "dump")
    found = locate(tmp_path / "dump", "msprobe")
    assert found.path == tmp_path / "dump"
    with pytest.raises(LayoutError, match="no step"):
        found.layout.scan(found.path)


def _cases():
    # divergence/ holds the evaluation sample: truth JSON files, the dumps packed in a tarball
    for family in sorted(p for p in DATA.iterdir() if p.is_dir() and p.name not in ("archives", "divergence")):
        # msprobe_oracle/<case>/ holds msprobe's own CSV outputs beside pairs of dumps: no dump there
        yield from sorted(p for p in family.iterdir() if p.is_dir() and not all(
            f.suffix == ".csv" for f in p.iterdir()))


@pytest.mark.parametrize("case", list(_cases()), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_test_dump_is_one_dump_of_one_layout(case):
    """Trying every layout (not only the first that matches) finds exactly one on each real case."""
    found = detect_all(case)
    assert [(d.layout.name, d.path) for d in found] == [(detect(case).name, case)]
    assert found[0].layout.detect(case)
