"""job.model in a config: zoo name, layer-list file, or a torch factory."""

from pathlib import Path

import pytest

from hardware_profiles.errors import ConfigError
from sim.model_specs import resolve_model


def test_torch_factory_is_extracted_with_its_kwargs():
    # Linear(4, 16): 2*4*16 = 128 FLOPs/sample forward, (4*16 + 16)*4 = 320 param bytes;
    # Linear(16, 2): 2*16*2 = 64 FLOPs, (16*2 + 2)*4 = 136 bytes.
    m = resolve_model({"torch": "tests.factories:two_layer", "input": [4], "kwargs": {"width": 16}},
                      Path("."))
    assert [ly.op for ly in m.layers] == ["gemm", "elementwise", "gemm"]
    assert [ly.fwd_flops for ly in m.layers] == [128.0, 0.0, 64.0]
    assert [ly.param_bytes for ly in m.layers] == [320.0, 0.0, 136.0]
    assert m.input_bytes == 16.0


@pytest.mark.parametrize(("spec", "field", "words"), [
    ({"torch": "tests.factories"}, "job.model.torch", "pkg.module:factory"),
    ({"torch": "tests.nope:two_layer", "input": [4]}, "job.model.torch", "cannot import"),
    ({"torch": "tests.factories:two_layer", "input": [0]}, "job.model.input", "positive ints"),
    ({"torch": "tests.factories:two_layer"}, "job.model.input", "positive ints"),
    ({"torch": "tests.factories:not_a_module", "input": [4]}, "job.model.torch", "nn.Module"),
    ({"torch": "tests.factories:two_layer", "input": [4], "size": 3}, "job.model.size", "unknown field"),
    ({"file": "missing.yaml", "x": 1}, "job.model", "zoo name"),
    ({"torch": "tests.factories:two_layer", "input": [4], "kwargs": {"depth": 2}}, "job.model.kwargs",
     "TypeError"),
    ({"torch": "tests.factories:two_layer", "input": [5]}, "job.model.input", "RuntimeError"),
    ("no_such_model", "job.model", "unknown model"),
])
def test_bad_model_specs_name_the_field(spec, field, words):
    with pytest.raises(ConfigError) as e:
        resolve_model(spec, Path("."), "cfg.yaml")
    assert e.value.file == "cfg.yaml"
    assert e.value.field == field
    assert words in e.value.message
