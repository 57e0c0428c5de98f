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
    Boost co-scheduling (BCS, see :mod:`cosched.policy.watch`): no freezing,
    no rotation. When a vCPU runs while a sibling waits for a CPU, the
    sibling is raised above ordinary tasks until it has run, for at most
    ``boost-ms`` (1-100, default 2); the same vCPU is then not boosted again
    for ``pause-ms`` (0-100, default 0: from the next look on; measured in
    ``docs/decisions/0008-boost-no-pause-between-boosts.md``). A boost is SCHED_DEADLINE once
    the kernel has let go of the vCPU's last one's budget (the period of
    its reservation, from the boost's start:
    :func:`cosched.switcher.boosts.boost_attr`), SCHED_FIFO before.
    ``window-ms``, ``priority`` and
    ``weight`` belonged to an earlier, rotating ``boost``; they are still
    accepted (so existing annotations stay valid) and have no effect.
``relaxed``
    Relaxed co-scheduling (see :mod:`cosched.policy.watch`): a vCPU that
    gets more than ``costop-ms`` (1-100, default 3) ahead of its slowest
    runnable sibling is co-stopped until it is back within ``costart-ms``
    (0-100, default 2, below ``costop-ms``). With ``boost`` (default true)
    the waiting laggard is boosted meanwhile, for at most ``boost-ms``, and
    not again for ``pause-ms``.
``auto``
    Chooses one of the modes above per guest from what the sampler measures
    (see :mod:`cosched.policy.auto`), each with its default parameters.
    ``allow`` (default all of ``none,boost,relaxed,gang,partial``) bounds
    the choice; ``dwell-s`` (1-3600, default 5) is the least time between
    two changes of one guest's mode. ``slot`` (bool, default true): when
    ``auto`` leaves the guest to the host scheduler while it is busy and
    gang guests rotate, it runs in the turn the hosted guests share beside
    them, frozen in theirs; false: it is never frozen, at the gang guests' cost.
    ``keep-pct`` (0-100, default 90): the hosted turn is at most so long that
    each gang guest beside it keeps this percent of the share of the cycle it
    would have if the hosted guests rotated as gang guests; 0: the turn is
    sized by CPU time alone (:func:`cosched.policy.plan.hosted_turn_ms`;
    measured in ``docs/decisions/0024-gang-guests-keep-their-share.md``).
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
    choices: tuple[str, ...] = ()        # for a list parameter: what it may name

    def coerce(self, value: object) -> object:
        """Check a value from TOML (typed) or XML (a string); return it typed."""
        if self.type is tuple:
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
                raise ParamError(self.name, f"expected a comma-separated list, got {value!r}")
            names = tuple(dict.fromkeys(i.strip() for i in items))
            bad = [n for n in names if n not in self.choices]
            if bad or not names:
                raise ParamError(self.name, f"{bad[0] if bad else 'nothing'!r} is not one of {', '.join(self.choices)}")
            return names
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
BOOST_MS = Param("boost-ms", int, 2, 1, 100, "longest boost of one vCPU in milliseconds")
PAUSE_MS = Param("pause-ms", int, 0, 0, 100, "least time between two boosts of one vCPU in milliseconds")
COSTOP = Param("costop-ms", int, 3, 1, 100, "lead over the slowest sibling that co-stops a vCPU")
COSTART = Param("costart-ms", int, 2, 0, 100, "lead below which a co-stopped vCPU starts again")
LAGGARD = Param("boost", bool, True, doc="boost the waiting laggard while a sibling is co-stopped")

MODES = ("none", "boost", "relaxed", "gang", "partial")
ALLOW = Param("allow", tuple, MODES, doc="the modes auto may choose", choices=MODES)
DWELL = Param("dwell-s", int, 5, 1, 3600, "least time between two mode changes of a guest")
SLOT = Param("slot", bool, True, doc="left to the host scheduler while busy: a turn beside gang guests, shared with "
            "the other such guests")

KEEP = Param("keep-pct", int, 90, 0, 100, "percent of their all-gang share of the cycle that gang guests keep beside "
             "the hosted turn (0: no bound)")

KINDS: dict[str, tuple[Param, ...]] = {
    "none": (),
    "gang": (QUANTUM, BOOST, PRIORITY, WEIGHT),
    "partial": (QUANTUM, BOOST, PRIORITY, WEIGHT),
    "boost": (BOOST_MS, PAUSE_MS, WINDOW, PRIORITY, WEIGHT),
    "relaxed": (COSTOP, COSTART, LAGGARD, BOOST_MS, PAUSE_MS),
    "auto": (ALLOW, DWELL, SLOT, KEEP),
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
    if kind == "relaxed" and values["costart-ms"] >= values["costop-ms"]:
        # name the one the operator set: costop-ms=1 alone clashes with the default costart-ms
        if "costart-ms" in overrides or "costop-ms" not in overrides:
            raise ParamError("costart-ms", f"{values['costart-ms']} must be below costop-ms ({values['costop-ms']})")
        raise ParamError("costop-ms", f"{values['costop-ms']} must be above costart-ms ({values['costart-ms']})")
    return tuple(sorted(values.items()))
