"""Device profiles: the shipped files, the loader's search order and its errors."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from hardware_profiles import (
    BUILTIN_DIR,
    DeviceProfile,
    EfficiencyCurve,
    list_profiles,
    load_profile,
    load_profile_file,
)
from hardware_profiles.errors import ConfigError
from sim.precision import MathMode, PrecisionError, math_mode

SHIPPED = ["cpu-2c", "cpu-8c", "cpu-16c", "t4", "l4", "a10g", "v100", "a100", "h100", "h200"]


def _valid(name: str = "mydev", **over: object) -> dict:
    d: dict = {
        "schema": 1,
        "name": name,
        "kind": "gpu",
        "peak_flops": {"fp32": 10e12, "fp16": 40e12},
        "mem_bw_Bps": 500e9,
        "memory_bytes": 16e9,
        "launch_overhead_s": 5e-6,
        "efficiency": {"gemm": 0.7},
        "nic_bw_Bps": 1.25e9,
        "price_per_hour": 1.0,
        "power_w": {"idle": 10, "active": 100},
        "source": {"kind": "datasheet", "note": "test", "date": "2026-11-30"},
    }
    d.update(over)
    return d


def _write(folder: Path, stem: str, data: dict | str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / f"{stem}.json"
    p.write_text(data if isinstance(data, str) else json.dumps(data, indent=2))
    return p


def _err(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_profile_file(path)
    e = info.value
    assert "\n" not in str(e)
    return e


# --- shipped profiles -------------------------------------------------------


@pytest.mark.parametrize("name", list_profiles())
def test_shipped_profile_loads_and_name_is_stem(name: str) -> None:
    p = load_profile(name)
    assert isinstance(p, DeviceProfile)
    assert p.name == name
    path = BUILTIN_DIR / f"{name}.json"
    if not path.exists():
        path = BUILTIN_DIR / "measured" / f"{name}.json"
    assert path.stem == p.name
    assert load_profile_file(path) == p
    assert p.peak("fp32") > 0
    # JSON round trip of the stable format.
    again = DeviceProfile.model_validate_json(p.model_dump_json(by_alias=True, exclude_none=True))
    assert again == p


def test_all_datasheet_profiles_are_shipped() -> None:
    assert set(SHIPPED) <= set(list_profiles())
    assert list_profiles() == sorted(list_profiles())


@pytest.mark.parametrize("name", SHIPPED)
def test_datasheet_profile_provenance(name: str) -> None:
    p = load_profile(name)
    assert p.source.date == "2026-11-30"
    assert p.kind == ("cpu" if name.startswith("cpu-") else "gpu")
    assert set(p.efficiency) == {"gemm", "conv", "attention", "embedding", "elementwise"}
    assert p.power_w.idle < p.power_w.active
    if p.kind == "cpu":  # datasheet figures and uncalibrated defaults
        assert p.source.kind == "datasheet" and "hetsim calibrate" in p.source.note
        assert p.launch_overhead_s == 1e-6
        assert all(0 < float(e) <= 1 for e in p.efficiency.values())
    else:  # datasheet figures plus the parameters fitted to published measurements
        assert p.source.kind == "fitted" and "python -m calibration.published --write" in p.source.fit
        assert p.corrections.wave_quantization is not None and p.corrections.layout_transpose is not None
        assert set(p.math_efficiency or {}) == set(p.peak_flops) - {"fp32"}


# (name, fp32, fp16, mem_bw_Bps, memory_bytes, TDP W, price USD/h): hardware.md
GPU_FIGURES = [
    ("t4", 8.1e12, 65e12, 320e9, 16e9, 70, 0.526),
    ("l4", 30.3e12, 121e12, 300e9, 24e9, 72, None),
    ("a10g", 31.2e12, 125e12, 600e9, 24e9, 150, 1.006),
    ("v100", 15.7e12, 125e12, 900e9, 16e9, 300, 3.06),
    ("a100", 19.5e12, 312e12, 1.555e12, 40e9, 400, 2.75),
    ("h100", 66.9e12, 989e12, 3.35e12, 80e9, 700, 12.3),
    ("h200", 67e12, 989e12, 4.8e12, 141e9, 700, None),
]


@pytest.mark.parametrize("name,fp32,fp16,bw,mem,tdp,price", GPU_FIGURES)
def test_gpu_figures_equal_hardware_md(name, fp32, fp16, bw, mem, tdp, price) -> None:
    p = load_profile(name)
    assert p.peak_flops["fp32"] == fp32
    assert p.peak_flops["fp16"] == fp16
    assert p.mem_bw_Bps == bw
    assert p.memory_bytes == mem
    assert p.power_w.active == tdp
    if price is not None:
        assert p.price_per_hour == price
    else:  # not in hardware.md: an estimate, and the note says so
        assert "estimate" in p.source.note


def test_specific_figures() -> None:
    v100 = load_profile("v100")
    assert v100.peak_flops["fp32"] == 15.7e12
    assert v100.mem_bw_Bps == 900e9
    assert v100.price_per_hour == 3.06
    assert v100.nic_bw_Bps == 10e9 / 8  # p3.2xlarge 10 Gbps
    assert load_profile("t4").peak_flops["fp16"] == 65e12
    assert load_profile("a100").nic_bw_Bps == 400e9 / 8 / 8  # p4d 400 Gbps over 8 GPUs
    assert load_profile("h100").nic_bw_Bps == 3200e9 / 8 / 8  # p5 3200 Gbps over 8 GPUs
    for name in ("a100", "h100", "h200", "l4", "a10g"):  # bf16 and TF32 tensor cores
        p = load_profile(name)
        assert p.peak("bf16") == p.peak_flops["fp16"]
        assert math_mode(p, "bf16") == MathMode("bf16", "bf16") == MathMode("bf16", "bf16", None)
        assert math_mode(p, "tf32").mode == "tf32" and p.peak("tf32") == pytest.approx(p.peak_flops["fp16"] / 2, rel=0.01)
    for name in ("t4", "v100"):  # no bf16 or TF32 tensor cores: fp32 rate, said in a note
        p = load_profile(name)
        for dtype in ("bf16", "tf32"):
            assert math_mode(p, dtype) == MathMode(dtype, "fp32", f"{name} has no {dtype} math: {dtype} "
                                                   "matmuls run as fp32")
    assert load_profile("a100").peak("tf32") == 156e12


@pytest.mark.parametrize("name,vcpu,price", [("cpu-2c", 2, 0.085), ("cpu-8c", 8, 0.34), ("cpu-16c", 16, 0.68)])
def test_cpu_profiles(name: str, vcpu: int, price: float) -> None:
    p = load_profile(name)
    assert p.price_per_hour == price
    assert math.isclose(p.price_per_hour, 0.0425 * vcpu, rel_tol=1e-12)
    assert p.peak_flops == {"fp32": 96e9 * vcpu}
    assert {math_mode(p, d).mode for d in ("tf32", "fp16", "bf16")} == {"fp32"}
    assert math.isclose(p.mem_bw_Bps, 3.2e9 * vcpu, rel_tol=1e-12)
    assert p.memory_bytes == 2 * 2**30 * vcpu
    assert math.isclose(p.power_w.active, 300 / 64 * vcpu, rel_tol=1e-12)


# --- search order, listing, cache ------------------------------------------


def test_user_folder_shadows_builtin(tmp_path: Path) -> None:
    user = tmp_path / "my_profiles"
    _write(user, "v100", _valid("v100", price_per_hour=9.99))
    _write(user, "only-mine", _valid("only-mine"))
    assert load_profile("v100", [user]).price_per_hour == 9.99
    assert load_profile("v100").price_per_hour == 3.06
    assert load_profile("t4", [user]).peak_flops["fp16"] == 65e12  # falls through
    assert load_profile("only-mine", [user]).name == "only-mine"
    names = list_profiles([user])
    assert "only-mine" in names and "v100" in names and names == sorted(set(names))
    assert "only-mine" not in list_profiles()


def test_first_search_dir_wins(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _write(a, "dev", _valid("dev", price_per_hour=1.0))
    _write(b, "dev", _valid("dev", price_per_hour=2.0))
    assert load_profile("dev", [a, b]).price_per_hour == 1.0
    assert load_profile("dev", [b, a]).price_per_hour == 2.0
    assert load_profile("dev", [str(b)]).price_per_hour == 2.0


def test_cache_rereads_changed_file(tmp_path: Path) -> None:
    p = _write(tmp_path, "dev", _valid("dev", price_per_hour=1.0))
    first = load_profile_file(p)
    assert load_profile_file(p) is first
    _write(tmp_path, "dev", _valid("dev", price_per_hour=22.0))
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert load_profile_file(p).price_per_hour == 22.0


# --- EfficiencyCurve, peak(), eff() ----------------------------------------


def test_efficiency_curve_at() -> None:
    c = EfficiencyCurve(flops=[1e6, 1e8], eff=[0.2, 0.6])
    assert c.at(1e3) == 0.2  # clamped below
    assert c.at(1e6) == 0.2
    assert c.at(1e8) == 0.6
    assert c.at(1e12) == 0.6  # clamped above
    assert abs(c.at(1e7) - 0.4) < 1e-12  # midpoint in log space
    assert abs(c.at(10**6.5) - 0.3) < 1e-12  # quarter point in log space
    three = EfficiencyCurve(flops=[1e3, 1e5, 1e6], eff=[0.1, 0.5, 0.9])
    assert abs(three.at(1e4) - 0.3) < 1e-12
    assert abs(three.at(10**5.5) - 0.7) < 1e-12
    one = EfficiencyCurve(flops=[1e6], eff=[0.5])
    assert one.at(1.0) == 0.5 and one.at(1e9) == 0.5


def test_schema_1_profiles_keep_their_precision_fallbacks() -> None:
    # schema 1 let fp16 and bf16 stand in for each other, then fp32; migration writes that
    # down as math_fallback, so a schema 1 file runs every precision as it did
    def modes(peaks: dict) -> dict:
        p = DeviceProfile.model_validate(_valid(peak_flops=peaks))
        return {d: math_mode(p, d).mode for d in ("fp32", "tf32", "fp16", "bf16")}

    assert modes({"fp32": 1e12, "fp16": 4e12, "bf16": 5e12}) == {
        "fp32": "fp32", "tf32": "fp32", "fp16": "fp16", "bf16": "bf16"}
    assert modes({"fp32": 1e12, "fp16": 4e12}) == {"fp32": "fp32", "tf32": "fp32", "fp16": "fp16", "bf16": "fp16"}
    assert modes({"fp32": 1e12, "bf16": 3e12}) == {"fp32": "fp32", "tf32": "fp32", "fp16": "bf16", "bf16": "bf16"}
    assert modes({"fp32": 1e12}) == {"fp32": "fp32", "tf32": "fp32", "fp16": "fp32", "bf16": "fp32"}


def test_a_schema_2_profile_without_a_peak_or_a_fallback_cannot_run_the_precision() -> None:
    p = DeviceProfile.model_validate(_valid(schema=2, peak_flops={"fp32": 1e12, "fp16": 4e12}))
    assert math_mode(p, "fp16").mode == "fp16"
    with pytest.raises(PrecisionError, match="'mydev' has no peak_flops.tf32 and no math_fallback.tf32"):
        math_mode(p, "tf32")
    with pytest.raises(KeyError):
        p.peak("tf32")


@pytest.mark.parametrize(("over", "where"), [
    ({"math_fallback": {"fp32": "fp16"}}, "math_fallback.fp32: not a precision with a fallback"),
    ({"math_fallback": {"fp16": "fp32"}}, "math_fallback.fp16: peak_flops has fp16"),
    ({"math_fallback": {"tf32": "bf16"}}, "math_fallback.tf32: 'bf16' is not a peak_flops entry"),
    ({"math_efficiency": {"tf32": {"gemm": 0.5}}}, "math_efficiency.tf32: peak_flops has no tf32"),
    ({"math_efficiency": {"fp32": {"gemm": 0.5}}}, "math_efficiency.fp32: not a math mode"),
    ({"peak_flops": {"fp32": 1e12, "fp16": 4e12, "bf16": 4e12}, "math_efficiency": {"fp16": {"gemm": 0.5}}},
     "math_efficiency.bf16: incomplete"),
    ({"math_efficiency": {"fp16": {"lstm": 0.5}}}, "math_efficiency.fp16.lstm: unknown op class"),
])
def test_math_mode_tables_are_checked(over: dict, where: str) -> None:
    with pytest.raises(ValueError, match=where.replace(".", r"\.").replace("(", r"\(")):
        DeviceProfile.model_validate(_valid(schema=2, **over))


def test_eff_reads_the_math_mode_table_then_efficiency() -> None:
    p = DeviceProfile.model_validate(_valid(schema=2, efficiency={"gemm": 0.7, "conv": 0.6},
                                            math_efficiency={"fp16": {"gemm": 0.4}}))
    assert p.eff("gemm", 1e9, mode="fp16") == 0.4
    assert p.eff("conv", 1e9, mode="fp16") == 0.6  # the mode's table lacks conv: efficiency's
    assert p.eff("gemm", 1e9) == 0.7 and p.eff("gemm", 1e9, phase="bwd", mode="fp16") == 0.4
    assert p.eff_key("gemm", mode="fp16") == "gemm" and p.eff_key("attention", mode="fp16") is None


def test_eff_per_op_class() -> None:
    p = DeviceProfile.model_validate(
        _valid(efficiency={"gemm": 0.7, "conv": {"flops": [1e6, 1e8], "eff": [0.2, 0.6]}})
    )
    assert p.eff("gemm", 1e9) == 0.7
    assert isinstance(p.efficiency["conv"], EfficiencyCurve)
    assert abs(p.eff("conv", 1e7) - 0.4) < 1e-12
    assert p.eff("embedding", 1e7) == 1.0  # missing op class: 1.0
    bare = _valid()
    del bare["efficiency"]
    assert DeviceProfile.model_validate(bare).eff("gemm", 1.0) == 1.0


# --- errors: one line naming file and field --------------------------------


def test_unknown_name() -> None:
    with pytest.raises(ConfigError) as info:
        load_profile("nope", source="configs/x.yaml", field="cluster.devices[1].type")
    e = info.value
    assert (e.file, e.field) == ("configs/x.yaml", "cluster.devices[1].type")
    assert "unknown device type 'nope'" in e.message
    assert "known: " + ", ".join(list_profiles()) in e.message
    assert "\n" not in str(e)


def test_unknown_name_defaults_and_user_names(tmp_path: Path) -> None:
    _write(tmp_path, "mine", _valid("mine"))
    with pytest.raises(ConfigError) as info:
        load_profile("nope", [tmp_path])
    assert (info.value.file, info.value.field) == ("<config>", "type")
    assert "mine" in info.value.message


@pytest.mark.parametrize("name", ["../v100", "sub/v100", ".hidden", "", "v100.json"])
def test_path_like_names_are_unknown(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_profile(name, source="c.yaml")
    assert (info.value.file, info.value.field) == ("c.yaml", "type")


def test_missing_search_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_profile("v100", [tmp_path / "absent"], source="c.yaml")
    assert (info.value.file, info.value.field) == ("c.yaml", "profiles")


def test_malformed_json(tmp_path: Path) -> None:
    p = _write(tmp_path, "bad", '{\n  "schema": 1,\n  "name": "bad",,\n}\n')
    e = _err(p)
    assert (e.file, e.field) == (str(p), "line 3")
    assert "invalid JSON" in e.message


def test_malformed_json_through_search(tmp_path: Path) -> None:
    p = _write(tmp_path, "bad", "{")
    with pytest.raises(ConfigError) as info:
        load_profile("bad", [tmp_path], source="c.yaml")
    assert (info.value.file, info.value.field) == (str(p), "line 1")


def test_not_an_object(tmp_path: Path) -> None:
    e = _err(_write(tmp_path, "arr", "[1, 2]"))
    assert e.field == ""
    assert "JSON object" in e.message


def test_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "absent.json"
    e = _err(p)
    assert (e.file, e.field) == (str(p), "")


def test_missing_required_field(tmp_path: Path) -> None:
    d = _valid("dev")
    del d["mem_bw_Bps"]
    p = _write(tmp_path, "dev", d)
    e = _err(p)
    assert (e.file, e.field) == (str(p), "mem_bw_Bps")
    assert e.message == "required field missing"


def test_negative_mem_bw(tmp_path: Path) -> None:
    p = _write(tmp_path, "dev", _valid("dev", mem_bw_Bps=-1))
    e = _err(p)
    assert (e.file, e.field) == (str(p), "mem_bw_Bps")
    assert "greater than 0" in e.message


def test_infinite_value_rejected(tmp_path: Path) -> None:
    text = json.dumps(_valid("dev")).replace('"mem_bw_Bps": 500000000000.0', '"mem_bw_Bps": Infinity')
    assert "Infinity" in text
    e = _err(_write(tmp_path, "dev", text))
    assert e.field == "mem_bw_Bps"


def test_unknown_dtype(tmp_path: Path) -> None:
    p = _write(tmp_path, "dev", _valid("dev", peak_flops={"fp32": 1e12, "fp64": 5e11}))
    e = _err(p)
    assert (e.file, e.field) == (str(p), "peak_flops")
    assert "unknown dtype 'fp64'" in e.message


def test_fp32_required(tmp_path: Path) -> None:
    p = _write(tmp_path, "dev", _valid("dev", peak_flops={"fp16": 1e12}))
    e = _err(p)
    assert (e.file, e.field) == (str(p), "peak_flops")
    assert "fp32" in e.message


def test_unknown_field(tmp_path: Path) -> None:
    p = _write(tmp_path, "dev", _valid("dev", mem_bandwidth=1e9))
    e = _err(p)
    assert (e.file, e.field) == (str(p), "mem_bandwidth")
    assert e.message == "unknown field"


def test_name_differs_from_stem(tmp_path: Path) -> None:
    p = _write(tmp_path, "dev", _valid("other"))
    e = _err(p)
    assert (e.file, e.field) == (str(p), "name")
    assert "'other'" in e.message and "'dev'" in e.message


@pytest.mark.parametrize(
    "over,field",
    [
        ({"power_w": {"idle": -1, "active": 100}}, "power_w.idle"),
        ({"power_w": {"idle": 200, "active": 100}}, "power_w"),
        ({"efficiency": {"gemm": 2.0}}, "efficiency.gemm"),
        ({"efficiency": {"gemm": "fast"}}, "efficiency.gemm"),
        ({"efficiency": {"gemm": {"flops": [1e6, 1e8], "eff": [0.2, 3]}}}, "efficiency.gemm"),
        ({"efficiency": {"gemm": {"flops": [1e6, 1e8]}}}, "efficiency.gemm.eff"),
        ({"efficiency": {"matmul": 0.5}}, "efficiency"),
        ({"kind": "tpu"}, "kind"),
        ({"schema": 3}, "schema"),
        ({"source": {"kind": "guess"}}, "source.kind"),
        ({"peak_flops": {"fp32": "lots"}}, "peak_flops.fp32"),
    ],
)
def test_nested_field_locations(tmp_path: Path, over: dict, field: str) -> None:
    p = _write(tmp_path, "dev", _valid("dev", **over))
    e = _err(p)
    assert (e.file, e.field) == (str(p), field)
    assert e.message and not e.message.startswith("Value error")
