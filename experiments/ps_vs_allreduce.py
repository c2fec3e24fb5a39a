"""PS or all-reduce, and where each wins: a parameter server with H-PS's features against
collective all-reduce, over models and clusters.

    python -m experiments.ps_vs_allreduce [--out results/ps_vs_allreduce] [--evaluator analytic|des]

Models: a dense CNN (``resnet50``, 102 MB of gradients), a transformer (``transformer``,
207 MB, a third of it its token embedding) and a sparse CTR model (``ctr_dnn``: 166 MB
of embedding tables, 1.4 MB dense). Clusters, each with 10 and with 100 Gbit/s between
machines (the nodes' NICs, the PS shards' and CPU servers' links):

* homogeneous GPUs: two nodes of 4 V100 (NVLink inside, 150 GB/s per GPU per direction);
* mixed GPU types: a node of 4 V100 (NVLink) and a node of 4 T4 (PCIe 3.0, 16 GB/s);
* GPUs plus CPU workers: a node of 4 V100 (NVLink) and 4 CPU servers (``cpu-16c``).

PS: 4 shards on ``cpu-16c`` servers, BSP, with H-PS's features: the ``hps`` allocation
(memory-capped shares in proportion to speed), layer-wise pipelining of pushes and
pulls, and sparse tables moving only the rows a batch touches; a GPU in a node reaches
the shards through its share of the node's NIC. All-reduce: ``job.sync: allreduce``,
DDP-style 25 MiB buckets overlapping the backward, the same ``hps`` shares, ring and
hierarchical (the better one is compared; both are in results.csv). fp32 gradients on
both sides, SGD with momentum (Adam for the transformer). Every worker computes at
the cost model's speed (``sim.costmodel``); throughput is samples per second after
the warm-up, cost the devices' (and shards') price per hour over it.

Writes OUT/report.md, OUT/throughput.png and OUT/results.csv; the first two are committed.
"""

from __future__ import annotations

import argparse
import csv
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments import runner
from experiments.plots import markdown_table, save_figure
from hardware_profiles.fileio import atomic_write

MODELS = {  # label: (zoo model, global batch, optimizer)
    "dense CNN (resnet50)": ("resnet50", 512, "momentum"),
    "transformer": ("transformer", 128, "adam"),
    "sparse CTR (ctr_dnn)": ("ctr_dnn", 8192, "momentum"),
}
NVLINK_GBPS = 1200.0  # V100 NVLink: 150 GB/s per GPU per direction
PCIE3_GBPS = 128.0  # PCIe 3.0 x16: 16 GB/s per direction
SHARDS = 4
LINKS_GBPS = (10.0, 100.0)
ITERATIONS = 20


def cluster(kind: str, gbps: float, allreduce: bool) -> dict[str, Any]:
    """The ``cluster:`` section of a cluster kind with ``gbps`` between machines."""
    node_a = {"name": "v100-node", "devices": ["v100:0-3"], "intra_gbps": NVLINK_GBPS, "nic_gbps": gbps}
    if kind == "homogeneous":
        devices = [{"type": "v100", "count": 8}]
        nodes = [node_a, {"name": "v100-node-2", "devices": ["v100:4-7"], "intra_gbps": NVLINK_GBPS,
                          "nic_gbps": gbps}]
    elif kind == "mixed GPUs":
        devices = [{"type": "v100", "count": 4}, {"type": "t4", "count": 4}]
        nodes = [node_a, {"name": "t4-node", "devices": ["t4:0-3"], "intra_gbps": PCIE3_GBPS, "nic_gbps": gbps}]
    else:  # GPUs + CPUs: each CPU worker a server of its own, on the flat network
        devices = [{"type": "v100", "count": 4}, {"type": "cpu-16c", "count": 4}]
        nodes = [node_a]
    out: dict[str, Any] = {"devices": devices, "nodes": nodes, "network": {"bandwidth_gbps": gbps, "latency_us": 20}}
    if not allreduce:
        out["ps"] = {"shards": SHARDS, "type": "cpu-16c"}
    return out


