"""The wire framer: frontend messages out of bytes however a socket cuts them."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from resgroups.server.wire import Framer

messages = st.lists(
    st.tuples(st.sampled_from([b"P", b"B", b"D", b"E", b"S", b"Q", b"X"]), st.binary(max_size=300)),
    max_size=12,
)


def _wire(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


@settings(max_examples=300, deadline=None)
@given(messages, st.lists(st.integers(1, 400), max_size=40))
def test_messages_come_out_whole_and_in_order_however_the_bytes_are_cut(
    sent: list[tuple[bytes, bytes]], cuts: list[int]
) -> None:
    data = b"".join(_wire(k, b) for k, b in sent)
    framer, got, at = Framer(), [], 0
    for n in [*cuts, len(data)]:
        chunk, at = data[at : at + n], at + n
        got += framer.feed(chunk)
        if at >= len(data):
            break
    assert got == sent
    assert all(type(body) is bytes for _, body in got)
    assert framer.violation is None
    assert framer.feed(b"") == []  # nothing left over


@given(messages, st.integers(1, 50))
def test_a_length_that_lies_stops_the_framing_after_the_messages_before_it(
    sent: list[tuple[bytes, bytes]], cut: int
) -> None:
    data = b"".join(_wire(k, b) for k, b in sent) + b"Q" + struct.pack("!i", 3) + b"more"
    framer = Framer()
    got = framer.feed(data[:cut]) + framer.feed(data[cut:])
    assert got == sent
    assert framer.violation is not None
    assert "invalid message length 3" in str(framer.violation)
    assert framer.feed(_wire(b"S", b"")) == []  # nothing is framed after it


def test_a_message_over_the_limit_is_a_violation() -> None:
    framer = Framer(limit=100)
    assert framer.feed(_wire(b"Q", b"x" * 96)) == [(b"Q", b"x" * 96)]
    assert framer.feed(_wire(b"Q", b"x" * 97)) == []
    assert "allowed 4..100" in str(framer.violation)
