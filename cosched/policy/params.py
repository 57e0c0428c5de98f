"""Parameters of each policy kind: name, type, default and allowed range.

A preset file fixes values for a kind; an annotation attribute overrides one
value. Both are checked against the schema here, so a bad value is rejected
with the parameter named, wherever it came from.

Kinds and their parameters:

``none``
    Observed only: cosched measures the guest and changes nothing.
``gang``
    Strict co-scheduling: guests on the pool take turns in fixed quanta and
    every vCPU of the guest in its slot runs at once.
    ``quantum-ms`` (1-1000, default 50): slot length. ``boost`` (bool, default
    true): raise the guest to SCHED_FIFO during its slot. ``priority`` (1-99,
    default 1): the SCHED_FIFO priority. ``weight`` (1-100, default 1):
    share of slots relative to other guests.
``partial``
    Co-scheduling only among guests that share host CPUs (cells); the same
    parameters as ``gang``.
``boost``
    No freezing: the guest's vCPUs are raised to SCHED_FIFO together for
    ``window-ms`` (1-1000, default 20) in rotation; ``priority`` and
    ``weight`` as above.
"""
from __future__ import annotations

from dataclasses import dataclass


class ParamError(ValueError):
    """A parameter value is wrong; ``param`` names it."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True)
class Param:
    name: str
    type: type
    default: object
    min: int | None = None
    max: int | None = None
    doc: str = ""

    def coerce(self, value: object) -> object:
        """Check a value from TOML (typed) or XML (a string); return it typed."""
        if self.type is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ("true", "yes", "1", "false", "no", "0"):
                return value.strip().lower() in ("true", "yes", "1")
            raise ParamError(self.name, f"expected true or false, got {value!r}")
        if isinstance(value, bool):
            raise ParamError(self.name, f"expected an integer, got {value!r}")
        if isinstance(value, str):
            text = value.strip()
            if not text.isascii() or not text.isdigit():
                raise ParamError(self.name, f"expected an integer, got {value!r}")
            value = int(text)
        if not isinstance(value, int):
            raise ParamError(self.name, f"expected an integer, got {value!r}")
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            raise ParamError(self.name, f"{value} is outside {self.min}..{self.max}")
        return value


QUANTUM = Param("quantum-ms", int, 50, 1, 1000, "slot length in milliseconds")
WINDOW = Param("window-ms", int, 20, 1, 1000, "boost window in milliseconds")
BOOST = Param("boost", bool, True, doc="SCHED_FIFO during the guest's slot")
PRIORITY = Param("priority", int, 1, 1, 99, "SCHED_FIFO priority")
WEIGHT = Param("weight", int, 1, 1, 100, "share of slots relative to other guests")

KINDS: dict[str, tuple[Param, ...]] = {
    "none": (),
    "gang": (QUANTUM, BOOST, PRIORITY, WEIGHT),
    "partial": (QUANTUM, BOOST, PRIORITY, WEIGHT),
    "boost": (WINDOW, PRIORITY, WEIGHT),
}


def resolve(kind: str, base: dict[str, object], overrides: dict[str, object]) -> tuple[tuple[str, object], ...]:
    """Defaults of ``kind``, then ``base`` (a preset), then ``overrides``.

    Raises :class:`ParamError` naming the first unknown or bad parameter.
    """
    if kind not in KINDS:
        raise ParamError("policy", f"unknown policy kind {kind!r} (known: {', '.join(KINDS)})")
    schema = {p.name: p for p in KINDS[kind]}
    values = {p.name: p.default for p in schema.values()}
    for source in (base, overrides):
        for name, value in source.items():
            if name not in schema:
                known = ", ".join(schema) or "none"
                raise ParamError(name, f"unknown parameter for policy {kind!r} (known: {known})")
            values[name] = schema[name].coerce(value)
    return tuple(sorted(values.items()))
