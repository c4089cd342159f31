//! `--name GLOB`: fnmatch(3) without flags, as `find -name` uses it
//! (`*`, `?`, `[...]`, `[!...]`/`[^...]` with ranges, `\` escapes; a
//! leading dot is not special), on name bytes.

/// Whether `name` matches `pat`.
pub(crate) fn matches(pat: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    // Backtracking point of the last `*`: (pattern after it, name position).
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pat.len() {
            match pat[p] {
                b'*' => {
                    star = Some((p + 1, n));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    n += 1;
                    continue;
                }
                b'[' => match bracket(pat, p, name[n]) {
                    Some((true, next)) => {
                        p = next;
                        n += 1;
                        continue;
                    }
                    // An unterminated `[` matches itself.
                    None if name[n] == b'[' => {
                        p += 1;
                        n += 1;
                        continue;
                    }
                    _ => {}
                },
                b'\\' if p + 1 < pat.len() && pat[p + 1] == name[n] => {
                    p += 2;
                    n += 1;
                    continue;
                }
                b'\\' if p + 1 < pat.len() => {}
                c if c == name[n] => {
                    p += 1;
                    n += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, sn)) => {
                p = sp;
                n = sn + 1;
                star = Some((sp, sn + 1));
            }
            None => return false,
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

/// Matches byte `c` against the bracket expression at `pat[p] == '['`:
/// (matched, index after it), or None when it is unterminated.
fn bracket(pat: &[u8], p: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = p + 1;
    let negate = matches!(pat.get(i), Some(b'!' | b'^'));
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let &x = pat.get(i)?;
        if x == b']' && !first {
            return Some((matched != negate, i + 1));
        }
        first = false;
        let lo = if x == b'\\' {
            i += 1;
            *pat.get(i)?
        } else {
            x
        };
        i += 1;
        if pat.get(i) == Some(&b'-') && pat.get(i + 1).is_some_and(|&h| h != b']') {
            let hi = pat[i + 1];
            i += 2;
            if lo <= c && c <= hi {
                matched = true;
            }
        } else if lo == c {
            matched = true;
        }
    }
}

/// The literal start of a glob (up to its first special character).
pub(crate) fn literal_prefix(pat: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < pat.len() {
        match pat[i] {
            b'*' | b'?' | b'[' => break,
            b'\\' if i + 1 < pat.len() => {
                out.push(pat[i + 1]);
                i += 2;
            }
            b'\\' => break,
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Whether the glob has no special characters (it is one exact name).
pub(crate) fn is_literal(pat: &[u8]) -> bool {
    !pat.iter().any(|c| matches!(c, b'*' | b'?' | b'[' | b'\\'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        let m = |p: &str, n: &str| matches(p.as_bytes(), n.as_bytes());
        assert!(m("*.rs", "main.rs"));
        assert!(m("*.rs", ".rs"));
        assert!(!m("*.rs", "main.rsx"));
        assert!(m("a?c", "abc"));
        assert!(!m("a?c", "ac"));
        assert!(m("*", ""));
        assert!(m("[ab]*", "banana"));
        assert!(!m("[!ab]*", "banana"));
        assert!(m("[a-c]x", "bx"));
        assert!(m("[]]", "]"));
        assert!(m("\\*", "*"));
        assert!(!m("\\*", "x"));
        assert!(m("*a*b*c*", "xxaxxbxxcxx"));
        assert!(!m("*a*b*c*", "xxaxxcxxbxx"));
        assert!(m("[", "["));
        assert_eq!(literal_prefix(b"foo*.rs"), b"foo");
        assert!(is_literal(b"Makefile"));
        assert!(!is_literal(b"*.c"));
    }
}
