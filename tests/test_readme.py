"""The README runs: every shell command and Python snippet of its quick start and usage
sections is executed, as written, against the sample data shipped in tests/data (in a
temporary directory), with exit codes and printed answers checked; the sections are read
from README.md itself, so a command that stops working fails here.

Only the virtualenv/pip steps are not run (CI has installed dumpdb already); ``dumpdb`` and
``.venv/bin/...`` run with this interpreter. The quick start's commands, the scripts and the
``$DUMPDB_ARCHIVE`` check run as processes (``python -m dumpdb``); the other sections' commands
run in this process through typer's runner (the same app, arguments and working directory,
without a process start and its imports each time), and their Python snippets through ``exec``.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA, ms_case, npy_payload

import dumpdb
from dumpdb.errors import DumpdbWarning

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    """The text from the heading starting with ``title`` to the next heading of its level or above."""
    m = re.search(r"^(#+) " + re.escape(title) + r".*$", README, re.M)
    assert m, f"README has no section {title!r}"
    level = len(m.group(1))
    rest = README[m.end():]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return rest[: end.start()] if end else rest


def blocks(text: str, lang: str | None = None) -> list[str]:
    found = re.findall(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)
    return [body for tag, body in found if lang is None or tag == lang]


def commands(block: str) -> list[list[str]]:
    """Shell commands of a block: one per line (``&&`` splits), comments dropped; the
    virtualenv and pip steps are skipped."""
    out = []
    for line in block.splitlines():
        for part in line.split(" && "):
            argv = shlex.split(part, comments=True)
            if not argv or argv[:3] == ["python3", "-m", "venv"] or "pip" in Path(argv[0]).name:
                continue
            out.append(argv)
    return out


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("DUMPDB_ARCHIVE", None)  # the README's ./dumpdb.archive default
    env["COLUMNS"] = "200"
    return env


def run(argv: list[str], cwd: Path, process: bool = True) -> subprocess.CompletedProcess:
    """Run a README command line in ``cwd``: in a process, or (``process=False``, for
    ``dumpdb`` commands) in this one through typer's runner (:func:`run_in_process`)."""
    exe = argv[0]
    if exe in ("dumpdb", ".venv/bin/dumpdb"):
        if not process:
            return run_in_process(argv, cwd)
        argv = [sys.executable, "-m", "dumpdb", *argv[1:]]
    elif exe in (".venv/bin/python", "python", "python3"):
        argv = [sys.executable, *argv[1:]]
    return subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)


@contextlib.contextmanager
def _in(cwd: Path) -> Iterator[None]:
    """This process in ``cwd``, with the environment ``_env`` gives a README process and fresh
    rich consoles (made on first use, they read COLUMNS then), as a new process has them."""
    from dumpdb import cli

    old, env, readme_env = os.getcwd(), dict(os.environ), _env()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(readme_env)
    cli._consoles.clear()
    try:
        yield
    finally:
        cli._consoles.clear()
        os.environ.clear()
        os.environ.update(env)
        os.chdir(old)
        gc.collect()  # the command's or snippet's archives closed, as at a process's exit


