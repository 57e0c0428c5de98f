"""The truth comparison over the scrape times (old) and over cosched's sampling windows (new),
with the daemon stopped for STALL seconds before every other run's last scrape (a starved daemon)."""
import json, os, signal, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, "/work/main")
from benchmarks import suite
from testbed import guests, image, services
from testbed.daemon import DaemonProcess

N = int(sys.argv[1]); MODE = sys.argv[2]; STALL = float(sys.argv[3])
calls = []
orig_tf = suite.truth_figures
def tf(events, tids, since, to, silent, width, calls_=None):
    calls.append((events, tids, since, to, silent, width, calls_))
    return orig_tf(events, tids, since, to, silent, width, calls_)
suite.truth_figures = tf
orig_scrape = suite.scrape
state = {"n": 0, "stall": False}
def scrape(daemon):
    state["n"] += 1
    if state["stall"] and state["n"] % 2 == 0:      # the last scrape of a measurement
        os.kill(daemon.proc.pid, signal.SIGSTOP); time.sleep(STALL); os.kill(daemon.proc.pid, signal.SIGCONT)
    return orig_scrape(daemon)
suite.scrape = scrape
services.ensure(); img = image.build()
gs = []; d = DaemonProcess(Path(tempfile.mkdtemp()), extra_config='sample_budget_pct = 25\nmeter = "auto"\n').start()
rows = []
try:
    for i in range(3):
        with guests.paused(gs):
            gs.append(suite.boot(f"cosched-prof-truth-{i}", "barrier", 2, img))
    d.wait(lambda: all(d.domain(g.name) for g in gs), 10, "observed")
    suite.apply_mode(d, gs, MODE, settle=1.5)
    for k in range(N):
        state["stall"] = k % 2 == 1
        calls.clear()
        r = suite.measure(d, gs, MODE, 8.0, truth=True)
        t0, t1 = r["interval"]
        for (name, w), c in zip(r["per_guest"].items(), calls):
            old = orig_tf(c[0], c[1], t0, t1, c[4], c[5], c[6])
            row = dict(run=k, stall=state["stall"], guest=name[-1], cosched=w["hazard"], new=w["trace"]["hazard"],
                       old=old["hazard"], skew=w["skew_mean_ms"], skew_new=w["trace"]["skew_mean_ms"],
                       skew_old=old["skew_mean_ms"], since=c[2] - t0, to=c[3] - t1)
            rows.append(row)
            print(json.dumps(row), flush=True)
finally:
    for g in gs: g.destroy()
    d.stop()
