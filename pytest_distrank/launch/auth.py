"""Launcher mode: the control store's payloads are authenticated (HMAC-SHA256 with a run secret).

Runs in every rank of a launched world: :func:`obtain` at configure time, before the control
store is reached; :class:`Auth` in the main thread and the watchdog thread of every rank, through
:class:`channel.Channel` (and in a process a test forked, which inherits it).

torch's ``TCPStore`` has no authentication: whoever reaches MASTER_ADDR:MASTER_PORT reads and
writes every key. So the secret never comes from the store, nor from any exchange over it:

- ``DISTRANK_SECRET`` set (the user sets the same value for every rank, in the environment: never
  on a command line, which ``/proc/<pid>/cmdline`` shows to every local user): that secret.
- otherwise, when every rank is on this machine: rank 0 draws one and writes it to a file
  ``<pytest's temp folder of this user>/.distrank-secrets/<launch token>`` (folder 0700, file
  0600, opened ``O_NOFOLLOW``, owner and mode checked before reading), whose name every local rank
  derives from the launcher's environment alone (:func:`launch_token`); the other ranks wait for
  it. Rank 0 removes it once every rank has proven it holds the secret (a signed collection).
- otherwise (several nodes, no secret): the payloads carry a MAC with an empty key, which binds
  them to their key, test, rank and attempt but proves nothing about who wrote them; rank 0 says
  so in the header, and ``DISTRANK_REQUIRE_SECRET=1`` refuses such a run instead.

Each payload's MAC covers the run (rank 0's random run id), its key, the test index and the rank
the key names (:func:`keys.subject`), the launcher's attempt (torchrun's restart count) and the
payload: a genuine payload replayed under another key, test, rank, run or attempt does not
verify. :func:`mac` is a pure function (property-tested in ``tests/unit/test_launch_auth.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import os
import secrets
import stat
import struct
import time
from collections.abc import Mapping
from pathlib import Path

from ..envvars import REQUIRE_SECRET_ENV, SECRET_ENV
from .env import Launch

#: Bound on a local rank's wait for rank 0's secret file (rank 0 may still be importing).
SECRET_WAIT = 120.0
#: The shortest ``DISTRANK_SECRET`` accepted (characters).
MIN_SECRET = 16
#: The MAC's hex length and what separates it from the payload on the wire.
MAC_HEX = 64
_SEP = ":"
_DOMAIN = b"pytest-distrank control payload v1\x00"
#: The launcher's variables that name one launch (every rank of it sees the same values).
TOKEN_VARIABLES = (
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "PMIX_NAMESPACE",
    "OMPI_MCA_ess_base_jobid",
    "OMPI_MCA_orte_ess_jobid",
    "MASTER_ADDR",
    "MASTER_PORT",
)
#: What a payload that does not verify means, for the messages that name it.
MEANING = (
    "someone other than the ranks of this run wrote to the control store at "
    "MASTER_ADDR:MASTER_PORT (torch's TCPStore has no authentication: any local user, or any host "
    "that reaches the port, can), or DISTRANK_SECRET differs between the nodes"
)


class AuthError(Exception):
    """No secret can be had (a refused folder or file, a short DISTRANK_SECRET, none in time)."""


def mac(
    secret: bytes, run: str, key: str, index: int, rank: int, attempt: int, payload: bytes
) -> str:
    """HMAC-SHA256 over the run, key, test index, rank, attempt and payload (hex).

    Each field is length-prefixed, so no two different tuples encode alike.
    """
    digest = hmac.new(secret, _DOMAIN, hashlib.sha256)
    for field in (run.encode(), key.encode(), str(index).encode(), str(rank).encode()):
        digest.update(struct.pack(">Q", len(field)) + field)
    digest.update(struct.pack(">Q", len(str(attempt))) + str(attempt).encode())
    digest.update(struct.pack(">Q", len(payload)) + payload)
    return digest.hexdigest()


def verifies(
    secret: bytes, run: str, key: str, index: int, rank: int, attempt: int, payload: bytes, tag: str
) -> bool:
    """Whether ``tag`` is the MAC of exactly this tuple (compared in constant time)."""
    return hmac.compare_digest(mac(secret, run, key, index, rank, attempt, payload), tag)


@dataclasses.dataclass
class Auth:
    """This rank's secret and what its MACs cover besides each payload's key."""

    secret: bytes
    #: Where the secret came from, in words (the header says it).
    source: str
    #: Whether the secret is one only the ranks know (False: several nodes, no DISTRANK_SECRET).
    authenticated: bool
    #: torchrun's restart count.
    attempt: int
    #: Rank 0's run id once agreed ("" while the run id itself travels).
    run: str = ""
    #: The secret file (one node, no DISTRANK_SECRET): re-read while stale, removed by rank 0.
    path: Path | None = None

    def seal(self, key: str, index: int, rank: int, text: str) -> str:
        """``text`` as it travels: the MAC, then the payload."""
        tag = mac(self.secret, self.run, key, index, rank, self.attempt, text.encode())
        return tag + _SEP + text

    def unseal(self, key: str, index: int, rank: int, raw: bytes) -> str:
        """The payload of ``raw`` read at ``key``; ValueError (why, in words) unless it
        verifies."""
        try:
            wire = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("is not text") from None
        tag, sep, text = wire[:MAC_HEX], wire[MAC_HEX : MAC_HEX + 1], wire[MAC_HEX + 1 :]
        if sep != _SEP:
            raise ValueError("carries no MAC")
        if not verifies(self.secret, self.run, key, index, rank, self.attempt, text.encode(), tag):
            raise ValueError("does not verify (its MAC is not this run's for this key)")
        return text

    def reread(self) -> bool:
        """Read the secret file again (a stale one of an earlier launch was read); whether it
        changed."""
        if self.path is None:
            return False
        with contextlib.suppress(AuthError, OSError):
            fresh = _read_secret(self.path)
            if fresh is not None and fresh != self.secret:
                self.secret = fresh
                return True
        return False

    def forget(self) -> None:
        """Rank 0: remove the secret file (every rank has read it, or the run ends)."""
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def launch_token(launch: Launch, env: Mapping[str, str]) -> str:
    """A name for this launch that every rank on this machine derives alike, without the store."""
    parts = [launch.launcher, str(launch.restart), str(launch.world_size)]
    parts += [f"{name}={env.get(name, '')}" for name in TOKEN_VARIABLES]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def obtain(launch: Launch, base: Path, env: Mapping[str, str]) -> Auth:
    """This rank's secret (see the module docstring); :class:`AuthError` when none can be had."""
    given = env.get(SECRET_ENV, "")
    if given:
        if len(given) < MIN_SECRET:
            raise AuthError(
                f"{SECRET_ENV} has {len(given)} characters; it needs at least {MIN_SECRET} "
                "(e.g. the output of: python -c 'import secrets; print(secrets.token_hex(32))')"
            )
        return Auth(given.encode(), f"{SECRET_ENV} (environment)", True, launch.restart)
    if launch.one_node:
        path = secret_folder(base) / launch_token(launch, env)
        secret = _make_secret(path) if launch.rank == 0 else _wait_secret(path)
        return Auth(secret, "a file of this user (one node)", True, launch.restart, path=path)
    if env.get(REQUIRE_SECRET_ENV, "") not in ("", "0"):
        raise AuthError(
            f"{launch.world_size} ranks on several nodes and {SECRET_ENV} is not set, but "
            f"{REQUIRE_SECRET_ENV}={env[REQUIRE_SECRET_ENV]} asks for authenticated results.\n"
            f"Set {SECRET_ENV} to the same random value for every rank, in the environment "
            "(docs/multi-node.md, Security)"
        )
    return Auth(b"", "none (several nodes, DISTRANK_SECRET not set)", False, launch.restart)


