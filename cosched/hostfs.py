"""Every file the daemon reads or writes on the host goes through a HostFS.

``HostFS("/")`` is the real host; tests build a fake /proc, /sys and cgroup
tree in a temporary directory and pass that directory as the root, the way
prometheus_client's ``ProcessCollector(proc=...)`` is tested on a fake /proc.
Paths given to the methods are absolute host paths (``/proc/1/stat``).
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import resource
from pathlib import Path

from cosched.kernel import status_field

PIDFD_THREAD = os.O_EXCL        # include/uapi/linux/pidfd.h (Linux 6.9): a pidfd of one thread
FD_SETSIZE = 1024               # select(2) takes descriptors below this
OUT_OF_FILES = (errno.EMFILE, errno.ENFILE)   # the process's open files limit reached, or the system's


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft limit of open files to its hard limit, and
    return (before, after). The daemon keeps two or three descriptors open
    per vCPU thread it samples, and its switcher (which inherits the limit)
    up to eight per vCPU it watches; systemd starts services with a soft
    limit of 1,024 (and a hard one of 524,288), which would have them stop
    opening at a few hundred vCPUs. ``OSError`` where the kernel (or a
    seccomp filter) refuses."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:                   # not called otherwise: a strict seccomp filter may refuse the call
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return soft, hard


def _kept(fd: int) -> int:
    """``fd``, moved to ``FD_SETSIZE`` or above where the open files limit
    allows: descriptors kept open for good leave the numbers below it to
    those the switcher waits on with select(2) (its timer needs
    microseconds, which poll(2) does not take): pidfds of vCPU threads and
    the meter's reports."""
    try:
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, FD_SETSIZE)
    except OSError:                   # the limit is FD_SETSIZE or below, or reached
        return fd
    os.close(fd)
    return high


RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
_SYS_OPENAT2 = 437          # the same number on every architecture (Linux 5.6)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    how = _OpenHow(flags, 0, resolve)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(_SYS_OPENAT2, dirfd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


