"""Unit tests of launcher mode's authenticated control store (launch/auth.py, channel, tamper).

torch's TCPStore has no authentication: whoever reaches MASTER_PORT reads and writes every key
(hostile-4 D3: another local user wrote rank 1's "passed" reports and a failing test passed).
Here a real TCPStore runs in this process; the ranks' :class:`Channel` objects connect to it as
they do to torchrun's agent store, and the attacker is a plain client of the same store writing
raw keys. Each attack must be detected: a forged report, a deleted or overwritten genuine one, a
counter bumped with ``add``, a forged plan, a genuine payload replayed under another test index,
rank, run or attempt. The MAC's rule is a property over generated tuples.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pytest import TestReport

from pytest_distrank.envvars import REQUIRE_SECRET_ENV, SECRET_ENV
from pytest_distrank.launch import auth as auth_module
from pytest_distrank.launch import keys
from pytest_distrank.launch import session as session_module
from pytest_distrank.launch.auth import Auth, AuthError, launch_token, mac, obtain, verifies
from pytest_distrank.launch.channel import Channel, ChannelError, Forged
from pytest_distrank.launch.current import Current
from pytest_distrank.launch.early import poll_early
from pytest_distrank.launch.env import Launch
from pytest_distrank.launch.gather import gather
from pytest_distrank.launch.plan import exchange
from pytest_distrank.launch.session import RankSession
from pytest_distrank.settings import Settings, Value

from .test_launch_gather import Reports as Wire  # a report travels as its index in a list

SECRET = b"0123456789abcdef0123456789abcdef"
RUN = "run0123"
NODEID = "test_forge.py::test_rank_one_fails"
LOCATION = ("test_forge.py", 3, "test_rank_one_fails")


def as_is(raw: object) -> object:
    """A reader for payloads these tests make up (the MAC is checked before any reader)."""
    return raw


# -- the MAC: a pure function ------------------------------------------------------------------

Fields = tuple[str, str, int, int, int, bytes]
_FIELDS = st.tuples(
    st.text(max_size=12),
    st.text(max_size=24),
    st.integers(-1, 10**6),
    st.integers(-1, 4096),
    st.integers(0, 100),
    st.binary(max_size=64),
)


@st.composite
def _neighbour(draw: st.DrawFn, fields: Fields) -> Fields:
    """Another tuple close to ``fields``: one field changed, a character moved from one text
    field to the next (what a plain concatenation cannot tell apart), or any tuple."""
    how = draw(st.sampled_from(["field", "shift", "any"]))
    if how == "any":
        return draw(_FIELDS)
    run, key, index, rank, attempt, payload = fields
    if how == "shift":
        if run:
            return run[:-1], run[-1] + key, index, rank, attempt, payload
        return run + key[:1], key[1:], index, rank, attempt, payload
    changed = list(fields)
    i = draw(st.integers(0, 5))
    changed[i] = draw(_FIELDS)[i]
    return cast(Fields, tuple(changed))


@given(st.binary(max_size=40), _FIELDS, st.data())
def test_a_mac_verifies_for_exactly_the_tuple_it_was_made_for(
    secret: bytes, fields: Fields, data: st.DataObject
) -> None:
    """Rule: the MAC of (run, key, index, rank, attempt, payload) verifies for that tuple and for
    no other: a genuine payload replayed under another key, test index, rank, run or attempt, or
    altered, does not verify (with any secret, the empty one of unauthenticated runs included)."""
    other = data.draw(_neighbour(fields))
    tag = mac(secret, *fields)
    assert verifies(secret, *fields, tag)
    assert verifies(secret, *other, tag) == (other == fields)


@given(st.binary(min_size=1, max_size=40), st.binary(min_size=1, max_size=40), _FIELDS)
def test_a_mac_made_with_another_secret_does_not_verify(
    secret: bytes, other: bytes, fields: Fields
) -> None:
    """Rule: a MAC made with one secret verifies under another only if they are the same secret
    (HMAC pads keys with zero bytes, so a secret and itself plus trailing NULs are one key: the
    secrets the plugin uses are hex text, which has none)."""
    same = secret.rstrip(b"\0") == other.rstrip(b"\0")
    assert verifies(other, *fields, mac(secret, *fields)) == same


def test_the_subject_of_each_key_is_its_test_and_rank() -> None:
    assert keys.subject(keys.report(3, 1)) == (3, 1)
    assert keys.subject(keys.stack(0, 2)) == (0, 2)
    assert keys.subject(keys.verdict(3)) == (3, 0)
    assert keys.subject(keys.abort(7)) == (7, 0)
    assert keys.subject(keys.fatal(2)) == (-1, 2)
    assert keys.subject(keys.collect(5)) == (-1, 5)
    assert keys.subject(keys.PLAN) == (-1, 0)
    assert keys.subject(keys.RUN) == (-1, 0)


# -- a real TCPStore, ranks and an attacker ----------------------------------------------------


def _launch(port: int, rank: int = 0, world_size: int = 2, restart: int = 0) -> Launch:
    return Launch(
        launcher="torchrun",
        rank=rank,
        world_size=world_size,
        local_rank=rank,
        local_world_size=world_size,
        master_addr="127.0.0.1",
        master_port=port,
        agent_store=True,
        restart=restart,
        variables=(),
    )


@dataclasses.dataclass
class Store:
    """The store's host (as torchrun's agent) and a way to make each rank's channel. Each test
    is an attempt of its own (torchrun's restart count): its keys are apart from the others'."""

    raw: Any
    attempt: int

    def channel(self, rank: int, secret: bytes = SECRET, world_size: int = 2) -> Channel:
        auth = Auth(secret, "test", True, self.attempt, run=RUN)
        launch = _launch(self.raw.port, rank, world_size, self.attempt)
        return Channel(launch, 5.0, auth, connected=self.raw)

    @property
    def prefix(self) -> str:
        """The Channel's PrefixStore joins its prefix and the key with "/"."""
        return f"distrank/r{self.attempt}/ctl//"

    def forge(self, key: str, value: bytes) -> None:
        """The attacker: any client of the store writes any key."""
        self.raw.set(self.prefix + key, value)

    def bump(self, key: str) -> None:
        self.raw.add(self.prefix + key, 1)

    def raw_get(self, key: str) -> bytes:
        return bytes(self.raw.get(self.prefix + key))


@pytest.fixture(scope="module")
def _host() -> Any:
    """One store for the module, and its one client connection for every rank: new TCPStore
    client connections sometimes stall for the whole connect timeout (channel.py says so too)."""
    import torch.distributed as dist

    return dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5)
    )


