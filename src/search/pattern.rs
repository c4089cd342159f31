//! Which literal strings every match of a grep pattern must contain.
//!
//! The index can only narrow a search safely if it never drops a file grep
//! would match, so this is conservative everywhere: a construct it does not
//! fully understand contributes no literal (it "breaks the run"), an
//! alternation becomes an OR, and a quantifier that allows zero repetitions
//! drops its atom. What remains is a formula of literals ([`Req`]) that is
//! implied by every match; the literals are then cut into pieces the
//! trigram index can check ([`Req::for_index`]).
//!
//! Syntax follows GNU grep: BRE by default (`\(\)`, `\{\}`, `\|`, `\+`,
//! `\?` are the GNU operators; plain `+ ? { } | ( )` are literal), ERE
//! with `-E`, fixed strings with `-F`. Several patterns (newline-separated,
//! or several `-e`) are alternatives.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Syntax {
    Basic,
    Extended,
    Fixed,
}

/// A formula every matching line satisfies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Req {
    /// No constraint.
    All,
    /// The line contains this string.
    Lit(String),
    And(Vec<Req>),
    Or(Vec<Req>),
}

/// The formula for a list of patterns (alternatives).
pub(crate) fn required(patterns: &[String], syntax: Syntax) -> Req {
    let mut alts = Vec::new();
    for p in patterns {
        // A pattern holding newlines is one pattern per line.
        for line in p.split('\n') {
            alts.push(match syntax {
                Syntax::Fixed => Req::Lit(line.to_string()),
                _ => Parser::new(line, syntax == Syntax::Extended).parse(),
            });
        }
    }
    if alts.is_empty() {
        return Req::All;
    }
    simplify(Req::Or(alts))
}

/// Characters whose case-insensitive matches could fall outside what the
/// index folds to the same trigram: non-ASCII letters (Unicode folding
/// differs between grep's locale, SQLite and Lucene), and `i`, `k`, `s`,
/// which have non-ASCII case partners (Turkish dotless i, KELVIN SIGN, LONG S).
fn unsafe_under_ignore_case(c: char) -> bool {
    !c.is_ascii() || matches!(c, 'i' | 'I' | 'k' | 'K' | 's' | 'S')
}

impl Req {
    /// The formula restricted to what the trigram index can check: every
    /// literal cut into pieces of at least 3 characters (under
    /// `ignore_case`, pieces free of [`unsafe_under_ignore_case`]
    /// characters); shorter pieces constrain nothing.
    pub(crate) fn for_index(&self, ignore_case: bool) -> Req {
        let r = match self {
            Req::All => Req::All,
            Req::Lit(s) => {
                let pieces: Vec<Req> = if ignore_case {
                    s.split(unsafe_under_ignore_case)
                        .filter(|p| p.chars().count() >= 3)
                        .map(|p| Req::Lit(p.to_string()))
                        .collect()
                } else if s.chars().count() >= 3 {
                    vec![Req::Lit(s.clone())]
                } else {
                    vec![]
                };
                Req::And(pieces)
            }
            Req::And(v) => Req::And(v.iter().map(|r| r.for_index(ignore_case)).collect()),
            Req::Or(v) => Req::Or(v.iter().map(|r| r.for_index(ignore_case)).collect()),
        };
        simplify(r)
    }
}

fn simplify(r: Req) -> Req {
    match r {
        Req::Lit(s) if s.is_empty() => Req::All,
        Req::And(v) => {
            let mut out = Vec::new();
            for r in v.into_iter().map(simplify) {
                match r {
                    Req::All => {}
                    Req::And(inner) => out.extend(inner),
                    r => {
                        if !out.contains(&r) {
                            out.push(r)
                        }
                    }
                }
            }
            match out.len() {
                0 => Req::All,
                1 => out.pop().expect("one"),
                _ => Req::And(out),
            }
        }
        Req::Or(v) => {
            let mut out = Vec::new();
            for r in v.into_iter().map(simplify) {
                match r {
                    Req::All => return Req::All,
                    Req::Or(inner) => out.extend(inner),
                    r => {
                        if !out.contains(&r) {
                            out.push(r)
                        }
                    }
                }
            }
            match out.len() {
                0 => Req::All,
                1 => out.pop().expect("one"),
                _ => Req::Or(out),
            }
        }
        r => r,
    }
}

