"""The cost of one read of a thread's ``stat`` and ``sched``, as the deadline
checks of ``SchedKnob`` make them: by path through ``HostFS.read_or`` (what
they did), and through a descriptor kept open (``OpenFile.read``, what they
do now). 20,000 reads each of a sleeping thread of this process, best of 5.

    python3 benchmarks/evidence/sched-kept-files/micro.py     # from the checkout
"""
import os
import sys
import threading
import timeit

sys.path.insert(0, os.getcwd())

from cosched.hostfs import HostFS  # noqa: E402

N = 20_000


def main() -> None:
    fs, stop, tids = HostFS("/"), threading.Event(), []
    t = threading.Thread(target=lambda: (tids.append(threading.get_native_id()), stop.wait()))
    t.start()
    while not tids:
        pass
    tid = tids[0]
    try:
        for name in ("stat", "sched"):
            path = f"/proc/{tid}/{name}"
            kept = fs.open_file(path)
            by_path = min(timeit.repeat(lambda: fs.read_or(path), number=N, repeat=5)) / N * 1e6
            through = min(timeit.repeat(lambda: kept.read(16384), number=N, repeat=5)) / N * 1e6
            kept.close()
            print(f"/proc/TID/{name}: by path {by_path:.1f} us, kept open {through:.1f} us")
    finally:
        stop.set()
        t.join()


if __name__ == "__main__":
    main()
