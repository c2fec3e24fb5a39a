"""Zoo models built with other sizes (calibration/model_variants.py): labels, layers, and the
per-layer tables a profile makes of their timings, keyed as the validation's DES prices them."""

from __future__ import annotations

import pytest

from calibration import model_variants
from calibration.calibrate import layer_tables
from experiments import validate
from sim import zoo
from sim.costmodel import table_key

SMALL_RESNET = {"size": 32, "classes": 10}


def test_labels_are_the_name_then_sorted_compact_json() -> None:
    assert model_variants.label("resnet18", SMALL_RESNET) == 'resnet18{"classes":10,"size":32}'
    assert model_variants.label("ctr_dnn", {"hidden": (256, 128)}) == 'ctr_dnn{"hidden":[256,128]}'
    assert model_variants.label("mlp", {}) == "mlp{}"  # the runtime's module at the default sizes
    assert model_variants.label("mlp") == "mlp"  # the zoo's committed layer list
    assert model_variants.parse('resnet18{"classes":10,"size":32}') == ("resnet18", SMALL_RESNET)
    assert model_variants.parse("mlp{}") == ("mlp", {}) and model_variants.parse("mlp") == ("mlp", {})
    with pytest.raises(ValueError, match="unknown zoo model 'nosuch'"):
        model_variants.parse("nosuch{}")
    with pytest.raises(ValueError):
        model_variants.parse('mlp{"a":')


def test_a_variant_is_the_runtimes_module_with_dense_tables() -> None:
    plain, small = model_variants.model("resnet18"), model_variants.model(model_variants.label("resnet18", SMALL_RESNET))
    assert plain is zoo.get("resnet18")
    assert len(small.layers) == len(plain.layers)
    # 32x32 images: every activation is (224/32)^2 = 49 times smaller than at 224x224
    assert small.layers[0].activation_bytes * 49 == pytest.approx(plain.layers[0].activation_bytes)
    assert any(ly.sparse is not None for ly in zoo.get("ctr_dnn").layers)
    assert all(ly.sparse is None for ly in model_variants.model("ctr_dnn{}").layers)


def test_tables_of_a_variant_key_the_layers_validate_prices(tmp_path: object) -> None:
    """A raw profile entry of the v5 config's model (resnet18 on 32x32 images, 10 classes)
    gives one table per signature of validate's exact model; each at the timed batch."""
    config = validate.SUITE_DIR / "v5_resnet18_2w_bsp_q16.yaml"
    _, _, opts, problem = validate.load(config)
    text = model_variants.label("resnet18", opts.model_kwargs)
    m = model_variants.model(text)
    raw = {"models": {text: [{"batch": 8, "layers": {ly.name: [1e-3 * (i + 1), 2e-3 * (i + 1)]
                                                      for i, ly in enumerate(m.layers)}}]}}
    tables = layer_tables(raw)
    exact = problem.job.model
    keys = {table_key(ly, exact.input_bytes_of(i)) for i, ly in enumerate(exact.layers)}
    assert set(tables) == keys
    first = table_key(exact.layers[0], exact.input_bytes_of(0))
    assert tables[first].batch == [8] and tables[first].fwd_s == [1e-3] and tables[first].bwd_s == [2e-3]


def test_fresh_models_time_each_configs_model_at_half_once_and_twice_its_share() -> None:
    got = validate.fresh_models([validate.SUITE_DIR / "v5_resnet18_2w_bsp_q16.yaml",
                                 validate.SUITE_DIR / "v1_mlp_2w_bsp.yaml", validate.SUITE_DIR / "v7_mlp_4w_asp_q8.yaml"])
    # v5: 16 samples over 2 workers; v1: 128 over 2 and v7: 256 over 4, both 64 a worker
    assert got == {'resnet18{"classes":10,"size":32}': (4, 8, 16), "mlp{}": (32, 64, 128)}
