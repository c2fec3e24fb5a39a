"""experiments.ps_vs_allreduce: its configs, one case end to end, and the expectations' verdicts."""

from __future__ import annotations

from experiments import ps_vs_allreduce as pva
from sim.config import config_from_dict


def test_every_config_is_valid_and_only_the_ps_side_has_shards() -> None:
    for model in pva.MODELS:
        for kind in pva.CLUSTERS:
            for sync in ("bsp", "allreduce"):
                cfg = config_from_dict(pva.config(model, kind, 10.0, sync, "hierarchical"), "x")
                dumped = cfg.model_dump(mode="json")
                assert ("ps" in dumped["cluster"]) == (sync == "bsp")
                assert dumped["cluster"]["nodes"][0]["devices"] == ["v100:0-3"]


def test_dense_cnn_over_10_gbits_between_two_nvlink_nodes() -> None:
    # resnet50's 102 MB of gradients: 4 PS shards behind 10 Gbit/s links against a ring that
    # crosses the NICs only between the two nodes: all-reduce is the faster
    model = "dense CNN (resnet50)"
    ps = pva.run(pva.config(model, "homogeneous", 10.0, "bsp"), "analytic")
    hier = pva.run(pva.config(model, "homogeneous", 10.0, "allreduce", "hierarchical"), "analytic")
    assert hier["throughput_sps"] > 2 * ps["throughput_sps"]
    assert hier["usd_per_Msamples"] < ps["usd_per_Msamples"]


def test_verdicts_follow_the_winners() -> None:
    def row(model: str, cluster: str, gbps: float, winner: str, ratio: float) -> dict:
        return {"model": model, "cluster": cluster, "gbps": gbps, "winner": winner, "allreduce_over_ps": ratio}

    dense, ctr = "dense CNN (resnet50)", "sparse CTR (ctr_dnn)"
    rows = [row(dense, "homogeneous", 100.0, "all-reduce", 1.5), row(dense, "GPUs + CPUs", 100.0, "PS", 0.9),
            row(ctr, "homogeneous", 10.0, "PS", 0.1)]
    (d, d_ok, d_nums), (s, s_ok, _), (c, c_ok, c_nums) = pva.checks(rows)
    assert (d_ok, s_ok, c_ok) == (False, True, True)
    assert d_nums == "homogeneous 100 Gbit/s: x1.50, GPUs + CPUs 100 Gbit/s: x0.90"
    assert c_nums == "dense CNN (resnet50), GPUs + CPUs 100 Gbit/s: x0.90"
