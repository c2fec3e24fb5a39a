"""Schema 1 profiles read as schema 2 (hardware_profiles.migrate.migrate_v1): the mapping
field by field, the loader reading either, and every committed measured profile pricing
every zoo model identically in its schema 1 and its schema 2 form."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hardware_profiles import MEASURED_DIR, DeviceProfile, load_profile_file
from hardware_profiles.errors import ConfigError
from hardware_profiles.migrate import migrate_v1
from sim import zoo
from sim.costmodel import layer_times

BASE = {"name": "m", "kind": "cpu", "peak_flops": {"fp32": 1e9}, "mem_bw_Bps": 1e9,
        "memory_bytes": 1e9, "launch_overhead_s": 1e-6, "nic_bw_Bps": 1e9, "price_per_hour": 0.0,
        "power_w": {"idle": 0, "active": 0}, "source": {"kind": "measured", "date": "2026-11-30"}}
CURVE = {"bytes": [1e6, 1e8], "s": [0.0, 1e-4]}
#: schema 1's implied precision fallback of an fp32-only profile, as migration writes it
FB = {"tf32": "fp32", "fp16": "fp32", "bf16": "fp32"}


def as_v1(data: dict[str, Any]) -> dict[str, Any]:
    """The schema 1 form of schema 2 profile ``data`` (the inverse of migrate_v1)."""
    out = {k: v for k, v in data.items() if k not in ("corrections", "measurement", "math_fallback")}
    out["schema"] = 1
    corr = data.get("corrections", {})
    for name, fwd, bwd in (("call_overhead", "call_overhead_s", "call_overhead_bwd_s"),
                           ("row_cost", "row_cost_s", "row_cost_bwd_s")):
        for phase, key in (("fwd", fwd), ("bwd", bwd)):
            if phase in corr.get(name, {}):
                out[key] = corr[name][phase]
    if "glue" in corr:
        out["layer_glue_s"] = corr["glue"]
    if "cold_calls" in corr:
        out["cold_call_s"] = corr["cold_calls"]["curves"]
        out["cold_window"] = corr["cold_calls"].get("window", 1)
    for flag in ("dense_sparse_grad", "weight_grad_only_bwd"):
        if flag in corr:
            out[flag] = True
    out.update(data.get("measurement", {}))
    return out


def test_every_schema_1_field_moves_where_schema_2_keeps_it() -> None:
    v1 = {**BASE, "schema": 1, "efficiency": {"gemm": 0.5, "gemm/rows2": 0.1},
          "call_overhead_s": {"gemm": 1e-5}, "call_overhead_bwd_s": {"elementwise/k1": 2e-5},
          "row_cost_bwd_s": {"embedding": 1e-8}, "layer_glue_s": {"fwd": [1e-6, 1e-12]},
          "cold_call_s": {"gemm": CURVE}, "dense_sparse_grad": True, "weight_grad_only_bwd": False,
          "spread": {"layer_median": 0.1}, "raw": {"dispatch_s": 1e-6}}
    assert migrate_v1(v1) == {
        **BASE, "schema": 2, "efficiency": {"gemm": 0.5, "gemm/rows2": 0.1},
        "corrections": {"call_overhead": {"fwd": {"gemm": 1e-5}, "bwd": {"elementwise/k1": 2e-5}},
                        "row_cost": {"bwd": {"embedding": 1e-8}}, "glue": {"fwd": [1e-6, 1e-12]},
                        "cold_calls": {"window": 1, "curves": {"gemm": CURVE}},
                        "skinny_gemm": {}, "dense_sparse_grad": {}},
        "measurement": {"spread": {"layer_median": 0.1}, "raw": {"dispatch_s": 1e-6}},
        "math_fallback": FB}
    assert "schema" in v1 and v1["schema"] == 1  # the input is left as it was
    # a datasheet's fields are the same in both: only the version changes; a window without
    # curves priced nothing and goes; no gemm/rowsM curve, no skinny_gemm
    assert migrate_v1({**BASE, "schema": 1, "cold_window": 3}) == {**BASE, "schema": 2, "math_fallback": FB}
    assert migrate_v1({**BASE, "efficiency": {"gemm/rows5": 0.1}}) == {
        **BASE, "schema": 2, "efficiency": {"gemm/rows5": 0.1}, "math_fallback": FB}


def test_the_model_reads_schema_1_and_schema_2() -> None:
    v1 = DeviceProfile.model_validate({**BASE, "schema": 1, "cold_call_s": {"gemm": CURVE}, "cold_window": 2,
                                       "raw": {"x": 1}})
    v2 = DeviceProfile.model_validate({**BASE, "schema": 2, "corrections": {"cold_calls": {
        "window": 2, "curves": {"gemm": CURVE}}}, "measurement": {"raw": {"x": 1}}, "math_fallback": FB})
    assert v1 == v2 and v2.schema_ == 2
    # no schema (1 was its default): a schema 1 field says schema 1; else it reads as either
    assert DeviceProfile.model_validate({**BASE, "dense_sparse_grad": True}) == DeviceProfile.model_validate(
        {**BASE, "corrections": {"dense_sparse_grad": {}}, "math_fallback": FB})
    assert DeviceProfile.model_validate(BASE).schema_ == 2
    with pytest.raises(ValueError, match="'corrections' is a schema 2 field"):
        DeviceProfile.model_validate({**BASE, "schema": 1, "corrections": {}})
    with pytest.raises(ValueError, match="unknown field|Extra inputs"):
        DeviceProfile.model_validate({**BASE, "schema": 2, "layer_glue_s": {"fwd": [0.0, 0.0]}})


def test_the_loader_reads_a_schema_1_file_and_names_a_bad_field(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({**BASE, "schema": 1, "dense_sparse_grad": True}))
    assert load_profile_file(path).corrections.dense_sparse_grad is not None
    path.write_text(json.dumps({**BASE, "schema": 1, "call_overhead_s": {"relu": 1e-6}}))
    with pytest.raises(ConfigError) as info:
        load_profile_file(path)
    assert (info.value.field, "\n" in str(info.value)) == ("corrections.call_overhead.fwd", False)


MEASURED = sorted(MEASURED_DIR.glob("*.json"))


@pytest.mark.parametrize("path", MEASURED, ids=[p.stem for p in MEASURED])
def test_a_committed_profile_prices_alike_in_schema_1_and_2(path: Path) -> None:
    data = json.loads(path.read_text())
    assert data["schema"] == 2
    v1 = as_v1(data)
    assert migrate_v1(v1) == data
    new, old = load_profile_file(path), DeviceProfile.model_validate(v1)
    assert old == new and old is not new
    for name in zoo.names():
        m = zoo.get(name)
        for b in (1, 16, 256):
            for a, c in zip(layer_times(m, old, "fp32", b), layer_times(m, new, "fp32", b), strict=True):
                assert np.array_equal(a, c), (name, b)
