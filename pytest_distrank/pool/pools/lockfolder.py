"""The GPU lock folder, used so that nothing another user put in it is trusted.

Runs in the controller (pool mode), for GPU leasing (:mod:`gpus`). The folder is shared by every
user of the machine, so anyone who may write it may put anything in it: a symbolic or hard link
named like a file of the plugin's, pointing at a file of whoever runs the tests; a FIFO, which
blocks whoever opens it; a file under a name the plugin never writes. What this module guarantees
(docs/gpus.md, "The lock folder"):

- The folder is opened once per lease (``O_DIRECTORY | O_NOFOLLOW``: a link in its place is
  refused) and used only through that descriptor (``dir_fd=``), never looked up by path again. Its
  owner must be this user or root, since the owner of a folder may replace any file in it, and a
  folder that others may write must be sticky; otherwise :class:`UnsafeFolder`.
- A file in it is opened only when ``lstat`` says it is a regular file, with ``O_NOFOLLOW |
  O_NONBLOCK``, and ``fstat`` must agree: no link is followed, no FIFO or device waited for.
- Nothing that exists is written, truncated or chmodded: the plugin writes only files it has just
  made (``O_CREAT | O_EXCL``); a note is such a file, renamed over the old note.
- What others wrote is untrusted text: a note is read up to a bound, its control characters
  dropped and its length capped (:func:`untrusted_text`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import secrets
import stat
from pathlib import Path

from ...options import GPU_LOCK_DIR

#: Modes of what the plugin makes in the folder. Lock files are world-writable because version
#: 0.1.0 of the plugin opens them for writing (filelock); shares and notes are only read.
FOLDER_MODE = 0o1777
LOCK_MODE = 0o666
NOTE_MODE = 0o644
#: The longest note shown, in characters; what is read of it, in bytes.
NOTE_LIMIT = 200
_READ_LIMIT = 4 * NOTE_LIMIT
#: How every file in the folder is opened: no link followed, no FIFO waited for, none inherited.
_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

_KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFDIR: "a folder",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


class UnsafeFolder(Exception):
    """The lock folder is not one this process may trust; the message says why and what to do."""


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _make(path: str) -> bool:
    """Make the folder (private until it is checked) if it is missing; whether this did."""
    try:
        Path(path).mkdir(0o700, parents=True)  # the parents with the usual mode
    except FileExistsError:
        return False
    return True


def _refuse(path: str, info: os.stat_result | None) -> None:
    """Raise :class:`UnsafeFolder` unless ``info`` (None: ``path`` is a link) is a folder this
    process may trust."""
    me = os.geteuid()
    option = f"{GPU_LOCK_DIR.flag} (env {GPU_LOCK_DIR.env})"
    if info is None:
        target = untrusted_text(os.readlink(path))
        why = f"it is a symbolic link (to {target}), which the plugin does not follow there"
        fix = f"Point {option} at the folder itself"
    elif info.st_uid not in (me, 0):
        nor_root = "" if me == 0 else " nor root"
        why = (
            f"it belongs to {_user(info.st_uid)}, not to you ({_user(me)}){nor_root}, and the "
            "owner of a folder can replace any file in it"
        )
        fix = (
            f"Point {option} at a folder of your own (a missing one is made), or, to share GPUs "
            "with other users, at one root made: mkdir -m 1777 DIR, as root"
        )
    elif stat.S_IMODE(info.st_mode) & 0o022 and not info.st_mode & stat.S_ISVTX:
        who = "every user" if info.st_mode & 0o002 else "its group"
        why = f"{who} may write it and it is not sticky, so they can replace any file in it"
        fix = f"Make it sticky (chmod +t {path}) or point {option} at another folder"
    else:
        return
    shown = f" (owner {_user(info.st_uid)}, mode {info.st_mode & 0o7777:04o})" if info else ""
    raise UnsafeFolder(f"the GPU lock folder {path}{shown} is not safe to use: {why}.\n{fix}.")


def open_folder(path: str, lock_names: list[str]) -> int:
    """The lock folder, opened and checked; made first if it is missing (sticky and
    world-writable, like /tmp, with the lock files ``lock_names``). The caller closes it. Raise
    :class:`UnsafeFolder`, or ``OSError`` when it cannot be made or opened."""
    made = _make(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except NotADirectoryError:
        if os.path.islink(path):
            _refuse(path, None)
        raise
    try:
        info = os.fstat(fd)
        _refuse(path, info)
        if made and info.st_uid == os.geteuid():
            os.fchmod(fd, FOLDER_MODE)
            for name in lock_names:
                with contextlib.suppress(FileExistsError):
                    os.close(create(fd, name, LOCK_MODE))
    except BaseException:
        os.close(fd)
        raise
    return fd


def create(folder: int, name: str, mode: int) -> int:
    """A new file ``name`` in the folder, opened read-only, with ``mode`` past the umask (it is
    this process's own); raise ``FileExistsError`` when anything has the name."""
    fd = os.open(name, os.O_RDONLY | os.O_CREAT | os.O_EXCL | _OPEN, mode, dir_fd=folder)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def planted(folder: int, name: str) -> str | None:
    """What ``name`` is when it is neither missing nor a regular file ("a FIFO"), else None."""
    try:
        mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    return None if stat.S_ISREG(mode) else _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def open_file(folder: int, name: str, create_mode: int = 0) -> int | None:
    """``name`` in the folder opened read-only, when it is a regular file; None when it is
    missing or something else. With ``create_mode``, a missing file is made with that mode."""
    if planted(folder, name):
        return None
    try:
        fd = os.open(name, os.O_RDONLY | _OPEN, dir_fd=folder)
    except FileNotFoundError:
        if not create_mode:
            return None
        try:
            return create(folder, name, create_mode)
        except FileExistsError:
            return open_file(folder, name)  # made by another process just now
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced after the lstat
        os.close(fd)
        return None
    return fd


def flocked(fd: int, exclusive: bool) -> bool:
    """Take the flock of ``fd`` if no other open file holds it; never waits."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def held(folder: int, name: str) -> bool | None:
    """Whether a live process holds the flock of ``name``: probed read-only and shared, so a file
    another user made can be probed too. None when it is missing or not a regular file."""
    fd = open_file(folder, name)
    if fd is None:
        return None
    try:
        return not flocked(fd, exclusive=False)
    finally:
        os.close(fd)


def remove(folder: int, name: str, fd: int) -> None:
    """Unlink ``name`` if it is still the file ``fd`` has open (raise OSError)."""
    if os.path.samestat(os.stat(name, dir_fd=folder, follow_symlinks=False), os.fstat(fd)):
        os.unlink(name, dir_fd=folder)


def write_note(folder: int, name: str, text: str) -> None:
    """Make ``name`` a new file holding ``text``: a file made for it (``O_EXCL``), renamed over
    whatever had the name, whose target is never opened. Raise OSError (another user's note in a
    sticky folder stays)."""
    temp = f"{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, NOTE_MODE, dir_fd=folder)
    try:
        try:
            os.fchmod(fd, NOTE_MODE)
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=folder)
        raise


def read_note(folder: int, name: str) -> str | None:
    """The note ``name`` as untrusted text, or None when it is missing or not a regular file."""
    fd = open_file(folder, name)
    if fd is None:
        return None
    try:
        data = os.read(fd, _READ_LIMIT)
    finally:
        os.close(fd)
    return untrusted_text(data.decode("utf-8", "replace"))


def untrusted_text(text: str, limit: int = NOTE_LIMIT) -> str:
    """``text`` fit for one line of a message: every character that does not print (control
    characters, escape sequences' ESC, line breaks, bidi overrides) a space, runs of spaces one,
    at most ``limit`` characters."""
    shown = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."
