import pytest

from cosched.policy.params import KINDS, ParamError, resolve
from cosched.policy.presets import PresetError, Presets, builtin_dir, load_preset


def test_builtin_presets_load_cleanly():
    presets = Presets.load([])
    assert presets.errors == ()
    assert {"none", "gang", "partial", "boost"} <= set(presets.by_name)
    for p in presets.by_name.values():
        assert p.kind in KINDS
        assert (builtin_dir() / f"{p.name}.toml").is_file()


def test_site_preset_adds_and_overrides(tmp_path):
    (tmp_path / "fast-gang.toml").write_text('policy = "gang"\n[parameters]\nquantum-ms = 10\n')
    (tmp_path / "boost.toml").write_text('policy = "boost"\n[parameters]\nwindow-ms = 5\n')
    presets = Presets.load([tmp_path])
    assert dict(presets.spec("fast-gang", {}, "annotation").params)["quantum-ms"] == 10
    assert dict(presets.spec("boost", {}, "annotation").params)["window-ms"] == 5
    assert dict(presets.spec("fast-gang", {"quantum-ms": "30"}, "annotation").params)["quantum-ms"] == 30


@pytest.mark.parametrize("text,needle", [
    ('policy = "gang"\n[parameters]\nquantum-ms = 0\n', "quantum-ms"),
    ('policy = "gang"\n[parameters]\nquantum = 10\n', "quantum"),
    ('policy = "warp"\n', "warp"),
    ('policy = "gang"\ncolour = "red"\n', "colour"),
    ('policy = [\n', "bad.toml"),
    ('description = "no kind"\n', "policy"),
    ('policy = "gang"\n[parameters]\nboost = "yes please"\n', "boost"),
])
def test_broken_site_presets_are_reported_not_fatal(tmp_path, text, needle):
    (tmp_path / "bad.toml").write_text(text)
    with pytest.raises(PresetError, match=needle):
        load_preset(tmp_path / "bad.toml")
    presets = Presets.load([tmp_path])
    assert "bad" not in presets.by_name and "gang" in presets.by_name
    assert len(presets.errors) == 1 and "bad.toml" in presets.errors[0]


def test_typed_values_from_toml():
    assert dict(resolve("gang", {"boost": False, "quantum-ms": 7}, {}))["quantum-ms"] == 7
    with pytest.raises(ParamError):
        resolve("gang", {"quantum-ms": True}, {})
    with pytest.raises(ParamError):
        resolve("gang", {"quantum-ms": 2.5}, {})
