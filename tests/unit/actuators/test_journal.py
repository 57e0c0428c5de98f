"""The state journal and the knobs that restore its entries, on fake trees."""

from tests.support.fakehost import FakeAffinity, FakeSched

from cosched.actuators import journal as jr
from cosched.actuators.freezer import FreezerKnob
from cosched.actuators.rt_runtime import RtRuntimeKnob
from cosched.actuators.sched import (SchedAttr, SchedKnob)


def knobs(fs, sched=None, affinity=None):
    return {k.kind: k for k in (SchedKnob(fs, get=(sched or FakeSched()).get, put=(sched or FakeSched()).set),
                                FreezerKnob(fs), RtRuntimeKnob(fs), (affinity or FakeAffinity()).knob(fs))}


def threads(fake, *tids):
    for tid in tids:
        fake.stat(1, tid, "CPU 0/TCG")           # start time 1000 + tid


def test_restore_order_identity_and_idempotence(fake, fs, tmp_path):
    for p in ("/cg/a/cpu.rt_runtime_us", "/cg/a/v0/cpu.rt_runtime_us", "/cg/a/v0/cgroup.freeze"):
        fake.write(p, "5")
    threads(fake, 7, 8)
    sched, affinity = FakeSched(), FakeAffinity()
    batch = SchedAttr("batch", nice=3)
    sched.attrs = {7: batch, 8: batch}
    k = knobs(fs, sched, affinity)
    j = jr.Journal(str(tmp_path / "run/journal"))
    vcpu = jr.Target("vm", "u", 0, 7, 1007, "/cg/a/v0/cgroup.freeze", ("/cg/a/cpu.rt_runtime_us",
                                                                         "/cg/a/v0/cpu.rt_runtime_us"))
    recorded = {kind: k[kind].record(vcpu, {}) for kind in ("rt", "freeze", "sched", "affinity")}
    assert [len(recorded[kind]) for kind in ("rt", "freeze", "sched", "affinity")] == [2, 1, 1, 1]
    assert k["sched"].record(vcpu, recorded["sched"]) == {}        # what is known is not read again
    j.record({**recorded["rt"], **recorded["freeze"], **recorded["sched"], **recorded["affinity"],
              "sched:8:999": {"kind": "sched", "tid": 8, "start_time": 999, "attr": batch.to_json()}})
    j.record({"rt:/cg/a/cpu.rt_runtime_us": {"kind": "rt", "path": "/cg/a/cpu.rt_runtime_us", "original": "999"}})
    assert jr.Journal(j.path).entries["rt:/cg/a/cpu.rt_runtime_us"]["original"] == "5"     # first recording wins
    # the daemon changed all of it
    for p in ("/cg/a/cpu.rt_runtime_us", "/cg/a/v0/cpu.rt_runtime_us", "/cg/a/v0/cgroup.freeze"):
        fs.write(p, "1" if p.endswith("freeze") else "0")
    sched.attrs = {7: SchedAttr("fifo", priority=2), 8: SchedAttr("fifo", priority=2)}
    affinity.now = {7: (0,)}
    order = []
    fs_write = fs.write
    fs.write = lambda p, d: (order.append(p), fs_write(p, d))
    assert jr.restore(jr.Journal(j.path), k) == []
    assert sched.attrs == {7: batch, 8: SchedAttr("fifo", priority=2)}       # tid 8 is another thread now
    assert order == ["/cg/a/v0/cgroup.freeze", "/cg/a/v0/cpu.rt_runtime_us", "/cg/a/cpu.rt_runtime_us"]
    assert affinity.get(7) == (0, 1)
    assert len(jr.Journal(j.path)) == 0
    assert all(fs.read(p) == "5" for p in order)
    assert jr.restore(jr.Journal(j.path), k) == []                            # idempotent


