"""The state journal: every original value, recorded before the first write.

A file under the state directory (``/run/cosched/journal``: tmpfs, so it
outlives a crashed daemon but not a reboot, exactly like the changes it
undoes), rewritten atomically (write, fsync, rename) on every change.

Format (version 2), one self-checking line per entry, in the spirit of
kubelet's checksummed checkpoints, so that damage loses only what it hit::

    cosched-journal 2
    <crc32 hex> {"key": "...", "entry": {...}}
    ...
    end <number of entries> <crc32 hex of the entry lines>

Loading keeps every line whose checksum holds. A damaged line, a missing or
wrong ``end`` line (a truncated file) or an unreadable file is reported in
:attr:`Journal.damage` and logged as an error; the damaged file is kept
beside the journal (``.damaged``) for inspection, and ``cosched reset``
restores what was recovered and says what could not be. Version 1 journals
(one JSON document) are still read.

Each entry belongs to one knob, named by its ``kind``, and only that knob's
module knows how to restore it: ``sched`` (:mod:`~cosched.actuators.sched`),
``freeze`` (:mod:`~cosched.actuators.freezer`), ``rt``
(:mod:`~cosched.actuators.rt_runtime`), ``affinity``
(:mod:`~cosched.actuators.affinity`), ``place``
(:mod:`~cosched.actuators.placement`). Keys make the first recording win.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import threading
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

log = logging.getLogger("cosched.journal")

GONE = (errno.ENOENT, errno.ESRCH, errno.ENODEV)
HEADER = "cosched-journal 2"
# Restore order: threads back to their policy before their group's RT runtime
# drops; freeze files; RT runtime deepest first; pinning; threads back into
# the cgroups cosched moved them out of, last.
ORDER = ("sched", "freeze", "rt", "affinity", "place")


class Gone(Exception):
    """The target of an entry no longer exists (thread exited, cgroup removed,
    domain stopped): there is nothing left to restore."""


@dataclass(frozen=True)
class Target:
    """One vCPU thread of a guest, as every knob is given it to record what it may change."""

    name: str                           # the guest's, for messages
    uuid: str
    vcpu: int                           # the vCPU's index
    tid: int
    start_time: int                     # the thread's, so that a reused TID is not taken for it
    freeze: str | None = None           # host path of its cgroup.freeze
    rt_chain: tuple[str, ...] = ()      # cpu.rt_runtime_us files a boost needs, top-down
    cgroup2_mount: str | None = None    # where the v2 tree is mounted


class Knob(Protocol):
    """What every knob does: ``record`` the originals of what it may change
    for one vCPU (those not in ``known``: journal key -> entry; OSError when
    they cannot be read), then ``restore`` an entry, ``verify`` that the host
    holds its original again, and tell whether its target still ``exists``.
    How it applies a change is its own (the value differs by knob)."""

    kind: str

    def record(self, target: Target, known: Mapping[str, dict]) -> dict[str, dict]: ...

    def restore(self, entry: dict) -> None: ...

    def verify(self, entry: dict) -> bool: ...

    def exists(self, entry: dict) -> bool: ...


def thread_entry(kind: str, t: Target, **value) -> dict[str, dict]:
    """A thread knob's entry for ``t``, keyed by kind, TID and start time."""
    return {thread_key(kind, t.tid, t.start_time): {"kind": kind, "name": t.name, "uuid": t.uuid, "vcpu": t.vcpu,
                                                     "tid": t.tid, "start_time": t.start_time, **value}}


def thread_key(kind: str, tid: int, start_time: int) -> str:
    return f"{kind}:{tid}:{start_time}"


class FileKnob(ABC):
    """A knob that is one file's content (cgroup files): recorded, written back, compared.

    Subclasses name their ``kind``, the files of a vCPU they change
    (:meth:`paths`), and may check more in :meth:`verify`.
    """

    kind = "file"

    def __init__(self, fs):
        self.fs = fs

    def key(self, path: str) -> str:
        """The journal key of ``path``'s original."""
        return f"{self.kind}:{path}"

    @abstractmethod
    def paths(self, target: Target) -> tuple[str, ...]:
        """The files of one vCPU this knob changes, top-down."""

    def record(self, target: Target, known: Mapping[str, dict]) -> dict[str, dict]:
        """The current value of each of the vCPU's files not yet known (a file that is gone has none)."""
        out = {}
        for path in self.paths(target):
            value = None if self.key(path) in known else self.fs.read_or(path)
            if value is not None:
                out[self.key(path)] = {"kind": self.kind, "path": path, "original": value.strip(),
                                       "depth": path.count("/")}
        return out

    def restore(self, entry: dict) -> None:
        if not self.fs.exists(entry["path"]):
            raise Gone(f"{entry['path']} is gone")
        self.fs.write(entry["path"], entry["original"])

    def verify(self, entry: dict) -> bool:
        value = self.fs.read_or(entry["path"])
        return value is None or value.strip() == entry["original"]

    def exists(self, entry: dict) -> bool:
        return self.fs.exists(entry["path"])


def _crc(text: str) -> str:
    return f"{zlib.crc32(text.encode()):08x}"


def _v1_entry(e: dict) -> dict:
    """A version 1 entry in version 2 terms."""
    if e.get("kind") == "file":
        kind = "rt" if e["path"].endswith("cpu.rt_runtime_us") else "freeze"
        return {"kind": kind, "path": e["path"], "original": e["original"], "depth": e["path"].count("/")}
    if e.get("kind") == "sched" and "attr" not in e:
        return {"kind": "sched", "tid": e["tid"], "start_time": e["start_time"],
                "attr": {"policy": e["policy"], "priority": e["priority"]}}
    return e


