package sotw.example;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.regex.Pattern;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The snapshot/update job as a Kafka Streams team writes it: each session's current rows in a table topic
 * written with exactly-once v2, ordered by the seqs it keeps in one state store keyed by session and row.
 *
 * <p>Every sensor publishes a session's snapshot (seq 0), then upserts and deletes of single rows, to its own
 * topic, keyed by session (docs/wire-format.md). Faults reorder and repeat messages, so the job keeps, for
 * each row, the seq of the message that set it, and applies a message to a row only when its seq is higher: a
 * delayed update or a copy sent again never puts an old value back. A delete is kept in the store as a
 * tombstone with its seq, so an older upsert cannot revive the row, and is written to the output topic as a
 * Kafka tombstone (null value).
 *
 * <p>Output: key {@code SESSION/ROW_ID}, value the row as JSON with {@code session}, {@code sensor},
 * {@code row_id}, {@code seq} and {@code committed_ms} beside the row's columns (sotw's tables contract,
 * docs/own-pipeline.md). Streams gives an output record its input record's timestamp, which is the message's
 * send time, not when the row became visible: {@code committed_ms} says when it was processed.
 *
 * <p>Exactly-once v2 commits the store's changelog, the output records and the input offsets in one
 * transaction, so a job killed mid-batch and started again neither loses nor repeats a change, and a reader
 * with {@code isolation.level=read_committed} never sees the aborted attempt.
 */
public final class SnapshotUpdateJob {
    private static final Logger LOG = LoggerFactory.getLogger(SnapshotUpdateJob.class);
    private static final ObjectMapper JSON = new ObjectMapper();
    static final String STORE = "sessions";

    private SnapshotUpdateJob() {}

