"""The HeterPS reproduction script on one workload and one target (its full run is a separate command)."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments import reproduce_heterps as rh


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("heterps")
    df = rh.run(out, quick=True, workloads=["ctr_dnn"], methods=["cpu_only", "gpu_only", "greedy", "exact"],
                fractions=[0.35])
    return out, df


def test_rows_and_gaps(small):
    out, df = small
    assert list(df.method) == ["cpu_only", "gpu_only", "greedy", "exact"]
    assert set(df.workload) == {"ctr_dnn"} and set(df.fraction) == {0.35}
    exact = df[df.method == "exact"].iloc[0]
    assert bool(exact.proven) and exact.gap == 0.0
    feasible = df[df.feasible.astype(bool)]
    # nothing beats the proven optimum; each gap is its cost over exact's, minus 1
    assert (feasible.cost_usd >= exact.cost_usd * (1 - 1e-9)).all()
    for r in feasible.itertuples():
        assert r.gap == pytest.approx(r.cost_usd / exact.cost_usd - 1, rel=1e-12, abs=1e-15)
    assert pd.read_csv(out / "results.csv").shape[0] == 4


def test_throughput_table(small):
    out, _ = small
    t = pd.read_csv(out / "throughput.csv").iloc[0]
    # a heterogeneous placement can always do what its best single type does
    assert t.placement_max_sps >= t.single_type_max_sps * (1 - 2e-3)
    assert t.placement_max_sps <= t.upper_bound_sps * (1 + 1e-9)


def test_report_written(small):
    out, df = small
    figs = rh.figures(df, out)
    rh.report(df, out, figs, quick=True, seconds=1.0)
    text = (out / "report.md").read_text()
    assert "| exact |" in text
    # the cost claim is computed from the rows: best single type over exact, one case here
    cost = df[df.feasible.astype(bool)].set_index("method").cost_usd
    ratio = min(cost.get("cpu_only", float("inf")), cost.get("gpu_only", float("inf"))) / cost["exact"]
    assert f"costs {ratio:.2f}x to {ratio:.2f}x (median {ratio:.2f}x) the exact placement" in text
    for f in figs:
        assert (out / f).stat().st_size < 300_000
