"""Hints that do not lie: every option a message, hint or help text of dumpdb names exists.

Walks every string literal of the package (messages, hints, help texts, docstrings: the
f-strings' literal parts included), finds each ``--option`` in it and checks it against
typer's own parameters of the command it belongs to: the command the text names
(``dumpdb gc ...``), else the CLI command whose function holds the text, else any
command. Options of other tools that dumpdb's texts quote are listed in FOREIGN, each
with where it comes from.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import typer
from typer.testing import CliRunner

import dumpdb
from dumpdb.cli import app

PACKAGE = Path(dumpdb.__file__).parent
# not CSS custom properties (``--pass:#2e7d32``, ``var(--pass)``) of the HTML reports
OPTION = re.compile(r"(?<![\w(-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)(?![\w:-])")
NAMED = re.compile(r"\bdumpdb ([a-z][a-z-]*)")
FOREIGN: dict[str, str] = {
    "patience": "git diff --patience (compare/sequence.py cites the algorithm)",
    "clients": "scripts/bench_store.py --clients (storage/remote.py and s3.py cite the measurement)",
}


def _commands() -> tuple[dict[str, set[str]], set[str]]:
    """{command name: its option names}, and the root (global) options."""
    group = typer.main.get_command(app)
    assert hasattr(group, "commands")  # typer >= 0.20 vendors its own click: no isinstance

    def opts(cmd) -> set[str]:
        return {o.lstrip("-") for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}

    return {name: opts(cmd) for name, cmd in group.commands.items()}, opts(group) | {"help"}


def _functions_of_commands(tree: ast.Module) -> dict[str, str]:
    """cli.py function name -> the command name it implements (``@app.command("name")``)."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and ast.unparse(dec.func) == "app.command":
                    name = dec.args[0].value if dec.args else node.name.replace("_", "-")
                    found[node.name] = name
    return found


def _texts(tree: ast.AST):
    """(enclosing top-level function name or None, text) for every string literal; an
    f-string is one text (its literal parts, placeholders as '{}')."""
    for top in ast.iter_child_nodes(tree):
        owner = top.name if isinstance(top, (ast.FunctionDef, ast.ClassDef)) else None
        inside_fstring = set()
        for node in ast.walk(top):
            if isinstance(node, ast.JoinedStr):
                parts = [v.value if isinstance(v, ast.Constant) else "{}" for v in node.values]
                inside_fstring.update(id(v) for v in node.values)
                yield owner, "".join(str(p) for p in parts)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside_fstring:
                yield owner, node.value


def _hints() -> list[tuple[str, str | None, str, str]]:
    """(file, owner, text, option) for every --option in a string of the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name.endswith("_pb2.py"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for owner, text in _texts(tree):
            for m in OPTION.finditer(text):
                found.append((path.relative_to(PACKAGE).as_posix(), owner, text, m.group(1)))
    return found


def test_every_option_a_text_names_exists():
    commands, root = _commands()
    every = set().union(*commands.values()) | root
    cli_tree = ast.parse((PACKAGE / "cli.py").read_text(encoding="utf-8"))
    implements = _functions_of_commands(cli_tree)
    wrong = []
    hints = _hints()
    for file, owner, text, option in hints:
        if option in FOREIGN:
            continue
        before = text[:text.find("--" + option)].rsplit("\n", 1)[-1]  # the option's own line
        named = [c for c in NAMED.findall(before) if c in commands]
        if named:
            allowed = commands[named[-1]] | root
        elif file == "cli.py" and owner in implements:
            allowed = commands[implements[owner]] | root
        else:
            allowed = every
        if option not in allowed:
            wrong.append(f"{file} ({owner}): --{option} in {text[:90]!r}")
    assert len(hints) > 30  # the walk sees the package's hints
    assert wrong == []


def test_default_more_hint_is_only_used_by_commands_with_max_rows():
    """``_emit(..., max_rows=N)`` without ``more=`` prints "use --max-rows 0 for more": only
    commands that have --max-rows may rely on that default (compare says --show N)."""
    commands, _ = _commands()
    tree = ast.parse((PACKAGE / "cli.py").read_text(encoding="utf-8"))
    implements = _functions_of_commands(tree)
    calls: dict[str, set[str]] = {}  # function -> functions it calls
    relies: set[str] = set()  # functions with an _emit(max_rows=...) relying on the default hint
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name):
                calls.setdefault(node.name, set()).add(sub.func.id)
                kw = {k.arg: k.value for k in sub.keywords}
                limited = "max_rows" in kw and not (isinstance(kw["max_rows"], ast.Constant)
                                                    and kw["max_rows"].value is None)
                if sub.func.id == "_emit" and limited and "more" not in kw:
                    relies.add(node.name)
    assert relies  # sql, scan, ranks do
    for fn, command in implements.items():
        reached = {fn} | calls.get(fn, set())
        if reached & relies:
            assert "max-rows" in commands[command], command


def test_compare_has_no_max_rows_and_names_show():
    commands, _ = _commands()
    assert "max-rows" not in commands["compare"] and "show" in commands["compare"]
    result = CliRunner().invoke(app, ["compare", "--max-rows", "0", "a", "b"])
    assert result.exit_code == 2 and "No such option" in result.output
