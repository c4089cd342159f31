package esfs;

import org.elasticsearch.common.settings.Settings;
import org.elasticsearch.index.IndexSettings;
import org.elasticsearch.index.analysis.AbstractTokenizerFactory;

/** AbstractTokenizerFactory's constructor, whose parameters differ between 8.x and 9.x. */
abstract class TokenizerBase extends AbstractTokenizerFactory {
    TokenizerBase(IndexSettings is, Settings s, String name) {
        super(is, s, name);
    }
}
