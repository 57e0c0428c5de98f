"""Named presets: the ``name`` an annotation selects.

A preset is a TOML file whose stem is its name::

    # /etc/cosched/policies.d/fast-gang.toml
    policy = "gang"          # the policy kind (see cosched.policy.params)
    description = "gang with short slots for latency-bound guests"
    [parameters]
    quantum-ms = 20

Built-in presets are the files of the repository's top-level ``policies/``,
which the package carries as ``cosched/policies/`` (a link the build follows);
files in the site directories
(default ``/etc/cosched/policies.d``) add presets or replace built-in ones of
the same name. A broken preset file is reported and skipped; it never stops
the others from loading.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from cosched.compat import Traversable, tomllib
from cosched.model import PolicySpec
from cosched.policy.params import ParamError, resolve

SITE_DIR = "/etc/cosched/policies.d"
_TOP_KEYS = {"policy", "description", "parameters"}


def builtin_dir() -> Traversable:
    """The built-in presets: package data (``cosched/policies/*.toml``), found
    through :mod:`importlib.resources` wherever and however the package is installed."""
    return resources.files("cosched") / "policies"


@dataclass(frozen=True)
class Preset:
    name: str
    kind: str
    description: str
    params: tuple[tuple[str, object], ...]
    path: str


class PresetError(ValueError):
    pass


def load_preset(path: Path | Traversable) -> Preset:
    """Parse and validate one preset file; :class:`PresetError` names the fault."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise PresetError(f"{path}: {e}") from None
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise PresetError(f"{path}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(_TOP_KEYS))})")
    kind = data.get("policy")
    if not isinstance(kind, str):
        raise PresetError(f"{path}: 'policy' must name a policy kind")
    params = data.get("parameters", {})
    if not isinstance(params, dict):
        raise PresetError(f"{path}: [parameters] must be a table")
    try:
        resolved = resolve(kind, params, {})
    except ParamError as e:
        raise PresetError(f"{path}: {e}") from None
    return Preset(path.name.removesuffix(".toml"), kind, str(data.get("description", "")), resolved, str(path))


@dataclass(frozen=True)
class Presets:
    """All presets by name, and the errors met while loading them."""

    by_name: dict[str, Preset]
    errors: tuple[str, ...] = field(default=())

    @classmethod
    def load(cls, dirs: list[Path | str] | None = None) -> "Presets":
        dirs = [builtin_dir(), *(Path(d) for d in (dirs if dirs is not None else [SITE_DIR]))]
        by_name: dict[str, Preset] = {}
        errors: list[str] = []
        for d in dirs:
            try:
                files = sorted((f for f in d.iterdir() if f.name.endswith(".toml") and f.is_file()),
                               key=lambda f: f.name)
            except (FileNotFoundError, NotADirectoryError):
                continue                          # no site directory: built-in presets only
            except OSError as e:
                errors.append(f"{d}: {e.strerror}")
                continue
            for path in files:
                try:
                    preset = load_preset(path)
                except PresetError as e:
                    errors.append(str(e))
                    continue
                by_name[preset.name] = preset
        return cls(by_name, tuple(errors))

    def spec(self, name: str, overrides: dict[str, str], source: str) -> PolicySpec:
        """The policy a guest gets for preset ``name`` with ``overrides``."""
        preset = self.by_name.get(name)
        if preset is None:
            raise ParamError("name", f"unknown preset {name!r} (known: {', '.join(sorted(self.by_name))})")
        params = resolve(preset.kind, dict(preset.params), overrides)
        return PolicySpec(preset=name, kind=preset.kind, params=params, source=source)
