//! Analyzers: the `standard`, `simple`, `whitespace` and `keyword` built-ins and custom
//! analyzers made of a tokenizer (`standard`, `keyword`, `whitespace`, `letter`,
//! `lowercase`, `path_hierarchy`, `ngram`, `edge_ngram`) and token filters (`lowercase`,
//! `uppercase`, `trim`).

use std::collections::HashMap;

use serde_json::Value;

use crate::error::{EsError, EsResult};

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tokenizer {
    Standard {
        max_token_length: usize,
    },
    Keyword,
    Whitespace,
    Letter,
    Lowercase,
    PathHierarchy {
        delimiter: char,
        replacement: char,
        skip: usize,
        reverse: bool,
    },
    /// `ngram` (every gram of every token-char run) or `edge_ngram` (grams anchored at the
    /// start of each run). An empty `token_chars` keeps every character.
    NGram {
        min: usize,
        max: usize,
        token_chars: Vec<CharClass>,
        custom: Vec<char>,
        edge: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum CharClass {
    Letter,
    Digit,
    Whitespace,
    Punctuation,
    Symbol,
    Custom,
}

fn is_symbol(c: char) -> bool {
    matches!(c, '$' | '+' | '<' | '=' | '>' | '^' | '`' | '|' | '~')
        || (!c.is_ascii() && !c.is_alphanumeric() && !c.is_whitespace() && !c.is_control())
}

fn char_in(c: char, classes: &[CharClass], custom: &[char]) -> bool {
    classes.iter().any(|k| match k {
        CharClass::Letter => c.is_alphabetic(),
        CharClass::Digit => c.is_numeric(),
        CharClass::Whitespace => c.is_whitespace(),
        CharClass::Punctuation => c.is_ascii_punctuation() && !is_symbol(c),
        CharClass::Symbol => is_symbol(c),
        CharClass::Custom => custom.contains(&c),
    })
}

/// Lucene's NGramTokenizer / EdgeNGramTokenizer: grams ordered by start, then length.
pub(crate) fn ngrams(
    text: &str,
    min: usize,
    max: usize,
    classes: &[CharClass],
    custom: &[char],
    edge: bool,
) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if !classes.is_empty() && !char_in(chars[i], classes, custom) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && (classes.is_empty() || char_in(chars[i], classes, custom)) {
            i += 1;
        }
        let run = &chars[start..i];
        if edge {
            for n in min..=max {
                if n <= run.len() {
                    out.push(run[..n].iter().collect());
                }
            }
        } else {
            for s in 0..run.len() {
                for n in min..=max {
                    if s + n <= run.len() {
                        out.push(run[s..s + n].iter().collect());
                    }
                }
            }
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Filter {
    Lowercase,
    Uppercase,
    Trim,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Analyzer {
    pub tokenizer: Tokenizer,
    pub filters: Vec<Filter>,
}

impl Analyzer {
    pub(crate) fn standard() -> Analyzer {
        Analyzer {
            tokenizer: Tokenizer::Standard {
                max_token_length: 255,
            },
            filters: vec![Filter::Lowercase],
        }
    }

    pub(crate) fn keyword() -> Analyzer {
        Analyzer {
            tokenizer: Tokenizer::Keyword,
            filters: vec![],
        }
    }

    /// Tokens of `text` in order; positions are the indexes in the returned vector.
    pub(crate) fn analyze(&self, text: &str) -> Vec<String> {
        let mut toks = match &self.tokenizer {
            Tokenizer::Standard { max_token_length } => standard_tokens(text, *max_token_length),
            Tokenizer::Keyword => {
                if text.is_empty() {
                    vec![]
                } else {
                    vec![text.to_string()]
                }
            }
            Tokenizer::Whitespace => text.split_whitespace().map(str::to_string).collect(),
            Tokenizer::Letter => letter_tokens(text),
            Tokenizer::Lowercase => letter_tokens(text)
                .into_iter()
                .map(|t| t.to_lowercase())
                .collect(),
            Tokenizer::NGram {
                min,
                max,
                token_chars,
                custom,
                edge,
            } => ngrams(text, *min, *max, token_chars, custom, *edge),
            Tokenizer::PathHierarchy {
                delimiter,
                replacement,
                skip,
                reverse,
            } => path_hierarchy(text, *delimiter, *replacement, *skip, *reverse),
        };
        for f in &self.filters {
            for t in toks.iter_mut() {
                match f {
                    Filter::Lowercase => *t = t.to_lowercase(),
                    Filter::Uppercase => *t = t.to_uppercase(),
                    Filter::Trim => *t = t.trim().to_string(),
                }
            }
        }
        toks
    }
}

fn letter_tokens(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphabetic())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum WordClass {
    Letter,
    Numeric,
    ExtendNumLet,
    MidLetter,
    MidNum,
    MidNumLet,
    Ideographic,
    Other,
}

fn classify(c: char) -> WordClass {
    match c {
        '_'
        | '\u{203F}'
        | '\u{2040}'
        | '\u{2054}'
        | '\u{FE33}'
        | '\u{FE34}'
        | '\u{FE4D}'..='\u{FE4F}'
        | '\u{FF3F}' => WordClass::ExtendNumLet,
        '.' | '\'' | '\u{2018}' | '\u{2019}' | '\u{2024}' | '\u{FE52}' | '\u{FF07}'
        | '\u{FF0E}' => WordClass::MidNumLet,
        ':' | '\u{00B7}' | '\u{0387}' | '\u{05F4}' | '\u{2027}' | '\u{FE13}' | '\u{FE55}'
        | '\u{FF1A}' => WordClass::MidLetter,
        ',' | ';' | '\u{037E}' | '\u{0589}' | '\u{060C}' | '\u{060D}' | '\u{066C}' | '\u{07F8}'
        | '\u{2044}' | '\u{FE10}' | '\u{FE14}' | '\u{FE50}' | '\u{FE54}' | '\u{FF0C}'
        | '\u{FF1B}' => WordClass::MidNum,
        c if is_ideographic(c) => WordClass::Ideographic,
        c if c.is_numeric() => WordClass::Numeric,
        c if c.is_alphabetic() => WordClass::Letter,
        _ => WordClass::Other,
    }
}

fn is_ideographic(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF | 0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF | 0x20000..=0x2FA1F)
}

/// An approximation of Lucene's StandardTokenizer (Unicode UAX#29 word boundaries):
/// letters/digits/underscore runs form words; `.` `'` join letters (`file.txt`,
/// `don't`), `:` joins letters, `.` `,` `;` join digits (`3.14`, `1,000`); every
/// other character separates; CJK ideographs are single-character tokens.
pub(crate) fn standard_tokens(text: &str, max_len: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let classes: Vec<WordClass> = chars.iter().map(|&c| classify(c)).collect();
    let is_word = |k: WordClass| {
        matches!(
            k,
            WordClass::Letter | WordClass::Numeric | WordClass::ExtendNumLet
        )
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let k = classes[i];
        if k == WordClass::Ideographic {
            out.push(chars[i].to_string());
            i += 1;
            continue;
        }
        if !is_word(k) {
            i += 1;
            continue;
        }
        let start = i;
        i += 1;
        loop {
            if i < chars.len() && is_word(classes[i]) {
                i += 1;
                continue;
            }
            // A single mid character between two word characters of the right kinds.
            if i + 1 < chars.len() && is_word(classes[i + 1]) {
                let prev = classes[i - 1];
                let next = classes[i + 1];
                let mid = classes[i];
                let letters = prev == WordClass::Letter
                    && next == WordClass::Letter
                    && matches!(mid, WordClass::MidLetter | WordClass::MidNumLet);
                let digits = prev == WordClass::Numeric
                    && next == WordClass::Numeric
                    && matches!(mid, WordClass::MidNum | WordClass::MidNumLet);
                if letters || digits {
                    i += 2;
                    continue;
                }
            }
            break;
        }
        let word: Vec<char> = chars[start..i].to_vec();
        for chunk in word.chunks(max_len.max(1)) {
            out.push(chunk.iter().collect());
        }
    }
    out
}

/// Lucene's PathHierarchyTokenizer / ReversePathHierarchyTokenizer.
/// `/a/b/c` gives `/a`, `/a/b`, `/a/b/c`; reversed: `/a/b/c`, `a/b/c`, `b/c`, `c`.
pub(crate) fn path_hierarchy(
    text: &str,
    delim: char,
    repl: char,
    skip: usize,
    reverse: bool,
) -> Vec<String> {
    if text.is_empty() {
        return vec![];
    }
    let chars: Vec<char> = text.chars().collect();
    let fix = |s: &[char]| -> String {
        s.iter()
            .map(|&c| if c == delim { repl } else { c })
            .collect()
    };
    let mut out = Vec::new();
    if !reverse {
        let mut start = 0;
        if skip > 0 {
            let inner: Vec<usize> = (1..chars.len()).filter(|&p| chars[p] == delim).collect();
            if skip > inner.len() {
                return vec![];
            }
            start = inner[skip - 1];
        }
        let s = &chars[start..];
        for p in 1..s.len() {
            if s[p] == delim {
                out.push(fix(&s[..p]));
            }
        }
        out.push(fix(s));
    } else {
        let mut end = chars.len();
        if skip > 0 {
            let delims: Vec<usize> = (0..chars.len().saturating_sub(1))
                .filter(|&p| chars[p] == delim)
                .collect();
            if skip > delims.len() {
                return vec![];
            }
            end = delims[delims.len() - skip] + 1;
        }
        let s = &chars[..end];
        out.push(fix(s));
        for p in 0..s.len() {
            if s[p] == delim && p + 1 < s.len() {
                out.push(fix(&s[p + 1..]));
            }
        }
    }
    out
}

/// The analyzers and normalizers an index knows.
#[derive(Debug, Clone, Default)]
pub(crate) struct Analysis {
    pub analyzers: HashMap<String, Analyzer>,
    pub normalizers: HashMap<String, Vec<Filter>>,
}

fn builtin_analyzer(name: &str) -> Option<Analyzer> {
    Some(match name {
        "standard" | "default" => Analyzer::standard(),
        "keyword" => Analyzer::keyword(),
        "simple" => Analyzer {
            tokenizer: Tokenizer::Lowercase,
            filters: vec![],
        },
        "whitespace" => Analyzer {
            tokenizer: Tokenizer::Whitespace,
            filters: vec![],
        },
        _ => return None,
    })
}

fn str_param(v: &Value, key: &str) -> Option<String> {
    match v.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn single_char(v: &Value, key: &str, default: char, tok: &str) -> EsResult<char> {
    match str_param(v, key) {
        None => Ok(default),
        Some(s) => {
            let mut it = s.chars();
            match (it.next(), it.next()) {
                (Some(c), None) => Ok(c),
                _ => Err(EsError::bad_request(format!(
                    "[{key}] of tokenizer [{tok}] must be a single character"
                ))),
            }
        }
    }
}

fn usize_param(def: &Value, key: &str, default: usize, tok: &str) -> EsResult<usize> {
    match str_param(def, key) {
        None => Ok(default),
        Some(s) => s.parse().map_err(|_| {
            EsError::bad_request(format!(
                "Failed to parse value [{s}] for [{key}] of tokenizer [{tok}]"
            ))
        }),
    }
}

fn ngram_tokenizer(
    name: &str,
    def: &Value,
    edge: bool,
    max_ngram_diff: usize,
) -> EsResult<Tokenizer> {
    let min = usize_param(def, "min_gram", 1, name)?;
    let max = usize_param(def, "max_gram", 2, name)?;
    if min == 0 || min > max {
        return Err(EsError::bad_request(format!(
            "min_gram must be >= 1 and <= max_gram (tokenizer [{name}])"
        )));
    }
    if !edge && max - min > max_ngram_diff {
        return Err(EsError::bad_request(format!(
            "The difference between max_gram and min_gram in NGram Tokenizer must be less than or equal to: [{max_ngram_diff}] but was [{}]. This limit can be set by changing the [index.max_ngram_diff] index level setting.",
            max - min
        )));
    }
    let mut token_chars = Vec::new();
    for c in filter_list(def, "token_chars") {
        token_chars.push(match c.as_str() {
            "letter" => CharClass::Letter,
            "digit" => CharClass::Digit,
            "whitespace" => CharClass::Whitespace,
            "punctuation" => CharClass::Punctuation,
            "symbol" => CharClass::Symbol,
            "custom" => CharClass::Custom,
            other => return Err(EsError::bad_request(format!("Unknown token type: '{other}', must be one of [symbol, private_use, paragraph_separator, start_punctuation, unassigned, enclosing_mark, connector_punctuation, letter_number, other_number, math_symbol, lowercase_letter, space_separator, surrogate, initial_quote_punctuation, decimal_digit_number, digit, other_punctuation, dash_punctuation, currency_symbol, non_spacing_mark, format, modifier_letter, control, uppercase_letter, other_symbol, end_punctuation, modifier_symbol, other_letter, line_separator, titlecase_letter, letter, punctuation, combining_spacing_mark, final_quote_punctuation, custom, whitespace]"))),
        });
    }
    let custom: Vec<char> = str_param(def, "custom_token_chars")
        .unwrap_or_default()
        .chars()
        .collect();
    Ok(Tokenizer::NGram {
        min,
        max,
        token_chars,
        custom,
        edge,
    })
}

fn build_tokenizer(
    name: &str,
    defs: &serde_json::Map<String, Value>,
    max_ngram_diff: usize,
) -> EsResult<Tokenizer> {
    if let Some(def) = defs.get(name) {
        let ty = str_param(def, "type").unwrap_or_default();
        return Ok(match ty.as_str() {
            "ngram" | "nGram" => ngram_tokenizer(name, def, false, max_ngram_diff)?,
            "edge_ngram" | "edgeNGram" => ngram_tokenizer(name, def, true, max_ngram_diff)?,
            "path_hierarchy" | "PathHierarchy" => {
                let delimiter = single_char(def, "delimiter", '/', name)?;
                let replacement = single_char(def, "replacement", delimiter, name)?;
                let skip = str_param(def, "skip")
                    .map(|s| s.parse::<usize>())
                    .transpose()
                    .map_err(|_| {
                        EsError::bad_request(format!(
                            "Failed to parse value for [skip] of tokenizer [{name}]"
                        ))
                    })?;
                let reverse = str_param(def, "reverse")
                    .map(|s| s == "true")
                    .unwrap_or(false);
                Tokenizer::PathHierarchy {
                    delimiter,
                    replacement,
                    skip: skip.unwrap_or(0),
                    reverse,
                }
            }
            "standard" => {
                let max = str_param(def, "max_token_length")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(255);
                Tokenizer::Standard {
                    max_token_length: max,
                }
            }
            "keyword" => Tokenizer::Keyword,
            "whitespace" => Tokenizer::Whitespace,
            "letter" => Tokenizer::Letter,
            "lowercase" => Tokenizer::Lowercase,
            other => {
                return Err(EsError::unsupported(&format!(
                    "the tokenizer type [{other}] (tokenizer [{name}])"
                )));
            }
        });
    }
    Ok(match name {
        "standard" => Tokenizer::Standard {
            max_token_length: 255,
        },
        "keyword" => Tokenizer::Keyword,
        "whitespace" => Tokenizer::Whitespace,
        "letter" => Tokenizer::Letter,
        "lowercase" => Tokenizer::Lowercase,
        "ngram" => Tokenizer::NGram {
            min: 1,
            max: 2,
            token_chars: vec![],
            custom: vec![],
            edge: false,
        },
        "edge_ngram" => Tokenizer::NGram {
            min: 1,
            max: 2,
            token_chars: vec![],
            custom: vec![],
            edge: true,
        },
        "path_hierarchy" => Tokenizer::PathHierarchy {
            delimiter: '/',
            replacement: '/',
            skip: 0,
            reverse: false,
        },
        _ => {
            return Err(EsError::bad_request(format!(
                "failed to find tokenizer under name [{name}]"
            )));
        }
    })
}

fn build_filter(name: &str, defs: &serde_json::Map<String, Value>) -> EsResult<Filter> {
    let ty = match defs.get(name) {
        Some(def) => str_param(def, "type").unwrap_or_default(),
        None => name.to_string(),
    };
    match ty.as_str() {
        "lowercase" => Ok(Filter::Lowercase),
        "uppercase" => Ok(Filter::Uppercase),
        "trim" => Ok(Filter::Trim),
        _ if defs.contains_key(name) => Err(EsError::unsupported(&format!(
            "the token filter type [{ty}] (filter [{name}])"
        ))),
        _ => Err(EsError::unsupported(&format!("the token filter [{name}]"))),
    }
}

fn filter_list(def: &Value, key: &str) -> Vec<String> {
    match def.get(key) {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        Some(Value::String(s)) => s
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        _ => vec![],
    }
}

impl Analysis {
    /// Builds the analysis chain from the (nested) `index.analysis` settings object.
    pub(crate) fn from_settings(
        analysis: Option<&Value>,
        max_ngram_diff: usize,
    ) -> EsResult<Analysis> {
        let mut a = Analysis::default();
        let empty = serde_json::Map::new();
        let Some(an) = analysis else { return Ok(a) };
        let section = |k: &str| an.get(k).and_then(Value::as_object).unwrap_or(&empty);
        let tokenizers = section("tokenizer");
        let filters = section("filter");
        if let Some(cf) = an.get("char_filter").and_then(Value::as_object)
            && !cf.is_empty()
        {
            return Err(EsError::unsupported("char_filter definitions"));
        }
        for (name, def) in section("analyzer") {
            let ty = str_param(def, "type").unwrap_or_else(|| "custom".into());
            let analyzer = match ty.as_str() {
                "custom" => {
                    let tok = str_param(def, "tokenizer").ok_or_else(|| {
                        EsError::bad_request(format!(
                            "analyzer [{name}] must specify either an analyzer type, or a tokenizer"
                        ))
                    })?;
                    if !filter_list(def, "char_filter").is_empty() {
                        return Err(EsError::unsupported(&format!(
                            "char filters (analyzer [{name}])"
                        )));
                    }
                    let mut fl = Vec::new();
                    for f in filter_list(def, "filter") {
                        fl.push(build_filter(&f, filters)?);
                    }
                    Analyzer {
                        tokenizer: build_tokenizer(&tok, tokenizers, max_ngram_diff)?,
                        filters: fl,
                    }
                }
                other => match builtin_analyzer(other) {
                    Some(mut an) => {
                        if let (Tokenizer::Standard { max_token_length }, Some(m)) = (
                            &mut an.tokenizer,
                            str_param(def, "max_token_length").and_then(|s| s.parse().ok()),
                        ) {
                            *max_token_length = m;
                        }
                        if def.get("stopwords").is_some() {
                            return Err(EsError::unsupported(&format!(
                                "stopwords (analyzer [{name}])"
                            )));
                        }
                        an
                    }
                    None => {
                        return Err(EsError::unsupported(&format!(
                            "the analyzer type [{other}] (analyzer [{name}])"
                        )));
                    }
                },
            };
            a.analyzers.insert(name.clone(), analyzer);
        }
        for (name, def) in section("normalizer") {
            let mut fl = Vec::new();
            for f in filter_list(def, "filter") {
                fl.push(build_filter(&f, filters)?);
            }
            a.normalizers.insert(name.clone(), fl);
        }
        Ok(a)
    }

    pub(crate) fn analyzer(&self, name: &str) -> Option<Analyzer> {
        self.analyzers
            .get(name)
            .cloned()
            .or_else(|| builtin_analyzer(name))
    }

    pub(crate) fn normalizer(&self, name: &str) -> Option<Vec<Filter>> {
        if let Some(n) = self.normalizers.get(name) {
            return Some(n.clone());
        }
        (name == "lowercase").then(|| vec![Filter::Lowercase])
    }
}

pub(crate) fn apply_filters(filters: &[Filter], s: &str) -> String {
    let mut s = s.to_string();
    for f in filters {
        s = match f {
            Filter::Lowercase => s.to_lowercase(),
            Filter::Uppercase => s.to_uppercase(),
            Filter::Trim => s.trim().to_string(),
        };
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_hierarchy_forward() {
        assert_eq!(
            path_hierarchy("/a/b/c", '/', '/', 0, false),
            vec!["/a", "/a/b", "/a/b/c"]
        );
        assert_eq!(path_hierarchy("a/b", '/', '/', 0, false), vec!["a", "a/b"]);
        assert_eq!(path_hierarchy("/", '/', '/', 0, false), vec!["/"]);
        assert_eq!(
            path_hierarchy("/a/b/c", '/', '/', 1, false),
            vec!["/b", "/b/c"]
        );
        assert_eq!(
            path_hierarchy("/a/b", '/', '|', 0, false),
            vec!["|a", "|a|b"]
        );
    }

    #[test]
    fn ngram_tokenizers() {
        assert_eq!(ngrams("abcd", 3, 3, &[], &[], false), vec!["abc", "bcd"]);
        assert_eq!(
            ngrams("abc", 1, 2, &[], &[], false),
            vec!["a", "ab", "b", "bc", "c"]
        );
        assert_eq!(
            ngrams("ab cd", 2, 2, &[CharClass::Letter], &[], false),
            vec!["ab", "cd"]
        );
        assert_eq!(
            ngrams("héllo", 3, 3, &[], &[], false),
            vec!["hél", "éll", "llo"]
        );
        assert_eq!(ngrams("ab", 3, 3, &[], &[], false), Vec::<String>::new());
        assert_eq!(
            ngrams("quick fox", 1, 3, &[CharClass::Letter], &[], true),
            vec!["q", "qu", "qui", "f", "fo", "fox"]
        );
    }

    #[test]
    fn path_hierarchy_reverse() {
        assert_eq!(
            path_hierarchy("/a/b/c", '/', '/', 0, true),
            vec!["/a/b/c", "a/b/c", "b/c", "c"]
        );
        assert_eq!(
            path_hierarchy("www.site.co.uk", '.', '.', 0, true),
            vec!["www.site.co.uk", "site.co.uk", "co.uk", "uk"]
        );
    }

    #[test]
    fn standard() {
        let a = Analyzer::standard();
        assert_eq!(
            a.analyze("Hello, World! file.txt don't 3.14 foo-bar a_b"),
            vec![
                "hello", "world", "file.txt", "don't", "3.14", "foo", "bar", "a_b"
            ]
        );
        assert_eq!(a.analyze("Report 2024 v1"), vec!["report", "2024", "v1"]);
    }
}
