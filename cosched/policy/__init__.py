"""Policies: what each guest's vCPUs should get, as pure code.

``params`` holds the parameter schema of each policy kind; ``presets`` loads
the named presets (``policies/*.toml`` and ``/etc/cosched/policies.d``) that
annotations refer to. Everything here is pure: no libvirt, no /proc.
"""
