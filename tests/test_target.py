"""What ``prescreen warm`` compiles: shapes, spec files, targets, Inductor config overrides."""

from __future__ import annotations

import pytest

from prescreen.errors import ConfigError
from prescreen.target import (
    ShapeRange,
    build,
    load_spec,
    load_target,
    parse_inductor_config,
    parse_shape,
    shape_points,
)


def test_parse_shape_forms_and_errors() -> None:
    assert parse_shape("batch=1..4096") == ShapeRange("batch", 1, 4096)
    assert parse_shape(" seq = 64 ") == ShapeRange("seq", 64, 64)
    for bad in ("batch", "batch=10..2", "batch=0..4", "9x=1..2", "batch=a..b"):
        with pytest.raises(ConfigError, match="invalid shape"):
            parse_shape(bad)


def test_points_are_geometric_with_both_ends() -> None:
    assert ShapeRange("b", 1, 4096).points(2) == (1, 4096)
    assert ShapeRange("b", 1, 4096).points(3) == (1, 64, 4096)
    assert ShapeRange("b", 8, 8).points(3) == (8,)
    grid = list(shape_points((ShapeRange("b", 1, 4), ShapeRange("s", 16, 16)), 2))
    assert grid == [{"b": 1, "s": 16}, {"b": 4, "s": 16}]


def test_load_spec_toml_and_json(tmp_path) -> None:
    toml = tmp_path / "warm.toml"
    toml.write_text('target = "m:f"\nratio = 0.5\n[shapes]\nbatch = "1..64"\nseq = { min = 16, max = 2048 }\n')
    spec = load_spec(toml)
    assert spec["target"] == "m:f" and spec["ratio"] == 0.5
    assert spec["shapes"] == (ShapeRange("batch", 1, 64), ShapeRange("seq", 16, 2048))
    js = tmp_path / "warm.json"
    js.write_text('{"target": "m:f", "shapes": {"batch": "2..8"}}')
    assert load_spec(js)["shapes"] == (ShapeRange("batch", 2, 8),)


def test_load_spec_errors_name_the_file(tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("target = ")
    with pytest.raises(ConfigError, match="bad.toml.*not valid TOML"):
        load_spec(bad)
    with pytest.raises(ConfigError, match="cannot read spec"):
        load_spec(tmp_path / "missing.json")
    shapes = tmp_path / "s.json"
    shapes.write_text('{"shapes": {"batch": "9..1"}}')
    with pytest.raises(ConfigError, match="min 9 is greater than max 1"):
        load_spec(shapes)


def test_load_target_and_build(tmp_path) -> None:
    f = tmp_path / "t.py"
    f.write_text("def make(batch=2, device='cpu'):\n    return (lambda x: x * 2), [batch]\n")
    fn = load_target(f"{f}:make")
    model, inputs = build(fn, {"batch": 5}, "cpu")
    assert model(3) == 6 and inputs == (5,)
    with pytest.raises(ConfigError, match="takes no size named 'seq'"):
        build(fn, {"seq": 5}, "cpu")
    with pytest.raises(ConfigError, match="has no callable 'nope'"):
        load_target(f"{f}:nope")
    with pytest.raises(ConfigError, match="cannot import 'no_such_module_xyz'"):
        load_target("no_such_module_xyz:f")
    with pytest.raises(ConfigError, match="expected module:callable"):
        load_target("just_a_name")


def test_inductor_config_overrides_are_checked() -> None:
    assert parse_inductor_config(["freezing=True", "max_autotune_gemm_backends=ATEN"]) == {
        "freezing": True, "max_autotune_gemm_backends": "ATEN"}
    with pytest.raises(ConfigError, match="has no 'no_such_option'"):
        parse_inductor_config(["no_such_option=1"])
    with pytest.raises(ConfigError, match="takes a boolean"):
        parse_inductor_config(["freezing=maybe"])
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_inductor_config(["freezing"])
