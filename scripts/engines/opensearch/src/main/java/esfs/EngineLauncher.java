package esfs;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.Collection;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;

import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.http.HttpServerTransport;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.plugins.Plugin;

/**
 * Runs one single-node OpenSearch in this JVM, for esfs's tests (started by scripts/engine).
 *
 * <p>The server jar and its modules come from Maven Central as plain jars on the class path. The
 * usual distribution loads modules from a modules/ directory, each in its own class loader; here
 * they are handed to the node as "classpath plugins" instead, which is what the protected
 * {@link Node} constructor is for. No security manager and no bootstrap checks: this is a
 * throwaway test node bound to 127.0.0.1.
 *
 * <p>Usage: {@code java -cp classes:lib/* esfs.EngineLauncher DIR HTTP_PORTS}. HTTP_PORTS is a
 * port or a range ("19200-19299": the first free one is taken, so two engines never race for a
 * port). Once the node is up, its URL is written to DIR/url. Data goes to DIR/data; the log goes
 * to stdout, which the caller redirects. SIGTERM closes the node cleanly.
 */
public final class EngineLauncher {

    /** Modules a plain distribution would load from modules/ (only those esfs needs). */
    private static final List<Class<? extends Plugin>> MODULES = List.of(
            org.opensearch.transport.Netty4Plugin.class, // HTTP (and transport) layer
            org.opensearch.analysis.common.CommonAnalysisPlugin.class, // path_hierarchy, ngram, lowercase
            org.opensearch.painless.PainlessPlugin.class, // scripts, e.g. max of _score
            org.opensearch.index.reindex.ReindexPlugin.class); // _update_by_query, _delete_by_query

    /** Node's plugin-taking constructor is protected: a subclass makes it reachable. */
    private static final class EmbeddedNode extends Node {
        EmbeddedNode(Environment env, Collection<Class<? extends Plugin>> plugins) {
            super(env, plugins, true);
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: EngineLauncher DIR HTTP_PORTS");
            System.exit(2);
        }
        Path dir = Paths.get(args[0]).toAbsolutePath();
        String httpPorts = args[1];
        // log4j's default configuration logs only errors; the caller's log file wants INFO
        if (System.getProperty("org.apache.logging.log4j.level") == null) {
            System.setProperty("org.apache.logging.log4j.level", "INFO");
        }
        // keep logging alive while our own shutdown hook closes the node
        System.setProperty("log4j.shutdownHookEnabled", "false");
        Files.createDirectories(dir.resolve("config"));

        Settings settings = Settings.builder()
                .put("cluster.name", "esfs-test")
                .put("node.name", "esfs-test")
                .put("path.home", dir.toString())
                .put("path.data", dir.resolve("data").toString())
                .put("path.logs", dir.resolve("logs").toString())
                .put("network.host", "127.0.0.1")
                .put("http.port", httpPorts)
                .put("transport.port", "0") // any free port: nothing connects to it
                .put("discovery.type", "single-node")
                // Each test mount makes an index set (5 shards) and none is deleted: the
                // default 1000 shards per node ended a long session's runs on one engine.
                .put("cluster.max_shards_per_node", 100000)
                // shared CI disks are often >90% full: do not refuse to allocate shards
                .put("cluster.routing.allocation.disk.threshold_enabled", false)
                .build();
        Environment env = InternalSettingsPreparer.prepareEnvironment(
                settings, Collections.emptyMap(), dir.resolve("config"), () -> "esfs-test");

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
            // one node: replicas could never be assigned and indices would stay yellow. This default
            // is read from the cluster state, not from node settings, hence an update once started.
            node.client().admin().cluster().prepareUpdateSettings()
                    .setPersistentSettings(Settings.builder().put("cluster.default_number_of_replicas", 0))
                    .get();
            int port = node.injector().getInstance(HttpServerTransport.class)
                    .boundAddress().publishAddress().getPort();
            String url = "http://127.0.0.1:" + port;
            // written whole, then renamed: a reader never sees half a URL
            Path tmp = dir.resolve("url.tmp");
            Files.writeString(tmp, url + "\n");
            Files.move(tmp, dir.resolve("url"), StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
            System.out.println("esfs-engine: started on " + url);
        } catch (Throwable t) {
            // e.g. the port is taken: exit at once (the hook closes the node) so the caller
            // sees the failure now instead of waiting for its timeout
            System.err.println("esfs-engine: failed to start");
            t.printStackTrace();
            System.exit(1);
        }
        // the node's own threads may all be daemons: keep the JVM up until SIGTERM
        closed.await();
    }
}
