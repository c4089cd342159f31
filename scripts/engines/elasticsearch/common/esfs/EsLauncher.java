package esfs;

import org.elasticsearch.common.logging.LogConfigurator;
import org.elasticsearch.common.settings.Settings;
import org.elasticsearch.env.Environment;
import org.elasticsearch.http.HttpServerTransport;
import org.elasticsearch.node.EmbeddedNode;
import org.elasticsearch.node.InternalSettingsPreparer;
import org.elasticsearch.node.Node;
import org.elasticsearch.plugins.Plugin;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;

/**
 * Runs one Elasticsearch node in this JVM, for esfs's tests (started by scripts/engine).
 *
 * <p>The server jar and Elastic's real HTTP module come from Maven Central as plain jars on the
 * class path and are handed to the node as class-path plugins, the route the test framework's
 * MockNode takes ({@link EmbeddedNode}). Three modules are not on Maven Central; small stand-ins
 * cover what esfs uses of them: {@link PathAnalysisPlugin} (analysis-common's path_hierarchy and
 * ngram tokenizers), {@link ScoreScriptPlugin} (a "painless" that runs only `_score`) and
 * {@link RootInfoPlugin} (rest-root's `GET /`).
 *
 * <p>Usage: {@code java -cp classes:lib/* esfs.EsLauncher DIR HTTP_PORTS}. HTTP_PORTS is a port or
 * a range (the first free one is taken). Once the node is up its URL is written to DIR/url; data
 * goes to DIR/data, the log to stdout. SIGTERM closes the node cleanly.
 *
 * <p>Alone, the node is a single-node cluster whose indices get no replicas. With
 * ESFS_SEED_HOSTS (host:port list of every node's transport) it joins a cluster instead:
 * ESFS_NODE_NAME names it, ESFS_TRANSPORT_PORT is its transport port and ESFS_MASTER_NODES the
 * node names that bootstrap the first election.
 */
public final class EsLauncher {
    static final List<Class<? extends Plugin>> MODULES = List.of(
        org.elasticsearch.transport.netty4.Netty4Plugin.class, // HTTP + transport (Elastic's module)
        PathAnalysisPlugin.class,                               // path_hierarchy + ngram tokenizers
        ScoreScriptPlugin.class,                                // stand-in "painless": `_score` only
        RootInfoPlugin.class);                                  // GET / (rest-root module)

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: EsLauncher DIR HTTP_PORTS");
            System.exit(2);
        }
        long t0 = System.nanoTime();
        Path dir = Paths.get(args[0]).toAbsolutePath();
        // log4j's default configuration logs only errors; the caller's log file wants INFO
        if (System.getProperty("org.apache.logging.log4j.level") == null) {
            System.setProperty("org.apache.logging.log4j.level", "INFO");
        }
        // keep logging alive while our own shutdown hook closes the node
        System.setProperty("log4j.shutdownHookEnabled", "false");
        Files.createDirectories(dir.resolve("config"));
        String seeds = System.getenv("ESFS_SEED_HOSTS");
        boolean cluster = seeds != null && !seeds.isBlank();
        String nodeName = env("ESFS_NODE_NAME", "esfs-test");
        Settings.Builder b = Settings.builder()
            .put("cluster.name", "esfs-test").put("node.name", nodeName)
            .put("path.home", dir.toString())
            .put("path.data", dir.resolve("data").toString())
            .put("path.logs", dir.resolve("logs").toString())
            .put("network.host", "127.0.0.1")
            .put("http.port", args[1])
            // Each test mount makes an index set and none is deleted: the default 1000 shards
            // per node ended a long session's runs on one engine.
            .put("cluster.max_shards_per_node", 100000)
            // shared CI disks are often >90% full: do not refuse to allocate shards
            .put("cluster.routing.allocation.disk.threshold_enabled", false);
        if (cluster) {
            b.put("transport.port", env("ESFS_TRANSPORT_PORT", "9300"))
                .putList("discovery.seed_hosts", List.of(seeds.split(",")))
                .putList("cluster.initial_master_nodes", List.of(env("ESFS_MASTER_NODES", nodeName).split(",")));
        } else {
            b.put("transport.port", "0") // any free port: nothing connects to it
                .put("discovery.type", "single-node");
        }
        Settings settings = b.build();
        // Elasticsearch's own logging API needs its log4j-backed provider before anything logs
        LogConfigurator.configureWithoutConfig(settings);
        Environment env = InternalSettingsPreparer.prepareEnvironment(settings, Collections.emptyMap(), dir.resolve("config"), () -> nodeName);
        Node node = new EmbeddedNode(env, MODULES);
        CountDownLatch closed = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                node.close(); // flushes shards and releases the data dir lock
            } catch (Exception e) {
                e.printStackTrace();
            } finally {
                closed.countDown();
            }
        }, "esfs-engine-shutdown"));
        try {
            node.start();
            int port = node.injector().getInstance(HttpServerTransport.class).boundAddress().publishAddress().getPort();
            String url = "http://127.0.0.1:" + port;
            if (!cluster) {
                noReplicas(url);
            }
            // written whole, then renamed: a reader never sees half a URL
            Path tmp = dir.resolve("url.tmp");
            Files.writeString(tmp, url + "\n");
            Files.move(tmp, dir.resolve("url"), StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
            System.out.printf("esfs-engine: %s started on %s in %.1f s%n", nodeName, url, (System.nanoTime() - t0) / 1e9);
        } catch (Throwable t) {
            // e.g. the port is taken: exit at once so the caller sees the failure now
            System.err.println("esfs-engine: failed to start");
            t.printStackTrace();
            System.exit(1);
        }
        // the node's own threads may all be daemons: keep the JVM up until SIGTERM
        closed.await();
    }

    /**
     * One node: replicas could never be assigned and indices would stay yellow. Elasticsearch has
     * no cluster-wide replicas default (OpenSearch's cluster.default_number_of_replicas), so a
     * catch-all index template at the lowest priority; an index that asks for replicas still
     * gets them.
     */
    private static void noReplicas(String url) throws Exception {
        HttpResponse<String> r = HttpClient.newHttpClient().send(
            HttpRequest.newBuilder(URI.create(url + "/_index_template/esfs-no-replicas"))
                .header("Content-Type", "application/json")
                .PUT(HttpRequest.BodyPublishers.ofString(
                    "{\"index_patterns\":[\"*\"],\"priority\":0,\"template\":{\"settings\":{\"number_of_replicas\":0}}}"))
                .build(),
            HttpResponse.BodyHandlers.ofString());
        if (r.statusCode() != 200) {
            throw new IllegalStateException("index template: HTTP " + r.statusCode() + " " + r.body());
        }
    }

    private static String env(String name, String dflt) {
        String v = System.getenv(name);
        return v == null || v.isBlank() ? dflt : v;
    }
}
