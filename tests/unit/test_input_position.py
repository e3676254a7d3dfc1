from freshroute import input_position


def test_a_position_covers_another_when_it_is_as_far_in_every_partition_the_other_names():
    assert input_position.covers([3, 9], [3, 8])
    assert input_position.covers([3, 9], [None, 9])
    assert input_position.covers([3, 9], [3, 9])
    assert not input_position.covers([3, 8], [3, 9])
    assert not input_position.covers([None, 9], [0, 9])  # nothing of partition 0 where the held row had some
    assert not input_position.covers([3], [3, 1])  # a partition the new row does not name


def test_a_header_decodes_as_spark_writes_it_and_anything_else_is_no_position():
    assert input_position.decode(b"[null,24,3]") == [None, 24, 3]
    assert input_position.decode(input_position.encode([1, None])) == [1, None]
    for raw in (None, b"", b"not json", b'{"0": 1}', b'[1, "2"]', b"[1.5]"):
        assert input_position.decode(raw) is None
    assert input_position.of_record([("x", b"1"), (input_position.HEADER, b"[1]")]) == b"[1]"
    assert input_position.of_record(None) is None
