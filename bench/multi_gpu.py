"""Multi-GPU scaling: the all-reduce model against the published 8-GPU rows.

    python -m bench.multi_gpu [--table CSV] [--out results/multi_gpu] [--evaluator analytic|des]

Every row of the table with more than one GPU (8x V100 in a DGX-1, 8x A100 in a DGX
A100: ResNet-50 trained data-parallel, NCCL all-reduce over NVLink) is simulated as an
all-reduce plan (``job.sync: allreduce``, ring, 25 MiB buckets overlapping the
backward, as DDP runs it) on one node of its GPUs (:data:`NODES`), each GPU at the
row's batch, with the shipped GPU profile as it is: nothing is fitted to these rows.
For each it prints the predicted and measured 8-GPU throughput and the scaling
efficiency, 8-GPU throughput over 8 x the single-GPU row's (same source, GPU,
precision and batch): predicted over 8 x the predicted single GPU, measured over 8 x
the measured single GPU; the target is the predicted efficiency within 5 points of
the measured one. It also prints what the communication costs per iteration and the
time per iteration the measured efficiency leaves unexplained, and the bandwidth the
all-reduce would need to explain it. Writes OUT/multi_gpu.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibration import published as P
from hardware_profiles import load_profile
from hardware_profiles.errors import ConfigError
from sim.cluster import Cluster, Device, Network, Node
from sim.collective import collective_costs
from sim.evaluate import evaluate
from sim.plan import Plan, PlanKind, Replica, Stage
from sim.problem import Job, Problem

GB = 1e9


@dataclass(frozen=True)
class NodeKind:
    """A multi-GPU server: its GPUs' link to each other (per GPU, per direction) and latency."""

    name: str
    intra_bw_Bps: float
    intra_latency_s: float
    note: str


#: The servers of the table's rows, by hetsim GPU type. NVLink per GPU per direction: half
#: the bidirectional figure (hardware.md: V100 300 GB/s, A100 600 GB/s); a few microseconds
#: a hop, NCCL's order on NVLink.
NODES = {
    "v100": NodeKind("DGX-1 (8x V100 SXM2)", 150 * GB, 5e-6,
                     "NVLink 2.0, hybrid cube-mesh: 6 links x 25 GB/s per direction per GPU"),
    "a100": NodeKind("DGX A100 (8x A100 SXM4)", 300 * GB, 5e-6,
                     "NVLink 3.0 through NVSwitch: 12 links x 25 GB/s per direction per GPU"),
}


def problem_of(row: P.Row, gpus: int, iterations: int = 12) -> tuple[Problem, Plan]:
    """The all-reduce plan of ``row`` on ``gpus`` of its GPUs in one node, each at the row's batch."""
    prof = load_profile(row.profile)
    node = NODES[row.profile]
    devices = tuple(Device(f"{prof.name}:{k}", prof, node.intra_bw_Bps) for k in range(gpus))
    cluster = Cluster(devices, (), Network(node.intra_latency_s), nodes=(
        Node(node.name, tuple(d.id for d in devices), node.intra_bw_Bps, node.intra_latency_s,
             node.intra_bw_Bps, node.intra_latency_s),))
    model = P.row_model(row.model, row.seq_len)
    job = Job(model=model, global_batch=gpus * row.batch, dtype=row.dtype, memory_format=row.memory_format,
              iterations=iterations, sync="allreduce", pipeline=True, warmup_iterations=2,
              optimizer=P.OPTIMIZERS.get(row.model, "momentum"))
    stage = Stage(0, len(model.layers), tuple(Replica(d.id, row.batch) for d in devices), prof.name)
    return Problem(row.id, 0, cluster, job), Plan((stage,), (), "equal", kind=PlanKind.DATA_PARALLEL)


def single_of(row: P.Row, rows: Sequence[P.Row]) -> P.Row | None:
    """The single-GPU row measured alongside ``row``: same id but its GPU count (the table's
    ``...-8`` and ``...-1``), else the same source, GPU, model, precision and batch."""
    stem = row.id.rsplit("-", 1)[0]
    for r in rows:
        if r.gpus == 1 and r.id.rsplit("-", 1)[0] == stem:
            return r
    for r in rows:
        if (r.gpus == 1 and r.profile == row.profile and r.model == row.model and r.dtype == row.dtype
                and r.batch == row.batch and r.device.split("(")[-1] == row.device.split("(")[-1]):
            return r
    return None


