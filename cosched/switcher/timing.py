"""The switch loop's clock: how often it reports and looks, and how long it waits.

Measured on a 2-CPU host with TCG guests; ``docs/design/switcher.md`` says why."""
from cosched.switcher import protocol as pr

STATS_EVERY_NS = int(pr.STATS_EVERY_S * 1e9)
IDLE_STATS_EVERY_NS = int(pr.IDLE_STATS_EVERY_S * 1e9)
STATS_SLACK_NS = STATS_EVERY_NS // 2   # a report waits this long for a slot change to ride on: one wake-up, not two
WATCH_POLL_NS = 500_000      # 1 ms co-ran siblings measurably less often (barrier guests, 2-CPU host)
LONG_WAIT_NS = WATCH_POLL_NS  # a wait the meter reports long: as long as the shortest two looks can tell
STILL_WAIT_S = 0.002         # a vCPU kept still for a return from a boost: it freezes in about 0.1 ms
FREEZE_WAIT_S = 0.05         # a TCG vCPU freezes in about 0.1 ms; 64 spinning ones on 2 CPUs in under 4 ms
ADMISSION_CHECK_NS = 1_000_000_000   # the deadline admission total is checked at most this often,
REFUSED_CHECK_NS = 100_000_000       # and this often after a refused boost when nothing need be waited for
