"""Reading back what the Real-time queries write: where each table is in its input, its windows, its rejects."""

import threading

import orjson
import pytest
from confluent_kafka import KafkaError, KafkaException

from freshroute import input_position
from freshroute.windows import WindowSpec, window_key
from pipeline.follower import FollowedSource, FollowedTable, OutputFollower, committed_offsets
from pipeline.input_lag import InputLagPublisher
from pipeline.topics import end_offset
from tests.unit.fake_changelog import Msg


def test_where_a_query_starts_is_the_end_of_its_last_committed_batch(tmp_path):
    assert committed_offsets(tmp_path) is None  # no checkpoint yet
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    for batch, ends in ((4, {"0": 10, "1": 7}), (5, {"0": 12, "1": 9})):
        (tmp_path / "offsets" / str(batch)).write_text(
            'v1\n{"batchWatermarkMs":0}\n' + orjson.dumps({"readings": ends}).decode())
    (tmp_path / "commits" / "4").write_text("v1\n{}")
    # Batch 5 is planned (its offsets are written) but not committed: it does not count yet.
    assert committed_offsets(tmp_path) == {0: 10, 1: 7}
    (tmp_path / "commits" / "5").write_text("v1\n{}")
    assert committed_offsets(tmp_path) == {0: 12, 1: 9}
    (tmp_path / "commits" / "6").write_text("v1\n{}")  # its offsets file is missing: no answer, no error
    assert committed_offsets(tmp_path) is None


class Expiry:
    def __init__(self):
        self.noted = []

    def note(self, windows):
        self.noted.extend(windows)


def test_rows_and_dead_letters_move_a_tables_position_and_windows_and_rejects_are_noted():
    window = WindowSpec(10_000, 10_000, 5_000, 3_600_000)
    expiry = Expiry()
    stats = FollowedTable("stats", "stats-changelog", "readings", "readings", reached={0: 5})
    windows = FollowedTable("win", "win-changelog", "readings", "readings", window, expiry)
    counts = {}
    source = FollowedSource("readings", "readings.rejected", lambda r: counts.update({r: counts.get(r, 0) + 1}))
    publisher = InputLagPublisher(None, threading.Event(), "nowhere")
    f = OutputFollower(None, [stats, windows], [source], publisher, threading.Event())

    def header(position):
        return [(input_position.HEADER, input_position.encode(position))]

    f._take(Msg(0, b"s1", b"{}", topic="stats-changelog", headers=header([3, 9, None])))  # older than reached in 0
    f._take(Msg(1, b"s1", b"{}", topic="stats-changelog", headers=header([7, None, None])))
    f._take(Msg(0, window_key(b"s1", 20_000), b"{}", partition=3, topic="win-changelog", headers=header([None, 2])))
    f._take(Msg(1, window_key(b"s1", 30_000), None, partition=3, topic="win-changelog", headers=header([None, 3])))
    f._take(Msg(0, b"bad", b"x", topic="readings.rejected", headers=[
        ("freshroute.reason", b"not_json"), ("freshroute.partition", b"2"), ("freshroute.offset", b"40")]))
    assert stats.reached == {0: 8, 1: 10, 2: 41}
    assert windows.reached == {1: 4, 2: 41}
    assert expiry.noted == [(20_000 + 10_000 + 3_600_000, 3, window_key(b"s1", 20_000))]  # a tombstone: none
    assert counts == {"not_json": 1}

    f.reached("stats", {0: 20, 1: 4})  # a checkpoint: never moves a partition back
    assert stats.reached == {0: 20, 1: 10, 2: 41}


def test_a_tables_input_lag_is_its_inputs_ends_beyond_where_its_rows_say_it_is():
    publisher = InputLagPublisher(None, threading.Event(), "nowhere")
    publisher.running(["stats"])
    behind = publisher.observe_positions("stats", {0: 8, 1: 10}, {0: 10, 1: 10, 2: 0}, 1_000)
    assert behind.records == 2 and behind.offsets == {0: 8, 1: 10} and behind.caught_up_ms == publisher.started_ms
    caught_up = publisher.observe_positions("stats", {0: 10, 1: 10}, {0: 10, 1: 10}, 2_000)
    assert caught_up.records == 0 and caught_up.caught_up_ms == 2_000 and caught_up.alive_ms >= caught_up.at_ms
    publisher.running([])  # its query stopped: no longer said to be alive
    stopped = publisher.observe_positions("stats", {0: 10, 1: 10}, {0: 12, 1: 10}, 3_000)
    assert stopped.records == 2 and stopped.caught_up_ms == 2_000 and stopped.alive_ms == caught_up.alive_ms


