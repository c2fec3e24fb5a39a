"""Gradient packing on the wire: what a worker sends and what a PS shard unpacks.

A tensor of ``n`` fp32 values at ``bits < 32`` is quantized affinely with a
per-tensor scale and offset (``x ~ offset + q * scale``, ``q`` in
``[0, 2**bits - 1]``, stochastic rounding so the estimate is unbiased), the
``q`` are bit-packed little-end first into ``ceil(n * bits / 8)`` bytes, and the
fp32 scale and offset follow (8 bytes). The size is therefore exactly
:func:`sim.quantization.packed_bytes` ``(n, bits)``, the figure the cost
model charges. At 32 bits the raw fp32 bytes travel (``4 * n``).
"""

from __future__ import annotations

import torch

from sim.quantization import QUANT_META_BYTES, packed_bytes

META_BYTES = int(QUANT_META_BYTES)  # fp32 scale + fp32 offset


def wire_bytes(n: int, bits: int) -> int:
    """Bytes :func:`pack` produces for ``n`` values: :func:`sim.quantization.packed_bytes`."""
    return int(packed_bytes(n, bits))


def _flat(x: torch.Tensor) -> torch.Tensor:
    """``x``'s values as a flat fp32 CPU tensor (no copy where they are one already)."""
    return x.detach().reshape(-1).to(torch.float32, copy=False).cpu()


def pack(x: torch.Tensor, bits: int, gen: torch.Generator | None = None) -> torch.Tensor:
    """Quantize the values of ``x`` to ``bits`` (2, 4, 8, 16 or 32) as a uint8 tensor."""
    flat = _flat(x)
    n = flat.numel()
    if n == 0:
        return torch.empty(0, dtype=torch.uint8)
    if bits == 32:
        return flat.contiguous().view(torch.uint8).clone()
    if bits not in (2, 4, 8, 16):
        raise ValueError(f"bits must be one of 2, 4, 8, 16, 32, got {bits!r}")
    lo, hi = float(flat.min()), float(flat.max())
    levels = (1 << bits) - 1
    scale = (hi - lo) / levels if hi > lo else 1.0
    v = (flat - lo) / scale
    noise = torch.rand(n, generator=gen)
    q = torch.clamp(torch.floor(v + noise), 0, levels).to(torch.int64)
    if bits == 16:
        body = (q - 32768).to(torch.int16).view(torch.uint8)
    else:
        per = 8 // bits
        pad = (-n) % per
        if pad:
            q = torch.cat([q, torch.zeros(pad, dtype=torch.int64)])
        shifts = torch.arange(per, dtype=torch.int64) * bits
        body = (q.view(-1, per) << shifts).sum(dim=1).to(torch.uint8)
    meta = torch.tensor([scale, lo], dtype=torch.float32).view(torch.uint8)
    return torch.cat([body, meta])


def pack_many(xs: list[torch.Tensor], bits: int, gen: torch.Generator | None = None) -> torch.Tensor:
    """``torch.cat([pack(x) for x in xs])``, the same bytes; at 32 bits in one copy."""
    if bits == 32:
        return torch.cat([_flat(x) for x in xs]).view(torch.uint8)
    return torch.cat([pack(x, bits, gen) for x in xs])


def unpack(buf: torch.Tensor, n: int, bits: int) -> torch.Tensor:
    """The fp32 values of a buffer made by :func:`pack` (``n`` values at ``bits``); at 32 bits
    a view of ``buf`` (it shares its memory) unless ``buf`` starts off a 4-byte boundary."""
    if n == 0:
        return torch.empty(0, dtype=torch.float32)
    if buf.numel() != wire_bytes(n, bits):
        raise ValueError(f"buffer holds {buf.numel()} bytes, {wire_bytes(n, bits)} expected")
    if bits == 32:  # a view of buf's bytes where they are 4-aligned: no copy
        return buf.view(torch.float32) if buf.storage_offset() % 4 == 0 else buf.clone().view(torch.float32)
    scale, lo = buf[-META_BYTES:].clone().view(torch.float32).tolist()
    body = buf[:-META_BYTES]
    if bits == 16:
        q = body.clone().view(torch.int16).to(torch.int64) + 32768
    else:
        per = 8 // bits
        shifts = torch.arange(per, dtype=torch.int64) * bits
        q = ((body.to(torch.int64).unsqueeze(1) >> shifts) & ((1 << bits) - 1)).reshape(-1)[:n]
    return q.to(torch.float32) * scale + lo


def unpack_many(buf: torch.Tensor, numels: list[int], bits: int) -> list[torch.Tensor]:
    """The tensors of a buffer made by :func:`pack_many` (``numels[i]`` values each, at
    ``bits``), each unpacked from its slice (at 32 bits views of ``buf``, as :func:`unpack`).

    Raises:
        ValueError: ``buf`` holds another number of bytes.
    """
    want = sum(wire_bytes(n, bits) for n in numels)
    if buf.numel() != want:
        raise ValueError(f"buffer holds {buf.numel()} bytes, {want} expected")
    out, off = [], 0
    for n in numels:
        nb = wire_bytes(n, bits)
        out.append(unpack(buf[off:off + nb], n, bits))
        off += nb
    return out
