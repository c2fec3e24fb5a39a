"""The multi-GPU rows of the published table: bench.multi_gpu's figures and their place
in bench.gpu_fidelity's report, JSON and figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import gpu_fidelity, multi_gpu
from calibration import published as P

HEADER = "id,device,hetsim_type,model,batch_per_gpu,gpus,precision,memory_format,measured,unit,multi_gpu_sync,notes,source"
ROWS = [
    "x-v100-fp32-1,V100 (DGX-1),v100,resnet50 (torchvision v1.5),112,1,fp32,unknown,367,img/s,,,t",
    "x-v100-fp32-8,8x V100 (DGX-1),v100,resnet50 (torchvision v1.5),112,8,fp32,unknown,2855,img/s,NCCL,,t",
    # an 8-GPU row with no single-GPU row beside it (batch 64 measured on 8 GPUs only)
    "y-v100-fp32-8,8x V100 (DGX-2),v100,resnet50 (torchvision v1.5),64,8,fp32,unknown,2000,img/s,NCCL,,t",
]


def _table(tmp: Path) -> Path:
    path = tmp / "table.csv"
    path.write_text("\n".join([HEADER, *ROWS]) + "\n")
    return path


def test_scaling_efficiency_of_one_row(tmp_path: Path) -> None:
    rows, _ = P.read_table(_table(tmp_path))
    single, eight = rows[0], rows[1]
    assert multi_gpu.single_of(eight, rows) is single and multi_gpu.single_of(rows[2], rows) is None
    got = multi_gpu.measure(eight, single, "analytic")
    # measured: 2855 / (8 x 367); predicted: the 8-GPU plan's throughput over 8 x the 1-GPU plan's
    assert got["efficiency_measured"] == pytest.approx(2855 / (8 * 367), rel=1e-12)
    assert got["efficiency_predicted"] == pytest.approx(
        got["predicted_sps"] / (8 * got["predicted_single_sps"]), rel=1e-12)
    assert 0.9 < got["efficiency_predicted"] <= 1.0
    assert got["efficiency_gap_points"] == pytest.approx(
        100 * (got["efficiency_predicted"] - got["efficiency_measured"]), rel=1e-12)
    # the ring over 8 GPUs: each moves 2 x 7/8 of the gradient at 150 GB/s per direction,
    # and each bucket takes 2 x 7 steps of 5 us
    ring = 2 * 7 / 8 * got["gradient_bytes"] / 150e9
    assert got["allreduce_s"] == pytest.approx(ring + got["buckets"] * 2 * 7 * 5e-6, rel=1e-9)
    # the DES prices the same plan alike (no dynamics: the same recursion)
    des = multi_gpu.measure(eight, single, "des")
    assert des["predicted_sps"] == pytest.approx(got["predicted_sps"], rel=1e-6)


def test_gpu_fidelity_reports_every_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert gpu_fidelity.main(["--table", str(_table(tmp_path)), "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "median |error|" in text and "over 1 rows" in text  # the single-GPU summary: its row only
    assert "| x-v100-fp32-8 |" in text and "scaling efficiency within 5 points:" in text
    assert "skipped y-v100-fp32-8: 8 GPUs: no single-GPU row to scale from" in text
    doc = json.loads((out / "gpu_fidelity.json").read_text())
    assert [r["id"] for r in doc["rows"]] == ["x-v100-fp32-1"]
    assert [r["id"] for r in doc["multi_gpu"]["rows"]] == ["x-v100-fp32-8"]
    assert doc["multi_gpu"]["skipped"] == [{"id": "y-v100-fp32-8",
                                            "reason": "8 GPUs: no single-GPU row to scale from"}]
    assert (out / "predicted_vs_measured.png").stat().st_size > 0
