"""Sample the kernel's RT run queues of the guests' vCPU groups every 100 ms:
how many samples found one throttled, and the largest rt_time/rt_runtime seen."""
import re, sys, time, json
out = sys.argv[1]
samples = throttled = 0
worst = 0.0
names = set()
block = re.compile(r"rt_rq\[(\d+)\]:(\S+)\n((?:  \..*\n)+)")
try:
    while True:
        text = open("/tmp/dbg/sched/debug").read()
        samples += 1
        hit = False
        for cpu, path, body in block.findall(text):
            if "/vcpu" not in path:
                continue
            f = dict(re.findall(r"\.(\w+)\s+:\s+(\S+)", body))
            rt = float(f.get("rt_runtime", 0))
            if f.get("rt_throttled") == "1":
                hit = True
                names.add(path)
            if rt > 0:
                worst = max(worst, float(f.get("rt_time", 0)) / rt)
        throttled += hit
        if samples % 10 == 0:
            json.dump({"samples": samples, "throttled": throttled, "worst_time_over_runtime": worst,
                       "groups": sorted(names)}, open(out, "w"))
        time.sleep(0.1)
except KeyboardInterrupt:
    pass