class Ends:
    """A consumer that says where input partitions end; the first ask of a topic named ``busy`` times out."""

    def __init__(self, ends):
        self.ends = ends
        self.failed = set()

    def get_watermark_offsets(self, tp, timeout, cached):
        from confluent_kafka import KafkaException

        if tp.topic == "busy" and tp.topic not in self.failed:
            self.failed.add(tp.topic)
            raise KafkaException("Local: Timed out")
        return 0, self.ends[tp.topic][tp.partition]


def test_each_input_is_asked_where_it_ends_once_a_round_and_a_broker_too_slow_to_say_skips_only_its_tables():
    a = FollowedTable("a", "a-changelog", "readings", "readings", reached={0: 4, 1: 10})
    b = FollowedTable("b", "b-changelog", "readings", "readings", reached={0: 10, 1: 10})
    c = FollowedTable("c", "c-changelog", "busy", "busy", reached={0: 1})
    publisher = InputLagPublisher(None, threading.Event(), "nowhere")
    publisher.running(["a", "b", "c"])
    f = OutputFollower(Ends({"readings": {0: 10, 1: 10}, "busy": {0: 3}}), [a, b, c], [], publisher,
                       threading.Event())
    f.input_partitions = {"readings": [0, 1], "busy": [0]}
    f._publish()
    assert publisher.latest["a"].records == 6 and publisher.latest["b"].records == 0
    assert "c" not in publisher.latest  # unknown this round: not published as anything
    f._publish()
    assert publisher.latest["c"].records == 2


def test_with_input_arriving_all_the_time_a_table_is_caught_up_as_of_the_latest_round_whose_ends_it_reached():
    t = FollowedTable("a", "a-changelog", "readings", "readings", reached={0: 10, 1: 10})
    publisher = InputLagPublisher(None, threading.Event(), "nowhere")
    publisher.running(["a"])
    consumer = Ends({"readings": {0: 10, 1: 10}})
    f = OutputFollower(consumer, [t], [], publisher, threading.Event())
    f.input_partitions = {"readings": [0, 1]}
    f._publish()
    first = publisher.latest["a"]
    assert first.records == 0
    consumer.ends["readings"] = {0: 12, 1: 11}  # more arrived; the rows have not said so yet
    t.reached.update({0: 11})
    f._publish()
    assert publisher.latest["a"].records == 2 and publisher.latest["a"].caught_up_ms == first.caught_up_ms
    t.reached.update({0: 12, 1: 11})  # the rows reach the second round's ends as a third round sees more
    consumer.ends["readings"] = {0: 13, 1: 11}
    f._publish()
    second_round = f.ends_seen[1][0]
    assert publisher.latest["a"].records == 1 and publisher.latest["a"].caught_up_ms == second_round


class SettlingConsumer:
    """Answers where a partition ends only after its leader is known: the first ``refusals`` asks are refused."""

    def __init__(self, refusals: int, code: int) -> None:
        self.refusals, self.code, self.asked = refusals, code, 0

    def get_watermark_offsets(self, tp, timeout, cached):
        self.asked += 1
        if self.asked <= self.refusals:
            raise KafkaException(KafkaError(self.code, "Broker: Not leader for partition"))
        return 0, 42


def test_where_a_new_topics_partition_ends_is_asked_again_while_its_leader_settles():
    consumer = SettlingConsumer(2, KafkaError.NOT_LEADER_FOR_PARTITION)
    assert end_offset(consumer, "t-changelog", 3) == 42 and consumer.asked == 3
    # Anything else is the caller's to handle at once, and so is a leader that never settles.
    with pytest.raises(KafkaException):
        end_offset(SettlingConsumer(1, KafkaError.TOPIC_AUTHORIZATION_FAILED), "t-changelog", 3)
    never = SettlingConsumer(10**6, KafkaError.LEADER_NOT_AVAILABLE)
    with pytest.raises(KafkaException):
        end_offset(never, "t-changelog", 3, timeout_s=0.3)
    assert 2 <= never.asked <= 5
