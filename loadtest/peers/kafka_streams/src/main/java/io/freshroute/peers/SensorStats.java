package io.freshroute.peers;

import io.javalin.Javalin;
import io.javalin.http.Context;
import java.io.IOException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.zip.CRC32;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyQueryMetadata;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.InvalidStateStoreException;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.processor.StreamPartitioner;
import org.apache.kafka.streams.state.HostInfo;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;

/**
 * The demo's sensor_stats (count, sum, min, max, last of each sensor's readings) in Kafka Streams, served by
 * interactive queries the way its documentation shows (KIP-535), as a team would run it in production: Javalin on
 * Jetty answers, a key is read where its active replica is, forwarded there once over a pooled keep-alive HTTP/1.1
 * client when that is another instance, and read from a standby when the active cannot be reached.
 *
 * <p>Arguments: bootstrap servers, input topic, application id, state directory, HTTP port (on 127.0.0.1).
 */
public final class SensorStats {
  private static final String STORE = "sensor_stats";
  private static final String PREFIX = "/v1/tables/sensor_stats/keys/";
  private static final int STORE_RETRIES = 20;
  private static final long STORE_RETRY_MS = 50;
  private static final Pattern READING = Pattern.compile("\"reading\"\\s*:\\s*(-?[0-9.eE+-]+)");

  /**
   * Where the input's producers put a key: the demo producer is confluent-kafka's, whose default partitioner is
   * librdkafka's CRC-32 of the key (Java clients hash with murmur2, which Kafka Streams assumes unless told).
   */
  private static final StreamPartitioner<String, Object> PRODUCED = (topic, key, value, partitions) -> {
    CRC32 crc = new CRC32();
    crc.update(key.getBytes(StandardCharsets.UTF_8));
    return Optional.of(Set.of((int) (crc.getValue() % partitions)));
  };

  /** A sensor's aggregate, stored as five fixed-width numbers (no text to parse on each update). */
  record Stats(long count, double sum, double min, double max, double last) {
    static final int BYTES = 40;

    Stats add(double r) {
      return new Stats(count + 1, sum + r, Math.min(min, r), Math.max(max, r), r);
    }

    String json(String key) {
      return "{\"key\":\"" + key + "\",\"value\":{\"count\":" + count + ",\"sum\":" + sum + ",\"avg\":" + (sum / count)
          + ",\"min\":" + min + ",\"max\":" + max + ",\"last\":" + last + "}}";
    }
  }

  static final Serde<Stats> STATS = Serdes.serdeFrom(
      (Serializer<Stats>) (topic, s) -> s == null ? null : ByteBuffer.allocate(Stats.BYTES).putLong(s.count())
          .putDouble(s.sum()).putDouble(s.min()).putDouble(s.max()).putDouble(s.last()).array(),
      (Deserializer<Stats>) (topic, b) -> {
        if (b == null) {
          return null;
        }
        ByteBuffer in = ByteBuffer.wrap(b);
        return new Stats(in.getLong(), in.getDouble(), in.getDouble(), in.getDouble(), in.getDouble());
      });

