"""A bare measured device profile for hand-worked cost-model and calibration tests."""

from __future__ import annotations

from typing import Any

from hardware_profiles.schema import DeviceProfile


def bare_profile(**kw: Any) -> DeviceProfile:
    """1 GFLOP/s fp32, 1 GB/s of memory and NIC, 1 us launches, free; ``kw`` sets more fields."""
    data: dict[str, Any] = {
        "schema": 2, "name": "m", "kind": "cpu", "peak_flops": {"fp32": 1e9},
        "mem_bw_Bps": 1e9, "memory_bytes": 1e9, "launch_overhead_s": 1e-6,
        "nic_bw_Bps": 1e9, "price_per_hour": 0.0, "power_w": {"idle": 0, "active": 0},
        "source": {"kind": "measured", "date": "2026-11-30"},
    }
    data.update(kw)
    return DeviceProfile.model_validate(data)
