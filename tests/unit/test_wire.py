"""Length-prefixed frames: split however the bytes arrive, refuse what is not a frame."""

import pytest

from freshroute.wire import MAX_FRAME, FrameError, FrameReader, frame


def test_frames_are_recovered_whatever_the_chunking():
    payloads = [b"", b"a", b"hello" * 100, bytes(range(256))]
    stream = b"".join(frame(p) for p in payloads)
    for size in (1, 2, 3, 7, 64, len(stream)):
        reader = FrameReader()
        out = []
        for i in range(0, len(stream), size):
            out.extend(reader.feed(stream[i:i + size]))
        assert out == payloads, size


def test_an_incomplete_frame_waits_for_the_rest():
    reader = FrameReader()
    data = frame(b"abcdef")
    assert reader.feed(data[:5]) == []
    assert reader.feed(data[5:] + frame(b"x")[:2]) == [b"abcdef"]
    assert reader.feed(frame(b"x")[2:]) == [b"x"]


def test_an_oversized_length_is_a_frame_error():
    reader = FrameReader()
    with pytest.raises(FrameError, match="limit"):
        reader.feed((MAX_FRAME + 1).to_bytes(4, "big") + b"xx")
    # e.g. an HTTP client on the read port
    with pytest.raises(FrameError):
        FrameReader().feed(b"GET / HTTP/1.1\r\n")
