"""The changelog tailer against an in-memory consumer: what it applies, skips, resumes and resets."""

from __future__ import annotations

import dataclasses
import logging
import time
from types import SimpleNamespace

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException

from freshroute import version_time
from freshroute.metadata.roles import ReplicaState, Role
from store_node.changelog import ChangelogTailer
from store_node.replica import replica_path
from store_node.replica_store import ReplicaStore
from store_node.settings import StoreNodeSettings
from tests.unit.fake_changelog import (SPEC, Clock, Err, FakeAdmin, FakeConsumer, Msg, eof, host, record, refetch, stats,
                                       steps_until)

KEY = ("counts", 0)
STATS_INTERVAL_MS = StoreNodeSettings.model_fields["statistics_interval_ms"].default


@pytest.fixture
def env(tmp_path, request):
    clock = Clock()
    made = {}

    def consumer_factory(config):
        made["consumer"] = FakeConsumer(config)
        return made["consumer"]

    def admin_factory(config):
        made["admin"] = FakeAdmin(config)
        return made["admin"]

    # Record by record: the path a replica that resumes takes (tests/unit/test_bulk_restore.py has the bulk one).
    # A replica moved away stops at once here; test_a_replica_moved_away_serves_on_… gives it time to serve on.
    # A test changes these through indirect parametrization: @pytest.mark.parametrize("env", [{...}], indirect=True).
    settings = StoreNodeSettings(**{"node_id": "n1", "data_dir": tmp_path, "removed_replica_grace_ms": 0,
                                    "moved_replica_serve_ms": 0, "topic_check_ms": 1, "caught_up_threshold": 0,
                                    "bulk_restore": False, **getattr(request, "param", {})})
    tailer = ChangelogTailer(settings, clock, consumer_factory, admin_factory)
    assert tailer.open()
    yield SimpleNamespace(tailer=tailer, clock=clock, consumer=made["consumer"], admin=made["admin"], root=tmp_path,
                          made=made)
    tailer.close()


@pytest.fixture
def made(env):
    """The fakes the tailer made, the latest of each kind."""
    return env.made


def test_new_replica_restores_from_the_beginning(env):
    host(env, 0)
    assert env.consumer.assigned == {(SPEC.topic, 0): OFFSET_BEGINNING}
    rep = env.tailer.serving[KEY]
    assert rep.state is ReplicaState.RESTORING and rep.role is Role.ACTIVE


def test_new_replicas_are_opened_first_and_assigned_together(env, monkeypatch):
    store = ReplicaStore.open(replica_path(env.root, "counts", 2))
    store.apply([(b"a", b"1")], 42)
    store.close()
    calls = []
    monkeypatch.setattr(env.consumer, "incremental_assign", lambda tps: calls.append(
        [(tp.partition, tp.offset) for tp in tps]) or FakeConsumer.incremental_assign(env.consumer, tps))
    host(env, 0, 1, 2)
    assert calls == [[(0, OFFSET_BEGINNING), (1, OFFSET_BEGINNING), (2, 42)]]  # one assignment, after every open
    starts = {env.tailer.serving[("counts", p)].restore_started for p in (0, 1, 2)}
    assert len(starts) == 1  # their restores are timed from that assignment


def test_replicas_whose_assignment_fails_are_closed_and_retried(env, monkeypatch):
    import store_node.assignment_follower as assignment_follower

    def refuse(tps):
        raise KafkaException(KafkaError(KafkaError._STATE))

    monkeypatch.setattr(env.consumer, "incremental_assign", refuse)
    monkeypatch.setattr(assignment_follower, "_RETRY_S", 0.0)  # the retry delay has passed by the next round
    host(env, 0, 1)
    assert dict(env.tailer.serving) == {}
    monkeypatch.undo()
    env.tailer.step()  # the stores were closed: reopening them is not refused as locked
    assert set(env.tailer.serving) == {("counts", 0), ("counts", 1)}
    assert env.consumer.assigned == {(SPEC.topic, 0): OFFSET_BEGINNING, (SPEC.topic, 1): OFFSET_BEGINNING}


def test_a_full_fetch_queue_backs_off_instead_of_spinning(env):
    # librdkafka's fetch thread spins on a full queue with no backoff; the tailer's consumer pauses 10 ms.
    assert env.consumer.config["fetch.queue.backoff.ms"] == 10
    assert env.consumer.config["max.partition.fetch.bytes"] == 1024 * 1024  # the settings' other bounds stay


def test_restart_resumes_from_the_stored_offset(env):
    store = ReplicaStore.open(replica_path(env.root, "counts", 0))
    store.apply([(b"a", b"1")], 42)
    store.close()
    host(env, 0)
    assert env.consumer.assigned == {(SPEC.topic, 0): 42}
    rep = env.tailer.serving[KEY]
    assert rep.counters.resumed_from == 42 and rep.store.get(b"a") == b"1"


def test_records_are_applied_latest_wins_tombstones_delete_poison_is_skipped(env):
    host(env, 0)
    changelog = [
        record(0, "a", {"n": 1}), record(1, "b", {"n": 2}), record(2, "a", {"n": 3}),
        record(3, "b", None),  # tombstone
        Msg(4, None, b'{"n": 9}'),  # null key
        record(5, "c", b"not json"),
        record(6, b"\xff\xfe", {"n": 1}),  # not UTF-8
        record(7, "d", {"n": 4}),
        eof(8),  # a restore is written by the end of the partition at the latest
    ]
    env.consumer.queue += changelog
    env.tailer.step()
    rep = env.tailer.serving[KEY]
    assert rep.lag.applied == 0 and env.tailer.records_skipped == 0  # the window held poison: read again
    refetch(env, changelog)
    env.tailer.step()
    assert rep.store.get(b"a") == b'{"n": 3}'
    assert rep.store.get(b"b") is None
    assert rep.store.get(b"c") is None
    assert rep.store.get(b"d") == b'{"n": 4}'
    assert rep.lag.applied == 8  # the poison records are behind the replica, not blocking it
    assert rep.counters.records_skipped == 3 and env.tailer.records_skipped == 3
    assert rep.counters.records_applied == 5


