import ctypes, threading, timeit, sys
import cosched.sampler.meter as mm
from cosched.sampler.meter import Meter, UNKNOWN
size_t, size_g = int(sys.argv[1]), int(sys.argv[2])
orig = mm._libbpf
def lib():
    l = orig()
    l.bpf_map__set_max_entries.restype, l.bpf_map__set_max_entries.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint32]
    real_load = l.bpf_object__load
    class L:  # wrap load to resize first
        def __getattr__(s, n): return getattr(l, n)
        def bpf_object__load(s, obj):
            for name, n in (("threads", size_t), ("watched", size_t), ("guests", size_g)):
                assert l.bpf_map__set_max_entries(l.bpf_object__find_map_by_name(obj, name.encode()), n) == 0
            return real_load(obj)
    return L()
mm._libbpf = lib
stop = threading.Event()
ts = [threading.Thread(target=stop.wait) for _ in range(8)]
for t in ts: t.start()
m = Meter.load()
for g in range(4):
    m.add(g, {ts[2*g].native_id: UNKNOWN, ts[2*g+1].native_id: UNKNOWN})
n = 5000
print(size_t, size_g, "read us", timeit.timeit(m.read, number=n) / n * 1e6, len(m.read().threads))
stop.set(); m.close()