def test_what_could_not_be_restored_stays_and_is_named(fake, fs, tmp_path):
    threads(fake, 5)
    j = jr.Journal(str(tmp_path / "journal"))
    j.record({"pin:u:0": {"kind": "pin", "uuid": "u", "name": "vm", "vcpu": 0, "cpumap": [True]},
              "odd:1": {"kind": "odd"},
              "affinity:5:1005": {"kind": "affinity", "tid": 5, "start_time": 1005},             # no cpus: KeyError
              "sched:5:1005": {"kind": "sched", "tid": 5, "start_time": 1005, "attr": {"policy": "nonsense"}}})
    problems = jr.restore(j, knobs(fs))
    assert any("pin:u:0" in p and "no knob" in p for p in problems)         # a kind this version no longer has
    assert any("odd:1" in p and "no knob" in p for p in problems)
    assert "affinity:5:1005: KeyError: 'cpus'" in problems
    assert any("sched:5:1005" in p and "unknown scheduling policy 'nonsense'" in p for p in problems)
    assert len(jr.Journal(j.path)) == 4


def entries(n):
    return {f"freeze:/cg/{i}/cgroup.freeze": {"kind": "freeze", "path": f"/cg/{i}/cgroup.freeze", "original": "0"}
            for i in range(n)}


def test_damaged_lines_lose_only_themselves(tmp_path, caplog):
    path = tmp_path / "journal"
    jr.Journal(str(path)).record(entries(4))
    lines = path.read_text().split("\n")
    assert lines[0] == jr.HEADER and lines[5].startswith("end 4 ")
    lines[2] = lines[2].replace('"original":"0"', '"original":"1"')      # a flipped byte
    path.write_text("\n".join(lines))
    j = jr.Journal(str(path))
    assert len(j) == 3 and "freeze:/cg/1/cgroup.freeze" not in j.entries
    assert any("line 3: checksum mismatch" in d for d in j.damage)
    assert (tmp_path / "journal.damaged").read_text() == "\n".join(lines)
    assert "action=damaged" in caplog.text and "action=recovered entries=3" in caplog.text


def test_a_cut_short_journal_says_so(tmp_path):
    path = tmp_path / "journal"
    jr.Journal(str(path)).record(entries(3))
    text = path.read_text()
    path.write_text(text[: text.index("\nend ") - 10])                     # cut inside the last entry
    j = jr.Journal(str(path))
    assert len(j) == 2
    assert any("line 4" in d for d in j.damage) and any("cut short" in d for d in j.damage)


def test_garbage_recovers_nothing_loudly(tmp_path):
    path = tmp_path / "journal"
    path.write_bytes(b"\x00\xffgarbage\n")
    j = jr.Journal(str(path))
    assert len(j) == 0 and j.damage


def test_version_1_journal_is_read(tmp_path):
    path = tmp_path / "journal.json"
    path.write_text('{"version": 1, "entries": {'
                    '"file:/cg/a/cgroup.freeze": {"kind": "file", "path": "/cg/a/cgroup.freeze", "original": "0", "depth": 3},'
                    '"file:/cg/a/cpu.rt_runtime_us": {"kind": "file", "path": "/cg/a/cpu.rt_runtime_us", "original": "0", "depth": 3},'
                    '"sched:7:1": {"kind": "sched", "tid": 7, "start_time": 1, "policy": "other", "priority": 0}}}')
    j = jr.Journal(str(path))
    assert not j.damage
    assert sorted(e["kind"] for e in j.entries.values()) == ["freeze", "rt", "sched"]
    assert SchedAttr.from_json(j.entries["sched:7:1"]["attr"]) == SchedAttr("other")


def test_a_write_that_does_not_take_is_reported_and_kept(fake, fs, tmp_path):
    fake.write("/cg/a/cpu.rt_runtime_us", "0")
    j = jr.Journal(str(tmp_path / "journal"))
    k = knobs(fs)
    j.record(k["rt"].record(jr.Target("vm", "u", 0, 7, 1007, rt_chain=("/cg/a/cpu.rt_runtime_us",)), {}))
    fs.write("/cg/a/cpu.rt_runtime_us", "5000")
    real = fs.write
    fs.write = lambda p, d: None                      # the kernel accepts the write and ignores it
    problems = jr.restore(j, k)
    assert problems == ["rt:/cg/a/cpu.rt_runtime_us (original=0): written, but the host does not hold the original value"]
    assert len(jr.Journal(j.path)) == 1
    fs.write = real
    assert jr.restore(j, k) == [] and fs.read("/cg/a/cpu.rt_runtime_us") == "0"