@pytest.mark.parametrize("key_format, value_format, good, bad", [
    # bytes keys and values: anything but a null key is a record (what a pipeline's table would skip is kept)
    ("bytes", "bytes", [(b"\xff\xfe", b"\x00\x01"), (b"k", b"not json")], [(None, b"x")]),
    # JSON keys, text values
    ("json", "string", [(b'{"id":1}', "héllo".encode())], [(b"not-json", b"v"), (b'"k"', b"\xff\xfe")]),
])
def test_a_topic_served_as_it_is_keeps_the_records_of_its_formats_and_skips_the_others(env, key_format, value_format,
                                                                                       good, bad):
    from dataclasses import replace

    spec = replace(SPEC, key_format=key_format, value_format=value_format, origin="topic")
    env.tailer.set_desired({KEY: (spec, Role.ACTIVE)})
    env.tailer.step()
    rep = env.tailer.serving[KEY]
    changelog = [Msg(i, k, v) for i, (k, v) in enumerate(good + bad)] + [eof(len(good) + len(bad))]
    env.consumer.queue += changelog
    env.tailer.step()
    if bad and rep.lag.applied == 0:  # the restore window held poison: read again, each record checked
        refetch(env, changelog)
        env.tailer.step()
    assert {k: rep.store.get(k) for k, _ in good} == dict(good)
    assert rep.lag.applied == len(good) + len(bad) and rep.counters.records_skipped == len(bad)


def test_records_of_several_partitions_go_to_their_own_replicas(env):
    host(env, 0, 1)
    env.consumer.queue += [record(0, "a", 1, partition=0), record(0, "b", 2, partition=1),
                           record(1, "c", 3, partition=0), eof(2, partition=0), eof(1, partition=1)]
    env.tailer.step()
    r0, r1 = env.tailer.serving[("counts", 0)], env.tailer.serving[("counts", 1)]
    assert (r0.lag.applied, r1.lag.applied) == (2, 1)
    assert r1.store.get(b"b") == b"2" and r0.store.get(b"b") is None


def test_eof_is_fresh_evidence_and_skips_gaps(env):
    host(env, 0)
    env.consumer.queue += [record(0, "a", 1), eof(5)]  # offsets 1..4 were compacted away / control records
    env.tailer.step()
    rep = env.tailer.serving[KEY]
    assert rep.lag.applied == 5
    assert rep.state is ReplicaState.ACTIVE  # caught up, with evidence from that fetch
    assert rep.snapshot().staleness_ms == 0


def caught_up_by_statistics(env):
    """A replica of partition 0 that applied 10 records, which the broker's statistics then said was its end:
    (the replica, when it was complete as of). That is the statistics before, since the response came after them;
    the first statistics only show the partition fetched from its leader, whose responses counted by then may
    answer requests sent before."""
    host(env, 0)
    rep = env.tailer.serving[KEY]
    env.consumer.queue += [record(i, f"k{i}", i) for i in range(10)]
    env.tailer.step()
    env.consumer.pending_stats.append(stats({0: 10}, rx=4))
    env.tailer.step()
    assert rep.snapshot().lag_offsets is None
    env.clock.now += STATS_INTERVAL_MS
    env.consumer.pending_stats.append(stats({0: 10}, rx=5))
    env.tailer.step()
    return rep, env.clock.now - STATS_INTERVAL_MS


def test_stats_evidence_needs_a_responding_broker(env):
    rep, caught_up_at = caught_up_by_statistics(env)
    assert rep.state is ReplicaState.ACTIVE
    assert rep.snapshot().lag_offsets == 0
    # The broker stops answering: rx stays put, so there is no new evidence.
    for _ in range(5):
        env.clock.now += 1000
        env.consumer.pending_stats.append(stats({0: 10}, rx=5))
        env.tailer.step()
    assert rep.snapshot().staleness_ms == env.clock.now - caught_up_at
    # It answers again.
    env.clock.now += 100
    env.consumer.pending_stats.append(stats({0: 10}, rx=6))
    env.tailer.step()
    assert rep.snapshot().staleness_ms == 0


def test_a_response_the_network_held_back_is_no_evidence_of_now(env):
    """Found by loadtest.partitions (a store node's links 200 ms slower and 30 % lossy): a Fetch response
    retransmitted for seconds carried an end offset seconds old, and dated by its arrival the replica said it had
    been caught up 5 s ago where it had been behind for 10."""
    rep, caught_up_at = caught_up_by_statistics(env)
    env.clock.now += 5000
    env.consumer.pending_stats.append(stats({0: 10}, rx=5))  # silence
    env.tailer.step()
    # One response comes through, 4.5 s after its request, then the end of the records it carried.
    env.clock.now += 100
    env.consumer.pending_stats.append(stats({0: 10}, rx=6, rtt_max_ms=4500))
    env.consumer.queue += [eof(10)]
    env.tailer.step()
    snap = rep.snapshot()
    assert snap.lag_offsets is None  # the broker said so 4.6 s ago, past the evidence window
    assert snap.staleness_ms == env.clock.now - max(caught_up_at, env.clock.now - 100 - 4500)
    # Answers the broker sends at once are evidence again.
    env.clock.now += 100
    env.consumer.pending_stats.append(stats({0: 10}, rx=7, rtt_max_ms=2))
    env.tailer.step()
    assert rep.snapshot().lag_offsets == 0 and rep.snapshot().staleness_ms == 0


def test_a_batch_dates_its_end_offset_by_the_partitions_leader_not_by_another_broker(env):
    """With several brokers, one that answers for other partitions says nothing of a silent leader's end offset: a
    batch applied from what the consumer had fetched must not make the replica look caught up as of now."""
    rep, caught_up_at = caught_up_by_statistics(env)
    for answered in range(10, 30):  # 2 s of the leader silent, broker 2 answering
        env.clock.now += STATS_INTERVAL_MS
        env.consumer.pending_stats.append(stats({0: 10}, rx=5, others={2: answered}))
        env.tailer.step()
    env.consumer.watermarks[(SPEC.topic, 0)] = 12
    env.consumer.queue += [record(i, f"k{i}", i) for i in range(10, 12)]
    env.tailer.step()
    snap = rep.snapshot()
    assert rep.lag.applied == 12
    assert snap.lag_offsets is None and snap.staleness_ms == env.clock.now - caught_up_at
    # The leader answers again: the batch's end is its news.
    env.clock.now += 100
    env.consumer.pending_stats.append(stats({0: 12}, rx=6, others={2: 30}))
    env.tailer.step()
    assert rep.snapshot().lag_offsets == 0 and rep.snapshot().staleness_ms == 0


