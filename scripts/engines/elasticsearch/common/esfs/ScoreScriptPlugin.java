package esfs;

import org.apache.lucene.index.LeafReaderContext;
import org.elasticsearch.common.settings.Settings;
import org.elasticsearch.plugins.Plugin;
import org.elasticsearch.plugins.ScriptPlugin;
import org.elasticsearch.script.AggregationScript;
import org.elasticsearch.script.ScriptContext;
import org.elasticsearch.script.ScriptEngine;
import org.elasticsearch.search.lookup.SearchLookup;

import java.util.Collection;
import java.util.Map;
import java.util.Set;

/**
 * NOT painless: lang-painless is not on Maven Central for 8.x/9.x. A stand-in engine under the
 * name "painless" that compiles exactly one script, `_score`, in aggregations (esfs's
 * `{"max": {"script": "_score"}}`); anything else is rejected at compile time.
 */
public class ScoreScriptPlugin extends Plugin implements ScriptPlugin {
    @Override
    public ScriptEngine getScriptEngine(Settings settings, Collection<ScriptContext<?>> contexts) {
        return new ScriptEngine() {
            @Override
            public String getType() {
                return "painless";
            }

            @Override
            public <T> T compile(String name, String source, ScriptContext<T> context, Map<String, String> params) {
                if (context.equals(AggregationScript.CONTEXT) && source.strip().equals("_score")) {
                    AggregationScript.Factory f = (p, lookup) -> new AggregationScript.LeafFactory() {
                        @Override
                        public AggregationScript newInstance(LeafReaderContext ctx) {
                            return new AggregationScript(p, lookup, ctx) {
                                @Override
                                public Object execute() {
                                    return get_score();
                                }
                            };
                        }

                        @Override
                        public boolean needs_score() {
                            return true;
                        }
                    };
                    return context.factoryClazz.cast(f);
                }
                throw new IllegalArgumentException("esfs stand-in for painless runs only `_score` in aggregations, not ["
                    + source + "] in [" + context.name + "]");
            }

            @Override
            public Set<ScriptContext<?>> getSupportedContexts() {
                return Set.of(AggregationScript.CONTEXT);
            }
        };
    }
}
