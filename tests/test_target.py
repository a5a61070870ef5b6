"""What ``prescreen warm`` compiles: shapes, spec files, targets, Inductor config overrides."""

from __future__ import annotations

import pytest

from prescreen.errors import ConfigError
from prescreen.target import (
    MAX_SIZE,
    ShapeRange,
    build,
    check_fits,
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


def test_parse_shape_sizes_with_an_exponent_and_the_largest_size() -> None:
    assert parse_shape("batch=1..1e6") == ShapeRange("batch", 1, 10**6)
    assert parse_shape("batch=2E3") == ShapeRange("batch", 2000, 2000)
    assert parse_shape(f"batch=1..{MAX_SIZE}").high == 2**63 - 1
    for too_big in (f"batch=1..{MAX_SIZE + 1}", "batch=1..1e19", "batch=1..1e999999999", "batch=1.." + "9" * 5000):
        with pytest.raises(ConfigError, match=r"is more than 9223372036854775807 \(2\*\*63 - 1\)"):
            parse_shape(too_big)
    for bad in ("batch=1.5e3", "batch=1e-3", "batch=1..2e"):
        with pytest.raises(ConfigError, match="expected NAME=MIN..MAX"):
            parse_shape(bad)


def _mlp_target(tmp_path, device_line: str = "device=device") -> object:
    path = tmp_path / "m.py"
    path.write_text("import torch\n"
                    "def make(batch=2, device='cpu'):\n"
                    "    model = torch.nn.Linear(64, 32)\n"
                    f"    return model, (torch.empty(batch, 64, {device_line}),)\n")
    return load_target(f"{path}:make")


def test_check_fits_measures_on_the_meta_device(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import prescreen.target as target

    fn = _mlp_target(tmp_path)
    grid = [{"batch": 7}, {"batch": 4095}]
    need = (4095 * 64 + 64 * 32 + 32) * 4  # the inputs at the largest batch, the weight and the bias (fp32)
    monkeypatch.setattr(target, "available_memory", lambda device: (need, "test memory"))
    check_fits(fn, grid, "cpu")  # exactly fits
    monkeypatch.setattr(target, "available_memory", lambda device: (need - 1, "test memory"))
    with pytest.raises(ConfigError, match=rf"warm at batch=4095 needs at least .* \({need} bytes\) for the model "
                                          r"and its example inputs, more than the .* of test memory on cpu"):
        check_fits(fn, grid, "cpu")
    check_fits(fn, [{}], "cpu")  # no shapes: nothing to grow
    # a target that builds on a device of its own cannot be measured without allocating: not checked
    check_fits(_mlp_target(tmp_path, "device='cpu'"), grid, "cpu")


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


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('device-memory = "64GiB"', "unknown key 'device-memory' (did you mean 'device_memory'?)"),
        ('target = "m:f"\nbudget = 3\nextra = 1', "unknown keys 'budget', 'extra'"),
        ('points = "abc"', "'points' must be a whole number, got 'abc'"),
        ("ratio = true", "'ratio' must be a number in (0, 1], got True"),
        ("[shapes]\nbatch = { min = 1 }", "shape 'batch' must be 'MIN..MAX' or {min = MIN, max = MAX}"),
        ('[shapes]\nbatch = { min = "a", max = 2 }', "{min = MIN, max = MAX} (whole numbers), got {'min': 'a'"),
        ("device_memory = true", "'device_memory' must be a size"),
        ("inductor_config = 3", "'inductor_config' must be a table"),
        ("target = 3", "'target' must be a string"),
    ],
)
def test_load_spec_rejects_what_it_does_not_know(tmp_path, text: str, needle: str) -> None:
    spec = tmp_path / "warm.toml"
    spec.write_text(text + "\n")
    with pytest.raises(ConfigError) as caught:
        load_spec(spec)
    assert needle in str(caught.value) and "warm.toml" in str(caught.value)


@pytest.mark.parametrize(
    ("value", "items"),
    [
        ('"freezing=True"', ("freezing=True",)),
        ('"freezing=True, max_autotune_gemm_backends=ATEN,TRITON"',
         ("freezing=True", "max_autotune_gemm_backends=ATEN,TRITON")),
        ('["freezing=True", "max_autotune=1"]', ("freezing=True", "max_autotune=1")),
        ("{ freezing = true, autotune_num_choices_displayed = 3 }",
         ("freezing=True", "autotune_num_choices_displayed=3")),
    ],
)
def test_spec_inductor_config_forms(tmp_path, value: str, items: tuple[str, ...]) -> None:
    spec = tmp_path / "warm.toml"
    spec.write_text(f"inductor_config = {value}\n")
    assert load_spec(spec)["inductor_config"] == items


def test_inductor_config_layers_merge_key_by_key() -> None:
    from prescreen.target import merge_inductor_config

    assert merge_inductor_config(("freezing=True", "max_autotune=1"), ("freezing=False",)) == (
        "max_autotune=1", "freezing=False")
    parsed = parse_inductor_config(merge_inductor_config(("freezing=True",), ("freezing = off",)))
    assert parsed == {"freezing": False}


def test_a_target_that_raises_is_a_config_error(tmp_path) -> None:
    f = tmp_path / "t.py"
    f.write_text("def make(batch=2):\n    raise RuntimeError('out of ideas\\nsecond line')\n")
    with pytest.raises(ConfigError, match=r"target make\(batch=5\) raised RuntimeError: out of ideas$"):
        build(load_target(f"{f}:make"), {"batch": 5}, "cpu")


def test_check_device() -> None:
    import torch

    from prescreen.target import check_device

    check_device("cpu")
    with pytest.raises(ConfigError, match="--device 'nosuchdev' is not a device"):
        check_device("nosuchdev")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no cuda device is available"):
            check_device("cuda")
