"""The scan-check registry: one entry per check, read by the engine and `dumpdb scan --list`."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dumpdb.checks import scan as scan_mod
from dumpdb.checks.registry import CHECKS, ThresholdTest, register
from dumpdb.cli import app


def test_every_check_is_one_registry_entry_the_engine_uses():
    assert scan_mod.CHECKS is CHECKS
    assert set(scan_mod.DEFAULT_CHECKS) <= set(CHECKS)
    for name, check in CHECKS.items():
        assert check.name == name and check.description and check.source
        p = {k: v for k, v in check.params.items() if v is not None}
        if check.tests is not None:
            assert all(isinstance(t, ThresholdTest) for t in check.tests(p))
        assert isinstance(check.eligible(p), str) and check.eligible(p)
    between = {n for n, c in CHECKS.items() if c.between_iterations}
    assert between == {"tensor_unchanged", "tensor_change_above_threshold", "tensor_change_below_threshold"}


def test_a_name_registers_once():
    with pytest.raises(ValueError, match="already registered"):
        register("nan", "again", "test")
    assert CHECKS["nan"].description != "again"


def test_scan_list_shows_every_registered_check(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    r = CliRunner().invoke(app, ["scan", "any-run", "--list"])
    assert r.exit_code == 0
    for name in CHECKS:
        assert name in r.output
