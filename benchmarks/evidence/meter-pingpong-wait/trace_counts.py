"""Switches from and to each CPU's idle task in a trace of the benchmark's
own ftrace instance (benchmarks.trace.SchedTrace).

    python benchmarks/evidence/meter-pingpong-wait/trace_counts.py OUT.txt
        records 1 s of one pingpong guest alone (a daemon with its
        defaults) on its vCPU threads into OUT.txt, then counts
    python benchmarks/evidence/meter-pingpong-wait/trace_counts.py pingpong-ftrace.txt.gz
        counts a kept trace
"""
import collections
import gzip
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.trace import SchedTrace, switches  # noqa: E402


def idle_switches(text: str) -> dict[str, int]:
    """Per CPU, the switches from its idle task and to it."""
    n = collections.Counter()
    for _t, cpu, prev, _state, nxt, _comm in switches(text):
        if prev == 0:
            n[f"cpu{cpu} from idle"] += 1
        if nxt == 0:
            n[f"cpu{cpu} to idle"] += 1
    return dict(sorted(n.items()))


def record(out: Path) -> str:
    from testbed import guests, image
    from testbed.daemon import DaemonProcess
    daemon = DaemonProcess(Path(tempfile.mkdtemp(prefix="cosched-probe-"))).start()
    try:
        g = guests.start("cosched-probe-pp", image=image.build(), workload="pingpong",
                         policy=guests.annotation("none"))
        try:
            g.wait_for("cosched-result")
            time.sleep(2.0)
            with SchedTrace({v["tid"] for v in daemon.domain(g.name)["vcpus"]}) as t:
                time.sleep(1.0)
        finally:
            g.destroy()
    finally:
        daemon.stop()
    out.write_text(t.text)
    return t.text


def main() -> None:
    path = Path(sys.argv[1])
    if path.suffix == ".gz":
        text = gzip.decompress(path.read_bytes()).decode()
    else:
        text = path.read_text() if path.exists() else record(path)
    for k, v in idle_switches(text).items():
        print(k, v)


if __name__ == "__main__":
    main()
