"""Named presets: the ``name`` an annotation selects.

A preset is a TOML file whose stem is its name::

    # /etc/cosched/policies.d/fast-gang.toml
    policy = "gang"          # the policy kind (see cosched.policy.params)
    description = "gang with short slots for latency-bound guests"
    [parameters]
    quantum-ms = 20

Built-in presets ship in ``policies/``; files in the site directories
(default ``/etc/cosched/policies.d``) add presets or replace built-in ones of
the same name. A broken preset file is reported and skipped; it never stops
the others from loading.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from cosched.model import PolicySpec
from cosched.policy.params import ParamError, resolve

SITE_DIR = "/etc/cosched/policies.d"
_TOP_KEYS = {"policy", "description", "parameters"}


def builtin_dir() -> Path:
    """Where the built-in presets are: the source tree, or the installed copy."""
    candidates = [
        os.environ.get("COSCHED_PRESETS_DIR"),
        Path(__file__).resolve().parents[2] / "policies",
        Path(sys.prefix) / "share" / "cosched" / "policies",
        Path("/usr/local/share/cosched/policies"),
        Path("/usr/share/cosched/policies"),
    ]
    for c in candidates:
        if c and (Path(c) / "none.toml").is_file():
            return Path(c)
    raise FileNotFoundError("built-in presets not found (looked for policies/none.toml)")


@dataclass(frozen=True)
class Preset:
    name: str
    kind: str
    description: str
    params: tuple[tuple[str, object], ...]
    path: str


class PresetError(ValueError):
    pass


def load_preset(path: Path) -> Preset:
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
    return Preset(path.stem, kind, str(data.get("description", "")), resolved, str(path))


@dataclass(frozen=True)
class Presets:
    """All presets by name, and the errors met while loading them."""

    by_name: dict[str, Preset]
    errors: tuple[str, ...] = field(default=())

    @classmethod
    def load(cls, dirs: list[Path | str] | None = None) -> "Presets":
        dirs = [builtin_dir(), *(dirs if dirs is not None else [SITE_DIR])]
        by_name: dict[str, Preset] = {}
        errors: list[str] = []
        for d in dirs:
            for path in sorted(Path(d).glob("*.toml")):
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
