"""Where the changelog ends, and whether it is still the changelog the replicas were built from.

A replica's lag needs the end offset of its partition, dated by a broker response that is
fresh: the consumer's statistics carry each partition's high watermark from Fetch responses
and each broker's state and response count, which together are the evidence a caught-up
confirmation needs. Only responses of the partition's leader to fetches sent while the
consumer was fetching the partition from it carry its end: after a leader change the high
watermark in the statistics is the old leader's until the new one has answered such a fetch.

Two surprises are judged here and acted on by the replica set, never silently:
- an end offset that stays below the applied offset: the broker lost the partition (its storage
  was wiped, an unclean leader election truncated it, or the topic was recreated);
- a changelog topic whose id changed: the topic was recreated.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import orjson
from confluent_kafka import KafkaError, KafkaException, TopicCollection, TopicPartition

from freshroute.topics import kafka_error
from store_node.replica import Clock, Replica
from store_node.replica_set import ReplicaSet
from store_node.settings import StoreNodeSettings

log = logging.getLogger(__name__)

MISSING_TOPIC = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
_BROKER_DOWN = {KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE}
# A changelog end below the applied offset must be seen this often, for this long, to wipe a replica. A new leader's
# high watermark trails the records the old one served until every in-sync follower has fetched from it, and a follower
# that stalls leaves the ISR only after the broker's replica.lag.time.max.ms (30 s by default): a lower end that
# outlasts that is a loss.
_SHRUNK_CONFIRMATIONS = 3
_SHRUNK_CONFIRM_MS = 35_000
_DESCRIBE_TIMEOUT_S = 2


@dataclass
class _BrokerSeen:
    state: str
    rx: int
    last_response_ms: int  # no later than the broker sent its latest response (see on_stats)


class EndOffsetWatcher:
    """Turns the consumer's statistics, end-of-partition events and topic descriptions into end offsets."""

    def __init__(self, settings: StoreNodeSettings, clock: Clock, replicas: ReplicaSet) -> None:
        self._settings = settings
        self._clock = clock
        self._replicas = replicas
        self._consumer: Any = None
        self._new_admin: Callable[[], Any] = lambda: None
        self._admin: Any = None
        self._brokers: dict[int, _BrokerSeen] = {}
        self._broker_outage = False
        self._stats_at: int | None = None
        self._leaders: dict[tuple[str, int], int] = {}  # replica key → the broker leading it, by the statistics
        # Replica key → (leader, leader epoch, since when in ms) while the statistics say the consumer fetches the
        # partition from its leader: only that leader's responses to requests sent since then carry its end.
        self._fetching: dict[tuple[str, int], tuple[int, int, int]] = {}
        # Replicas whose changelog end looks lower than their applied offset: (first seen in ms, times, reason).
        self._shrunk: dict[tuple[str, int], tuple[int, int, str]] = {}
        self._topic_futures: dict[str, Any] | None = None
        self._topic_check_at = 0.0
        self._missing_topics: set[str] = set()

    def open(self, consumer: Any, new_admin: Callable[[], Any]) -> None:
        self._consumer = consumer
        self._new_admin = new_admin
        self._admin = new_admin()

    # --- the consumer's callbacks, on the tailer's thread during poll() ----------------------------

    def on_client_error(self, err: KafkaError) -> None:
        if err.code() in _BROKER_DOWN:
            if not self._broker_outage:
                self._broker_outage = True
                log.warning("changelog broker unreachable (%s); replicas keep serving and their staleness grows",
                            err.str())
            return
        log.warning("changelog consumer: %s", err.str())

    def on_stats(self, raw: str) -> None:
        now = self._clock()
        # A response counted since the last statistics arrived after them, and answers a request sent at most the
        # window's longest round trip before: what the broker says in it is no older than that. Dated by its arrival
        # instead, a response the network held back (retransmitted through loss) passes an old end offset off as new.
        since = self._stats_at if self._stats_at is not None else now - self._settings.statistics_interval_ms
        self._stats_at = now
        stats = orjson.loads(raw)
        window = self._settings.evidence_window_ms
        brokers = self._brokers
        responding = False
        for b in stats.get("brokers", {}).values():
            nid = b.get("nodeid", -1)
            if nid < 0:
                continue  # bootstrap and coordinator pseudo-brokers
            rx = b.get("rx", 0)
            answered = since - (b.get("rtt") or {}).get("max", 0) // 1000
            seen = brokers.get(nid)
            if seen is None:
                brokers[nid] = seen = _BrokerSeen(b.get("state", ""), rx, answered if rx else 0)
            elif rx > seen.rx:
                seen.last_response_ms = max(seen.last_response_ms, answered)
            seen.state = b.get("state", "")
            seen.rx = rx
            if seen.state == "UP" and now - seen.last_response_ms <= window:
                responding = True
        if responding and self._broker_outage:
            self._broker_outage = False
            log.info("changelog broker reachable again")
        by_tp = self._replicas.by_tp
        hosted = {rep.key for rep in by_tp.values()}
        for gone in self._leaders.keys() - hosted:
            del self._leaders[gone]
        for gone in self._fetching.keys() - hosted:
            del self._fetching[gone]
        for topic, t in stats.get("topics", {}).items():
            for pid, p in t.get("partitions", {}).items():
                rep = by_tp.get((topic, int(pid)))
                if rep is None or rep.store is None:
                    continue
                self._leaders[rep.key] = p.get("leader", -1)
                self._follow_fetching(rep, p, now)
                hi = p.get("hi_offset", -1)
                sent = self._evidence_ms(rep)
                if hi < 0 or sent is None or now - sent > window:
                    continue
                if self.plausible(rep, hi, f"the changelog's high watermark {hi} is below the applied offset"):
                    rep.lag.observe_end(hi, sent)

    def _follow_fetching(self, rep: Replica, p: dict[str, Any], now: int) -> None:
        """Note since when the statistics say ``rep``'s partition is fetched from its leader (``p``: the
        partition's statistics), or that it is not.

        A partition moves to its new leader's fetches only after the metadata named that leader and the consumer
        validated its offset there; meanwhile the leader answers fetches of other partitions, and requests already
        on their way when the partition joined them carry nothing of it either.
        """
        leader_id = p.get("leader", -1)
        leader = self._brokers.get(leader_id)
        if (leader is None or leader.state != "UP" or p.get("broker", -1) != leader_id
                or p.get("fetch_state") != "active"):
            self._fetching.pop(rep.key, None)
            return
        epoch = p.get("leader_epoch", -1)
        seen = self._fetching.get(rep.key)
        if seen is None or seen[:2] != (leader_id, epoch):
            self._fetching[rep.key] = (leader_id, epoch, now)

    def _evidence_ms(self, rep: Replica) -> int | None:
        """When ``rep``'s leader sent, at the latest, its last response that answered a fetch of ``rep``'s partition
        (what its high watermark is as of); None while no response is known to have."""
        fetching = self._fetching.get(rep.key)
        if fetching is None:
            return None
        leader_id, _, since = fetching
        leader = self._brokers.get(leader_id)
        # A response dated from ``since`` on answered a request sent no earlier (see on_stats), which then held
        # the partition.
        if leader is None or leader.state != "UP" or leader.last_response_ms < since:
            return None
        return leader.last_response_ms

    # --- evidence from the records' side ----------------------------------------------------------

    def answered_at(self, rep: Replica, now: int) -> int | None:
        """A time no later than the broker sent the response behind an end-of-partition event of ``rep``: the
        consumer's events come in the order its responses arrived, and a leader's responses arrive in the order it
        sent them, so after the responses of that leader the statistics already counted. ``now`` before the first
        statistics; None while the statistics do not show the partition fetched from its leader (the event may be
        the old leader's, and no response of the new one is known to date it by)."""
        if rep.key not in self._leaders:
            return now
        seen = self._evidence_ms(rep)
        return None if seen is None else min(now, seen)

    def plausible(self, rep: Replica, end: int, what: str) -> bool:
        """Is ``end`` a possible end of ``rep``'s changelog? A lower one is noted as a suspected loss.

        A high watermark below the applied offset means the broker lost the partition — or, for
        a moment, that a new leader has not yet caught its high watermark up to the records the
        old one served. Only a low end that persists is a loss (:meth:`confirm_shrunk`).
        """
        if end < rep.lag.applied:
            first, times, _ = self._shrunk.get(rep.key, (self._clock(), 0, what))
            self._shrunk[rep.key] = (first, times + 1, what)
            return False
        self._shrunk.pop(rep.key, None)
        return True

    def refresh(self, rep: Replica) -> None:
        """Take the end offset of the latest Fetch response now, rather than at the next statistics.

        It is dated to the leader's last response the statistics saw, which is no later than the
        Fetch that carried it: the end offset at that time was at most this, so the replica, once
        past it, was complete as of then. Another broker's answers say nothing of this partition's end,
        nor do its leader's before it fetched the partition from there.
        """
        seen = self._evidence_ms(rep)
        if seen is None or self._clock() - seen > self._settings.evidence_window_ms:
            return
        try:
            _, hi = self._consumer.get_watermark_offsets(TopicPartition(rep.topic, rep.partition), cached=True)
        except KafkaException:
            return
        if hi >= rep.lag.applied:
            rep.lag.observe_end(hi, seen)

    def note_missing(self, topic: str) -> None:
        if topic not in self._missing_topics:
            self._missing_topics.add(topic)
            log.warning("changelog topic %s does not exist (yet); its replicas wait for it", topic)

    # --- after every poll -------------------------------------------------------------------------

    def confirm_shrunk(self) -> None:
        """Wipe the replicas whose changelog has stayed below their applied offset long enough."""
        now = self._clock()
        for key, (first, times, what) in list(self._shrunk.items()):
            rep = self._replicas.get(key)
            if rep is None:
                del self._shrunk[key]
            elif times >= _SHRUNK_CONFIRMATIONS and now - first >= _SHRUNK_CONFIRM_MS:
                del self._shrunk[key]
                self._replicas.reset(rep, f"{what} for {(now - first) / 1000:.1f}s (the broker lost the partition: "
                                          "its storage was wiped, or the topic was recreated)")

    def check_topic_ids(self) -> None:
        """Compare each changelog's topic id with the one its replicas' rows came from."""
        self._admin.poll(0)  # hands librdkafka's log lines to the node's logger; nothing else would
        now = time.monotonic()
        futures = self._topic_futures
        if futures is not None:
            if not all(f.done() for f in futures.values()):
                if now - self._topic_check_at < 30:
                    return
            self._topic_futures = None
            timed_out = [topic for topic, f in futures.items() if f.done() and not self._learn_topic_id(topic, f)]
            if timed_out:
                # librdkafka sends DescribeTopics to the controller its last metadata named, and waits for a
                # controller that died by reconnecting without pause (0.3-1.0 of a core a node, measured) and without
                # asking for new metadata. A new client learns a live one from its bootstrap.
                log.info("changelog topics were not described in time (the controller the admin client knew of "
                         "may be down); asking with a new admin client")
                self._admin = self._new_admin()
            return
        if now - self._topic_check_at < self._settings.topic_check_ms / 1000:
            return
        self._topic_check_at = now
        topics = sorted({r.topic for r in self._replicas.hosted()})
        if topics and not self._broker_outage:  # with no broker answering, a description would only time out
            try:
                self._topic_futures = self._admin.describe_topics(TopicCollection(topics),
                                                                  request_timeout=_DESCRIBE_TIMEOUT_S)
            except Exception as e:
                log.debug("describe_topics failed: %s", e)

    def _learn_topic_id(self, topic: str, described: Any) -> bool:
        """Act on the topic's description; False when it timed out."""
        try:
            desc = described.result(0)
        except KafkaException as e:
            err = kafka_error(e)
            if err is not None and err.code() in MISSING_TOPIC:
                self.note_missing(topic)
            return err is None or err.code() != KafkaError._TIMED_OUT  # otherwise: nothing learned
        except Exception:
            return True
        topic_id = str(desc.topic_id)
        if topic in self._missing_topics:
            self._missing_topics.discard(topic)
            log.info("changelog topic %s exists now", topic)
        self._replicas.topic_ids[topic] = topic_id
        for rep in [r for r in self._replicas.hosted() if r.topic == topic and r.store is not None]:
            if rep.store.topic_id is None:
                rep.store.set_topic_id(topic_id)
            elif rep.store.topic_id != topic_id:
                self._replicas.reset(rep, f"changelog topic {topic} was recreated (topic id {rep.store.topic_id} "
                                          f"→ {topic_id})")
        return True