_ATTEMPTS = iter(range(1, 10**6))


@pytest.fixture
def store(_host: Any) -> Store:
    return Store(_host, next(_ATTEMPTS))


FORGED_REPORT = (
    b'{"pid": 1, "index": 0, "nodeid": "test_forge.py::test_rank_one_fails", "reports": [], '
    b'"healthy": true, "warnings": [], "sequence": {}}'
)


def test_a_forged_report_is_refused_naming_its_key_and_rank(store: Store) -> None:
    """hostile-4 D3's forge: plain JSON written with a stdlib client."""
    store.forge(keys.report(0, 1), FORGED_REPORT)
    with pytest.raises(Forged) as caught:
        store.channel(0).take(keys.report(0, 1), keys.read_peer_report)
    assert (caught.value.key, caught.value.rank) == ("report/0/1", 1)
    text = str(caught.value)
    assert "'report/0/1' (rank 1) carries no MAC" in text
    assert "someone other than the ranks" in text and "DISTRANK_SECRET differs" in text
    assert isinstance(caught.value, ChannelError)  # a rank that reads one leaves, never passes
    assert not store.raw.check(
        [store.prefix + "report/0/1"]
    )  # taken: the genuine one may still come


def test_a_report_sealed_with_another_secret_does_not_verify(store: Store) -> None:
    """DISTRANK_SECRET differs between nodes (or an attacker guessed a MAC)."""
    store.channel(1, secret=b"another secret of thirty-two ch.").put(keys.report(0, 1), {"a": 1})
    with pytest.raises(Forged, match="does not verify"):
        store.channel(0).take(keys.report(0, 1), keys.read_peer_report)


