package esfs;

import org.elasticsearch.Build;
import org.elasticsearch.client.internal.node.NodeClient;
import org.elasticsearch.cluster.ClusterState;
import org.elasticsearch.cluster.service.ClusterService;
import org.elasticsearch.rest.BaseRestHandler;
import org.elasticsearch.rest.RestRequest;
import org.elasticsearch.rest.RestResponse;
import org.elasticsearch.rest.RestStatus;
import org.elasticsearch.xcontent.XContentBuilder;

import java.util.List;
import java.util.function.Supplier;

/**
 * `GET /` and `HEAD /`: in 8.10+ they live in the rest-root module, which is not on Maven Central.
 * Same fields as rest-root's RestMainAction, from the server's own Build, ClusterService and Lucene.
 * Registered by RootInfoPlugin (es8/, es9/: the registration's signature differs).
 */
final class RootInfoHandler extends BaseRestHandler {
    private final Supplier<ClusterService> cluster;

    RootInfoHandler(Supplier<ClusterService> cluster) {
        this.cluster = cluster;
    }

    @Override
    public String getName() {
        return "main_action";
    }

    @Override
    public List<Route> routes() {
        return List.of(new Route(RestRequest.Method.GET, "/"), new Route(RestRequest.Method.HEAD, "/"));
    }

    @Override
    protected RestChannelConsumer prepareRequest(RestRequest request, NodeClient client) {
        return channel -> {
            if (request.method() == RestRequest.Method.HEAD) {
                channel.sendResponse(new RestResponse(RestStatus.OK, "application/json", ""));
                return;
            }
            ClusterService clusterService = cluster.get();
            ClusterState state = clusterService.state();
            Build b = Build.current();
            XContentBuilder x = channel.newBuilder();
            x.startObject();
            x.field("name", clusterService.getNodeName());
            x.field("cluster_name", clusterService.getClusterName().value());
            x.field("cluster_uuid", state.metadata().clusterUUID());
            x.startObject("version")
                .field("number", b.qualifiedVersion())
                .field("build_flavor", b.flavor())
                .field("build_type", b.type().displayName())
                .field("build_hash", b.hash())
                .field("build_date", b.date())
                .field("build_snapshot", b.isSnapshot())
                .field("lucene_version", org.apache.lucene.util.Version.LATEST.toString())
                .field("minimum_wire_compatibility_version", b.minWireCompatVersion())
                .field("minimum_index_compatibility_version", b.minIndexCompatVersion())
                .endObject();
            x.field("tagline", "You Know, for Search");
            x.endObject();
            channel.sendResponse(new RestResponse(RestStatus.OK, x));
        };
    }
}
