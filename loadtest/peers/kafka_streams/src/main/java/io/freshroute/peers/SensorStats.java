package io.freshroute.peers;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URI;
import java.net.URLDecoder;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.Executors;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.zip.CRC32;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyQueryMetadata;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.processor.StreamPartitioner;
import org.apache.kafka.streams.state.HostInfo;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;

/**
 * The demo's sensor_stats (count, sum, min, max, last of each sensor's readings) in Kafka Streams, served by
 * interactive queries the way its documentation shows (KIP-535): a key is read where its active replica is, forwarded
 * there over HTTP when that is another instance, and read from a standby when the active cannot be reached.
 *
 * <p>Arguments: bootstrap servers, input topic, application id, state directory, HTTP port (on 127.0.0.1).
 */
public final class SensorStats {
  private static final String STORE = "sensor_stats";
  private static final String PREFIX = "/v1/tables/sensor_stats/keys/";
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

  private final KafkaStreams streams;
  private final int port;
  private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofMillis(500)).build();

  private SensorStats(KafkaStreams streams, int port) {
    this.streams = streams;
    this.port = port;
  }

  public static void main(String[] args) throws IOException {
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
        .aggregate(() -> "", (k, v, agg) -> add(agg, v),
            Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as(STORE)
                .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()));
    KafkaStreams streams = new KafkaStreams(builder.build(), p);
    Runtime.getRuntime().addShutdownHook(new Thread(streams::close));
    streams.start();

    SensorStats app = new SensorStats(streams, port);
    HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", port), 1024);
    server.setExecutor(Executors.newFixedThreadPool(8));
    server.createContext(PREFIX, app::lookup);
    server.createContext("/healthz", ex -> answer(ex, streams.state().isRunningOrRebalancing() ? 200 : 503,
        "{\"state\":\"" + streams.state() + "\"}"));
    server.start();
    System.out.println("sensor_stats serving on 127.0.0.1:" + port);
  }

  /** count,sum,min,max,last with one more reading. */
  static String add(String agg, String value) {
    Matcher m = READING.matcher(value);
    if (!m.find()) {
      return agg;
    }
    double r = Double.parseDouble(m.group(1));
    if (agg.isEmpty()) {
      return "1," + r + "," + r + "," + r + "," + r;
    }
    String[] f = agg.split(",");
    return (Long.parseLong(f[0]) + 1) + "," + (Double.parseDouble(f[1]) + r) + ","
        + Math.min(Double.parseDouble(f[2]), r) + "," + Math.max(Double.parseDouble(f[3]), r) + "," + r;
  }

  static String json(String key, String agg) {
    String[] f = agg.split(",");
    long count = Long.parseLong(f[0]);
    double sum = Double.parseDouble(f[1]);
    return "{\"key\":\"" + key + "\",\"value\":{\"count\":" + count + ",\"sum\":" + sum + ",\"avg\":" + (sum / count)
        + ",\"min\":" + f[2] + ",\"max\":" + f[3] + ",\"last\":" + f[4] + "}}";
  }

  private void lookup(HttpExchange ex) throws IOException {
    try {
      String key = URLDecoder.decode(ex.getRequestURI().getRawPath().substring(PREFIX.length()), StandardCharsets.UTF_8);
      boolean forwarded = "forwarded".equals(ex.getRequestURI().getQuery());
      boolean stale = "stale".equals(ex.getRequestURI().getQuery());
      KeyQueryMetadata md = streams.queryMetadataForKey(STORE, key, PRODUCED);
      if (md == null || md.equals(KeyQueryMetadata.NOT_AVAILABLE)) {
        answer(ex, 503, "{\"error\":\"no metadata for the key yet\"}");
        return;
      }
      if (forwarded || stale || md.activeHost().port() == port) {
        String agg = local(key, md.partition(), stale);
        if (agg != null || !stale) {
          answer(ex, agg == null ? 404 : 200, agg == null ? "{\"error\":\"not found\"}" : json(key, agg));
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
          HttpResponse<String> r = http.send(HttpRequest.newBuilder(URI.create(target)).timeout(Duration.ofSeconds(2))
              .build(), HttpResponse.BodyHandlers.ofString());
          if (r.statusCode() == 200 || r.statusCode() == 404) {
            answer(ex, r.statusCode(), r.body());
            return;
          }
        } catch (IOException | InterruptedException e) {
          // the next copy
        }
      }
      answer(ex, 503, "{\"error\":\"no copy of the key's partition answered\"}");
    } catch (RuntimeException e) {
      answer(ex, 503, "{\"error\":\"" + e.getClass().getSimpleName() + "\"}");
    }
  }

  private String local(String key, int partition, boolean stale) {
    StoreQueryParameters<ReadOnlyKeyValueStore<String, String>> q =
        StoreQueryParameters.fromNameAndType(STORE, QueryableStoreTypes.<String, String>keyValueStore())
            .withPartition(partition);
    return streams.store(stale ? q.enableStaleStores() : q).get(key);
  }

  private String url(HostInfo host, String key, String query) {
    return "http://" + host.host() + ":" + host.port() + PREFIX
        + URLEncoder.encode(key, StandardCharsets.UTF_8) + "?" + query;
  }

  private static void answer(HttpExchange ex, int status, String body) throws IOException {
    byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
    ex.getResponseHeaders().set("content-type", "application/json");
    ex.sendResponseHeaders(status, bytes.length);
    try (OutputStream out = ex.getResponseBody()) {
      out.write(bytes);
    }
  }
}
