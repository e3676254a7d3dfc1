package io.freshroute.changelog;

import java.util.Arrays;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;

import org.apache.kafka.clients.producer.Partitioner;
import org.apache.kafka.common.Cluster;
import org.apache.kafka.common.utils.Utils;

/**
 * Where a changelog record goes: Kafka's default partition of its table key, exactly as
 * {@code freshroute.keys.partition_for} computes it, so that the store nodes and the router find every key
 * where the pipeline wrote it.
 *
 * <p>A windowed table's record key is the table key, a NUL and the window start in 16 hex digits
 * ({@code freshroute.windows.window_key}); its topics, named in {@value #WINDOWED_TOPICS}, are partitioned by
 * the table key alone, so that a key's windows share a replica.
 */
public final class ChangelogPartitioner implements Partitioner {
    /** Producer setting: the comma-separated changelog topics whose record keys are window keys. */
    public static final String WINDOWED_TOPICS = "freshroute.windowed.topics";

    private static final int WINDOW_SUFFIX = 17;

    private Set<String> windowed = Set.of();

    @Override
    public void configure(Map<String, ?> configs) {
        Object topics = configs.get(WINDOWED_TOPICS);
        if (topics != null && !topics.toString().isBlank()) {
            windowed = new HashSet<>(Arrays.asList(topics.toString().split(",")));
        }
    }

    @Override
    public int partition(String topic, Object key, byte[] keyBytes, Object value, byte[] valueBytes, Cluster cluster) {
        if (keyBytes == null) {
            throw new IllegalArgumentException("a changelog record of " + topic + " has no key");
        }
        int length = keyBytes.length;
        if (windowed.contains(topic) && length >= WINDOW_SUFFIX && keyBytes[length - WINDOW_SUFFIX] == 0) {
            length -= WINDOW_SUFFIX;
        }
        byte[] tableKey = length == keyBytes.length ? keyBytes : Arrays.copyOf(keyBytes, length);
        return partitionOf(tableKey, cluster.partitionCountForTopic(topic));
    }

    /** Kafka's default partition of a key: {@code toPositive(murmur2(key)) % partitions}. */
    public static int partitionOf(byte[] key, int partitions) {
        return Utils.toPositive(Utils.murmur2(key)) % partitions;
    }

    @Override
    public void close() {
    }
}