@pytest.mark.parametrize(
    ("sent", "replayed", "world_size"),
    [
        (keys.report(0, 1), keys.report(1, 1), 2),  # another test index
        (keys.report(0, 1), keys.report(0, 2), 3),  # another rank
        (keys.verdict(0), keys.verdict(1), 2),  # rank 0's verdict on another test
        (keys.early(2, 1), keys.report(2, 1), 2),  # another key of the same test and rank
    ],
)
def test_a_genuine_payload_replayed_under_another_key_does_not_verify(
    store: Store, sent: str, replayed: str, world_size: int
) -> None:
    store.channel(1, world_size=world_size).put(sent, {"outcome": "passed"})
    genuine = store.raw_get(sent)
    store.forge(replayed, genuine)
    reader = store.channel(0, world_size=world_size)
    assert reader.get(sent, as_is) == {"outcome": "passed"}
    with pytest.raises(Forged, match="does not verify"):
        reader.get(replayed, as_is)


def test_a_genuine_payload_of_another_run_or_attempt_does_not_verify(store: Store) -> None:
    """The same DISTRANK_SECRET in two runs: a payload recorded in one is not the other's."""
    writer = store.channel(1)
    writer.put(keys.report(0, 1), {"outcome": "passed"})
    reader = store.channel(0)
    reader.auth.run = "another run"
    with pytest.raises(Forged):
        reader.get(keys.report(0, 1), as_is)
    reader.auth.run, reader.auth.attempt = RUN, 1  # torchrun's next restart
    with pytest.raises(Forged):
        reader.get(keys.report(0, 1), as_is)


def test_a_forged_plan_stops_the_rank_naming_the_plan(store: Store) -> None:
    store.forge(keys.PLAN, b'{"error": null, "steps": [], "pids": [1, 2], "logs": {}}')
    store.channel(0).add(keys.HEARTBEAT, 1)
    rs = SimpleNamespace(channel=store.channel(1), rank=1, log_path="/run/rank1.log")
    rs.launch = _launch(store.raw.port, 1)
    session = SimpleNamespace(items=[])
    plan = exchange(cast(RankSession, rs), cast(Settings, None), cast(pytest.Session, session))
    assert plan.steps == ()
    assert plan.error is not None
    assert "rank 1/2 (torchrun): the control store's 'plan' (rank 0) carries no MAC" in plan.error


# -- rank 0 gathering a test from the real store -----------------------------------------------


def _report(when: str, outcome: str = "passed") -> TestReport:
    return TestReport(NODEID, LOCATION, {}, outcome, "boom" if outcome == "failed" else None, when)  # type: ignore[arg-type]


def _rank0(store: Store, wire: Wire) -> tuple[RankSession, Current]:
    rs = SimpleNamespace(
        rank=0,
        world_size=2,
        channel=store.channel(0),
        pid=os.getpid(),
        pids=(os.getpid(), 4242),
        logs={0: "(rank 0 prints the report)", 1: "node1:/run/rank1.log"},
        serialize=wire.serialize,
        deserialize=wire.deserialize,
    )
    item = SimpleNamespace(nodeid=NODEID, location=LOCATION, path=Path("test_forge.py"))
    cur = Current.begin(0, cast(pytest.Item, item), 2, Value(0.6, "test"), 0.2)
    cur.reports = [_report("setup"), _report("call"), _report("teardown")]
    return cast(RankSession, rs), cur


