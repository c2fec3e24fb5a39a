"""``--set key.path=value`` (sim/overrides.py): parsing, applying, errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from hardware_profiles.errors import ConfigError
from sim import overrides
from sim.config import read_yaml


def _set(data: object, *items: str) -> object:
    return overrides.apply(data, overrides.parse(items))


def test_values_are_typed_by_yaml() -> None:
    data = _set({}, "a=3", "b=0.5", "c=true", "d=[x, 2]", "e=null", "f=hello", "g='7'", "h=")
    assert data == {"a": 3, "b": 0.5, "c": True, "d": ["x", 2], "e": None, "f": "hello", "g": "7", "h": ""}


def test_nested_keys_lists_and_missing_mappings() -> None:
    data = {"job": {"iterations": 30}, "cluster": {"devices": [{"type": "t4", "count": 1}]}}
    out = _set(data, "job.iterations=5", "cluster.devices.0.count=2", "cluster.devices.-1.type=v100",
               "runtime.checkpoint_every=4")
    assert out == {"job": {"iterations": 5}, "cluster": {"devices": [{"type": "v100", "count": 2}]},
                   "runtime": {"checkpoint_every": 4}}
    assert _set(None, "name=x") == {"name": "x"}  # an empty file


@pytest.mark.parametrize("item, field, message", [
    ("job", "--set", "expected KEY.PATH=VALUE, got 'job'"),
    ("=3", "--set", "expected KEY.PATH=VALUE, got '=3'"),
    ("job..x=1", "--set job..x", "empty part in the key path"),
    ("job.iterations=[1", "--set job.iterations", "malformed YAML value: expected ',' or ']', but got '<stream end>'"),
])
def test_malformed_overrides(item: str, field: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        overrides.parse([item])
    assert (e.value.file, e.value.field, e.value.message) == ("<command line>", field, message)


@pytest.mark.parametrize("item, message", [
    ("job.iterations.x=1", "job.iterations is an integer, not a mapping or a list"),
    ("job.model.x.y=1", "job.model is a string, not a mapping or a list"),
    ("cluster.devices.5.count=1", "cluster.devices has 1 item: no index 5"),
    ("cluster.devices.first.count=1", "cluster.devices is a list: 'first' is not an index"),
    ("cluster.devices.x=1", "cluster.devices is a list: 'x' is not an index"),
])
def test_paths_that_do_not_fit_the_data(item: str, message: str) -> None:
    data = {"job": {"iterations": 30, "model": "mlp"}, "cluster": {"devices": [{"type": "t4"}]}}
    with pytest.raises(ConfigError) as e:
        _set(data, item)
    assert (e.value.file, e.value.field, e.value.message) == ("<command line>", f"--set {item.split('=')[0]}",
                                                             message)


def test_read_yaml_applies_the_overrides_of_that_file_only(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("job: {iterations: 30}\n")
    b.write_text("job: {iterations: 30}\n")
    with overrides.overriding([a], ["job.iterations=4"]):
        assert read_yaml(a) == {"job": {"iterations": 4}}
        assert read_yaml(tmp_path / "." / "a.yaml") == {"job": {"iterations": 4}}  # same file, other spelling
        assert read_yaml(b) == {"job": {"iterations": 30}}
    assert read_yaml(a) == {"job": {"iterations": 30}}  # gone on leaving


def test_a_bad_item_registers_nothing(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    a.write_text("x: 1\n")
    with pytest.raises(ConfigError), overrides.overriding([a], ["x=2", "nonsense"]):
        pass
    assert read_yaml(a) == {"x": 1}