/// One token of a BRE/ERE, with the GNU operators resolved per syntax.
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    /// A character that matches itself.
    Char(char),
    /// Matches something not known here (`.`, a bracket expression, a
    /// class escape, a back-reference, an anchor, ...).
    Other,
    Open,
    Close,
    Alt,
    /// `*`, `?`, `{...}`: zero repetitions allowed.
    Optional,
    /// `+`: at least one.
    OneOrMore,
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
    /// The pattern could not be tokenized: no literal is trusted.
    broken: bool,
}

impl Parser {
    fn new(pattern: &str, ere: bool) -> Parser {
        let (toks, broken) = tokenize(pattern, ere);
        Parser {
            toks,
            pos: 0,
            broken,
        }
    }

    fn parse(mut self) -> Req {
        if self.broken {
            return Req::All;
        }
        let r = self.alt(0);
        if self.pos != self.toks.len() {
            // An unbalanced `)` or similar: trust nothing.
            return Req::All;
        }
        r
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn alt(&mut self, depth: usize) -> Req {
        let mut branches = vec![self.concat(depth)];
        while self.peek() == Some(&Tok::Alt) {
            self.pos += 1;
            branches.push(self.concat(depth));
        }
        if branches.len() == 1 {
            branches.pop().expect("one")
        } else {
            Req::Or(branches)
        }
    }

    fn concat(&mut self, depth: usize) -> Req {
        let mut items = Vec::new();
        let mut run = String::new();
        let flush = |run: &mut String, items: &mut Vec<Req>| {
            if !run.is_empty() {
                items.push(Req::Lit(std::mem::take(run)));
            }
        };
        loop {
            let atom = match self.peek() {
                None | Some(Tok::Alt) => break,
                Some(Tok::Close) if depth > 0 => break,
                Some(Tok::Close) => {
                    self.pos += 1;
                    Atom::Other // unmatched: a literal `)` or grep's error; claims nothing
                }
                Some(Tok::Char(c)) => {
                    let c = *c;
                    self.pos += 1;
                    Atom::Char(c)
                }
                Some(Tok::Open) => {
                    self.pos += 1;
                    let inner = self.alt(depth + 1);
                    if self.peek() != Some(&Tok::Close) {
                        self.pos = self.toks.len() + 1; // reject
                        return Req::All;
                    }
                    self.pos += 1;
                    Atom::Group(inner)
                }
                Some(Tok::Other) => {
                    self.pos += 1;
                    Atom::Other
                }
                // A quantifier with nothing before it: whatever it means
                // (GNU makes it literal in places), it adds no literal.
                Some(Tok::Optional | Tok::OneOrMore) => {
                    self.pos += 1;
                    Atom::Other
                }
            };
            // Quantifiers after the atom (possibly several).
            let mut optional = false;
            let mut repeated = false;
            while let Some(q) = self.peek() {
                match q {
                    Tok::Optional => optional = true,
                    Tok::OneOrMore => repeated = true,
                    _ => break,
                }
                self.pos += 1;
            }
            match atom {
                Atom::Char(c) if !optional => {
                    run.push(c);
                    if repeated {
                        flush(&mut run, &mut items);
                    }
                }
                Atom::Group(inner) if !optional => {
                    flush(&mut run, &mut items);
                    items.push(inner);
                }
                _ => flush(&mut run, &mut items),
            }
        }
        flush(&mut run, &mut items);
        Req::And(items)
    }
}

enum Atom {
    Char(char),
    Group(Req),
    Other,
}

/// Tokens of a pattern; `true` when it is malformed (an unterminated
/// bracket expression or a trailing backslash: grep reports those).
fn tokenize(p: &str, ere: bool) -> (Vec<Tok>, bool) {
    let chars: Vec<char> = p.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        let t = match c {
            '\\' => {
                let Some(&e) = chars.get(i) else {
                    return (toks, true);
                };
                i += 1;
                match e {
                    '(' if !ere => Tok::Open,
                    ')' if !ere => Tok::Close,
                    '|' if !ere => Tok::Alt,
                    '{' if !ere => {
                        if !skip_interval(&chars, &mut i, true) {
                            return (toks, true);
                        }
                        Tok::Optional
                    }
                    '?' if !ere => Tok::Optional,
                    '+' if !ere => Tok::OneOrMore,
                    // Escaped specials match themselves.
                    '.' | '*' | '[' | ']' | '\\' | '^' | '$' => Tok::Char(e),
                    '(' | ')' | '|' | '{' | '}' | '?' | '+' if ere => Tok::Char(e),
                    // \w \W \s \S \b \B \< \> \` \' , back-references, and
                    // anything else (GNU warns about stray backslashes).
                    _ => Tok::Other,
                }
            }
            '[' => {
                if !skip_bracket(&chars, &mut i) {
                    return (toks, true);
                }
                Tok::Other
            }
            '.' | '^' | '$' => Tok::Other,
            '*' => Tok::Optional,
            '(' if ere => Tok::Open,
            ')' if ere => Tok::Close,
            '|' if ere => Tok::Alt,
            '?' if ere => Tok::Optional,
            '+' if ere => Tok::OneOrMore,
            '{' if ere => {
                // An interval, or (GNU) a literal `{` when it is not one:
                // either way no literal is claimed.
                skip_interval(&chars, &mut i, false);
                Tok::Optional
            }
            c => Tok::Char(c),
        };
        toks.push(t);
    }
    (toks, false)
}

