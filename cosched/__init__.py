"""cosched: co-scheduling of libvirt guests' vCPU threads."""

__version__ = "0.1.0"