def secret_folder(base: Path) -> Path:
    """``<base>/.distrank-secrets``: made 0700; refused unless a folder of this user that nobody
    else can enter (:func:`_open_folder`)."""
    folder = base / ".distrank-secrets"
    os.close(_open_folder(folder))
    return folder


def _open_folder(folder: Path) -> int:
    """``folder`` (made 0700 when missing), opened without following a link and checked through
    that descriptor: what is checked is what the file is then opened in."""
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise AuthError(f"{folder} is not a folder of the current user ({exc.strerror})") from None
    info = os.fstat(fd)
    problem = ""
    if info.st_uid != os.geteuid():
        problem = "is not a folder owned by the current user"
    elif info.st_mode & 0o077:
        problem = (
            f"can be entered by other users (mode {stat.S_IMODE(info.st_mode):o}); make it 0700 "
            "or remove it"
        )
    if problem:
        os.close(fd)
        raise AuthError(f"{folder} {problem}")
    return fd


def _make_secret(path: Path) -> bytes:
    """Rank 0: a fresh secret in ``path`` (written aside, then renamed over a stale one)."""
    secret = secrets.token_hex(32).encode()
    aside = f"{path.name}.{os.getpid()}"
    folder = _open_folder(path.parent)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(aside, dir_fd=folder)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        fd = os.open(aside, flags, 0o600, dir_fd=folder)
        try:
            os.write(fd, secret)
        finally:
            os.close(fd)
        os.replace(aside, path.name, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        os.close(folder)
    return secret


def _read_secret(path: Path) -> bytes | None:
    """The secret in ``path``; None while it is missing or incomplete. :class:`AuthError` for a
    file that is not this user's own, 0600 (a link is refused by ``O_NOFOLLOW``)."""
    folder = _open_folder(path.parent)
    try:
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=folder)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise AuthError(f"cannot open the secret file {path}: {exc}") from None
    finally:
        os.close(folder)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise AuthError(f"{path} is not a file owned by the current user")
        if info.st_mode & 0o077:
            raise AuthError(f"{path} can be read by other users (mode {info.st_mode & 0o777:o})")
        data = os.read(fd, 4 * MAC_HEX)
    finally:
        os.close(fd)
    return data if len(data) == MAC_HEX else None


def _wait_secret(path: Path) -> bytes:
    end = time.monotonic() + SECRET_WAIT
    delay = 0.005
    while True:
        secret = _read_secret(path)
        if secret is not None:
            return secret
        if time.monotonic() >= end:
            raise AuthError(
                f"rank 0 wrote no secret file {path} within {SECRET_WAIT:.0f} s; do all ranks "
                "share one temporary folder (TMPDIR, --basetemp)? Or set DISTRANK_SECRET"
            )
        time.sleep(delay)
        delay = min(2 * delay, 0.1)
