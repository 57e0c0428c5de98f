"""The benchmark harness: the full suite, scale, soak, and their reports."""
import subprocess


def commit() -> str | None:
    """The short hash of the checkout's HEAD the harness runs from, with ``+`` appended
    when tracked files differ from it (None outside a git checkout)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        return None
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], capture_output=True).returncode
    return head.stdout.strip() + ("+" if dirty else "")
