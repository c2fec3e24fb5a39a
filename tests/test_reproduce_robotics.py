"""The robotics reproduction (quick mode): its files, and the exact solver bounding every plan."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments import reproduce_robotics


def test_quick_reproduction_writes_its_report_and_milp_bounds_every_plan(tmp_path: Path) -> None:
    assert reproduce_robotics.main(["--quick", "--out", str(tmp_path)]) == 0
    for f in ("report.md", "energy_deadline.csv", "des.csv", "gaps.csv", "kernels.csv",
              "energy_vs_deadline.png", "deadline_misses.png", "gap_to_optimum.png"):
        assert (tmp_path / f).stat().st_size > 0, f
    ed = pd.read_csv(tmp_path / "energy_deadline.csv")
    for (_, _), d in ed.groupby(["board", "deadline_factor"]):
        opt = d[d.method == "milp"].iloc[0]
        assert opt.proven
        for r in d[d.feasible].itertuples():
            assert opt.energy_mj <= r.energy_mj * (1 + 1e-9), r
    # HEFT ignores energy: it never picks a slower power mode than the fastest it can use
    heft = ed[ed.method == "heft"]
    assert heft.groupby("board")["mode"].nunique().max() == 1
    des = pd.read_csv(tmp_path / "des.csv")
    nominal = des[des.condition == "nominal"]
    assert (nominal.miss_rate == 0).all()  # a plan that meets its deadline meets it every frame
    report = (tmp_path / "report.md").read_text()
    assert "## Gap to the exact optimum" in report and "## Findings" in report