  private final KafkaStreams streams;
  private final int port;
  private final Map<Integer, ReadOnlyKeyValueStore<String, Stats>> activeStores = new ConcurrentHashMap<>();
  private final Map<Integer, ReadOnlyKeyValueStore<String, Stats>> staleStores = new ConcurrentHashMap<>();
  // HTTP/1.1 so that connections are kept alive and pooled (the JDK's default, HTTP/2, would try an upgrade).
  private final HttpClient http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1)
      .connectTimeout(Duration.ofMillis(500)).build();

  private SensorStats(KafkaStreams streams, int port) {
    this.streams = streams;
    this.port = port;
  }

  public static void main(String[] args) {
    String bootstrap = args[0], topic = args[1], appId = args[2], stateDir = args[3];
    int port = Integer.parseInt(args[4]);
    Properties p = new Properties();
    p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
    p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
    p.put(StreamsConfig.APPLICATION_SERVER_CONFIG, "127.0.0.1:" + port);
    p.put(StreamsConfig.NUM_STANDBY_REPLICAS_CONFIG, 1);
    // Each update reaches the store (and a query) at once, as freshroute's do; commits as often as its checkpoints.
    p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
    p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "latest");
    // A killed instance's partitions move after the session timeout: Kafka Streams' own default is 45 s.
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 10_000);

    StreamsBuilder builder = new StreamsBuilder();
    builder.stream(topic, Consumed.with(Serdes.String(), Serdes.String()))
        .filter((k, v) -> k != null && v != null)
        .groupByKey()
        .aggregate(() -> null, (k, v, agg) -> add(agg, v),
            Materialized.<String, Stats, KeyValueStore<Bytes, byte[]>>as(STORE)
                .withKeySerde(Serdes.String()).withValueSerde(STATS));
    KafkaStreams streams = new KafkaStreams(builder.build(), p);
    Runtime.getRuntime().addShutdownHook(new Thread(streams::close));
    streams.start();

    SensorStats app = new SensorStats(streams, port);
    Javalin.create(config -> {
      config.showJavalinBanner = false;
      config.jetty.defaultHost = "127.0.0.1";
    })
        .get(PREFIX + "{key}", app::lookup)
        .get("/healthz", ctx -> ctx.status(streams.state().isRunningOrRebalancing() ? 200 : 503)
            .json("{\"state\":\"" + streams.state() + "\"}"))
        .start(port);
    System.out.println("sensor_stats serving on 127.0.0.1:" + port);
  }

  /** The aggregate with one more reading (a reading without a number leaves it as it was). */
  static Stats add(Stats agg, String value) {
    Matcher m = READING.matcher(value);
    if (!m.find()) {
      return agg;
    }
    double r = Double.parseDouble(m.group(1));
    return agg == null ? new Stats(1, r, r, r, r) : agg.add(r);
  }

  private void lookup(Context ctx) throws InterruptedException {
    ctx.contentType("application/json");
    String key = ctx.pathParam("key");
    String mode = ctx.queryString();
    for (int attempt = 1; ; attempt++) {
      try {
        answer(ctx, key, "forwarded".equals(mode), "stale".equals(mode));
        return;
      } catch (InvalidStateStoreException e) {
        // A store migrating in a rebalance: Kafka Streams' documentation says to ask again shortly.
        if (attempt == STORE_RETRIES) {
          ctx.status(503).result("{\"error\":\"" + e.getClass().getSimpleName() + "\"}");
          return;
        }
        Thread.sleep(STORE_RETRY_MS);
      } catch (RuntimeException e) {
        ctx.status(503).result("{\"error\":\"" + e.getClass().getSimpleName() + "\"}");
        return;
      }
    }
  }

  /** The key's answer from this instance's copy, or forwarded to the active, then to each standby. */
  private void answer(Context ctx, String key, boolean forwarded, boolean stale) {
    KeyQueryMetadata md = streams.queryMetadataForKey(STORE, key, PRODUCED);
    if (md == null || md.equals(KeyQueryMetadata.NOT_AVAILABLE)) {
      ctx.status(503).result("{\"error\":\"no metadata for the key yet\"}");
      return;
    }
    if (forwarded || stale || md.activeHost().port() == port) {
      Stats s = local(key, md.partition(), stale);
      if (s != null || !stale) {
        ctx.status(s == null ? 404 : 200).result(s == null ? "{\"error\":\"not found\"}" : s.json(key));
        return;
      }
    }
    // The active elsewhere, then each standby: the first that answers.
    List<String> tries = new ArrayList<>();
    tries.add(url(md.activeHost(), key, "forwarded"));
    for (HostInfo standby : md.standbyHosts()) {
      tries.add(url(standby, key, "stale"));
    }
    for (String target : tries) {
      try {
        HttpResponse<byte[]> r = http.send(HttpRequest.newBuilder(URI.create(target))
            .timeout(Duration.ofSeconds(2)).build(), HttpResponse.BodyHandlers.ofByteArray());
        if (r.statusCode() == 200 || r.statusCode() == 404) {
          ctx.status(r.statusCode()).result(r.body());
          return;
        }
      } catch (IOException e) {
        // the next copy
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        break;
      }
    }
    ctx.status(503).result("{\"error\":\"no copy of the key's partition answered\"}");
  }

  /** The key's value in this instance's copy of its partition, the store handle kept until a rebalance moves it. */
  private Stats local(String key, int partition, boolean stale) {
    Map<Integer, ReadOnlyKeyValueStore<String, Stats>> handles = stale ? staleStores : activeStores;
    ReadOnlyKeyValueStore<String, Stats> store = handles.computeIfAbsent(partition, p -> {
      StoreQueryParameters<ReadOnlyKeyValueStore<String, Stats>> q =
          StoreQueryParameters.fromNameAndType(STORE, QueryableStoreTypes.<String, Stats>keyValueStore())
              .withPartition(p);
      return streams.store(stale ? q.enableStaleStores() : q);
    });
    try {
      return store.get(key);
    } catch (InvalidStateStoreException e) {
      handles.remove(partition);
      throw e;
    }
  }

  private String url(HostInfo host, String key, String query) {
    return "http://" + host.host() + ":" + host.port() + PREFIX
        + URLEncoder.encode(key, StandardCharsets.UTF_8) + "?" + query;
  }
}
