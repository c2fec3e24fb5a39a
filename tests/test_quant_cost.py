"""Measured (de)quantization cost: the profile field, the cost model's use of it, the benchmark."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hardware_profiles import load_profile
from hardware_profiles.schema import DeviceProfile
from sim.costmodel import dequantize_time_s, quantize_time_s
from sim.quantization import packed_bytes


def _with_quant(quant: dict | None) -> DeviceProfile:
    data = load_profile("cpu-2c").model_dump(by_alias=True, exclude_none=True)
    data["quant"] = quant
    return DeviceProfile.model_validate(data)


def test_measured_cost_replaces_the_memory_pass_where_given() -> None:
    dev = _with_quant({"8": {"pack_s_per_value": 5e-9, "unpack_s_per_value": 2e-9}})
    # 4e6 fp32 bytes = 1e6 values
    assert quantize_time_s(4e6, 8, dev) == pytest.approx(1e6 * 5e-9)
    assert dequantize_time_s(4e6, 8, dev) == pytest.approx(1e6 * 2e-9)
    # no measurement at 4 bits: one pass over fp32 + packed bytes
    assert quantize_time_s(4e6, 4, dev) == pytest.approx((4e6 + packed_bytes(1e6, 4)) / dev.mem_bw_Bps)
    assert quantize_time_s(4e6, 32, dev) == 0.0 and quantize_time_s(0.0, 8, dev) == 0.0


def test_unknown_bit_width_is_refused() -> None:
    with pytest.raises(ValidationError, match="unknown bit width '3'"):
        _with_quant({"3": {"pack_s_per_value": 1e-9, "unpack_s_per_value": 1e-9}})


def test_this_machine_carries_its_measured_quantization_cost() -> None:
    prof = load_profile("this_machine")
    for bits in (2, 4, 8, 16):
        pack = prof.quant_s_per_value(bits, "pack")
        unpack = prof.quant_s_per_value(bits, "unpack")
        assert pack is not None and unpack is not None and pack > 0 and unpack > 0
    rows = {r["bits"]: r for r in prof.measurement.raw["quant"]}  # type: ignore[index]
    assert prof.quant_s_per_value(8, "pack") == pytest.approx(rows[8]["pack_s"] / rows[8]["values"], rel=1e-3)


def test_quant_bench_rows_and_costs() -> None:
    from calibration import profiler as P
    from calibration.profiler import timing as PT

    dev, _ = P.setup_host("cpu", 1)
    rows = P.quant_bench(PT._OpTimer(dev, P.spec_for(True)), 4096)
    assert [r["bits"] for r in rows] == [2, 4, 8, 16] and all(r["pack_s"] > 0 for r in rows)
    costs = P.quant_costs({"quant": rows})
    assert costs is not None
    assert costs["8"]["pack_s_per_value"] == pytest.approx(rows[2]["pack_s"] / 4096, rel=1e-3)