def _send_last_reports(store: Store, wire: Wire, outcome: str) -> None:
    """What rank 1 sends at the end of its part of the test (plugin._run_peer)."""
    payload = {
        "pid": 4242,
        "index": 0,
        "nodeid": NODEID,
        "reports": [
            wire.serialize(_report(w, outcome if w == "call" else "passed"))
            for w in ("setup", "call", "teardown")
        ],
        "healthy": True,
        "warnings": [],
        "sequence": {},
    }
    peer = store.channel(1)
    peer.put(keys.report(0, 1), payload)
    peer.add(keys.done_count(0), 1)


def _failures(per_rank: dict[int, list[TestReport]], rank: int) -> list[str]:
    return [str(r.longrepr) for r in per_rank.get(rank, []) if r.failed]


def _crashes(reports: list[TestReport]) -> list[Any]:
    """The crash lines of synthesized failures."""
    return [
        SimpleNamespace(crash=r.longrepr.reprcrash.message)  # type: ignore[union-attr]
        for r in reports
        if r.failed and getattr(r.longrepr, "reprcrash", None) is not None
    ]


@pytest.fixture(autouse=True)
def _short_dump_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_distrank.launch import gather as gather_module

    monkeypatch.setattr(gather_module, "DUMP_WAIT", 0.1)


def test_a_forged_passed_report_fails_the_test_and_the_genuine_failure_still_counts(
    store: Store,
) -> None:
    """D3: a passed report written before rank 1's own (which failed) must not pass the test."""
    wire = Wire()
    rs, cur = _rank0(store, wire)
    store.forge(keys.report(0, 1), FORGED_REPORT)
    store.bump(keys.done_count(0))

    def rank_1_ends(now: float) -> bool:  # rank 1's own reports come once rank 0 took the forgery
        if cur.forged and not store.raw.check([store.prefix + keys.report(0, 1)]):
            _send_last_reports(store, wire, "failed")
        return False

    per_rank, stuck, healthy = gather(rs, cur, look=rank_1_ends)
    failures = _failures(per_rank, 1)
    assert "boom" in failures  # rank 1's own failure still counts
    assert any("the control store's 'report/0/1' (rank 1) carries no MAC" in f for f in failures)
    assert [r.crash for r in _crashes(per_rank[1])] == [
        "control store tampered with: 'report/0/1' carries no MAC"
    ]
    assert not healthy and stuck == []
    assert set(cur.forged) == {"report/0/1"}


def test_a_deleted_genuine_report_fails_the_test_naming_the_counter(store: Store) -> None:
    wire = Wire()
    rs, cur = _rank0(store, wire)
    _send_last_reports(store, wire, "passed")
    store.raw.delete_key(store.prefix + keys.report(0, 1))
    per_rank, _, _ = gather(rs, cur)
    failures = _failures(per_rank, 1)
    assert any(
        "'done/0' (rank 1) counts 1 last reports of this test but only 0 were in the store" in f
        for f in failures
    ), failures


def test_an_overwritten_genuine_report_fails_the_test(store: Store) -> None:
    """Rank 1 failed; the attacker overwrites its genuine report with a passed one (a genuine
    payload of another test, replayed)."""
    wire = Wire()
    rs, cur = _rank0(store, wire)
    peer = store.channel(1)
    peer.put(keys.report(5, 1), {"pid": 4242, "index": 5, "nodeid": NODEID, "reports": []})
    _send_last_reports(store, wire, "failed")
    store.forge(keys.report(0, 1), store.raw_get(keys.report(5, 1)))
    per_rank, _, _ = gather(rs, cur)
    failures = _failures(per_rank, 1)
    assert any("'report/0/1' (rank 1) does not verify" in f for f in failures), failures
    assert not any(r.outcome == "passed" and r.when == "call" for r in per_rank[1])


