"""The plan-cost setup of a data-parallel run: each worker's cost rows, as plain lists.

:func:`sim.costmodel.plan_costs` gives a plan's costs as numpy arrays; the DES
reads them per worker and per chunk in its hot paths, where indexing numpy
scalars is slow, so each worker's row is taken once as Python numbers.
A worker runs one share at a time; an online rebalance or a new gradient width
gives it new rows, which it takes from the next iteration it starts.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sim.costmodel import PlanCosts


class WorkerRows(NamedTuple):
    """What one worker's share costs per iteration (lists: one entry per layer group
    for ``fwd``/``bwd``, per chunk for the others)."""

    batch: int  #: samples of its share
    fwd: list[float]  #: forward seconds of each layer group
    bwd: list[float]  #: backward seconds of each layer group
    pull: list[float]  #: parameter bytes of each chunk it pulls
    push: list[float]  #: gradient bytes of each chunk it pushes
    agg: list[float]  #: shard seconds to aggregate its gradient of each chunk
    apply_one: list[float]  #: shard seconds to apply its update of each chunk (ASP/SSP)
    bits: int  #: its gradients' width
    quant: list[float]  #: seconds of each layer group's backward that quantize its gradient


def worker_rows(costs: PlanCosts, bits: int) -> list[WorkerRows]:
    """Each worker's rows of ``costs``, at gradient width ``bits``."""
    G = costs.bwd_s.shape[1]
    quant = np.zeros((len(costs.workers), G))
    if costs.quant_s is not None:
        for c, g in enumerate(costs.chunk_group):
            quant[:, int(g)] += costs.quant_s[:, c]
    return [WorkerRows(int(costs.batch[w]), costs.fwd_s[w].tolist(), costs.bwd_s[w].tolist(),
                       costs.pull_bytes[w].tolist(), costs.push_bytes[w].tolist(),
                       costs.agg_s[w].tolist(), costs.apply_one_s[w].tolist(), bits, quant[w].tolist())
            for w in range(len(costs.workers))]
