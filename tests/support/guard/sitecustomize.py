"""Loaded by every Python process the tests start (``PYTHONPATH`` holds this
directory): installs the scheduling guard of :mod:`guard_rules`."""
from guard_rules import install

install()
