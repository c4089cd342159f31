package esfs;

import org.apache.lucene.analysis.Tokenizer;
import org.apache.lucene.analysis.ngram.NGramTokenizer;
import org.apache.lucene.analysis.path.PathHierarchyTokenizer;
import org.apache.lucene.analysis.path.ReversePathHierarchyTokenizer;
import org.elasticsearch.common.settings.Settings;
import org.elasticsearch.env.Environment;
import org.elasticsearch.index.IndexSettings;
import org.elasticsearch.index.analysis.TokenizerFactory;
import org.elasticsearch.indices.analysis.AnalysisModule.AnalysisProvider;
import org.elasticsearch.plugins.AnalysisPlugin;
import org.elasticsearch.plugins.Plugin;

import java.util.List;
import java.util.Map;
import java.util.function.IntPredicate;

/**
 * The two tokenizers of Elasticsearch's analysis-common module that esfs uses (that module is not
 * on Maven Central for 8.x/9.x): path_hierarchy and ngram, with analysis-common's settings and
 * Lucene's own tokenizers. ("lowercase" is a pre-configured filter of the server itself.)
 */
public class PathAnalysisPlugin extends Plugin implements AnalysisPlugin {
    @Override
    public Map<String, AnalysisProvider<TokenizerFactory>> getTokenizers() {
        return Map.of("path_hierarchy", PathHierarchyFactory::new, "ngram", NGramFactory::new);
    }

    static char oneChar(Settings s, String key, char dflt) {
        String v = s.get(key);
        if (v == null) return dflt;
        if (v.length() != 1) throw new IllegalArgumentException(key + " must be a one char value");
        return v.charAt(0);
    }

    static final class PathHierarchyFactory extends TokenizerBase {
        final int bufferSize, skip;
        final char delimiter, replacement;
        final boolean reverse;

        PathHierarchyFactory(IndexSettings is, Environment env, String name, Settings s) {
            super(is, s, name);
            bufferSize = s.getAsInt("buffer_size", 1024);
            delimiter = oneChar(s, "delimiter", PathHierarchyTokenizer.DEFAULT_DELIMITER);
            replacement = oneChar(s, "replacement", delimiter);
            skip = s.getAsInt("skip", PathHierarchyTokenizer.DEFAULT_SKIP);
            reverse = s.getAsBoolean("reverse", false);
        }

        @Override
        public Tokenizer create() {
            return reverse ? new ReversePathHierarchyTokenizer(bufferSize, delimiter, replacement, skip)
                : new PathHierarchyTokenizer(bufferSize, delimiter, replacement, skip);
        }
    }

    static final class NGramFactory extends TokenizerBase {
        final int minGram, maxGram;
        final IntPredicate tokenChar; // null: every character

        NGramFactory(IndexSettings is, Environment env, String name, Settings s) {
            super(is, s, name);
            minGram = s.getAsInt("min_gram", NGramTokenizer.DEFAULT_MIN_NGRAM_SIZE);
            maxGram = s.getAsInt("max_gram", NGramTokenizer.DEFAULT_MAX_NGRAM_SIZE);
            int diff = maxGram - minGram, allowed = is.getMaxNgramDiff();
            if (diff > allowed) {
                throw new IllegalArgumentException("The difference between max_gram and min_gram in NGram Tokenizer must be less than"
                    + " or equal to: [" + allowed + "] but was [" + diff + "]. This limit can be set by changing the ["
                    + IndexSettings.MAX_NGRAM_DIFF_SETTING.getKey() + "] index level setting.");
            }
            IntPredicate p = null;
            for (String c : s.getAsList("token_chars", List.of())) {
                IntPredicate q = switch (c.toLowerCase(java.util.Locale.ROOT)) {
                    case "letter" -> Character::isLetter;
                    case "digit" -> Character::isDigit;
                    case "whitespace" -> Character::isWhitespace;
                    case "punctuation" -> ch -> switch (Character.getType(ch)) {
                        case Character.START_PUNCTUATION, Character.END_PUNCTUATION, Character.OTHER_PUNCTUATION,
                             Character.CONNECTOR_PUNCTUATION, Character.DASH_PUNCTUATION, Character.INITIAL_QUOTE_PUNCTUATION,
                             Character.FINAL_QUOTE_PUNCTUATION -> true;
                        default -> false;
                    };
                    case "symbol" -> ch -> switch (Character.getType(ch)) {
                        case Character.CURRENCY_SYMBOL, Character.MATH_SYMBOL, Character.OTHER_SYMBOL, Character.MODIFIER_SYMBOL -> true;
                        default -> false;
                    };
                    default -> throw new IllegalArgumentException("Unknown token type: '" + c + "'");
                };
                p = p == null ? q : p.or(q);
            }
            tokenChar = p;
        }

        @Override
        public Tokenizer create() {
            if (tokenChar == null) return new NGramTokenizer(minGram, maxGram);
            IntPredicate p = tokenChar;
            return new NGramTokenizer(minGram, maxGram) {
                @Override
                protected boolean isTokenChar(int chr) {
                    return p.test(chr);
                }
            };
        }
    }
}
