"""Status JSON structure and /metrics names of two cosched trees, on one host of demo guests."""
import json, os, sys, tempfile, time
sys.path.insert(0, '/work/main')
from prometheus_client.parser import text_string_to_metric_families
from testbed import guests, image, services
from testbed.daemon import DaemonProcess
P = "cosched-demo-"
trees = dict(a.split("=", 1) for a in sys.argv[1:])
services.ensure(); guests.destroy_all(P)
img = image.build()
gs = []
spec = [("1", "barrier", guests.annotation("gang")), ("2", "barrier", guests.annotation("gang")),
        ("3", "barrier", guests.annotation("gang")), ("sleeper", "blocking", guests.annotation("auto")),
        ("bad-annotation", "idle", guests.annotation("gang", quantum_ms="fast"))]
for n, w, pol in spec:
    with guests.paused(gs):
        g = guests.start(P + n, workload=w, image=img, policy=pol); gs.append(g); g.wait_for("cosched-result") if w != "idle" else time.sleep(3)

def shape(x, path=""):
    if isinstance(x, dict):
        out = set()
        for k, v in x.items():
            key = k if not k.startswith(("cosched-", "/")) else "<name>"
            out |= {f"{path}.{key}"} | shape(v, f"{path}.{key}")
        return out
    if isinstance(x, list):
        return set().union(*(shape(v, path + "[]") for v in x)) if x else {path + "[]"}
    return {f"{path}:{type(x).__name__}"}

res = {}
try:
    for label, tree in trees.items():
        os.chdir(tree)
        d = DaemonProcess(tempfile.mkdtemp()).start()
        try:
            time.sleep(12)
            st = d.status()
            names = set()
            for fam in text_string_to_metric_families(d.metrics()):
                for s in fam.samples:
                    names.add(f"{s.name}{{{','.join(sorted(s.labels))}}}")
            res[label] = {"status": sorted(shape(st)), "metrics": sorted(names),
                          "modes": {x["name"]: x.get("mode") for x in st["domains"]}}
        finally:
            print(label, "exit", d.stop())
finally:
    guests.destroy_all(P)
json.dump(res, open("/tmp/exp/iface.json", "w"), indent=1)
a, b = list(res)
for what in ("status", "metrics"):
    sa, sb = set(res[a][what]), set(res[b][what])
    print(f"{what}: {len(sa)} in {a}, {len(sb)} in {b}; only in {a}: {sorted(sa - sb)}; only in {b}: {sorted(sb - sa)}")
print(res[a]["modes"], res[b]["modes"])