def test_a_counter_bumped_alone_is_named_and_rank_1_is_still_waited_for(store: Store) -> None:
    """A moved counter only says "go read": rank 1 is not taken as finished, its own failure
    arrives and counts, and the counter that moved alone is named."""
    wire = Wire()
    rs, cur = _rank0(store, wire)
    store.bump(keys.done_count(0))
    store.bump(keys.early_count(0))
    poll_early(rs, cur)
    assert cur.early_ranks == set()  # nothing to read: no early failure of rank 1
    _send_last_reports(store, wire, "failed")
    per_rank, _, _ = gather(rs, cur)
    failures = _failures(per_rank, 1)
    assert "boom" in failures  # rank 1's own failure
    assert any("'done/0' (rank 1) counts 2 last reports" in f for f in failures), failures


def test_a_forged_early_failure_or_ended_session_is_named_not_believed(store: Store) -> None:
    wire = Wire()
    rs, cur = _rank0(store, wire)
    store.forge(keys.fatal(1), b'{"pid": 4242, "index": 0, "nodeid": "x", "message": "bye"}')
    store.forge(keys.early(0, 1), b'{"pid": 4242, "index": 0, "nodeid": "x", "kind": "skipped"}')
    store.bump(keys.early_count(0))
    poll_early(rs, cur)
    assert cur.stopped == {}  # rank 1 is not taken for gone
    assert set(cur.forged) == {"fatal/1", "early/0/1"}
    _send_last_reports(store, wire, "passed")
    per_rank, _, healthy = gather(rs, cur)
    assert len(_failures(per_rank, 1)) == 2 and not healthy


def test_genuine_payloads_gather_as_before(store: Store) -> None:
    wire = Wire()
    rs, cur = _rank0(store, wire)
    _send_last_reports(store, wire, "passed")
    per_rank, stuck, healthy = gather(rs, cur)
    assert [r.outcome for r in per_rank[1]] == ["passed"] * 3
    assert stuck == [] and healthy and cur.forged == {}


# -- the secret: where it comes from -----------------------------------------------------------


def _env(**more: str) -> dict[str, str]:
    return {
        "TORCHELASTIC_RUN_ID": "abc",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        **more,
    }


def test_one_node_rank_0_writes_a_private_file_the_others_read(tmp_path: Path) -> None:
    launch = _launch(29500, 0)
    mine = obtain(launch, tmp_path, _env())
    theirs = obtain(dataclasses.replace(launch, rank=1, local_rank=1), tmp_path, _env())
    assert mine.secret == theirs.secret and len(mine.secret) == 64 and mine.authenticated
    assert mine.path is not None
    assert stat.S_IMODE(os.stat(mine.path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(mine.path).st_mode) == 0o600
    other_launch = obtain(launch, tmp_path, _env(TORCHELASTIC_RUN_ID="def"))
    assert other_launch.path != mine.path and other_launch.secret != mine.secret
    mine.forget()
    assert not mine.path.exists()


def test_the_secret_file_is_refused_through_a_link_or_readable_by_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auth_module, "SECRET_WAIT", 0.2)
    peer = _launch(29500, 1)
    path = auth_module.secret_folder(tmp_path) / launch_token(peer, _env())
    target = tmp_path / "attacker's"
    target.write_bytes(b"a" * 64)
    path.symlink_to(target)
    with pytest.raises(AuthError, match="cannot open the secret file"):
        obtain(peer, tmp_path, _env())
    path.unlink()
    path.write_bytes(b"b" * 64)
    path.chmod(0o644)
    with pytest.raises(AuthError, match="can be read by other users"):
        obtain(peer, tmp_path, _env())
    path.unlink()
    with pytest.raises(AuthError, match="rank 0 wrote no secret file"):
        obtain(peer, tmp_path, _env())
    path.parent.chmod(0o755)
    with pytest.raises(AuthError, match="can be entered by other users"):
        obtain(peer, tmp_path, _env())


