"""The state journal: every original value, recorded before the first write.

A JSON file under the state directory (``/run/cosched/journal.json``: tmpfs,
so it outlives a crashed daemon but not a reboot, exactly like the changes it
undoes). It is rewritten atomically (write, fsync, rename) on every change.

Entries, keyed so that the first recording wins:

``file``  ``{"path", "original", "depth"}``: a cgroup file (``cgroup.freeze``,
          ``cpu.rt_runtime_us``); restored deepest first, because a parent's
          RT runtime cannot drop below what its children hold.
``sched`` ``{"tid", "start_time", "policy", "priority"}``: a thread's scheduling
          policy; restored only if the thread with that start time still
          exists (a reused TID belongs to someone else).
``pin``   ``{"uuid", "name", "vcpu", "cpumap"}``: libvirt's live vCPU pinning;
          restored through libvirt.

Restoring an entry whose target is gone (thread exited, cgroup removed,
domain stopped) counts as done: there is nothing left to put back.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import threading
from typing import Callable

from cosched.hostfs import HostFS

log = logging.getLogger("cosched.journal")

GONE = (errno.ENOENT, errno.ESRCH, errno.ENODEV)


class Journal:
    def __init__(self, path: str):
        self.path = path
        self.lock = threading.Lock()
        self.entries: dict[str, dict] = self._load()

    def _load(self) -> dict[str, dict]:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.error("journal=%s action=unreadable error=%r (moved aside)", self.path, str(e))
            os.replace(self.path, self.path + ".corrupt")
            return {}
        return dict(data.get("entries", {}))

    def _save(self) -> None:
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"version": 1, "entries": self.entries}, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def record(self, new: dict[str, dict]) -> None:
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


def file_entry(path: str, original: str) -> tuple[str, dict]:
    return f"file:{path}", {"kind": "file", "path": path, "original": original, "depth": path.count("/")}


def sched_entry(tid: int, start_time: int, policy: str, priority: int) -> tuple[str, dict]:
    return f"sched:{tid}:{start_time}", {"kind": "sched", "tid": tid, "start_time": start_time,
                                         "policy": policy, "priority": priority}


def pin_entry(uuid: str, name: str, vcpu: int, cpumap: list[bool]) -> tuple[str, dict]:
    return f"pin:{uuid}:{vcpu}", {"kind": "pin", "uuid": uuid, "name": name, "vcpu": vcpu, "cpumap": cpumap}


def restore(journal: Journal, fs: HostFS, set_policy: Callable[[int, str, int], None],
            thread_start: Callable[[int], int | None],
            pin: Callable[[str, int, list[bool]], None] | None, kinds=("sched", "file", "pin"),
            only: Callable[[dict], bool] = lambda e: True) -> list[str]:
    """Put back every original of the given kinds (and matching ``only``);
    return what could not be restored.

    Order: thread policies first (a FIFO thread must be back to normal before
    its group's RT runtime can drop), then files deepest first, then pinning.
    """
    problems: list[str] = []
    done: list[str] = []
    entries = sorted(journal.entries.items(),
                     key=lambda kv: (("sched", "file", "pin").index(kv[1]["kind"]), -kv[1].get("depth", 0)))
    for key, e in entries:
        if e["kind"] not in kinds or not only(e):
            continue
        try:
            if e["kind"] == "sched":
                if thread_start(e["tid"]) == e["start_time"]:
                    set_policy(e["tid"], e["policy"], e["priority"])
            elif e["kind"] == "file":
                fs.write(e["path"], e["original"])
            elif e["kind"] == "pin":
                if pin is None:
                    problems.append(f"domain {e['name']} vcpu {e['vcpu']}: pinning not restored: libvirt unreachable")
                    continue
                pin(e["uuid"], e["vcpu"], e["cpumap"])
            done.append(key)
            log.info("action=restored %s", " ".join(f"{k}={v}" for k, v in e.items() if k not in ("kind", "cpumap", "depth")))
        except LookupError:                   # the domain is gone: nothing to restore
            done.append(key)
        except OSError as err:
            if err.errno in GONE:
                done.append(key)
            else:
                problems.append(f"{key}: {os.strerror(err.errno) if err.errno else err}")
    journal.forget(done)
    return problems
