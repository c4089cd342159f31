//! Elasticsearch's `*`/`?` patterns (index names, field names, `_source`
//! filters, `wildcard` queries): one matcher for all.

/// `*` and `?` glob matching over bytes (`\` escapes).
pub(crate) fn wildcard_match(p: &[u8], s: &[u8], ci: bool) -> bool {
    let eq = |a: u8, b: u8| {
        if ci {
            a.eq_ignore_ascii_case(&b)
        } else {
            a == b
        }
    };
    let (mut pi, mut si) = (0usize, 0usize);
    let (mut star, mut mark) = (None::<usize>, 0usize);
    while si < s.len() {
        if pi < p.len() && p[pi] == b'\\' && pi + 1 < p.len() && eq(p[pi + 1], s[si]) {
            pi += 2;
            si += 1;
        } else if pi < p.len() && p[pi] == b'?' {
            // `?` matches one character: skip a whole UTF-8 sequence.
            pi += 1;
            si += 1;
            while si < s.len() && (s[si] & 0xC0) == 0x80 {
                si += 1;
            }
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            pi += 1;
            mark = si;
        } else if pi < p.len() && p[pi] != b'\\' && eq(p[pi], s[si]) {
            pi += 1;
            si += 1;
        } else if let Some(st) = star {
            pi = st + 1;
            mark += 1;
            si = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}
