//! An error with its causes, on one line: what a message that reaches a
//! user shows of a client library's failure ("error sending request: ...:
//! Connection refused"), for the Elasticsearch store and the object store
//! alike. A leaf: every layer may use it.

/// `e` and each of its sources that does not repeat what came before.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        if !msg.contains(&s) {
            msg.push_str(": ");
            msg.push_str(&s);
        }
        cur = c.source();
    }
    msg
}
