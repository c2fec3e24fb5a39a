"""Schema 1 profile data to schema 2: :func:`migrate_v1`.

Schema 1 kept the cost model's corrections as top-level fields of the profile and
its measurements (``spread``, ``raw``) beside them; schema 2 lists the corrections
under ``corrections: {name: parameters}`` (:mod:`hardware_profiles.corrections`) and
the measurements under ``measurement``. A migrated profile prices every pass exactly
as the schema 1 one did. :class:`hardware_profiles.schema.DeviceProfile` migrates
schema 1 data when it validates it, so the loader reads both.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import TypeAdapter, ValidationError

#: Schema 1 priced a GEMM by its ``gemm/rowsM`` efficiency curve alone (no memory term)
#: for M = 1 ... 4 wherever the profile had that curve: schema 2's ``skinny_gemm``.
_V1_RATE_KIND = re.compile(r"^gemm/rows[1-4]$")

_BOOL = TypeAdapter(bool)

#: Schema 1 fields that schema 2 keeps elsewhere.
V1_FIELDS = ("call_overhead_s", "call_overhead_bwd_s", "row_cost_s", "row_cost_bwd_s", "layer_glue_s",
             "cold_call_s", "cold_window", "dense_sparse_grad", "weight_grad_only_bwd", "spread", "raw")


def _phases(fwd: Any, bwd: Any) -> dict[str, Any] | None:
    """``{"fwd": fwd, "bwd": bwd}`` without the missing ones; None when both are."""
    out = {k: v for k, v in (("fwd", fwd), ("bwd", bwd)) if v is not None}
    return out or None


def migrate_v1(data: dict[str, Any]) -> dict[str, Any]:
    """The schema 2 form of schema 1 profile ``data`` (a new dict; ``data`` is not changed).

    ``call_overhead_s`` / ``call_overhead_bwd_s`` -> ``corrections.call_overhead.fwd`` /
    ``.bwd``; ``row_cost_s`` / ``row_cost_bwd_s`` -> ``corrections.row_cost``;
    ``layer_glue_s`` -> ``corrections.glue``; ``cold_call_s`` and ``cold_window`` (1
    when missing) -> ``corrections.cold_calls.curves`` and ``.window`` (a
    ``cold_window`` without ``cold_call_s`` priced nothing and is dropped);
    ``dense_sparse_grad`` / ``weight_grad_only_bwd`` true -> the correction of that
    name, listed without parameters (false: not listed); ``skinny_gemm`` listed where
    ``efficiency`` or ``efficiency_bwd`` has a ``gemm/rows1`` ... ``gemm/rows4`` curve
    (schema 1 priced those by compute alone); ``spread`` and ``raw`` ->
    ``measurement``; the precisions schema 1 ran without a peak of their own (fp16 and
    bf16 stood in for each other, else fp32; tf32 at fp32) -> ``math_fallback``. Every
    other field is kept as it is; ``schema`` becomes 2.

    Raises:
        ValueError: ``data`` also has ``corrections`` or ``measurement`` (schema 2
            fields: such data must say ``"schema": 2``).
    """
    for k in ("corrections", "measurement"):
        if k in data:
            raise ValueError(f"{k!r} is a schema 2 field: give \"schema\": 2")
    out = {k: v for k, v in data.items() if k not in V1_FIELDS}
    out["schema"] = 2
    corr: dict[str, Any] = {}
    if (v := _phases(data.get("call_overhead_s"), data.get("call_overhead_bwd_s"))) is not None:
        corr["call_overhead"] = v
    if (v := _phases(data.get("row_cost_s"), data.get("row_cost_bwd_s"))) is not None:
        corr["row_cost"] = v
    if data.get("layer_glue_s") is not None:
        corr["glue"] = data["layer_glue_s"]
    if data.get("cold_call_s") is not None:
        corr["cold_calls"] = {"window": data.get("cold_window") or 1, "curves": data["cold_call_s"]}
    tables = [t for t in (data.get("efficiency"), data.get("efficiency_bwd")) if isinstance(t, dict)]
    if any(_V1_RATE_KIND.match(str(k)) for t in tables for k in t):
        corr["skinny_gemm"] = {}
    for flag in ("dense_sparse_grad", "weight_grad_only_bwd"):
        if data.get(flag) is not None:
            try:  # as schema 1 read it: a bool in pydantic's lax mode (true, 1, "yes", ...)
                on = _BOOL.validate_python(data[flag])
            except ValidationError:
                corr[flag] = data[flag]  # not a bool: left for the schema to reject, named
                continue
            if on:
                corr[flag] = {}
    fallback = _v1_fallback(data.get("peak_flops"))
    if fallback:
        out["math_fallback"] = fallback
    if corr:
        out["corrections"] = corr
    meas = {k: data[k] for k in ("spread", "raw") if data.get(k) is not None}
    if meas:
        out["measurement"] = meas
    return out


def _v1_fallback(peaks: Any) -> dict[str, str]:
    """Schema 1's implied fallback of the precisions a profile has no peak for: fp16 and
    bf16 stood in for each other, everything else (tf32 did not exist) ran at fp32."""
    if not isinstance(peaks, dict) or "fp32" not in peaks:
        return {}  # left for the schema to reject
    out = {}
    for mode, alt in (("tf32", None), ("fp16", "bf16"), ("bf16", "fp16")):
        if mode not in peaks:
            out[mode] = alt if alt is not None and alt in peaks else "fp32"
    return out