CLUSTERS = {"homogeneous": "2 nodes x 4 V100", "mixed GPUs": "4 V100 + 4 T4 (two nodes)",
            "GPUs + CPUs": "4 V100 (a node) + 4 CPU servers"}


def config(model: str, kind: str, gbps: float, sync: str, algorithm: str = "ring") -> dict[str, Any]:
    name, batch, opt = MODELS[model]
    job: dict[str, Any] = {"model": name, "global_batch": batch, "iterations": ITERATIONS, "warmup_iterations": 2,
                           "pipeline": True, "sync": sync}
    if sync == "allreduce":
        job.update(allreduce=algorithm, optimizer=opt)
    return {"name": f"{name}-{kind}-{gbps:g}-{sync}", "cluster": cluster(kind, gbps, sync == "allreduce"),
            "job": job, "scheduler": {"name": "hps"}}


def run(cfg: dict[str, Any], evaluator: str) -> dict[str, Any]:
    """Plan with hps and evaluate: throughput, iteration time, price per hour, $ per 1M samples."""
    loaded = runner.from_dict(cfg, Path("."), cfg["name"])
    problem = runner.problem_of(loaded)
    sched, plan = runner.schedule(loaded, problem)
    res = runner.evaluate(problem, plan, evaluator, trace=False, scheduler=sched)
    sps = res.throughput_sps
    price = sum(d.price_per_hour for d in res.devices)
    return {"throughput_sps": sps, "iteration_s": res.summary()["iteration_time_s"]["mean"],
            "price_per_hour": price, "usd_per_Msamples": price / 3600 / sps * 1e6 if sps > 0 else None}


def measure(evaluator: str) -> list[dict[str, Any]]:
    rows = []
    for model in MODELS:
        for kind in CLUSTERS:
            for gbps in LINKS_GBPS:
                ps = run(config(model, kind, gbps, "bsp"), evaluator)
                ring = run(config(model, kind, gbps, "allreduce", "ring"), evaluator)
                hier = run(config(model, kind, gbps, "allreduce", "hierarchical"), evaluator)
                ar, alg = (ring, "ring") if ring["throughput_sps"] >= hier["throughput_sps"] else (hier, "hierarchical")
                rows.append({"model": model, "cluster": kind, "gbps": gbps,
                             "ps_sps": ps["throughput_sps"], "ring_sps": ring["throughput_sps"],
                             "hierarchical_sps": hier["throughput_sps"], "allreduce_sps": ar["throughput_sps"],
                             "allreduce_algorithm": alg, "ps_usd_per_Msamples": ps["usd_per_Msamples"],
                             "allreduce_usd_per_Msamples": ar["usd_per_Msamples"],
                             "ps_price_per_hour": ps["price_per_hour"], "allreduce_price_per_hour": ar["price_per_hour"],
                             "winner": "all-reduce" if ar["throughput_sps"] > ps["throughput_sps"] else "PS",
                             "allreduce_over_ps": ar["throughput_sps"] / ps["throughput_sps"]})
    return rows


def checks(rows: Sequence[dict[str, Any]]) -> list[tuple[str, bool, str]]:
    """The issue's expectations, each as (statement, holds, the numbers)."""
    def pick(model: str | None = None, cluster: str | None = None, gbps: float | None = None) -> list[dict[str, Any]]:
        return [r for r in rows if (model is None or r["model"] == model) and (cluster is None or r["cluster"] == cluster)
                and (gbps is None or r["gbps"] == gbps)]

    def ratios(rs: Sequence[dict[str, Any]], with_model: bool = False) -> str:
        return ", ".join(f"{r['model'] + ', ' if with_model else ''}{r['cluster']} {r['gbps']:g} Gbit/s: "
                         f"x{r['allreduce_over_ps']:.2f}" for r in rs)

    dense_fast = pick("dense CNN (resnet50)", None, 100.0)
    sparse = pick("sparse CTR (ctr_dnn)")
    cpus = pick(None, "GPUs + CPUs")
    return [
        ("all-reduce wins on the dense model over fast (100 Gbit/s) links",
         all(r["winner"] == "all-reduce" for r in dense_fast), ratios(dense_fast)),
        ("PS wins on the sparse CTR model (embeddings)", all(r["winner"] == "PS" for r in sparse), ratios(sparse)),
        ("PS wins on the mixed CPU/GPU cluster", all(r["winner"] == "PS" for r in cpus), ratios(cpus, True)),
    ]