def run_in_process(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``dumpdb ARGS`` (``argv[1:]``) through typer's runner in this process: exit code,
    stdout and stderr as a process gives them; an exception escaping the app fails the test."""
    from typer.testing import CliRunner

    from dumpdb.cli import app

    with _in(cwd):
        result = CliRunner().invoke(app, argv[1:], catch_exceptions=False)
    return subprocess.CompletedProcess(argv, result.exit_code, result.stdout, result.stderr)


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """A README snippet run by ``exec`` in ``cwd`` as a script's ``__main__``: returncode 1
    and the traceback on stderr if it raises."""
    out = io.StringIO()
    with _in(cwd), contextlib.redirect_stdout(out):
        try:
            exec(compile(code, "<README snippet>", "exec"), {"__name__": "__main__"})  # noqa: S102 - the README's own code
        except Exception:  # noqa: BLE001 - reported as a failed process would report it
            return subprocess.CompletedProcess(["python", "-c", code], 1, out.getvalue(), traceback.format_exc())
    return subprocess.CompletedProcess(["python", "-c", code], 0, out.getvalue(), "")


def _iterations_renamed(src: Path, dst: Path, renames: dict[str, str]) -> None:
    shutil.copytree(src, dst)
    for it_dir in sorted(dst.glob("rank_*/*/*/*")):
        if it_dir.name in renames:
            it_dir.rename(it_dir.with_name("tmp-" + renames[it_dir.name]))
    for it_dir in sorted(dst.glob("rank_*/*/*/tmp-*")):
        it_dir.rename(it_dir.with_name(it_dir.name[4:]))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A directory like a user's: tests/ (the shipped data) and scripts/ as in the repository,
    ./dump (the e1 sample), and in ./dumpdb.archive (the default archive) and ./lenet.dumpdb
    the runs the README's examples name."""
    w = tmp_path_factory.mktemp("readme")
    (w / "tests").symlink_to(REPO / "tests")
    (w / "scripts").symlink_to(REPO / "scripts")
    shutil.copytree(ms_case("e1_nan_inf_overflow"), w / "dump")
    # a run with iterations 8 and 9 (c1's 2 and 3 renamed) for "compare train:9 train:8"
    _iterations_renamed(ms_case("c1_inputs_kernels_iter"), w / "train", {"2": "8", "3": "9"})
    default = w / "dumpdb.archive"
    for src, name in ((w / "dump", "fp32-baseline"), (ms_case("d2_compare_fp16_bf16_iter0"), "fp16"),
                      (ms_case("d1_compare_fp32_iter0"), "fp32"), (w / "train", "train"),
                      (ms_case("e1_nan_inf_overflow"), "nan"), (ms_case("f_long_names"), "old-run")):
        assert dumpdb.ingest(src, archive=default, run=name).ok
    for src, name in ((ms_case("d2_compare_fp16_bf16_iter0"), "fp16"), (ms_case("d1_compare_fp32_iter0"), "fp32"),
                      (ms_case("e1_nan_inf_overflow"), "nan")):
        assert dumpdb.ingest(src, archive=w / "lenet.dumpdb", run=name).ok
    dumpdb.open(default).export(["fp32-baseline"], w / "fp32.bundle")  # read by the bundle snippet
    # "compare DIR DIR": two dump directories (the LeNet fp16/bf16 and fp32 steps)
    (w / "fp16_dump").symlink_to(ms_case("d2_compare_fp16_bf16_iter0"))
    (w / "fp32_dump").symlink_to(ms_case("d1_compare_fp32_iter0"))
    return w


# Exit codes the README documents for commands that report a finding.
# d2 (fp16/bf16) vs d1 (fp32) departs nowhere beyond float16 precision: first-divergence 0
# under the default (precision) rules; scan exits 1 when it finds NaN/Inf.
EXPECTED_EXIT = {("first-divergence", "fp16", "fp32"): 0, ("scan", "nan"): 1}


def _expected_exit(argv: list[str]) -> int:
    args = [a for a in argv[1:] if not a.startswith("-")]
    return next((code for key, code in EXPECTED_EXIT.items() if tuple(args[: len(key)]) == key), 0)


def _run_block_commands(block: str, cwd: Path, process: bool = False) -> dict[str, subprocess.CompletedProcess]:
    results = {}
    for argv in commands(block):
        proc = run(argv, cwd, process)
        assert proc.returncode == _expected_exit(argv), (argv, proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr, (argv, proc.stderr[-2000:])
        results[shlex.join(argv)] = proc
    return results


def test_readme_sections_are_all_found():
    for title in ("Quick start", "Using it", "Comparing runs", "Archival", "Verifying", "Example queries",
                  "Performance"):
        assert blocks(section(title)), title


def test_quick_start_answers_where_the_loss_went_wrong(work):
    block = blocks(section("Quick start"))[0]
    argvs = commands(block)
    assert [a[:2] for a in argvs] == [[".venv/bin/dumpdb", "ingest"], [".venv/bin/dumpdb", "sql"]]
    results = _run_block_commands(block, work, process=True)  # the first commands a user runs: as processes
    printed = list(results.values())[-1].stdout
    # the answer, read off the source dump: iteration 0's loss (SparseSoftmaxCrossEntropyWithLogits
    # output) holds one inf; in iteration 1 conv1's weight (Conv2D input 1) holds 147
    for value in ("SparseSoftmax", "891", "Conv2D", "80", "147"):
        assert value in printed, printed
    query = argvs[-1][-1]
    as_csv = run([".venv/bin/dumpdb", "sql", "--archive", "sample.dumpdb", "-f", "csv", query], work, process=False)
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    got = [(r["iteration"], r["op_type"], r["io"], r["slot"], r["nan_count"], r["inf_count"], r["code_line"])
           for r in rows]
    assert got == [("0", "SparseSoftmaxCrossEntropyWithLogits", "output", "0", "0", "1", "891"),
                   ("1", "Conv2D", "input", "1", "0", "147", "80")]
    it0 = ms_case("e1_nan_inf_overflow") / "rank_0/LeNet5/0/0"
    losses = [np.load(f) for f in it0.glob("SparseSoftmaxCrossEntropyWithLogits.*output.0.*.npy")]
    assert [(int(np.isinf(x).sum()), int(np.isnan(x).sum())) for x in losses if not np.isfinite(x).all()] == [(1, 0)]
    it1 = ms_case("e1_nan_inf_overflow") / "rank_0/LeNet5/0/1"
    weight = next(it1.glob("Conv2D.*conv1-Conv2d_Conv2D-op0.*input.1.*.npy"))
    assert int(np.isinf(np.load(weight)).sum()) == 147


def test_using_it_commands_and_python(work):
    text = section("Using it")
    results = _run_block_commands(blocks(text, "")[0], work)
    assert (work / "lenet.dumpdb" / "catalog.duckdb").is_file()
    import pyarrow.parquet as pq

    n_files = len(list((work / "dump").rglob("*.npy")))
    exported = pq.read_table(work / "tensors.parquet", columns=["run"])["run"].to_pylist()
    assert exported.count("fp32-baseline") == n_files
    layouts = next(p for cmd, p in results.items() if cmd.endswith("layouts"))
    for name in ("mindspore-sync", "msprobe", "ascend-async-pb", "torchair-ge"):
        assert name in layouts.stdout
    snippet = blocks(text, "python")[0]
    proc = run_python(snippet, work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # ingesting ./dump again adds nothing: "tensors_added deduplicated ratio errors"
    first = proc.stdout.splitlines()[0].split()
    assert first[0] == "0" and first[-1] == "[]", proc.stdout


def test_comparing_commands_and_python(work):
    text = section("Comparing runs")
    results = _run_block_commands(blocks(text, "")[0], work)
    header = next(csv.reader(open(work / "compare_result.csv", newline="")))
    assert header[:4] == ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype"]
    assert (work / "report.html").read_text().startswith("<!DOCTYPE html>")
    fd = next(p for cmd, p in results.items() if "first-divergence" in cmd)
    assert "no departure beyond float16 precision" in fd.stdout
    proc = run_python("import dumpdb\n" + blocks(text, "python")[0] + "\nprint('ok', results.num_rows)", work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^ok \d{2,}$", proc.stdout, re.M), proc.stdout


def test_archival_commands_and_bundle_snippet(work):
    text = section("Archival")
    _run_block_commands(blocks(text, "")[0], work)
    other = dumpdb.open(work / "other.dumpdb")
    assert other.runs()["run"].to_pylist() == ["fp32-baseline"]
    snippet = blocks(text, "python")[0]
    check = ("\nimport numpy as np\nfrom pathlib import Path\n"
             "raw = Path('dump', t['source_file']).read_bytes()\n"
             "print('exact', x.tobytes() == raw[len(raw) - x.nbytes:])")
    proc = run_python(snippet + check, work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("exact True"), proc.stdout


def test_verifying_and_maintaining_commands(work):
    block = blocks(section("Verifying"))[0]
    # the README's prune names iterations 5-8, which this run lacks: said, and the rest pruned
    with pytest.warns(DumpdbWarning, match=r"run 'fp32' has no iteration 5-8"):
        results = _run_block_commands(block, work)
    assert all(p.returncode == 0 for p in results.values())
    a = dumpdb.open(work / "dumpdb.archive")
    assert "old-run" not in a.runs()["run"].to_pylist()
    pruned = a.sql("SELECT DISTINCT iteration FROM tensors WHERE run = 'fp32' AND pruned_at IS NOT NULL")
    assert sorted(pruned["iteration"].to_pylist()) == [0]  # d1 has iteration 0 only: "0|5-8" prunes it
    assert a.verify().ok


def test_example_queries_run_on_the_quick_start_sample(work):
    sample = work / "sample.dumpdb"
    if not sample.exists():  # the quick start test made it; alone, make it the same way
        assert dumpdb.ingest(ms_case("e1_nan_inf_overflow"), archive=sample, run="nan").ok
    queries = [q.strip() for b in blocks(section("Example queries"), "sql") for q in b.split(";") if q.strip()]
    assert len(queries) >= 8
    a = dumpdb.open(sample)
    for q in queries:
        table = a.sql(q)
        # the sample ingests cleanly and has no quirks: only those two queries answer nothing
        assert table.num_rows > 0 or "ingest_errors" in q or "note IS NOT NULL" in q, q


@pytest.mark.parametrize("script", ["bench_ingest.py", "bench_compare.py"])
def test_performance_scripts_run_at_tiny_sizes(work, script, tmp_path):
    cmds = [a for b in blocks(section("Performance")) for a in commands(b) if a[-1].endswith(".py") or
            any(x.endswith(script) for x in a)]
    argv = next(a for a in cmds if any(x.endswith(script) for x in a))
    argv = argv[: argv.index("--size-gb") + 1] + ["0.002", "--out", str(tmp_path / "out")]
    if script == "bench_ingest.py":
        argv += ["--repeats", "1"]
    proc = run(argv, work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"\d", proc.stdout)


def test_readme_archive_default_and_env(work, tmp_path):
    """`--archive` defaults to $DUMPDB_ARCHIVE, else ./dumpdb.archive."""
    proc = run(["dumpdb", "sql", "-f", "csv", "SELECT count(*) AS n FROM runs WHERE run = 'fp16'"], work, process=False)
    assert proc.returncode == 0 and _csv(proc.stdout) == [["n"], ["1"]], proc.stdout + proc.stderr
    env_archive = tmp_path / "env.dumpdb"
    assert dumpdb.ingest(ms_case("c1_inputs_kernels_iter"), archive=env_archive, run="c1").ok
    env = {**_env(), "DUMPDB_ARCHIVE": str(env_archive)}
    proc = subprocess.run([sys.executable, "-m", "dumpdb", "sql", "-f", "csv", "SELECT count(*) AS n FROM tensors"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and _csv(proc.stdout) == [["n"], ["42"]], proc.stdout + proc.stderr


def _csv(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_npy_payload_helper_is_independent():
    """The snippet checks compare to the raw file tail; make sure that is the .npy payload."""
    f = next((DATA / "mindspore" / "c1_inputs_kernels_iter").rglob("*.npy"))
    raw = f.read_bytes()
    assert raw.endswith(npy_payload(f)[2])


def test_readme_test_command_is_what_ci_runs():
    block = next(b for b in blocks(section("Quick start")) if "pytest" in b)
    readme_pytest = next(a for a in commands(block) if "pytest" in a)
    ci = (REPO / ".ci" / "run").read_text()
    ci_pytest = [shlex.split(line) for line in ci.splitlines() if "-m pytest" in line and not line.startswith("#")]
    assert ci_pytest == [readme_pytest]
    assert "-n" in readme_pytest  # both cores
    assert "apt-get install -y" in ci and "chromium" in ci


def test_the_five_common_jobs_come_first_and_each_runs(work):
    """Issue 30: a table of contents, the five common jobs first (ingest, query, find the first
    NaN, compare two runs, archive), each with its one command that runs as written, terms defined."""
    heads = re.findall(r"^## (.+)$", re.sub(r"^```.*?^```", "", README, flags=re.M | re.S), re.M)
    assert heads[:4] == ["Contents", "Quick start", "The five common jobs", "Terms"]
    toc = section("Contents")
    assert all(f"[{h}](#" in toc for h in heads[1:])
    jobs = section("The five common jobs")
    titles = re.findall(r"^### (.+)$", jobs, re.M)
    assert titles == ["Ingest a dump", "Query it", "Find the first NaN/Inf", "Compare two runs", "Archive runs"]
    for title in titles:
        (block,) = blocks(section(title))
        (argv,) = commands(block)  # one command each
        _run_block_commands(block, work)
    assert (work / "lenet-fp32.zip").is_file()
    terms = section("Terms")
    for term in ("archive", "run", "rank", "iteration", "target", "bench", "pair", "payload", "selection"):
        assert f"**{term}**" in terms, term