@pytest.mark.parametrize("moving", [
    {"fetched_from": 1},  # the metadata names the new leader; the partition is still with the dead one's fetcher
    {"fetched_from": -1},  # … or with none
    {"fetch_state": "validate-epoch-wait"},  # the consumer validates its position with the new leader
    {},  # fetched from the new leader: the responses counted so far answer requests sent before it was
], ids=["old-fetcher", "no-fetcher", "validating", "just-joined"])
def test_a_new_leaders_answers_do_not_date_the_old_leaders_end(env, moving):
    """The kill -9 of a broker under load: its partitions' new leader answers fetches of other partitions all along,
    while the statistics keep the dead leader's high watermark until the new one answers a fetch of the partition. Dated
    by the new leader's answers, that old end made a replica say "0 behind, 0 ms" of records it had not seen."""
    rep, caught_up_at = caught_up_by_statistics(env)
    rx2 = 100
    env.clock.now += 3000  # broker 1 died; the controller has not moved its partitions yet
    env.consumer.pending_stats.append(stats({0: 10}, rx=5, state="DOWN", others={2: rx2}))
    env.tailer.step()
    assert rep.snapshot().lag_offsets is None
    new_leader = {"leader": 2, "leader_epoch": 1, "state": "DOWN"}
    for _ in range(5 if moving else 1):
        env.clock.now += STATS_INTERVAL_MS
        rx2 += 1
        env.consumer.pending_stats.append(stats({0: 10}, rx=5, others={2: rx2}, **new_leader, **moving))
        env.consumer.queue += [eof(10)]  # the end of what the old leader served, seen late
        env.tailer.step()
        snap = rep.snapshot()
        assert snap.lag_offsets is None and snap.staleness_ms == env.clock.now - caught_up_at
    # The new leader's answer to a fetch of the partition: 2 records were appended meanwhile.
    for _ in range(2):
        env.clock.now += STATS_INTERVAL_MS
        rx2 += 1
        env.consumer.pending_stats.append(stats({0: 12}, rx=5, others={2: rx2}, **new_leader))
        env.tailer.step()
    snap = rep.snapshot()
    assert snap.lag_offsets == 2 and snap.staleness_ms == env.clock.now - caught_up_at
    env.consumer.queue += [record(10, "k10", 10), record(11, "k11", 11)]
    env.tailer.step()
    assert rep.snapshot().lag_offsets == 0 and rep.snapshot().staleness_ms == 0


def test_a_leader_elected_again_in_a_new_epoch_dates_the_end_only_by_its_answers_since(env):
    rep, caught_up_at = caught_up_by_statistics(env)
    env.clock.now += 3000  # its only answers for 3 s, in epoch 0, were before it lost the leadership and won it back
    env.consumer.pending_stats.append(stats({0: 10}, rx=6, leader_epoch=1))
    env.tailer.step()
    snap = rep.snapshot()
    assert snap.lag_offsets is None and snap.staleness_ms == env.clock.now - caught_up_at
    env.clock.now += STATS_INTERVAL_MS
    env.consumer.pending_stats.append(stats({0: 10}, rx=7, leader_epoch=1))
    env.tailer.step()
    assert rep.snapshot().lag_offsets == 0 and rep.snapshot().staleness_ms == 0


def test_broker_down_gives_no_evidence(env):
    host(env, 0)
    env.consumer.pending_stats.append(stats({0: 0}, rx=3, state="DOWN"))
    env.tailer.step()
    assert env.tailer.serving[KEY].state is ReplicaState.RESTORING


