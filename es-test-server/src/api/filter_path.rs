//! The `filter_path` response filter.

use serde_json::{Map, Value, json};

fn fp_glob(p: &str, k: &str) -> bool {
    crate::wildcard::wildcard_match(p.as_bytes(), k.as_bytes(), false)
}

fn fp_include(v: &Value, pats: &[Vec<String>]) -> Option<Value> {
    match v {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, x) in m {
                let mut full = false;
                let mut next: Vec<Vec<String>> = Vec::new();
                for p in pats {
                    if p.is_empty() {
                        continue;
                    }
                    if p[0] == "**" {
                        next.push(p.clone());
                        if p.len() == 1 {
                            full = true;
                        } else if fp_glob(&p[1], k) {
                            if p.len() == 2 {
                                full = true;
                            } else {
                                next.push(p[2..].to_vec());
                            }
                        }
                    } else if fp_glob(&p[0], k) {
                        if p.len() == 1 {
                            full = true;
                        } else {
                            next.push(p[1..].to_vec());
                        }
                    }
                }
                if full {
                    out.insert(k.clone(), x.clone());
                } else if !next.is_empty()
                    && let Some(f) = fp_include(x, &next)
                {
                    out.insert(k.clone(), f);
                }
            }
            (!out.is_empty()).then_some(Value::Object(out))
        }
        Value::Array(a) => {
            let items: Vec<Value> = a.iter().filter_map(|x| fp_include(x, pats)).collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        _ => None,
    }
}

fn fp_exclude(v: &mut Value, pat: &[String]) {
    match v {
        Value::Object(m) => {
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                if fp_glob(&pat[0], &k) {
                    if pat.len() == 1 {
                        m.remove(&k);
                    } else if let Some(x) = m.get_mut(&k) {
                        fp_exclude(x, &pat[1..]);
                    }
                }
            }
        }
        Value::Array(a) => {
            for x in a {
                fp_exclude(x, pat);
            }
        }
        _ => {}
    }
}

pub(crate) fn filter_path(v: Value, spec: &str) -> Value {
    let mut inc = Vec::new();
    let mut exc = Vec::new();
    for p in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match p.strip_prefix('-') {
            Some(e) => exc.push(e.split('.').map(str::to_string).collect::<Vec<_>>()),
            None => inc.push(p.split('.').map(str::to_string).collect::<Vec<_>>()),
        }
    }
    let mut v = if inc.is_empty() {
        v
    } else {
        fp_include(&v, &inc).unwrap_or_else(|| json!({}))
    };
    for e in &exc {
        fp_exclude(&mut v, e);
    }
    v
}