/// Skips a bracket expression whose `[` was just read; false if unterminated.
fn skip_bracket(chars: &[char], i: &mut usize) -> bool {
    if chars.get(*i) == Some(&'^') {
        *i += 1;
    }
    if chars.get(*i) == Some(&']') {
        *i += 1;
    }
    while let Some(&c) = chars.get(*i) {
        *i += 1;
        match c {
            ']' => return true,
            '[' if matches!(chars.get(*i), Some(':' | '.' | '=')) => {
                let kind = chars[*i];
                *i += 1;
                // Up to the matching `:]`, `.]` or `=]`.
                loop {
                    match chars.get(*i) {
                        None => return false,
                        Some(&x) if x == kind && chars.get(*i + 1) == Some(&']') => {
                            *i += 2;
                            break;
                        }
                        _ => *i += 1,
                    }
                }
            }
            _ => {}
        }
    }
    false
}

/// Skips an interval's `m,n}` (or `m,n\}` in BRE); false if there is no end.
fn skip_interval(chars: &[char], i: &mut usize, bre: bool) -> bool {
    let start = *i;
    while let Some(&c) = chars.get(*i) {
        *i += 1;
        if bre && c == '\\' && chars.get(*i) == Some(&'}') {
            *i += 1;
            return true;
        }
        if !bre && c == '}' {
            return true;
        }
        if !(c.is_ascii_digit() || c == ',') {
            break;
        }
    }
    *i = start;
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(s: &str) -> Req {
        Req::Lit(s.into())
    }
    fn bre(p: &str) -> Req {
        required(&[p.to_string()], Syntax::Basic)
    }
    fn ere(p: &str) -> Req {
        required(&[p.to_string()], Syntax::Extended)
    }

    #[test]
    fn plain_words_are_literals() {
        assert_eq!(bre("hello"), lit("hello"));
        assert_eq!(ere("hello world"), lit("hello world"));
        assert_eq!(required(&["a.b*c".into()], Syntax::Fixed), lit("a.b*c"));
        assert_eq!(bre(""), Req::All);
    }

    #[test]
    fn metacharacters_break_runs() {
        assert_eq!(bre("foo.bar"), Req::And(vec![lit("foo"), lit("bar")]));
        assert_eq!(bre("^foo$"), lit("foo"));
        assert_eq!(bre("fo[a-z]bar"), Req::And(vec![lit("fo"), lit("bar")]));
        assert_eq!(bre("foo\\wbar"), Req::And(vec![lit("foo"), lit("bar")]));
        assert_eq!(bre("\\<foo\\>"), lit("foo"));
        assert_eq!(bre("[]x]abc"), lit("abc"));
        assert_eq!(bre("[[:alpha:]]abc"), lit("abc"));
    }

    #[test]
    fn optional_atoms_are_dropped() {
        // `o*` may be absent: "hell" then "world" only.
        assert_eq!(
            bre("hello*world"),
            Req::And(vec![lit("hell"), lit("world")])
        );
        assert_eq!(ere("colou?r"), Req::And(vec![lit("colo"), lit("r")]));
        assert_eq!(bre("colou\\?r"), Req::And(vec![lit("colo"), lit("r")]));
        assert_eq!(ere("ab{0,2}cd"), Req::And(vec![lit("a"), lit("cd")]));
        assert_eq!(bre("ab\\{2\\}cd"), Req::And(vec![lit("a"), lit("cd")]));
        // `+` keeps one copy but ends the run.
        assert_eq!(ere("ab+cd"), Req::And(vec![lit("ab"), lit("cd")]));
        assert_eq!(bre("ab\\+cd"), Req::And(vec![lit("ab"), lit("cd")]));
    }

    #[test]
    fn bre_treats_ere_operators_as_literals() {
        assert_eq!(bre("a+b?c|d(e)"), lit("a+b?c|d(e)"));
        assert_eq!(bre("x{1}"), lit("x{1}"));
        // ... and ERE escapes them.
        assert_eq!(ere("a\\+b\\(c"), lit("a+b(c"));
        assert_eq!(bre("a\\.b\\*c"), lit("a.b*c"));
    }

    #[test]
    fn alternation_is_or() {
        assert_eq!(ere("foo|bar"), Req::Or(vec![lit("foo"), lit("bar")]));
        assert_eq!(bre("foo\\|bar"), Req::Or(vec![lit("foo"), lit("bar")]));
        // One branch without a literal makes the whole pattern unconstrained.
        assert_eq!(ere("foo|."), Req::All);
        assert_eq!(
            ere("x(foo|bar)y"),
            Req::And(vec![
                lit("x"),
                Req::Or(vec![lit("foo"), lit("bar")]),
                lit("y")
            ])
        );
        assert_eq!(bre("x\\(foo\\)*y"), Req::And(vec![lit("x"), lit("y")]));
        assert_eq!(bre("\\(ab\\)\\+c"), Req::And(vec![lit("ab"), lit("c")]));
        // Several patterns are alternatives.
        assert_eq!(
            required(&["abc\ndef".into()], Syntax::Fixed),
            Req::Or(vec![lit("abc"), lit("def")])
        );
        assert_eq!(
            required(&["abc".into(), "".into()], Syntax::Basic),
            Req::All
        );
    }

    #[test]
    fn malformed_patterns_constrain_nothing() {
        assert_eq!(bre("abc[def"), Req::All);
        assert_eq!(bre("abc\\"), Req::All);
        // An unmatched `)`: literal or an error grep reports; either way
        // both sides are required.
        assert_eq!(ere("abc)def"), Req::And(vec![lit("abc"), lit("def")]));
        assert_eq!(ere("(abc"), Req::All);
        assert_eq!(bre("\\(abc"), Req::All);
        // Back-references are opaque.
        assert_eq!(bre("\\(abc\\)\\1"), lit("abc"));
        assert_eq!(ere("*abc"), lit("abc"));
    }

    #[test]
    fn index_pieces() {
        assert_eq!(lit("ab").for_index(false), Req::All);
        assert_eq!(lit("abc").for_index(false), lit("abc"));
        assert_eq!(
            Req::And(vec![lit("hello"), lit("xy")]).for_index(false),
            lit("hello")
        );
        assert_eq!(
            Req::Or(vec![lit("hello"), lit("xy")]).for_index(false),
            Req::All
        );
        // -i: only ASCII without i/k/s; "Mississippi" has no piece left.
        assert_eq!(lit("Mississippi").for_index(true), Req::All);
        assert_eq!(lit("Hello World").for_index(true), lit("Hello World"));
        assert_eq!(
            lit("needle_in_haystack").for_index(true),
            Req::And(vec![lit("needle_"), lit("n_hay"), lit("tac")])
        );
        assert_eq!(
            lit("café au lait").for_index(true),
            Req::And(vec![lit("caf"), lit(" au la")])
        );
        // Case-sensitive: any characters.
        assert_eq!(lit("née").for_index(false), lit("née"));
    }
}
