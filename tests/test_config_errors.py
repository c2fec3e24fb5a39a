"""A misspelt config field is reported as the unknown field it is, with the field it
most resembles, in one line (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments import cli

DEMO = (Path(__file__).resolve().parent.parent / "experiments" / "configs" / "demo.yaml").read_text()


@pytest.mark.parametrize(("old", "new", "line"), [
    # a required field misspelt: unknown AND missing; the spelling is what to report
    ("  global_batch:", "  globl_batch:", "job.globl_batch: unknown field (did you mean 'global_batch'?)"),
    ("  model:", "  modle:", "job.modle: unknown field (did you mean 'model'?)"),
    # an optional one: the closest field of its section
    ("  iterations:", "  iteratons:", "job.iteratons: unknown field (did you mean 'iterations'?)"),
    ("bandwidth_gbps", "bandwith_gbps",
     "cluster.network.bandwith_gbps: unknown field (did you mean 'bandwidth_gbps'?)"),
    ("scheduler:", "schedulr:", "schedulr: unknown field (did you mean 'scheduler'?)"),
    # nothing close: no suggestion
    ("  iterations:", "  bogus: 1\n  iterations:", "job.bogus: unknown field"),
])
def test_a_misspelt_field_names_itself_and_its_likely_meaning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, line: str) -> None:
    assert DEMO.count(old) == 1
    cfg = tmp_path / "c.yaml"
    cfg.write_text(DEMO.replace(old, new))
    assert cli.main(["simulate", str(cfg), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == f"hetsim: error: {cfg}: {line}\n"
    assert not (tmp_path / "out" / "summary.json").exists()