class HostFS:
    def __init__(self, root: str | os.PathLike = "/"):
        self.root = Path(root)
        self._prefix = str(self.root).rstrip("/") + "/"

    def _real(self, host_path: str) -> str:
        return self._prefix + host_path.lstrip("/")

    def path(self, host_path: str) -> Path:
        """The real location of ``host_path`` under this root."""
        return Path(self._real(host_path))

    def read(self, host_path: str) -> str:
        """The whole file as text (UTF-8, undecodable bytes replaced, line
        ends as text mode reads them)."""
        text = self.read_bytes(host_path).decode("utf-8", "replace")
        return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text

    def read_or(self, host_path: str, default: str | None = None) -> str | None:
        """``read``, but ``default`` when the file is gone (a thread exited)."""
        try:
            return self.read(host_path)
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            return default

    def read_bytes(self, host_path: str) -> bytes:
        """The whole file, through one descriptor and no buffered file object:
        the switcher reads a boosted vCPU's /proc files around every boost,
        thousands of times a second, and the file object's layers took three
        quarters of each read's time (10-12 us against 3-4, here)."""
        fd = os.open(self._real(host_path), os.O_RDONLY | os.O_CLOEXEC)
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def write(self, host_path: str, data: str) -> None:
        with open(self.path(host_path), "w", encoding="utf-8") as f:
            f.write(data)

    def listdir(self, host_path: str) -> list[str]:
        try:
            return os.listdir(self.path(host_path))
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            return []

    def exists(self, host_path: str) -> bool:
        return self.path(host_path).exists()

    def mkdir(self, host_path: str) -> None:
        os.mkdir(self.path(host_path))

    def rmdir(self, host_path: str) -> None:
        """Remove a directory (a cgroup: its control files go with it)."""
        os.rmdir(self.path(host_path))

    def exe(self, pid: int) -> tuple[str, os.stat_result]:
        """Process ``pid``'s executable: the path it was started from, as the
        process sees it (a ``" (deleted)"`` suffix, which a replaced binary
        gets, removed), and the file's status, read through ``/proc/PID/exe``:
        the very file the process runs, in whatever mount namespace it is."""
        link = self._real(f"/proc/{pid}/exe")
        target = os.readlink(link).removesuffix(" (deleted)")
        if self._prefix != "/" and target.startswith(self._prefix):
            target = "/" + target[len(self._prefix):]
        return target, os.stat(link)

    def read_in_root(self, root: str, path: str, limit: int = 1 << 20) -> str:
        """The text of ``path`` as seen inside ``root`` (a process's
        ``/proc/PID/root``), resolved as if ``root`` were ``/`` (openat2's
        RESOLVE_IN_ROOT: a symbolic link or ``..`` cannot lead out of it, nor
        through /proc's magic links); a file over ``limit`` bytes is refused
        with ValueError. Kernels before 5.6 have no openat2: OSError, and
        nothing is read."""
        dirfd = os.open(self._real(root), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = _openat2(dirfd, path, os.O_RDONLY | os.O_CLOEXEC, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
        finally:
            os.close(dirfd)
        try:
            data = os.read(fd, limit + 1)
            while len(data) <= limit and (chunk := os.read(fd, limit + 1 - len(data))):
                data += chunk
        finally:
            os.close(fd)
        if len(data) > limit:
            raise ValueError(f"{root}{path} is larger than {limit} bytes")
        return data.decode("utf-8", "replace")

    def open_fd(self, host_path: str) -> int:
        """A read-only descriptor, for files sampled many times a second."""
        return _kept(os.open(self._real(host_path), os.O_RDONLY | os.O_CLOEXEC))

    def exit_fd(self, tid: int) -> int | None:
        """A descriptor that turns readable once thread ``tid`` has exited
        (a pidfd), None where no live process stands behind the path (a
        fake root). On kernels before 6.9, which open pidfds of processes
        only, it is the pidfd of the thread's process: readable once the
        whole process has exited. Raises ``ProcessLookupError`` when the
        thread is already gone."""
        if self.root != Path("/"):
            return None
        try:
            return os.pidfd_open(tid, PIDFD_THREAD)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise ProcessLookupError(e.errno, os.strerror(e.errno)) from e
        tgid = status_field(self.read_or(f"/proc/{tid}/status"), "Tgid")
        if tgid is None:
            raise ProcessLookupError(errno.ESRCH, os.strerror(errno.ESRCH))
        return os.pidfd_open(int(tgid))

    def open_file(self, host_path: str, write: bool = False) -> "OpenFile":
        """``host_path`` kept open for whole reads or writes many times a second."""
        return OpenFile(self.path(host_path), write)


class OpenFile:
    """A host file opened on first use and then read or written whole through
    that descriptor (``pread``/``pwrite`` at offset 0).

    Kernel files suit this: a cgroup or /proc file regenerates its text on
    every read from offset 0, and a cgroup control file takes each write as a
    new command. Measured on 64 vCPU cgroups, a ``cgroup.freeze`` write costs
    8 us this way against 25 us for open-write-close from Python, and a
    ``cgroup.events`` read 2 us against 20 us. Once the kernel object is gone
    (a removed cgroup answers ENODEV) the file is opened again by path, once,
    so a cgroup re-created under the same path is reached; ENOENT propagates.
    """

    def __init__(self, path: Path, write: bool):
        self.path = path
        self.flags = (os.O_WRONLY if write else os.O_RDONLY) | os.O_CLOEXEC
        self.fd: int | None = None

    def _fd(self) -> int:
        if self.fd is None:
            self.fd = _kept(os.open(self.path, self.flags))
        return self.fd

    def _call(self, op):
        try:
            return op(self._fd())
        except OSError as e:
            self.close()
            if e.errno != errno.ENODEV:
                raise
        return op(self._fd())

    def read(self, size: int = 4096) -> str:
        """The file's text, up to ``size`` bytes (one ``pread``)."""
        return self._call(lambda fd: os.pread(fd, size, 0)).decode("utf-8", "replace")

    def write(self, data: str) -> None:
        self._call(lambda fd: os.pwrite(fd, data.encode(), 0))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def mounts(fs: HostFS) -> list[tuple[str, str, tuple[str, ...]]]:
    """Each mount of the host as (filesystem type, mount point, super
    options), from ``/proc/self/mountinfo``: the one reader of it."""
    out = []
    for line in (fs.read_or("/proc/self/mountinfo") or "").splitlines():
        left, sep, right = line.partition(" - ")
        fields, parts = left.split(), right.split()
        if sep and parts and len(fields) > 4:
            out.append((parts[0], fields[4].replace("\\040", " "), tuple(parts[2].split(",")) if len(parts) > 2 else ()))
    return out


def mount_point(fs: HostFS, fstype: str, option: str | None = None) -> str | None:
    """Where the first ``fstype`` mount is (with super option ``option``:
    a v1 cgroup hierarchy's controller, ``cpu`` or ``cpuset``); None when
    there is none, as for a v1 controller on a pure v2 host."""
    return find_mount(mounts(fs), fstype, option)


def find_mount(found: list[tuple[str, str, tuple[str, ...]]], fstype: str, option: str | None = None) -> str | None:
    """:func:`mount_point` among mounts already read with :func:`mounts`."""
    return next((m for t, m, opts in found if t == fstype and (option is None or option in opts)), None)


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Parse the kernel's CPU list format (``0-3,8,10-11``)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(set(cpus)))