def measure(row: P.Row, single: P.Row, evaluator: str) -> dict[str, Any]:
    """The figures of one multi-GPU row (see the module docstring)."""
    res = {}
    for n in (1, row.gpus):
        problem, plan = problem_of(row, n)
        res[n] = evaluate(problem, plan, evaluator, trace=False)
    pred1 = res[1].throughput_sps
    predn = res[row.gpus].throughput_sps
    problem, plan = problem_of(row, row.gpus)
    c = collective_costs(problem, plan)
    comm = c.comm_s(range(row.gpus))
    t1, tn = row.batch / single.measured_sps, row.gpus * row.batch / row.measured_sps
    eff_pred, eff_meas = predn / (row.gpus * pred1), row.measured_sps / (row.gpus * single.measured_sps)
    exposed = float(res[row.gpus].iteration_times()[-1] - res[1].iteration_times()[-1])
    lost = tn - t1  # seconds per iteration the 8 GPUs take beyond one GPU (measured)
    grad_bytes = sum(b.wire_bytes for b in c.buckets)
    # ring bandwidth that would make the whole all-reduce, not overlapped at all, take `lost`
    need = 2 * (row.gpus - 1) / row.gpus * grad_bytes / lost if lost > 0 else None
    return {"id": row.id, "single": single.id, "node": NODES[row.profile].name, "gpus": row.gpus,
            "precision": row.precision, "batch_per_gpu": row.batch, "measured_sps": row.measured_sps,
            "predicted_sps": predn, "measured_single_sps": single.measured_sps, "predicted_single_sps": pred1,
            "efficiency_measured": eff_meas, "efficiency_predicted": eff_pred,
            "efficiency_gap_points": 100 * (eff_pred - eff_meas), "throughput_error": predn / row.measured_sps - 1,
            "allreduce_s": float(comm.sum()), "exposed_comm_s": exposed, "buckets": c.n_buckets,
            "gradient_bytes": grad_bytes, "measured_iteration_1gpu_s": t1, "measured_iteration_s": tn,
            "measured_loss_s": lost, "ring_bw_to_explain_Bps": need}


def report(out: Sequence[dict[str, Any]]) -> str:
    lines = ["| row | node | precision | predicted | measured | error | eff. predicted | eff. measured | gap "
             "(points) | all-reduce / it. | exposed | measured loss / it. | ring BW to explain it |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in out:
        need = r["ring_bw_to_explain_Bps"]
        lines.append(
            f"| {r['id']} | {r['node']} | {r['precision']} | {r['predicted_sps']:.0f} | {r['measured_sps']:.0f} | "
            f"{r['throughput_error']:+.1%} | {r['efficiency_predicted']:.1%} | {r['efficiency_measured']:.1%} | "
            f"{r['efficiency_gap_points']:+.1f} | {1e3 * r['allreduce_s']:.2f} ms | "
            f"{1e3 * r['exposed_comm_s']:.2f} ms | {1e3 * r['measured_loss_s']:.1f} ms | "
            f"{'-' if need is None else f'{need / GB:.1f} GB/s'} |")
    within = sum(abs(r["efficiency_gap_points"]) <= 5 for r in out)
    lines += ["", f"scaling efficiency within 5 points: {within} of {len(out)} rows"]
    return "\n".join(lines) + "\n"


def read_rows(table: str) -> tuple[list[P.Row], list[P.Skipped]] | None:
    """:func:`calibration.published.read_table` of ``table``; None after printing its
    one-line error (bad input: the caller exits 2)."""
    try:
        return P.read_table(table)
    except ConfigError as e:
        print(f"hetsim: error: {e}", file=sys.stderr)
        return None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.multi_gpu", description=__doc__.split("\n")[0])
    ap.add_argument("--table", default=str(P.DEFAULT_TABLE), help="published measurements (CSV)")
    ap.add_argument("--out", default="results/multi_gpu", help="output folder")
    ap.add_argument("--evaluator", default="analytic", choices=("analytic", "des"))
    args = ap.parse_args(argv)
    got = read_rows(args.table)
    if got is None:
        return 2
    rows = got[0]
    out = []
    for row in rows:
        if row.gpus == 1:
            continue
        single = single_of(row, rows)
        if single is None or row.profile not in NODES:
            print(f"skipped {row.id}: " + ("no single-GPU row" if single is None else f"no node of {row.profile}"),
                  file=sys.stderr)
            continue
        out.append(measure(row, single, args.evaluator))
    sys.stdout.write(report(out))
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "multi_gpu.json").write_text(json.dumps({"table": args.table, "evaluator": args.evaluator,
                                                       "nodes": {k: vars(v) for k, v in NODES.items()},
                                                       "rows": out}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
