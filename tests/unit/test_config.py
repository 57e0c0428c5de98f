import pytest

from cosched.config import Config, ConfigError, load


def write(tmp_path, text):
    p = tmp_path / "cosched.toml"
    p.write_text(text)
    return str(p)


def test_defaults_without_file(tmp_path, monkeypatch):
    monkeypatch.setattr("cosched.config.DEFAULT_PATH", str(tmp_path / "missing.toml"))
    assert load(None) == Config()


def test_full_file(tmp_path):
    c = load(write(tmp_path, 'connect = "qemu:///session"\nsample_interval_ms = 5\nresync_interval_s = 2\n'
                             'presets_dirs = ["/x"]\nmetrics_address = "[::1]:9000"\n'))
    assert c.connect == "qemu:///session" and c.sample_interval_ms == 5 and c.resync_interval_s == 2.0
    assert c.presets_dirs == ("/x",) and c.metrics_host_port() == ("::1", 9000)


@pytest.mark.parametrize("text,needle", [
    ('conect = "x"\n', "conect"),
    ('sample_interval_ms = "10"\n', "sample_interval_ms"),
    ("sample_interval_ms = 0\n", "sample_interval_ms"),
    ("sample_interval_ms = true\n", "sample_interval_ms"),
    ('metrics_address = "9641"\n', "metrics_address"),
    ('presets_dirs = "/etc"\n', "presets_dirs"),
    ("connect = \n", "cosched.toml"),
])
def test_bad_config_names_the_key(tmp_path, text, needle):
    with pytest.raises(ConfigError, match=needle):
        load(write(tmp_path, text))


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="No such file"):
        load(str(tmp_path / "nope.toml"))


def test_deploy_example_is_valid_and_lists_every_key():
    from dataclasses import fields
    from pathlib import Path
    example = Path(__file__).resolve().parents[2] / "deploy" / "cosched.toml"
    assert load(str(example)) == Config()           # the example shows the defaults
    text = example.read_text()
    assert all(f"\n{f.name} = " in text for f in fields(Config))