def test_high_watermark_below_applied_wipes_and_restores(env):
    host(env, 0)
    env.consumer.queue += [record(i, f"k{i}", i) for i in range(20)] + [eof(20)]
    env.tailer.step()
    rep = env.tailer.serving[KEY]
    assert rep.lag.applied == 20
    # For a moment the broker reports an older watermark than the records it served: not a loss.
    env.consumer.pending_stats.append(stats({0: 18}, rx=8))
    env.tailer.step()
    env.consumer.pending_stats.append(stats({0: 20}, rx=9))
    env.tailer.step()
    assert rep.counters.restores == 0 and rep.lag.applied == 20
    rx = 10

    def low_watermark_for(ms: int, hi: int) -> None:
        nonlocal rx
        for _ in range(ms // 500):
            env.clock.now += 500
            env.consumer.pending_stats.append(stats({0: hi}, rx=rx))
            rx += 1
            env.tailer.step()

    # A new leader whose high watermark waits 30 s for a stalled follower to leave the ISR: not a loss either, and
    # the replica's staleness grows meanwhile (the low watermark is no evidence of being caught up).
    low_watermark_for(30_000, 18)
    assert rep.counters.restores == 0 and rep.lag.applied == 20
    assert rep.snapshot().staleness_ms >= 30_000
    env.consumer.pending_stats.append(stats({0: 20}, rx=rx))
    rx += 1
    env.tailer.step()
    assert rep.snapshot().staleness_ms == 0
    # A memory-only broker restarted: the recreated changelog has only 3 records, and stays so past the window.
    low_watermark_for(36_000, 3)
    assert rep.counters.restores == 1
    assert rep.lag.applied == 0 and rep.state is ReplicaState.RESTORING
    assert rep.store.get(b"k5") is None
    assert env.consumer.assigned[(SPEC.topic, 0)] == OFFSET_BEGINNING
    env.consumer.queue += [record(0, "x", 1), record(1, "y", 2), record(2, "z", 3), eof(3)]
    env.tailer.step()
    assert rep.lag.applied == 3 and rep.store.get(b"z") == b"3" and rep.state is ReplicaState.ACTIVE


def test_out_of_range_wipes_and_restores(env):
    host(env, 0)
    env.consumer.queue += [record(0, "a", 1)]
    env.tailer.step()
    env.consumer.queue += [Msg(1, topic=SPEC.topic, partition=0, error=Err(KafkaError._AUTO_OFFSET_RESET))]
    env.tailer.step()
    rep = env.tailer.serving[KEY]
    assert rep.counters.restores == 1 and rep.store.get(b"a") is None
    assert env.consumer.assign_calls[-1] == (SPEC.topic, 0, OFFSET_BEGINNING)


def test_records_after_a_reset_in_the_same_batch_are_dropped(env):
    host(env, 0)
    env.consumer.queue += [record(0, "a", 1),
                           Msg(1, topic=SPEC.topic, partition=0, error=Err(KafkaError._AUTO_OFFSET_RESET)),
                           record(7, "stale", 1), eof(8)]
    env.tailer.step()
    rep = env.tailer.serving[KEY]
    assert rep.store.get(b"stale") is None and rep.lag.applied == 0


def test_librdkafka_lines_go_to_the_nodes_logger_and_the_admin_clients_are_served(env):
    node_kafka = logging.getLogger("store_node.kafka.n1")
    assert env.consumer.config["logger"] is node_kafka and env.admin.config["logger"] is node_kafka
    served = env.admin.polls
    env.tailer.step()  # an admin client's log lines wait in its queue until it is polled
    assert env.admin.polls > served


def test_recreated_topic_is_detected_by_its_id(env):
    env.admin.topic_ids[SPEC.topic] = "id-1"
    host(env, 0)
    env.consumer.queue += [record(0, "a", 1)]
    rep = env.tailer.serving[KEY]
    steps_until(env, lambda: rep.store.topic_id == "id-1")
    env.admin.topic_ids[SPEC.topic] = "id-2"
    steps_until(env, lambda: rep.counters.restores == 1)
    assert rep.store.get(b"a") is None
    steps_until(env, lambda: rep.store.topic_id == "id-2")
    assert rep.counters.restores == 1


def test_an_admin_client_waiting_for_a_dead_controller_is_replaced(env, made):
    # librdkafka's DescribeTopics waits for the controller of its last metadata, reconnecting without pause.
    made["admin"].controller_down = True
    made["admin"].topic_ids[SPEC.topic] = "id-1"
    host(env, 0)
    stale = made["admin"]
    steps_until(env, lambda: made["admin"] is not stale)
    assert stale.described >= 1
    made["admin"].topic_ids[SPEC.topic] = "id-1"
    rep = env.tailer.serving[KEY]
    steps_until(env, lambda: rep.store.topic_id == "id-1")
    assert made["admin"].described >= 1


def test_topic_ids_wait_while_no_broker_answers(env, made):
    made["admin"].topic_ids[SPEC.topic] = "id-1"
    host(env, 0)
    env.tailer.end_offsets.on_client_error(KafkaError(KafkaError._ALL_BROKERS_DOWN))
    asked = made["admin"].described
    for _ in range(5):
        time.sleep(0.002)  # topic_check_ms=1
        env.tailer.step()
    assert made["admin"].described == asked
    env.consumer.pending_stats.append(stats({0: 0}, rx=3))
    steps_until(env, lambda: made["admin"].described > asked)


def test_corrupt_store_on_open_is_wiped(env):
    path = replica_path(env.root, "counts", 0)
    store = ReplicaStore.open(path)
    store.apply([(b"a", b"1")], 9)
    store.close()
    (path / "CURRENT").write_text("garbage\n")
    host(env, 0)
    rep = env.tailer.serving[KEY]
    assert rep.lag.applied == 0 and rep.store.get(b"a") is None
    assert env.consumer.assigned[(SPEC.topic, 0)] == OFFSET_BEGINNING


def test_failed_read_marks_the_replica_for_rebuild(env):
    host(env, 0)
    env.consumer.queue += [record(0, "a", 1)]
    env.tailer.step()
    rep = env.tailer.serving[KEY]
    rep.mark_corrupt("checksum mismatch")
    env.tailer.step()
    assert rep.counters.restores == 1 and rep.corrupt_reason is None


def test_role_changes_and_removal(env):
    host(env, 0, 1, role=Role.STANDBY)
    env.consumer.queue += [record(0, "a", 1), eof(1)]
    env.tailer.step()
    rep = env.tailer.serving[KEY]
    assert rep.state is ReplicaState.STANDBY
    host(env, 0, 1, role=Role.ACTIVE)
    assert rep.state is ReplicaState.ACTIVE and env.tailer.serving[KEY] is rep

    host(env, 1)  # partition 0 moves away
    assert KEY not in env.tailer.serving and rep.store is None
    assert (SPEC.topic, 0) not in env.consumer.assigned
    path = replica_path(env.root, "counts", 0)
    env.tailer.step()  # grace period 0 and a fresh assignment: the files go
    assert not path.exists()


@pytest.mark.parametrize("env", [{"removed_replica_grace_ms": 60_000}], indirect=True)
def test_moved_back_within_grace_resumes_from_its_files(env, tmp_path):
    host(env, 0)
    env.consumer.queue += [record(0, "a", 1), record(1, "b", 2), eof(2)]
    env.tailer.step()
    host(env)
    host(env, 0)
    assert env.consumer.assigned[(SPEC.topic, 0)] == 2
    assert env.tailer.serving[KEY].store.get(b"b") == b"2"


# Replicas moved away serve on for 10 s.
serve_on_10_s = pytest.mark.parametrize("env", [{"moved_replica_serve_ms": 10_000}], indirect=True)


def caught_up_with_time_to_serve_on(env):
    """Partition 0 hosted here and caught up, with 10 s to serve on once moved away (an env made serve_on_10_s)."""
    host(env, 0)
    env.consumer.queue += [record(0, "a", 1), eof(1)]
    env.tailer.step()
    return env.tailer.serving[KEY]


@serve_on_10_s
def test_a_replica_moved_away_serves_on_as_a_standby_then_stops(env):
    rep = caught_up_with_time_to_serve_on(env)
    moved_at = time.monotonic()  # its 10 s count from here or later, however long the steps below take
    host(env, 1)  # partition 0 placed elsewhere: it answers on, as a standby, and follows its changelog
    assert env.tailer.serving[KEY] is rep and rep.role is Role.STANDBY and rep.store.get(b"a") == b"1"
    assert (SPEC.topic, 0) in env.consumer.assigned
    env.consumer.queue += [record(1, "b", 2), eof(2)]
    env.tailer.step()
    assert rep.store.get(b"b") == b"2" and rep.state is ReplicaState.STANDBY
    env.tailer.replicas.end_moved(moved_at + 9)
    assert env.tailer.serving[KEY] is rep
    env.tailer.replicas.end_moved(time.monotonic() + 11)  # its time is over: it stops, its files kept
    assert KEY not in env.tailer.serving and rep.store is None and (SPEC.topic, 0) not in env.consumer.assigned


@serve_on_10_s
def test_a_replica_placed_back_while_it_serves_on_is_the_same_replica_in_its_new_role(env):
    rep = caught_up_with_time_to_serve_on(env)
    host(env)  # moved away (a node judged dead a moment too soon) …
    host(env, 0)  # … and placed back: not reopened, not restored
    assert env.tailer.serving[KEY] is rep and rep.role is Role.ACTIVE and rep.state is ReplicaState.ACTIVE
    env.tailer.replicas.end_moved(time.monotonic() + 11)
    assert env.tailer.serving[KEY] is rep  # it is placed here: nothing ends it


def test_rate_limit_caps_the_batch_size():
    settings = StoreNodeSettings(node_id="n1", apply_rate_limit=200)
    from store_node.applier import RateLimiter

    assert RateLimiter(settings.apply_rate_limit).batch_size(5000) == 20
    assert RateLimiter(0).batch_size(5000) == 5000


def test_end_offset_is_refreshed_after_each_batch(env):
    host(env, 0)
    for rx in (1, 2):  # the leader's responses to fetches of the partition
        env.consumer.pending_stats.append(stats({0: 0}, rx=rx))
        env.tailer.step()
    rep = env.tailer.serving[KEY]
    env.consumer.watermarks[(SPEC.topic, 0)] = 50
    env.consumer.queue += [record(i, f"k{i}", i) for i in range(10)]
    env.tailer.step()
    assert rep.snapshot().lag_offsets == 40  # known without waiting for the next statistics


def test_interleaved_runs_redeliveries_and_events_apply_in_offset_order(env):
    host(env, 0, 1)
    env.consumer.queue += [record(0, "a", 1, partition=0), record(1, "a", 2, partition=0),
                           record(0, "x", 1, partition=1),
                           record(2, "a", 3, partition=0), eof(3),  # partition 0's records first, then its EOF
                           record(1, "x", 2, partition=1), eof(2, partition=1)]
    env.tailer.step()
    r0, r1 = env.tailer.serving[("counts", 0)], env.tailer.serving[("counts", 1)]
    assert (r0.lag.applied, r1.lag.applied) == (3, 2)
    assert r0.store.get(b"a") == b"3" and r1.store.get(b"x") == b"2"
    assert r0.counters.records_applied == 3 and r1.counters.records_applied == 2
    # A re-delivery (after a re-assign) starting below the applied offset: only the new records count.
    env.consumer.queue += [record(1, "a", 99, partition=0), record(2, "a", 98, partition=0),
                           record(3, "a", 4, partition=0)]
    env.tailer.step()
    assert r0.store.get(b"a") == b"4" and r0.lag.applied == 4 and r0.counters.records_applied == 4


def _rows_written(monkeypatch) -> list[int]:
    """How many rows each WriteBatch the replicas build holds."""
    sizes: list[int] = []
    build = ReplicaStore.batch

    def counting(changes=()):
        changes = list(changes)
        sizes.append(len(changes))
        return build(changes)

    monkeypatch.setattr(ReplicaStore, "batch", staticmethod(counting))
    return sizes


def test_a_restore_writes_only_the_latest_change_of_each_key(env, monkeypatch):
    sizes = _rows_written(monkeypatch)
    host(env, 0)
    rep = env.tailer.serving[KEY]
    changelog = [record(0, "a", 1), record(1, "b", 1), record(2, "a", 2), record(3, "a", None),
                 record(4, "c", b"not json"), record(5, "b", 3), record(6, "c", 4), eof(7)]
    env.consumer.queue += changelog[:6]
    env.tailer.step()
    # Read, not written yet: the checkpoint and the rows stay together at the old offset.
    assert rep.lag.applied == 0 and rep.store.get(b"b") is None
    assert rep.staged is not None and rep.staged.rows == {b"a": None, b"b": b"3", b"c": b"not json"}
    env.consumer.queue += changelog[6:]
    env.tailer.step()
    assert rep.lag.applied == 7 and rep.staged is None and rep.state is ReplicaState.ACTIVE
    assert (rep.store.get(b"a"), rep.store.get(b"b"), rep.store.get(b"c")) == (None, b"3", b"4")
    assert sizes == [3]  # three rows written for seven records: a (deleted), b and c
    # The value that is not JSON was overwritten before the write: never checked, nothing read again.
    assert rep.counters.records_applied == 7 and rep.counters.records_skipped == 0
    assert env.consumer.assign_calls == [(SPEC.topic, 0, OFFSET_BEGINNING)]
    # Caught up, each poll's records are written at once.
    env.consumer.queue += [record(7, "a", 5)]
    env.tailer.step()
    assert rep.lag.applied == 8 and rep.store.get(b"a") == b"5" and sizes == [3, 1]


def test_staged_changes_are_written_before_an_end_of_partition_moves_the_checkpoint(env):
    host(env, 0)
    rep = env.tailer.serving[KEY]
    env.consumer.queue += [record(0, "a", 1), record(1, "b", 2)]
    env.tailer.step()
    assert rep.lag.applied == 0
    env.consumer.queue += [eof(9)]  # offsets 2..8 hold no records (compaction, control records)
    env.tailer.step()
    assert rep.lag.applied == 9 and rep.store.get(b"a") == b"1" and rep.store.get(b"b") == b"2"


def test_staged_changes_are_written_when_old_or_many(env, monkeypatch):
    import store_node.applier as applier

    host(env, 0)
    rep = env.tailer.serving[KEY]
    monkeypatch.setattr(applier, "_STAGE_MAX_ROWS", 3)
    env.consumer.queue += [record(i, f"k{i}", i) for i in range(5)]
    env.tailer.step()
    assert rep.lag.applied == 5 and rep.store.get(b"k4") == b"4"  # 5 rows ≥ 3: written
    monkeypatch.setattr(applier, "_STAGE_MAX_ROWS", 50_000)
    env.consumer.queue += [record(5, "k5", 5)]
    env.tailer.step()
    assert rep.lag.applied == 5 and rep.staged is not None
    monkeypatch.setattr(applier, "_STAGE_MAX_S", 0.0)
    env.tailer.step()  # no new records: the poll's housekeeping writes what is due
    assert rep.lag.applied == 6 and rep.store.get(b"k5") == b"5" and rep.staged is None


@pytest.mark.parametrize("env", [{"removed_replica_grace_ms": 60_000}], indirect=True)
def test_staged_changes_of_a_replica_moved_away_are_dropped_with_the_checkpoint_before_them(env, tmp_path):
    host(env, 0)
    env.consumer.queue += [record(0, "a", 1), record(1, "b", 2)]
    env.tailer.step()
    host(env)  # moved away before anything was written
    host(env, 0)  # and back: it resumes where its files say, and reads the records again
    assert env.consumer.assigned[(SPEC.topic, 0)] == OFFSET_BEGINNING
    rep = env.tailer.serving[KEY]
    assert rep.lag.applied == 0 and rep.staged is None and rep.store.get(b"a") is None


def test_a_clean_stop_writes_the_staged_changes(env):
    host(env, 0)
    env.consumer.queue += [record(0, "a", 1), record(1, "b", 2)]
    env.tailer.step()
    path = replica_path(env.root, "counts", 0)
    env.tailer.close()
    store = ReplicaStore.open(path)
    try:
        assert store.applied_offset == 2 and store.get(b"b") == b"2"
    finally:
        store.close()


def _loads_counted(monkeypatch) -> list[bytes]:
    """Every value checked for being JSON."""
    import freshroute.formats as formats

    seen: list[bytes] = []
    is_json = formats.is_json

    def counting(raw):
        seen.append(raw)
        return is_json(raw)

    monkeypatch.setattr(formats, "is_json", counting)
    return seen


def test_a_restore_checks_only_the_values_it_writes(env, monkeypatch):
    seen = _loads_counted(monkeypatch)
    host(env, 0)
    rep = env.tailer.serving[KEY]
    env.consumer.queue += [record(i, "ab"[i % 2], {"n": i}) for i in range(10)] + [eof(10)]
    env.tailer.step()
    assert rep.lag.applied == 10 and rep.store.get(b"a") == b'{"n": 8}' and rep.store.get(b"b") == b'{"n": 9}'
    assert sorted(seen) == [b'{"n": 8}', b'{"n": 9}']  # the two written, none of the eight overwritten
    assert env.consumer.assign_calls == [(SPEC.topic, 0, OFFSET_BEGINNING)]  # nothing read again
    # Caught up, each record is checked as it is read.
    env.consumer.queue += [record(10, "a", 10), record(11, "a", 11)]
    env.tailer.step()
    assert seen[2:] == [b"10", b"11"] and rep.lag.applied == 12


def test_a_poison_value_in_a_restore_is_read_again_and_skipped_at_its_offset(env, monkeypatch, caplog):
    import store_node.applier as applier

    monkeypatch.setattr(applier, "_STAGE_MAX_S", 0.0)  # each poll's records are written at once
    host(env, 0)
    rep = env.tailer.serving[KEY]
    changelog = [record(0, "a", {"n": 0}), record(1, "b", {"n": 1}), record(2, "a", {"n": 2}),
                 record(3, "a", b"{not json"), record(4, "b", {"n": 4}), record(5, "a", {"n": 5}),
                 record(6, "b", None), eof(7)]
    env.consumer.queue += changelog[:4]  # the poison is the latest change of its key when written
    env.tailer.step()
    # The window was not written: its checkpoint stays at the start and it is fetched again from there.
    assert rep.lag.applied == 0 and rep.staged is None and rep.store.get(b"a") is None
    assert env.consumer.assign_calls[-1] == (SPEC.topic, 0, OFFSET_BEGINNING)
    assert rep.counters.records_skipped == 0 and env.tailer.records_skipped == 0
    refetch(env, changelog)
    with caplog.at_level("WARNING", logger="store_node.applier"):
        env.tailer.step()
    assert rep.lag.applied == 7 and rep.state is ReplicaState.ACTIVE
    assert rep.store.get(b"a") == b'{"n": 5}' and rep.store.get(b"b") is None
    assert rep.counters.records_skipped == 1 and env.tailer.records_skipped == 1
    assert rep.counters.records_applied == 6
    assert [r.getMessage() for r in caplog.records if "poison" in r.getMessage()] == [
        "replica counts/0: skipping poison record at offset 3 (value is not JSON); 1 skipped so far"]
    assert len(env.consumer.assign_calls) == 2  # read again once


def test_poison_as_a_keys_latest_change_in_a_window_leaves_its_previous_valid_value(env):
    host(env, 0)
    rep = env.tailer.serving[KEY]
    changelog = [record(0, "a", 1), record(1, "b", 2), record(2, "a", b"\xff"), record(3, "c", 3), eof(4)]
    env.consumer.queue += changelog
    env.tailer.step()
    refetch(env, changelog)
    env.tailer.step()
    assert (rep.store.get(b"a"), rep.store.get(b"b"), rep.store.get(b"c")) == (b"1", b"2", b"3")
    assert rep.lag.applied == 4 and rep.counters.records_skipped == 1


def test_poison_as_a_keys_only_change_in_a_window_leaves_its_stored_value(env):
    store = ReplicaStore.open(replica_path(env.root, "counts", 0))
    store.apply([(b"a", b'{"n": 1}')], 5)
    store.close()
    host(env, 0)
    rep = env.tailer.serving[KEY]
    changelog = [record(5, "a", b"not json"), record(6, "c", 3), eof(7)]
    env.consumer.queue += changelog
    env.tailer.step()
    assert env.consumer.assign_calls[-1] == (SPEC.topic, 0, 5)  # from the checkpoint, not the start
    refetch(env, changelog)
    env.tailer.step()
    assert rep.store.get(b"a") == b'{"n": 1}' and rep.store.get(b"c") == b"3"
    assert rep.lag.applied == 7 and rep.counters.records_skipped == 1 and rep.counters.records_applied == 1


@pytest.mark.parametrize("written_by", ["the batch", "the end of the partition"])
def test_a_dropped_window_voids_the_rest_of_its_partitions_poll(env, monkeypatch, written_by):
    import store_node.applier as applier

    if written_by == "the batch":
        monkeypatch.setattr(applier, "_STAGE_MAX_ROWS", 2)
    host(env, 0, 1)
    r0, r1 = env.tailer.serving[("counts", 0)], env.tailer.serving[("counts", 1)]
    changelog = [record(0, "a", 1), record(1, "b", b"nope"), record(0, "x", 1, partition=1),
                 eof(2),  # the window is written (and dropped) here at the latest
                 record(2, "c", 3), record(1, "y", 2, partition=1), eof(3), eof(2, partition=1)]
    env.consumer.queue += changelog
    env.tailer.step()
    # Partition 0's records and events after the drop were fetched before it: applied, they would
    # have moved its checkpoint past the dropped window.
    assert r0.lag.applied == 0 and r0.staged is None and r0.store.get(b"c") is None
    assert env.consumer.assign_calls[-1] == (SPEC.topic, 0, OFFSET_BEGINNING)
    assert r1.lag.applied == 2 and r1.store.get(b"y") == b"2"  # the other partition is not affected
    refetch(env, changelog)
    env.tailer.step()
    assert r0.lag.applied == 3 and r0.counters.records_skipped == 1
    assert (r0.store.get(b"a"), r0.store.get(b"b"), r0.store.get(b"c")) == (b"1", None, b"3")


def test_a_window_read_again_is_written_once_it_covers_the_dropped_one(env, monkeypatch):
    import store_node.applier as applier

    host(env, 0)
    rep = env.tailer.serving[KEY]
    first = [record(0, "a", 1), record(1, "a", b"bad"), record(2, "b", 2)]
    env.consumer.queue += first
    env.tailer.step()
    assert rep.staged is not None and rep.lag.applied == 0
    monkeypatch.setattr(applier, "_STAGE_MAX_S", 0.0)
    env.tailer.step()  # the poll's housekeeping writes it: dropped, and fetched again at once
    assert rep.staged is None and env.consumer.assign_calls[-1] == (SPEC.topic, 0, OFFSET_BEGINNING)
    monkeypatch.setattr(applier, "_STAGE_MAX_S", 60.0)
    refetch(env, first)
    env.tailer.step()
    assert rep.lag.applied == 3 and rep.store.get(b"a") == b"1" and rep.counters.records_skipped == 1
    # Poison after it sends the tailer back only to the end of that window.
    later = [record(3, "c", 3), record(4, "c", b"bad"), eof(5)]
    env.consumer.queue += later
    env.tailer.step()
    assert env.consumer.assign_calls[-1] == (SPEC.topic, 0, 3) and rep.lag.applied == 3
    refetch(env, later)
    env.tailer.step()
    assert rep.lag.applied == 5 and rep.store.get(b"c") == b"3" and rep.counters.records_skipped == 2


def test_a_clean_stop_drops_a_window_with_poison(env):
    host(env, 0)
    env.consumer.queue += [record(0, "a", 1), record(1, "b", b"bad")]
    env.tailer.step()
    path = replica_path(env.root, "counts", 0)
    env.tailer.close()
    store = ReplicaStore.open(path)
    try:
        assert store.applied_offset == 0 and store.get(b"a") is None  # the next open reads it again
    finally:
        store.close()


@pytest.mark.parametrize("wait_ms", [0, -10, 1000, 5000])
def test_a_fetch_wait_outside_its_range_fails_naming_it(wait_ms):
    from freshroute.errors import ConfigError
    from freshroute.settings import load

    with pytest.raises(ConfigError, match="fetch_wait_max_ms"):
        load(StoreNodeSettings, node_id="n1", fetch_wait_max_ms=wait_ms)
    assert load(StoreNodeSettings, node_id="n1", fetch_wait_max_ms=999).fetch_wait_max_ms == 999


def test_a_replica_whose_disk_is_full_fails_with_its_reason_and_tries_again_later(env, monkeypatch, caplog):
    import store_node.replica_resets as replica_resets
    from store_node.replica_store import DiskFull

    host(env, 0, 1)
    full = replica_path(env.root, "counts", 0)
    write = ReplicaStore._write

    def no_space(store, rows, *checkpoint):
        if store.path == full:
            raise DiskFull(f"no space left on the device of {full} (while write)", path=str(full))
        write(store, rows, *checkpoint)

    monkeypatch.setattr(ReplicaStore, "_write", no_space)
    env.consumer.queue += [record(0, "a", 1), record(0, "b", 2, partition=1), eof(1), eof(1, partition=1)]
    env.tailer.step()
    rep, other = env.tailer.serving[KEY], env.tailer.serving[("counts", 1)]
    # FAILED with the reason in its report and its reads' refusals; its files deleted, its changelog no longer fetched.
    assert rep.state is ReplicaState.FAILED and "no space left on the device" in rep.failure
    report = {r.partition: r for r in env.tailer.reports()}
    assert report[0].state is ReplicaState.FAILED and report[0].failure == rep.failure and report[0].applied == 0
    assert report[1].state is ReplicaState.ACTIVE and report[1].failure is None
    assert rep.store is None and not full.exists() and (SPEC.topic, 0) not in env.consumer.assigned
    assert other.store.get(b"b") == b"2"  # the node's other replicas go on
    # Space freed: after FAILED_RETRY_S it restores from the start again.
    monkeypatch.undo()
    env.tailer.step()
    assert rep.state is ReplicaState.FAILED  # not before its time
    monkeypatch.setattr(replica_resets, "FAILED_RETRY_S", 0.0)
    env.tailer.step()
    assert rep.failure is None and rep.state is ReplicaState.RESTORING
    assert env.consumer.assigned[(SPEC.topic, 0)] == OFFSET_BEGINNING
    env.consumer.queue += [record(0, "a", 1), eof(1)]
    env.tailer.step()
    assert rep.state is ReplicaState.ACTIVE and rep.store.get(b"a") == b"1"
    # Its fetch was stopped once: the restart did not ask the consumer to unassign it again (librdkafka refuses).
    assert not [r.getMessage() for r in caplog.records if "unassigning" in r.getMessage()]


def test_a_replica_whose_store_cannot_even_be_opened_is_hosted_failed(env, monkeypatch):
    import store_node.replica_resets as replica_resets
    from store_node.replica_store import DiskFull

    def no_space(path, memory=None):
        raise DiskFull(f"no space left on the device of {path} (while open)", path=str(path))

    monkeypatch.setattr(ReplicaStore, "open_or_wipe", staticmethod(no_space))
    host(env, 0)
    rep = env.tailer.serving[KEY]
    assert rep.state is ReplicaState.FAILED and rep.failure.endswith("(while open)") and rep.store is None
    assert [(r.state, r.failure) for r in env.tailer.reports()] == [(ReplicaState.FAILED, rep.failure)]
    assert (SPEC.topic, 0) not in env.consumer.assigned
    monkeypatch.undo()
    monkeypatch.setattr(replica_resets, "FAILED_RETRY_S", 0.0)
    env.tailer.step()
    assert rep.state is ReplicaState.RESTORING and env.consumer.assigned[(SPEC.topic, 0)] == OFFSET_BEGINNING
    env.consumer.queue += [record(0, "a", 1), eof(1)]
    env.tailer.step()
    assert rep.state is ReplicaState.ACTIVE and rep.store.get(b"a") == b"1"


def test_a_replayed_row_older_than_the_one_held_is_skipped_and_counted(env):
    host(env, 0)
    env.consumer.queue += [record(0, "a", {"count": 1}, position=[None, 7]), eof(1)]
    env.tailer.step()
    rep = env.tailer.serving[KEY]
    assert rep.state is not ReplicaState.RESTORING
    # The pipeline ran on to count 3, crashed, and its replay writes counts 2 and 3 again, then goes on.
    env.consumer.queue += [
        record(1, "a", {"count": 2}, position=[3, 7]),
        record(2, "a", {"count": 3}, position=[3, 9]),
        record(3, "a", {"count": 2}, position=[3, 8]),  # the replay: older in partition 1
        record(4, "a", {"count": 3}, position=[3, 9]),  # the same row again
        record(5, "b", {"count": 1}, position=[4, None]),
        record(6, "a", {"count": 4}, position=[5, 9]),
        eof(7),
    ]
    env.tailer.step()
    assert rep.store.get(b"a") == b'{"count": 4}' and rep.store.get(b"b") == b'{"count": 1}'
    assert rep.counters.records_superseded == 1
    assert rep.store.positions_of([b"a", b"b"]) == [b"[5,9]", b"[4,null]"]
    # Across polls the held position is read from the store: an older row never overwrites a newer one.
    env.consumer.queue += [record(7, "a", {"count": 3}, position=[4, 9]), eof(8)]
    env.tailer.step()
    assert rep.store.get(b"a") == b'{"count": 4}' and rep.counters.records_superseded == 2
    assert rep.lag.applied == 8  # skipped rows are behind the replica, not blocking it


def test_a_record_without_a_position_is_applied_and_counted_and_a_delete_forgets_the_position(env):
    host(env, 0)
    env.consumer.queue += [record(0, "a", {"count": 5}, position=[9]), eof(1)]
    env.tailer.step()
    rep = env.tailer.serving[KEY]
    env.consumer.queue += [record(1, "a", {"count": 1}), record(2, "b", {"count": 1}), eof(3)]
    env.tailer.step()
    assert rep.store.get(b"a") == b'{"count": 1}' and rep.counters.records_unpositioned == 2
    assert rep.store.positions_of([b"a"]) == [b"[9]"]  # kept by an upsert without one
    env.consumer.queue += [record(3, "a", None), record(4, "a", {"count": 2}, position=[1]), eof(5)]
    env.tailer.step()
    assert rep.store.get(b"a") == b'{"count": 2}' and rep.store.positions_of([b"a"]) == [b"[1]"]


def test_a_restore_keeps_the_newest_row_of_each_key_by_its_position(env):
    host(env, 0)
    changelog = [record(0, "a", {"count": 3}, position=[9]), record(1, "a", {"count": 2}, position=[8]),
                 record(2, "b", {"count": 1}, position=[2]), eof(3)]
    env.consumer.queue += changelog
    env.tailer.step()
    rep = env.tailer.serving[KEY]
    assert rep.store.get(b"a") == b'{"count": 3}' and rep.store.get(b"b") == b'{"count": 1}'
    assert rep.counters.records_superseded == 1


def test_a_versioned_table_keeps_each_record_as_a_version_at_its_timestamp_and_expires_old_ones(env):
    versioned = dataclasses.replace(SPEC, history_retention_ms=1_000)
    env.clock.now = 1_000
    env.tailer.set_desired({("counts", 0): (versioned, Role.ACTIVE)})
    env.tailer.step()
    env.consumer.queue += [
        Msg(0, b"a", b'{"n":1}', timestamp_ms=1_100), Msg(1, b"a", b'{"n":2}', timestamp_ms=1_300),
        Msg(2, b"a", b"not json", timestamp_ms=1_350),  # poison: skipped, never a version
        Msg(3, b"a", b'{"n":"late"}', timestamp_ms=1_200),  # late: a version of its time, not the latest
        Msg(4, b"b", None, timestamp_ms=1_150), eof(5),
    ]
    env.tailer.step()
    rep = env.tailer.serving[KEY]
    assert rep.lag.applied == 5 and rep.counters.records_skipped == 1 and rep.counters.records_applied == 4
    assert rep.store.get(b"a") == b'{"n":2}' and rep.store.get(b"b") is None
    assert [(v.valid_from_ms, v.valid_to_ms, v.value) for v in rep.store.history.versions(b"a", 0, 1 << 62, 10)] == [
        (1_300, None, b'{"n":2}'), (1_200, 1_300, b'{"n":"late"}'), (1_100, 1_200, b'{"n":1}')]
    # Replaced more than the retention (1 s) ago: a@1100 (replaced at 1200) and b's delete (since 1150)
    # go, a@1200 later.
    env.clock.now = 2_250
    env.tailer.step()
    assert [v.valid_from_ms for v in rep.store.history.versions(b"a", 0, 1 << 62, 10)] == [1_300, 1_200]
    env.clock.now = 3_301  # expiry runs once a second
    env.tailer.step()
    assert [v.valid_from_ms for v in rep.store.history.versions(b"a", 0, 1 << 62, 10)] == [1_300]
    assert rep.store.history.versions(b"b", 0, 1 << 62, 10) == []
    env.clock.now = 2_000_000  # the latest value never expires
    env.tailer.step()
    assert [v.valid_from_ms for v in rep.store.history.versions(b"a", 0, 1 << 62, 10)] == [1_300]
    assert rep.counters.versions_expired == 3


def test_a_versioned_record_stands_at_its_version_time_header_when_it_has_one(env, caplog):
    """The pipeline's header (the latest input record the row reflects) is the version's time, not the record's own
    timestamp (when the pipeline wrote it); a header that is no time makes the record poison, never a version."""
    versioned = dataclasses.replace(SPEC, history_retention_ms=86_400_000)
    env.clock.now = 10_000
    env.tailer.set_desired({("counts", 0): (versioned, Role.ACTIVE)})
    env.tailer.step()
    stamp = [(version_time.HEADER, version_time.encode(1_000))]
    env.consumer.queue += [
        Msg(0, b"a", b'{"n":1}', timestamp_ms=9_000, headers=stamp),
        Msg(1, b"a", b'{"n":2}', timestamp_ms=9_001, headers=[(version_time.HEADER, version_time.encode(2_000))]),
        Msg(2, b"a", b'{"n":3}', timestamp_ms=9_002, headers=[(version_time.HEADER, b"soon")]),
        Msg(3, b"a", b'{"n":4}', timestamp_ms=9_003, headers=[(version_time.HEADER, b"-5")]),
        Msg(4, b"a", b'{"n":5}', timestamp_ms=3_000), eof(5),
    ]
    env.tailer.step()
    rep = env.tailer.serving[KEY]
    assert rep.lag.applied == 5 and rep.counters.records_skipped == 2 and rep.counters.records_applied == 3
    assert [(v.valid_from_ms, v.valid_to_ms, v.value) for v in rep.store.history.versions(b"a", 0, 1 << 62, 10)] == [
        (3_000, None, b'{"n":5}'), (2_000, 3_000, b'{"n":2}'), (1_000, 2_000, b'{"n":1}')]
    assert "offset 2 (its freshroute.version_time header is not a time in milliseconds)" in caplog.text
