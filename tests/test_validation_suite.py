"""bench.validation_suite --resimulate: the suite's simulated side again from a suite.json, no real runs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from bench import validation_suite
from calibration import runtime_cpu
from experiments import validate
from sim.cluster import Host

V1 = validation_suite.CONFIG_DIR / "v1_mlp_2w_bsp.yaml"


def _row(**over: object) -> dict[str, object]:
    row: dict[str, object] = {"config": "v1_mlp_2w_bsp", "scheduler": "equal", "worker threads / cores": "2/2",
                              "sim_s": 0.5, "background threads": 0.25}
    row.update(over)
    return {k: v for k, v in row.items() if v is not None}


def _suite(tmp_path: Path, rows: list[dict[str, object]]) -> Path:
    path = tmp_path / "suite.json"
    path.write_text(json.dumps({"rows": rows}))
    return path


def test_resimulate_gives_the_simulated_side_on_each_rows_host(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # one row of v1 on 2 cores with a quarter of a core busy elsewhere, and one of a config
    # that --only leaves out (never simulated: its missing fields would fail it)
    suite = _suite(tmp_path, [_row(), {"config": "v3_mlp_2w_slow"}])
    rc = validation_suite.main(["--resimulate", str(suite), "--only", "v1", "--out", str(tmp_path / "o")])
    assert rc == 0
    with (tmp_path / "o" / "resimulated.csv").open(newline="") as f:
        [got] = list(csv.DictReader(f))
    # what validate.resimulate gives on the same host: as it is, and with the profile's model
    # (this_machine's network.runtime_cpu, the model validate applies to v1's processes)
    _, _, _, problem = validate.load(V1)
    [model] = {json.dumps(m.to_json()): m for d in problem.cluster.devices
               if (m := runtime_cpu.RuntimeCpuModel.from_fit(d.type.network.runtime_cpu))}.values()
    again = validate.resimulate(V1, "equal", Host("local", 2, 0.25), {"profile": model})
    assert float(got["sim_s"]) == again["profile"]
    assert float(got["sim w/o CPU model"]) == again[""]
    assert (got["config"], got["scheduler"], got["cores"], got["background threads"], got["recorded sim_s"]) == (
        "v1_mlp_2w_bsp", "equal", "2", "0.25", "0.5")
    # the background load is the row's: a busier host gives a slower iteration
    busy = validate.resimulate(V1, "equal", Host("local", 2, 1.5), {})
    assert busy[""] > again[""]
    out = capsys.readouterr().out
    assert "0 of 1 rows give the recorded sim_s again exactly" in out


@pytest.mark.parametrize(("rows", "field"), [
    (None, "rows"),                                     # no rows key at all
    ([_row(**{"background threads": None})], "rows[0]"),  # a row without its host load
    ([_row(**{"worker threads / cores": "2"})], "rows[0]"),  # cores not given as threads/cores
    ([_row(config="v9_mlp_6w_bsp_pipe")], "rows"),      # no row of the selected config
])
def test_resimulate_bad_suite_json_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         rows: list[dict[str, object]] | None, field: str) -> None:
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"wall_s": 1.0} if rows is None else {"rows": rows}))
    rc = validation_suite.main(["--resimulate", str(suite), "--only", "v1", "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{suite}: {field}: " in err
    assert not (tmp_path / "o" / "resimulated.csv").exists()


def test_resimulate_of_a_missing_suite_json_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = validation_suite.main(["--resimulate", str(tmp_path / "nope.json"), "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nope.json: rows: no suite rows" in err


def test_rescore_of_a_folder_without_a_suite_is_one_line_exit_2(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``--rescore`` of a folder no suite wrote (missing, or without CONFIG/validation.json),
    or ``--report-only`` of such an OUT: one line naming it, exit 2, and no report written."""
    for src in (tmp_path / "missing", tmp_path):
        assert validation_suite.main(["--rescore", str(src), "--out", str(tmp_path / "out"), "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"python -m bench.validation_suite: error: {src}: "), err
    assert not (tmp_path / "out").exists()
    # --report-only likewise, of an OUT without runs
    (tmp_path / "out").mkdir()
    assert validation_suite.main(["--report-only", "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert not any((tmp_path / "out").iterdir())
