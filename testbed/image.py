"""Build the test guest: a Debian kernel plus a one-program initramfs.

The image is tiny and reproducible: the kernel is taken (not installed) from
Debian's ``linux-image-cloud-amd64`` package, and the initramfs holds just
``/dev/console`` and ``/init``, the static workload program compiled from
``testbed/workloads/guest-init.c``. Timestamps are zeroed and entries sorted,
so the same inputs give the same bytes. Results are cached under
``CACHE_DIR/<key>/`` where the key hashes the kernel package name and the
workload source; a rebuild happens only when either changes.

:func:`build_software` builds a second initramfs with real software beside
``/init``: the Debian programs of :data:`SOFTWARE` (installed on the host by
``make deps``) with the shared libraries ``ldd`` names for them, for the
``exec`` workload. Only the guests that run such software boot it: it is
larger, and TCG unpacks it slowly.

Run ``python3 -m testbed.image`` to build and print the paths.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CACHE_DIR = Path(os.environ.get("COSCHED_TESTBED_CACHE", "/var/cache/cosched-testbed"))
SOURCE = Path(__file__).resolve().parent / "workloads" / "guest-init.c"
KERNEL_META_PACKAGE = "linux-image-cloud-amd64"
# real guest software: a parallel compressor, a thread benchmark, and tools a pipe joins
SOFTWARE = ("/usr/bin/pigz", "/usr/bin/sysbench", "/usr/bin/dd", "/usr/bin/cat")


@dataclass(frozen=True)
class GuestImage:
    kernel: Path
    initrd: Path


def _run(cmd: list[str], **kw) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def kernel_package() -> str:
    """The versioned kernel package the meta package points at."""
    out = _run(["apt-cache", "depends", KERNEL_META_PACKAGE])
    for line in out.splitlines():
        words = line.split()
        if words[:1] == ["Depends:"] and words[1].startswith("linux-image-"):
            return words[1]
    raise RuntimeError(f"cannot resolve {KERNEL_META_PACKAGE}: run 'apt-get update' first")


def fetch_kernel(package: str, dest: Path) -> None:
    """Download ``package`` with apt and copy its vmlinuz to ``dest``."""
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # apt's sandbox user must be able to write here
        _run(["apt-get", "download", "-q", package], cwd=tmp)
        (deb,) = Path(tmp).glob("*.deb")
        root = Path(tmp) / "root"
        _run(["dpkg-deb", "-x", str(deb), str(root)])
        (vmlinuz,) = (root / "boot").glob("vmlinuz-*")
        shutil.copyfile(vmlinuz, dest)


def _cpio_entry(name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> bytes:
    """One entry of a ``newc`` cpio archive (the initramfs format)."""
    fields = [0, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name) + 1, 0]
    head = b"070701" + b"".join(b"%08X" % f for f in fields) + name.encode() + b"\0"
    head += b"\0" * (-len(head) % 4)
    return head + data + b"\0" * (-len(data) % 4)


def make_initramfs(init_binary: bytes, files: dict[str, bytes] | None = None) -> bytes:
    """A gzip'd newc archive with /dev, /dev/console and /init, and ``files``
    (path in the guest: contents, made executable) with their directories."""
    out = io.BytesIO()
    out.write(_cpio_entry("dev", 0o040755))
    out.write(_cpio_entry("dev/console", 0o020600, rdev=(5, 1)))
    out.write(_cpio_entry("dev/null", 0o020666, rdev=(1, 3)))
    out.write(_cpio_entry("dev/zero", 0o020666, rdev=(1, 5)))
    out.write(_cpio_entry("init", 0o100755, init_binary))
    files = files or {}
    dirs = sorted({str(parent) for path in files for parent in Path(path.lstrip("/")).parents if str(parent) != "."})
    for d in dirs:
        out.write(_cpio_entry(d, 0o040755))
    for path in sorted(files):
        out.write(_cpio_entry(path.lstrip("/"), 0o100755, files[path]))
    out.write(_cpio_entry("TRAILER!!!", 0))
    return gzip.compress(out.getvalue(), mtime=0)


def closure(programs: tuple[str, ...]) -> dict[str, bytes]:
    """``programs`` and every shared library ``ldd`` says they load (the
    dynamic loader included), by path, as the host has them."""
    paths = set(programs)
    for prog in programs:
        if not os.path.exists(prog):
            raise RuntimeError(f"{prog} is not installed: run `make deps`")
        for line in _run(["ldd", prog]).splitlines():
            words = line.split()
            lib = words[2] if len(words) > 2 and words[1] == "=>" else words[0] if words else ""
            if lib.startswith("/"):
                paths.add(lib)
    return {p: Path(p).read_bytes() for p in sorted(paths)}


def compile_init(dest: Path) -> None:
    _run(["gcc", "-O2", "-static", "-pthread", "-o", str(dest), str(SOURCE)])


def build_software(cache_dir: Path = CACHE_DIR) -> GuestImage:
    """The image with :data:`SOFTWARE` in its initramfs (the same kernel)."""
    files = closure(SOFTWARE)
    digest = hashlib.sha256(b"".join(p.encode() + hashlib.sha256(b).digest() for p, b in files.items()))
    return build(cache_dir, files, digest.hexdigest()[:16])


def build(cache_dir: Path = CACHE_DIR, files: dict[str, bytes] | None = None, variant: str = "") -> GuestImage:
    """Return the cached image, building whatever is missing (``files``:
    what the initramfs holds beside /init, ``variant`` names them)."""
    package = kernel_package()
    key = hashlib.sha256(package.encode() + SOURCE.read_bytes()).hexdigest()[:16]
    out = cache_dir / key
    image = GuestImage(kernel=out / "vmlinuz", initrd=out / (f"initrd-{variant}.gz" if variant else "initrd.gz"))
    if image.kernel.exists() and image.initrd.exists():
        return image
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(cache_dir, 0o755)
    os.chmod(out, 0o755)
    with tempfile.TemporaryDirectory() as tmp:
        init = Path(tmp) / "init"
        compile_init(init)
        partial = out / (image.initrd.name + ".part")
        partial.write_bytes(make_initramfs(init.read_bytes(), files))
        partial.chmod(0o644)
        partial.rename(image.initrd)
    if not image.kernel.exists():
        fetch_kernel(package, out / "vmlinuz.part")
        (out / "vmlinuz.part").chmod(0o644)
        (out / "vmlinuz.part").rename(image.kernel)
    return image


if __name__ == "__main__":
    img, software = build(), build_software()
    print(f"kernel {img.kernel}\ninitrd {img.initrd}\ninitrd with software {software.initrd}", file=sys.stdout)
