"""The switch loop: turns each cell's slot table into freeze/thaw and boosts, on
time, and watches ``boost`` and ``relaxed`` guests.

It runs as its own process (``python -m cosched.switcher``), started
and fed by the daemon, for two reasons measured on real hosts: a Python thread
sharing the daemon's interpreter can be held up to the GIL switch interval
(5 ms) by busy sibling threads, and while boosted vCPUs occupy every CPU an
ordinary (CFS) thread may not run at all. The switcher is single-threaded and
raises itself to SCHED_FIFO above every vCPU boost, so it always gets the CPU
at a slot boundary.

Its rooms: :mod:`.protocol` (the messages), :mod:`.loop` (the I/O loop),
:mod:`.switcher` (the plan in force), :mod:`.rotation` (slot tables),
:mod:`.watching` (``boost`` and ``relaxed`` guests), :mod:`.boosts` (their
size and pace), :mod:`.grants` (RT runtime), :mod:`.vcpus` (what was done to
each vCPU), :mod:`.timing`. How it works, with the measurements behind it:
``docs/design/switcher.md``.
"""
