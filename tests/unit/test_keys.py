import pytest

from freshroute.keys import deserialize_key, murmur2, partition_for, serialize_key

# Known answers from Apache Kafka's own UtilsTest.testMurmur2.
KAFKA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize("data,expected", sorted(KAFKA_MURMUR2.items()))
def test_murmur2_matches_kafka(data, expected):
    assert murmur2(data) == expected


def test_partition_is_positive_modulo():
    # -973932308 & 0x7fffffff = 1173551340; % 8 = 4
    assert partition_for(b"21", 8) == 1173551340 % 8 == 4
    assert all(0 <= partition_for(serialize_key(f"sensor-{i}"), 8) < 8 for i in range(500))


def test_key_round_trip_is_utf8():
    assert serialize_key("sensor-ü") == "sensor-ü".encode()
    assert deserialize_key(serialize_key("sensor-ü")) == "sensor-ü"
