"""How closely the analytic evaluator follows the DES (`python -m bench.agreement`).

Runs the demo cluster (experiments/configs/demo.yaml) over models x sync
modes x pipelining x network sharing with the proportional scheduler, and
prints the steady-state throughput of both evaluators and the analytic
one's relative error. Not a test: the tests pin the cases that must agree.
"""

from __future__ import annotations

import argparse
import itertools

from experiments import runner
from experiments.cli import DEFAULT_CONFIG

MODELS = ("resnet18", "ctr_dnn", "mlp")
SYNCS = (("bsp", 0), ("asp", 0), ("ssp", 0), ("ssp", 3))


def rows(iterations: int = 40) -> list[dict[str, object]]:
    base = runner.load(DEFAULT_CONFIG)
    out = []
    for model, (sync, st), pipe, sharing in itertools.product(MODELS, SYNCS, (False, True), ("fair", "none")):
        data = base.config.model_dump(mode="json")
        data["job"].update(model=model, sync=sync, staleness=st, pipeline=pipe, iterations=iterations)
        data["cluster"]["network"]["sharing"] = sharing
        loaded = runner.from_dict(data, base.base_dir, str(DEFAULT_CONFIG))
        a, _ = runner.run_one(loaded, "analytic", "proportional", trace=False)
        d, _ = runner.run_one(loaded, "des", "proportional", trace=False)
        out.append({"model": model, "sync": f"{sync}({st})" if sync == "ssp" else sync,
                    "pipeline": pipe, "sharing": sharing, "des_sps": d.throughput_sps,
                    "analytic_sps": a.throughput_sps,
                    "rel_error": a.throughput_sps / d.throughput_sps - 1})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=40)
    args = ap.parse_args()
    table = rows(args.iterations)
    print(f"{'model':9} {'sync':7} {'pipeline':8} {'sharing':7} {'des_sps':>11} {'analytic_sps':>12} {'error':>7}")
    for r in table:
        print(f"{r['model']:9} {r['sync']:7} {r['pipeline']!s:8} {r['sharing']:7} {r['des_sps']:11.1f} "
              f"{r['analytic_sps']:12.1f} {r['rel_error']:+7.1%}")
    for label, keep in (("bsp", lambda r: r["sync"] == "bsp"), ("asp/ssp", lambda r: r["sync"] != "bsp")):
        errs = [abs(r["rel_error"]) for r in table if keep(r)]
        print(f"{label}: max |error| {max(errs):.1%}, median {sorted(errs)[len(errs) // 2]:.1%} over {len(errs)} cases")


if __name__ == "__main__":
    main()