def parse(text: str) -> tuple[dict[str, dict], list[str]]:
    """(entries recovered, damage found) from a journal file's text."""
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
            return {k: _v1_entry(v) for k, v in dict(data["entries"]).items()}, []
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return {}, [f"version 1 journal unreadable: {e}"]
    lines = text.split("\n")
    entries: dict[str, dict] = {}
    damage: list[str] = []
    if lines[0] != HEADER:
        damage.append(f"line 1: header {lines[0][:40]!r}, expected {HEADER!r}")
    body, end = [], None
    for number, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        if line.startswith("end "):
            end = (number, line)
            break
        body.append(line)
        crc, _, payload = line.partition(" ")
        try:
            if crc != _crc(payload):
                raise ValueError("checksum mismatch")
            record = json.loads(payload)
            entries[record["key"]] = record["entry"]
        except (ValueError, KeyError, TypeError) as e:
            damage.append(f"line {number}: {e}: {line[:120]!r}")
    if end is None:
        damage.append(f"no end line after line {len(lines)}: the file was cut short, later entries may be lost")
    else:
        parts = end[1].split()
        if parts[1:] != [str(len(body)), _crc("\n".join(body))]:
            damage.append(f"line {end[0]}: end line {end[1]!r} does not match the {len(body)} entry lines before it")
    return entries, damage


def render(entries: Mapping[str, dict]) -> str:
    body = []
    for key in sorted(entries):
        payload = json.dumps({"key": key, "entry": entries[key]}, sort_keys=True, separators=(",", ":"))
        body.append(f"{_crc(payload)} {payload}")
    return "\n".join([HEADER, *body, f"end {len(body)} {_crc(chr(10).join(body))}", ""])


class Journal:
    def __init__(self, path: str):
        self.path = path
        self.lock = threading.Lock()
        self.damage: list[str] = []
        self.entries: dict[str, dict] = self._load()

    def _load(self) -> dict[str, dict]:
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return {}
        except OSError as e:
            self.damage = [f"cannot read: {e.strerror}"]
            log.error("journal=%s action=unreadable error=%r: the originals it held are lost", self.path, e.strerror)
            return {}
        entries, self.damage = parse(raw.decode("utf-8", "replace"))
        if self.damage:
            aside = self.path + ".damaged"
            with open(aside, "wb") as f:
                f.write(raw)
            for d in self.damage:
                log.error("journal=%s action=damaged %s", self.path, d)
            log.error("journal=%s action=recovered entries=%d damaged=%d kept_as=%s: originals on damaged "
                      "lines cannot be restored automatically", self.path, len(entries), len(self.damage), aside)
        return entries

    def _save(self) -> None:
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(render(self.entries))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def record(self, new: Mapping[str, dict]) -> None:
        """Record originals not recorded yet (the first recording wins)."""
        with self.lock:
            added = {k: v for k, v in new.items() if k not in self.entries}
            if added:
                self.entries.update(added)
                self._save()

    def forget(self, keys) -> None:
        with self.lock:
            keys = [k for k in keys if k in self.entries]
            for k in keys:
                del self.entries[k]
            if keys:
                self._save()

    def __len__(self) -> int:
        return len(self.entries)


def _describe(e: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in e.items() if k not in ("kind", "cpumap", "depth", "attr")) + (
        f" attr={e['attr']}" if "attr" in e else "")


def _about(key: str, e: dict) -> str:
    """``key (what the entry adds to its key)``: a problem line that names its guest."""
    extra = " ".join(f"{k}={v}" for k, v in e.items()
                     if k not in ("kind", "cpumap", "depth") and str(v) not in key)
    return f"{key} ({extra})" if extra else key


def restore(journal: Journal, knobs: Mapping[str, Knob], kinds=ORDER,
            only: Callable[[dict], bool] = lambda e: True) -> list[str]:
    """Put back every original of the given kinds (and matching ``only``),
    each through its own knob; return what could not be restored.

    Each restore is verified by its knob (the host must hold the original
    again). An entry whose target is gone is done. Any other failure, a write
    that did not take, an unknown kind or a malformed entry included, is
    reported and the entry stays in the journal for the next try.
    """
    problems: list[str] = []
    done: list[str] = []
    rank = {k: i for i, k in enumerate(ORDER)}
    entries = sorted(journal.entries.items(),
                     key=lambda kv: (rank.get(kv[1].get("kind"), len(ORDER)), -kv[1].get("depth", 0), kv[0]))
    for key, e in entries:
        known = e.get("kind") in ORDER
        if (known and e.get("kind") not in kinds) or (not known and tuple(kinds) != ORDER) or not only(e):
            continue
        knob = knobs.get(e.get("kind"))
        if knob is None:
            problems.append(f"{key}: no knob restores entries of kind {e.get('kind')!r}")
            continue
        try:
            knob.restore(e)
        except Gone:
            done.append(key)
            continue
        except OSError as err:
            if err.errno in GONE:
                done.append(key)
            else:
                problems.append(f"{_about(key, e)}: {os.strerror(err.errno) if err.errno else err}")
            continue
        except Exception as err:            # a bad entry or a bug: say so, keep the entry
            problems.append(f"{key}: {type(err).__name__}: {err}")
            continue
        try:
            held = knob.verify(e)
        except Exception as err:            # cannot tell: keep it for the next try
            problems.append(f"{_about(key, e)}: restored, but could not verify: {type(err).__name__}: {err}")
            continue
        if not held:
            problems.append(f"{_about(key, e)}: written, but the host does not hold the original value")
            continue
        done.append(key)
        log.info("action=restored kind=%s %s", e["kind"], _describe(e))
    journal.forget(done)
    return problems
