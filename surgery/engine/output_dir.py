"""Safe output folders: refuse risky paths, build beside OUT, publish by a rename that never
replaces what appeared meanwhile, and clean up what an interrupted run left."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import re
import shutil
import signal
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from surgery.core.errors import OutputError
from surgery.engine.output_paths import check_output as check_output  # its callers import it here
from surgery.engine.progress import notice

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
# Hidden siblings of OUT made by a run: `.NAME.partial-PID-HOST` (being built), `.NAME.old-PID-HOST`
# (the previous OUT during a --force swap). HOST tags the pid's namespace (see `host_tag`): on a
# shared file system (NFS, Lustre, containers sharing a volume) a pid means nothing elsewhere.
# Names without HOST were left by older versions: whose pid they hold cannot be told.
_SIBLING = re.compile(
    r"^\.(?P<name>.+)\.(?P<kind>partial|old)-(?P<pid>\d+)(?:-(?P<host>[0-9a-f]{12}))?$"
)
_NAME_MAX = 255


def _remove(path: Path, *, quietly: bool = False) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    except OSError:
        if not quietly:
            raise


def _read_first_line(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.readline().strip()
    except OSError:
        return ""


@cache
def host_tag() -> str:
    """12 hex digits naming where this process's pid is meaningful: the host name, its boot
    (Linux's boot id: a rebooted host is another) and the pid namespace (containers on one host
    sharing a volume each have their own pids)."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    boot = _read_first_line("/proc/sys/kernel/random/boot_id")
    identity = "\0".join([socket.gethostname(), boot, namespace])
    return hashlib.sha256(identity.encode("utf-8", "surrogateescape")).hexdigest()[:12]


def sibling(out: Path, kind: str, pid: int | None = None) -> Path:
    """The hidden `.NAME.KIND-PID-HOST` folder beside `out` (HOST: `host_tag`), its name kept
    within 255 bytes (a long OUT name is shortened and made unique with a hash)."""
    pid = os.getpid() if pid is None else pid
    name, suffix = out.name, f".{kind}-{pid}-{host_tag()}"
    if len(os.fsencode(f".{name}{suffix}")) > _NAME_MAX:
        digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:12]
        name = os.fsdecode(os.fsencode(name)[:180]).rstrip("\udcff") + "~" + digest
    return out.parent / f".{name}{suffix}"


@cache
def _renameat2():
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None  # not Linux, or a C library without renameat2
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    function.argtypes += [ctypes.c_uint]
    return function


def rename_noreplace(source: Path, target: Path) -> None:
    """Rename `source` to `target`, never replacing an existing `target`.

    Atomic on Linux (renameat2 with RENAME_NOREPLACE). Elsewhere, or on a file system without
    it, `target` is checked first; the rename of a folder then still never replaces a file or a
    non-empty folder, so only an empty folder created in between could be lost.

    Raises:
        FileExistsError: `target` exists.
        OSError: the rename failed otherwise.
    """
    rename = _renameat2()
    if rename is not None:
        if rename(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), 1) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise OSError(code, os.strerror(code), str(target))
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target))
    os.rename(source, target)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _provably_dead(match: re.Match[str]) -> bool:
    """Whether the run that named a sibling is gone: only a run of this host, boot and pid
    namespace can be checked (by its pid); any other may be alive elsewhere."""
    if match["host"] != host_tag():
        return False
    pid = int(match["pid"])
    return pid != os.getpid() and not _pid_alive(pid)


def clean_stale_siblings(folder: Path) -> None:
    """Remove what runs that died (SIGKILL) left in `folder`, saying so in a line.

    A staging folder of this host whose process is gone is removed. A `.old` folder (the
    previous OUT during a --force swap) is put back as OUT when OUT is missing, else removed: its
    run had finished. A folder of another host, boot or container is kept (its run may be alive
    on another node of a shared file system), with a line saying so.
    """
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for path in entries:
        match = _SIBLING.match(path.name)
        if match is None:
            continue
        if not _provably_dead(match):
            if match["host"] != host_tag():
                notice(
                    "note",
                    f"kept {path}: left by a run of another host, boot or container, which may "
                    "still be writing it; remove it by hand if it is not",
                )
            continue
        out = folder / match["name"]
        if match["kind"] == "old" and not os.path.lexists(out):
            try:
                rename_noreplace(path, out)
                notice("note", f"restored {out} from {path.name}, left by a run that died")
            except OSError:
                pass
            continue
        _remove(path, quietly=True)
        notice("note", f"removed {path}, left by a run (pid {match['pid']}) that died")


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP for the few renames that publish (delivered after)."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _publish(staging: Path, out: Path, replace: bool) -> None:
    """Rename `staging` to `out`; an existing `out` is swapped out only when `replace`, and put
    back if the swap fails."""
    with _signals_deferred():
        _publish_now(staging, out, replace)


def _publish_now(staging: Path, out: Path, replace: bool) -> None:
    try:
        rename_noreplace(staging, out)
        return
    except FileExistsError:
        if not replace:
            raise OutputError(
                f"output {out} appeared while this run was writing (another run?); it was left "
                "as it is; pass --force to replace it"
            ) from None
    old = sibling(out, "old")
    rename_noreplace(out, old)
    try:
        rename_noreplace(staging, out)
    except BaseException:
        try:
            rename_noreplace(old, out)
        except OSError:
            raise OutputError(
                f"could not replace {out}; its previous version is in {old}"
            ) from None
        raise
    _remove(old, quietly=True)


def _check_disk_space(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise OutputError(
            f"the output needs {needed / 1e9:.2f} GB but {folder} has {free / 1e9:.2f} GB free"
        )


@contextmanager
def staged_output(
    out: Path, *, replace: bool | None = None, carry: Sequence[str] = (), needed: int = 0
) -> Iterator[Path]:
    """Yield a temporary folder beside `out`; on success it becomes `out` by rename.

    Args:
        needed: bytes the caller will write there; refused at once when its file system has
            less free space.
        carry: names of entries of an existing `out` moved into the new output just before it
            replaces `out` (entries the new output also has are not carried).
        replace: whether an existing `out` may be replaced. Default: only if `out` existed when
            staging began (the caller's `check_output` refused it unless forced); an `out` that
            appears while the run writes is then never replaced.

    On any error (or Ctrl-C, SIGTERM, SIGHUP: the CLI turns them into exceptions) the temporary
    folder and any parent folders created for it are removed, so a failed run leaves nothing
    behind. Stale folders of runs that died are cleaned first (`clean_stale_siblings`).

    Raises:
        OutputError: too little disk space for `needed`, or `out` appeared meanwhile and may
            not be replaced.
        OSError: the file system refused (the caller turns it into one line).
    """
    out = Path(out).absolute()
    existing = next(p for p in out.parents if os.path.lexists(p))
    if not existing.is_dir():
        raise OutputError(f"cannot write {out}: {existing} is not a folder")
    created = [p for p in reversed(out.parents) if not p.exists()]
    if replace is None:
        replace = os.path.lexists(out)
    staging = sibling(out, "partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_siblings(out.parent)
        _remove(staging)
        staging.mkdir()
        _check_disk_space(staging, needed)
        yield staging
        for name in carry:
            if (out / name).exists() and not (staging / name).exists():
                os.replace(out / name, staging / name)
        _publish(staging, out, replace)
    except BaseException:
        _remove(staging, quietly=True)
        for folder in reversed(created):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if empty
        raise