def test_a_secrets_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    """Another user who owns the temporary folder replaces ``.distrank-secrets`` with a link to a
    folder of theirs: rank 0 must not write the secret there, nor a rank read one from there."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    (tmp_path / ".distrank-secrets").symlink_to(theirs)
    for rank in (0, 1):
        with pytest.raises(AuthError, match=r"\.distrank-secrets is not a folder of the current"):
            obtain(_launch(29500, rank), tmp_path, _env())
    assert list(theirs.iterdir()) == []


def test_a_stale_secret_file_is_read_again(tmp_path: Path) -> None:
    """An earlier launch with the same token left its file; rank 1 read it before rank 0
    replaced it: it reads it again (session._agree_run_id does, while the run id does not
    verify)."""
    launch = _launch(29500, 0)
    folder = auth_module.secret_folder(tmp_path)
    stale = folder / launch_token(launch, _env())
    stale.write_bytes(b"c" * 64)
    stale.chmod(0o600)
    peer = obtain(dataclasses.replace(launch, rank=1), tmp_path, _env())
    assert peer.secret == b"c" * 64
    fresh = obtain(launch, tmp_path, _env())
    assert peer.reread() and peer.secret == fresh.secret


def test_distrank_secret_wins_and_must_be_long_enough(tmp_path: Path) -> None:
    launch = dataclasses.replace(_launch(29500, 1), local_world_size=1, nodes=2)
    got = obtain(launch, tmp_path, _env(**{SECRET_ENV: "s" * 16}))
    assert got.secret == b"s" * 16 and got.authenticated and got.path is None
    with pytest.raises(AuthError, match="DISTRANK_SECRET has 5 characters; it needs at least 16"):
        obtain(launch, tmp_path, _env(**{SECRET_ENV: "short"}))


def test_several_nodes_without_a_secret_are_unauthenticated_or_refused(tmp_path: Path) -> None:
    launch = dataclasses.replace(_launch(29500, 1), local_world_size=1, nodes=2)
    got = obtain(launch, tmp_path, _env())
    assert not got.authenticated and got.secret == b""
    with pytest.raises(AuthError, match="DISTRANK_REQUIRE_SECRET=1 asks for authenticated"):
        obtain(launch, tmp_path, _env(**{REQUIRE_SECRET_ENV: "1"}))


def test_a_wait_for_the_secret_file_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auth_module, "SECRET_WAIT", 0.1)
    start = time.monotonic()
    with pytest.raises(AuthError):
        obtain(_launch(29500, 1), tmp_path, _env())
    assert time.monotonic() - start < 2


def test_the_run_id_is_read_again_while_a_stale_secret_file_was_read(
    store: Store, tmp_path: Path
) -> None:
    """session._agree_run_id: rank 1 read an earlier launch's secret file before rank 0 replaced
    it; the run id rank 0 then sealed does not verify, so rank 1 reads the file again."""
    launch = _launch(store.raw.port, 0, restart=store.attempt)
    fresh = obtain(launch, tmp_path, _env())
    assert fresh.path is not None
    rank0 = Channel(launch, 5.0, dataclasses.replace(fresh, run=""), connected=store.raw)
    stale = Auth(b"d" * 64, "test", True, store.attempt, path=fresh.path)
    peer = dataclasses.replace(launch, rank=1)
    rank1 = Channel(peer, 5.0, stale, connected=store.raw)
    run_id = session_module._agree_run_id(launch, rank0)
    assert session_module._agree_run_id(peer, rank1) == run_id
    assert rank1.auth.secret == fresh.secret and rank1.auth.run == run_id


def test_a_run_id_that_never_verifies_stops_the_rank_naming_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_module, "RUN_VERIFY", 0.2)
    store.forge(keys.RUN, b'"0123456789ab"')
    peer = _launch(store.raw.port, 1, restart=store.attempt)
    channel = Channel(peer, 5.0, Auth(SECRET, "test", True, store.attempt), connected=store.raw)
    with pytest.raises(ChannelError, match=r"rank 1/2 \(torchrun\): the control store's 'run'"):
        session_module._agree_run_id(peer, channel)