    public static void main(String[] args) throws Exception {
        Args options = Args.parse(args);
        Properties props = new Properties();
        try (InputStream in = Files.newInputStream(options.config)) {
            props.load(in); // bootstrap.servers and the cluster's security settings, in the Java client's names
        }
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, options.applicationId);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        if (options.stateDir != null) {
            props.put(StreamsConfig.STATE_DIR_CONFIG, options.stateDir.toString());
        }
        if (options.threads != null) {
            // One stream thread per core the job may use: the sensors' partitions (tasks) are shared among them.
            props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, options.threads);
        }
        if (options.commitIntervalMs != null) {
            // Exactly-once commits a transaction every 100 ms by default; each costs round trips to the broker's
            // transaction coordinator. A longer interval trades end-to-end latency for throughput.
            props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, options.commitIntervalMs);
        }
        // A run's sensor topics may appear after the job starts: look for new ones every second, not every 5 min.
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.METADATA_MAX_AGE_CONFIG), "1000");
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        if (options.instanceId != null) {
            // Static membership: an instance killed and started again takes its partitions back at once, rather
            // than waiting for its old member's session to time out (45 s) and a rebalance.
            props.put(StreamsConfig.consumerPrefix(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG),
                    options.applicationId + "-" + options.instanceId);
        }

        KafkaStreams streams = new KafkaStreams(topology(options.inputPattern, options.outputTopic), props);
        CountDownLatch done = new CountDownLatch(1);
        int[] exitCode = {0};
        streams.setUncaughtExceptionHandler(exc -> {
            LOG.error("the job stops on an error it cannot recover from", exc);
            exitCode[0] = 1;
            done.countDown();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        // SIGTERM (the harness stopping the run): close cleanly, committing the open transaction.
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(30));
            done.countDown();
        }, "shutdown"));
        streams.start();
        LOG.info("started: {} -> {} as {}", options.inputPattern, options.outputTopic, options.applicationId);
        done.await();
        streams.close(Duration.ofSeconds(30));
        System.exit(exitCode[0]);
    }

    /** The whole job: the sensors' topics, the session store, the table topic. */
    static Topology topology(String inputPattern, String outputTopic) {
        StreamsBuilder builder = new StreamsBuilder();
        builder.addStateStore(Stores.keyValueStoreBuilder(
                Stores.persistentKeyValueStore(STORE), Serdes.String(), Serdes.Long()).withCachingEnabled());
        builder.stream(Pattern.compile(inputPattern), Consumed.with(Serdes.String(), Serdes.ByteArray()))
                .process(SessionRows::new, STORE)
                .to(outputTopic, Produced.with(Serdes.String(), Serdes.String()));
        return builder.build();
    }

    /**
     * Applies each message to its session's rows in the store; forwards every row it changes.
     *
     * <p>The store holds what ordering needs, not the rows themselves: for each row, under the key
     * {@code SESSION/ROW_ID}, the seq of the message that last set it and whether that was a delete
     * ({@code seq * 2 + deleted}, eight bytes). The session is the key's prefix and the input topic's key, so a
     * session's rows live in the task that reads its messages. The row's values go from the message straight to
     * the output, so an update costs one eight-byte read and write whatever the session's size (a value holding
     * all of a session's rows would be read and rewritten whole for each message: sessions grow to thousands of
     * rows at 10x); the store's cache folds a row's writes within a commit into one changelog record.
     */
    static final class SessionRows implements Processor<String, byte[], String, String> {
        private ProcessorContext<String, String> context;
        private KeyValueStore<String, Long> store;

        @Override
        public void init(ProcessorContext<String, String> context) {
            this.context = context;
            this.store = context.getStateStore(STORE);
        }

        @Override
        public void process(Record<String, byte[]> record) {
            JsonNode msg = decode(record.value());
            if (msg == null) {
                return; // malformed: not a message of the wire format, skipped
            }
            String kind = msg.path("kind").asText();
            List<JsonNode> rows = new ArrayList<>();
            if (kind.equals("snapshot")) {
                msg.path("rows").forEach(rows::add);
            } else if (kind.equals("update")) {
                rows.add(msg.path("row"));
            } else {
                return; // "end" changes no row
            }
            String session = msg.path("session").asText();
            String sensor = msg.path("sensor").asText();
            long seq = msg.path("seq").asLong();
            boolean delete = "delete".equals(msg.path("op").asText());
            for (JsonNode row : rows) {
                if (!row.path("id").canConvertToLong()) {
                    continue;
                }
                long id = row.path("id").asLong();
                String key = session + "/" + id;
                Long held = store.get(key);
                if (held != null && (held >> 1) >= seq) {
                    continue; // an older or repeated message: the row already holds a later one
                }
                store.put(key, seq * 2 + (delete ? 1 : 0));
                context.forward(new Record<>(
                        key, delete ? null : output(session, sensor, id, seq, row), record.timestamp()));
            }
        }
    }

    static String output(String session, String sensor, long id, long seq, JsonNode row) {
        ObjectNode out = JSON.createObjectNode();
        row.fields().forEachRemaining(field -> out.set(field.getKey(), field.getValue()));
        out.put("session", session);
        out.put("sensor", sensor);
        out.put("row_id", id);
        out.put("seq", seq);
        out.put("committed_ms", System.currentTimeMillis());
        return out.toString();
    }

    static JsonNode decode(byte[] value) {
        if (value == null) {
            return null;
        }
        try {
            JsonNode msg = JSON.readTree(value);
            boolean ok = msg != null && msg.isObject() && msg.path("seq").isIntegralNumber()
                    && msg.path("session").isTextual() && msg.path("sensor").isTextual()
                    && msg.path("kind").isTextual();
            return ok ? msg : null;
        } catch (IOException exc) {
            return null;
        }
    }

    /** The command line: {@code --config FILE --input-pattern REGEX --output-topic NAME --application-id ID}. */
    record Args(
            Path config, String inputPattern, String outputTopic, String applicationId, Path stateDir,
            String instanceId, String threads, String commitIntervalMs) {
        static Args parse(String[] args) {
            Path config = null;
            String pattern = null;
            String topic = null;
            String id = null;
            Path stateDir = null;
            String instance = null;
            String threads = null;
            String commitInterval = null;
            for (int i = 0; i + 1 < args.length; i += 2) {
                switch (args[i]) {
                    case "--config" -> config = Path.of(args[i + 1]);
                    case "--input-pattern" -> pattern = args[i + 1];
                    case "--output-topic" -> topic = args[i + 1];
                    case "--application-id" -> id = args[i + 1];
                    case "--state-dir" -> stateDir = Path.of(args[i + 1]);
                    case "--instance-id" -> instance = args[i + 1];
                    case "--threads" -> threads = positive("--threads", args[i + 1]);
                    case "--commit-interval-ms" -> commitInterval = positive("--commit-interval-ms", args[i + 1]);
                    default -> throw new IllegalArgumentException("unknown option " + args[i]);
                }
            }
            if (config == null || pattern == null || topic == null || id == null || args.length % 2 != 0) {
                System.err.println("usage: java -jar sotw-streams-job.jar --config FILE --input-pattern REGEX "
                        + "--output-topic NAME --application-id ID [--state-dir DIR] [--instance-id NAME] [--threads N] "
                        + "[--commit-interval-ms MS]");
                System.exit(2);
            }
            return new Args(config, pattern, topic, id, stateDir, instance, threads, commitInterval);
        }

        private static String positive(String option, String value) {
            try {
                if (Integer.parseInt(value) > 0) {
                    return value;
                }
            } catch (NumberFormatException exc) {
                // reported below
            }
            System.err.println(option + " needs a positive whole number, not " + value);
            System.exit(2);
            return value;
        }
    }
}