def figure(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(MODELS), figsize=(12, 3.8))
    kinds = list(CLUSTERS)
    for ax, model in zip(axes, MODELS):
        x = np.arange(len(kinds))
        for k, (gbps, sync, color) in enumerate([(10.0, "ps", "#9ecae1"), (10.0, "allreduce", "#fdae6b"),
                                                 (100.0, "ps", "#3182bd"), (100.0, "allreduce", "#e6550d")]):
            vals = [next(r[f"{sync}_sps"] for r in rows if r["model"] == model and r["cluster"] == c
                         and r["gbps"] == gbps) for c in kinds]
            ax.bar(x + (k - 1.5) * 0.2, vals, 0.2, color=color,
                   label=f"{'PS (H-PS)' if sync == 'ps' else 'all-reduce'}, {gbps:g} Gbit/s")
        ax.set_xticks(x)
        ax.set_xticklabels(kinds, fontsize=8)
        ax.set_yscale("log")
        ax.set_title(model, fontsize=9)
        ax.set_ylabel("samples/s")
    axes[0].legend(fontsize=7, loc="lower left")
    fig.suptitle("PS (H-PS: hps shares, layer-wise pipelining) vs all-reduce (25 MiB buckets, overlapped)",
                 fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=110, close=False)
    plt.close(fig)


def report(rows: Sequence[dict[str, Any]], evaluator: str, seconds: float) -> str:
    import pandas as pd

    df = pd.DataFrame([{"model": r["model"], "cluster": r["cluster"], "Gbit/s": f"{r['gbps']:g}",
                        "PS samples/s": round(r["ps_sps"], 1), "all-reduce samples/s": round(r["allreduce_sps"], 1),
                        "algorithm": r["allreduce_algorithm"], "AR / PS": round(r["allreduce_over_ps"], 2),
                        "PS $/M samples": float(f"{r['ps_usd_per_Msamples']:.3g}"),
                        "AR $/M samples": float(f"{r['allreduce_usd_per_Msamples']:.3g}"), "winner": r["winner"]}
                       for r in rows])
    lines = ["# PS vs all-reduce", "",
             f"`python -m experiments.ps_vs_allreduce` ({evaluator} evaluator, {seconds:.0f} s). "
             "The set-up is in the module docstring of `experiments/ps_vs_allreduce.py`: PS = 4 `cpu-16c` "
             "shards with H-PS's features (hps shares, layer-wise pipelining, sparse rows only); all-reduce = "
             "25 MiB buckets overlapping the backward, ring or hierarchical (the faster shown), the same hps "
             "shares; fp32 gradients; clusters: " + "; ".join(f"{k}: {v}" for k, v in CLUSTERS.items())
             + ". Cost: every device's price per hour (the PS shards' too) over the time a million samples take.",
             "", "## The expectations, tested", ""]
    for text, ok, numbers in checks(rows):
        lines.append(f"- {text}: **{'holds' if ok else 'does not hold'}** (all-reduce / PS throughput: {numbers})")
    lines += ["", "## Every case", "", markdown_table(df), "", "![throughput](throughput.png)", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.ps_vs_allreduce", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/ps_vs_allreduce", help="output folder")
    ap.add_argument("--evaluator", default="analytic", choices=("analytic", "des"))
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = measure(args.evaluator)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    figure(rows, out / "throughput.png")
    atomic_write(out / "report.md", report(rows, args.evaluator, time.perf_counter() - t0))
    for text, ok, numbers in checks(rows):
        print(f"{text}: {'holds' if ok else 'does not hold'} ({numbers})")
    print(f"wrote {out}/ (report.md, throughput.png, results.csv)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
