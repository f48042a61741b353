"""Unit tests of launcher mode's payload readers (launch/keys.py): each payload is checked once,
where it leaves the store, key by key.

Properties over generated payloads of every kind: a valid one survives the JSON trip and reads back
as it was sent (tuples included); one with a key removed, an unknown key added, or a key of the
wrong type raises :class:`keys.MessageError` naming the kind and that key. And the channel turns
that error into :class:`channel.Malformed`, a :class:`channel.Forged`, so that rank 0 fails the
test naming the store key (tests/e2e/test_launch.py shows it in a launched world).
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.launch import keys
from pytest_distrank.launch.channel import Channel, Forged, Malformed

READERS: dict[type, Callable[[object], Any]] = {
    keys.Identity: keys.read_identity,
    keys.Collected: keys.read_collected,
    keys.PlanData: keys.read_plan,
    keys.Verdict: keys.read_verdict,
    keys.Early: keys.read_early,
    keys.PeerReport: keys.read_peer_report,
    keys.Stack: keys.read_stack,
    keys.Fatal: keys.read_fatal,
    keys.Abort: keys.read_abort,
    keys.Records: keys.read_records,
    keys.Still: keys.read_still,
    keys.Counts: keys.read_counts,
}
KINDS = sorted(READERS, key=lambda kind: kind.__name__)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=5,
)


def _is_typeddict(hint: Any) -> bool:
    return isinstance(hint, type) and hasattr(hint, "__total__")


def valid(hint: Any) -> st.SearchStrategy[Any]:
    """Values of ``hint`` as the sender holds them (tuples stay tuples)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return JSON
    if origin in (Union, types.UnionType):
        return st.one_of([valid(a) for a in args])
    if origin is Literal:
        return st.sampled_from(args)
    if _is_typeddict(hint):
        hints = get_type_hints(hint)
        return st.fixed_dictionaries({name: valid(h) for name, h in hints.items()})
    if origin is list:
        return st.lists(valid(args[0]), max_size=3)
    if origin is tuple:
        return st.tuples(*[valid(a) for a in args])
    if origin is dict:
        return st.dictionaries(valid(args[0]), valid(args[1]), max_size=3)
    return {str: st.text(max_size=8), int: st.integers(), bool: st.booleans()}.get(hint, st.none())


def accepts(hint: Any, value: object) -> bool:
    """Whether ``value``'s JSON type could be ``hint``'s, looking only at the top level (a
    candidate of a wrong type fails this)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(accepts(a, value) for a in args)
    if origin is Literal:
        return value in args
    wanted = {list: list, tuple: list, dict: dict}.get(origin) or (
        dict if _is_typeddict(hint) else hint
    )
    return type(value) is (wanted if wanted is not None else type(None))


#: A payload of some kind: (its TypedDict, a valid value of it).
CASES = st.sampled_from(KINDS).flatmap(lambda kind: st.tuples(st.just(kind), valid(kind)))
WRONG = [1.5, "?", 7, True, None, ["?"], {"?": 1}]


def wire(payload: object) -> object:
    return json.loads(json.dumps(payload))


@given(CASES)
def test_a_valid_payload_reads_back_as_it_was_sent(case: tuple[type, dict[str, Any]]) -> None:
    kind, payload = case
    assert READERS[kind](wire(payload)) == payload


@given(CASES, st.data())
def test_a_payload_without_one_key_is_refused_naming_it(
    case: tuple[type, dict[str, Any]], data: st.DataObject
) -> None:
    kind, payload = case
    key = data.draw(st.sampled_from(sorted(payload)))
    del payload[key]
    with pytest.raises(keys.MessageError) as caught:
        READERS[kind](wire(payload))
    assert (caught.value.kind, caught.value.field) == (kind.__name__, key)
    assert f"the {kind.__name__} payload's {key!r} is missing" in str(caught.value)


@given(CASES, st.data())
def test_a_key_of_a_wrong_type_is_refused_naming_it(
    case: tuple[type, dict[str, Any]], data: st.DataObject
) -> None:
    kind, payload = case
    hints = get_type_hints(kind)
    key = data.draw(st.sampled_from(sorted(k for k in hints if hints[k] is not Any)))
    payload[key] = data.draw(st.sampled_from([v for v in WRONG if not accepts(hints[key], v)]))
    with pytest.raises(keys.MessageError) as caught:
        READERS[kind](wire(payload))
    assert (caught.value.kind, caught.value.field) == (kind.__name__, key)
    assert repr(payload[key]) in str(caught.value)


@given(CASES)
def test_an_unknown_key_is_refused_naming_it(case: tuple[type, dict[str, Any]]) -> None:
    kind, payload = case
    payload["surplus"] = 1
    with pytest.raises(keys.MessageError, match=r"'surplus' is 1 .int., not absent"):
        READERS[kind](wire(payload))


def test_a_wrong_type_deep_inside_is_named_by_its_path() -> None:
    stack = {"reports": [], "dump": "", "when": "call", "records": "", "since_ns": 0}
    stack |= {"warnings": [["m", "q", "t", "f", "7"]], **keys.identity(0, "t.py::t")}
    with pytest.raises(keys.MessageError) as caught:
        keys.read_stack(stack)
    assert caught.value.field == "warnings[0][4]"
    assert str(caught.value) == "the Stack payload's 'warnings[0][4]' is '7' (str), not int"
    plan: dict[str, Any] = {
        "error": None,
        "pids": [1],
        "logs": {},
        "steps": [{"kind": "all", "reason": ""}],
    }
    with pytest.raises(keys.MessageError, match=r"'steps\[0\].backend' is missing"):
        keys.read_plan(plan)
    with pytest.raises(keys.MessageError, match=r"'action' is 'go' .str., not Literal"):
        keys.read_verdict({"action": "go", "reason": "", "gen": 1})


def test_plain_values_are_read_as_their_type() -> None:
    assert (keys.read_exit(3), keys.read_run("abc")) == (3, "abc")
    with pytest.raises(
        keys.MessageError, match=r"the exit payload's 'value' is '3' .str., not int"
    ):
        keys.read_exit("3")
    with pytest.raises(keys.MessageError):
        keys.read_exit(True)


class _Sealed:
    """What a :class:`Channel` needs to read: a store holding one sealed payload, and an auth
    that opens it (the MAC itself is tested in test_launch_auth.py)."""

    def __init__(self, payload: object) -> None:
        self.wire = json.dumps(payload).encode()

    def get(self, key: str) -> bytes:
        return self.wire

    def unseal(self, key: str, index: int, rank: int, raw: bytes) -> str:
        return raw.decode()


def test_the_channel_fails_a_malformed_payload_naming_its_key_and_rank() -> None:
    channel = Channel.__new__(Channel)
    store = _Sealed({"records": "", "since_ns": "late"})
    channel.control, channel.auth = store, store  # type: ignore[assignment]
    with pytest.raises(Malformed) as caught:
        channel.get(keys.records(3, 1), keys.read_records)
    assert isinstance(caught.value, Forged)  # rank 0 fails the test with it, as with a forgery
    assert (caught.value.key, caught.value.rank) == ("records/3/1", 1)
    assert "the Records payload's 'since_ns' is 'late' (str), not int" in str(caught.value)
    assert caught.value.headline == "malformed control payload"
