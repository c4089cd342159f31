//! Why a cluster cannot be used, in words a user acts on: the one place
//! where failures the user must fix — TLS trust (unknown CA, expired or
//! wrong-host certificate), http and https mixed up, and answers that
//! refuse this client (401, 403, a TLS terminator's 400 for plain HTTP) —
//! become one line naming the URL. Retrying cures none of them, so the
//! client reports them at once, at connect time or later.

use serde_json::Value;
use std::error::Error;
use std::path::PathBuf;

/// Who connects where: what a refusal's message names.
#[derive(Clone, Debug)]
pub(super) struct Who {
    /// The URL, without credentials.
    pub url: String,
    /// The basic-auth user, if any.
    pub user: Option<String>,
    /// An API key is sent (it wins over a user).
    pub api_key: bool,
    /// The CA file given with --es-ca.
    pub ca: Option<PathBuf>,
    /// The index name prefix: a 403 names the indices that need privileges.
    pub prefix: String,
}

impl Who {
    /// A transport failure retrying cannot cure, worded; None for the rest
    /// (refused connections, timeouts, resets), which the caller retries
    /// and reports as they are, or as [`Who::hint`] words them.
    pub(super) fn transport(&self, e: &(dyn Error + 'static)) -> Option<String> {
        use rustls::Error as Tls;
        let cause = match (find::<Tls>(e), find::<hyper::Error>(e)) {
            (Some(Tls::InvalidCertificate(c)), _) => self.certificate(c),
            // Its first bytes were no TLS record: plain HTTP answering.
            (Some(Tls::InvalidMessage(_)), _) if self.https() => self.not_tls(),
            // TLS bytes where an HTTP answer should start.
            (_, Some(h)) if !self.https() && h.is_parse() => self.speaks_tls(),
            _ => return None,
        };
        Some(format!("Elasticsearch at {}: {cause}", self.url))
    }

    /// What a transient-looking failure may really mean, worded (the
    /// caller still retries it: a server going down does the same).
    pub(super) fn hint(&self, e: &(dyn Error + 'static)) -> Option<String> {
        let closed = find::<hyper::Error>(e).is_some_and(|h| h.is_incomplete_message());
        // Elasticsearch closes a plain-HTTP connection to its TLS port
        // without a word.
        (closed && !self.https()).then(|| {
            format!(
                "the server closed the connection without answering: if it speaks TLS \
                 (Elasticsearch 8 and later do by default), use {}",
                self.with_scheme("https")
            )
        })
    }

    /// An answer that refuses this client, worded; None for the others.
    pub(super) fn answer(&self, status: u16, body: &Value) -> Option<String> {
        let cause = match status {
            401 => match (&self.user, self.api_key) {
                (_, true) => "the API key was refused: check ESFS_ES_API_KEY (the base64 \
                     \"id:key\" Elasticsearch gave; expired or invalidated keys are refused)"
                    .to_string(),
                (Some(u), _) => format!(
                    "authentication failed for user {u}: check the password in ESFS_ES_PASSWORD"
                ),
                (None, _) => "the server needs credentials: give --es-user USER with the \
                     password in ESFS_ES_PASSWORD, or an API key in ESFS_ES_API_KEY"
                    .to_string(),
            },
            403 => {
                let who = match (&self.user, self.api_key) {
                    (_, true) => "the API key".to_string(),
                    (Some(u), _) => format!("user {u}"),
                    (None, _) => "anonymous access".to_string(),
                };
                let reason = super::client::reason(body);
                let action = reason
                    .split_once("action [")
                    .and_then(|(_, r)| r.split_once(']'))
                    .map(|(a, _)| format!(" (to {a})"))
                    .unwrap_or_default();
                format!(
                    "permission denied for {who}{action}: it needs the cluster privilege \
                     monitor and the index privilege all on the indices {}-*",
                    self.prefix
                )
            }
            // nginx's answer to plain HTTP on its TLS port.
            400 if !self.https()
                && body
                    .as_str()
                    .is_some_and(|b| b.contains("plain HTTP request was sent to HTTPS port")) =>
            {
                self.speaks_tls()
            }
            _ => return None,
        };
        Some(format!("Elasticsearch at {}: {cause}", self.url))
    }

    fn https(&self) -> bool {
        self.url.starts_with("https:")
    }

    fn with_scheme(&self, scheme: &str) -> String {
        let rest = self.url.split_once("://").map_or("", |(_, r)| r);
        format!("{scheme}://{rest}")
    }

    fn host(&self) -> String {
        elasticsearch::http::Url::parse(&self.url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_string))
            .unwrap_or_default()
    }

    fn speaks_tls(&self) -> String {
        format!("the server speaks TLS: use {}", self.with_scheme("https"))
    }

    fn not_tls(&self) -> String {
        format!(
            "the server does not speak TLS: use {}",
            self.with_scheme("http")
        )
    }

    fn certificate(&self, c: &rustls::CertificateError) -> String {
        use rustls::CertificateError as C;
        match c {
            C::UnknownIssuer => match &self.ca {
                Some(ca) => format!(
                    "its certificate is not trusted: it is not signed by the CA in {}: \
                     give its CA with --es-ca",
                    ca.display()
                ),
                None => "its certificate is not trusted (signed by an unknown CA): \
                     give its CA with --es-ca FILE"
                    .to_string(),
            },
            C::Expired => "its certificate has expired: the server needs a new one".into(),
            C::ExpiredContext { time, not_after } => format!(
                "its certificate expired {} ago: the server needs a new one",
                span(time.as_secs().saturating_sub(not_after.as_secs()))
            ),
            C::NotValidYet | C::NotValidYetContext { .. } => {
                "its certificate is not valid yet: check the clocks of this machine and the server"
                    .into()
            }
            C::NotValidForName => format!(
                "its certificate is not valid for {}: use a host name it names",
                self.host()
            ),
            C::NotValidForNameContext { presented, .. } => format!(
                "its certificate is not valid for {} (only for {}): use a host name it names, \
                 or give the server a certificate for {}",
                self.host(),
                presented
                    .iter()
                    .map(|p| unquote(p))
                    .collect::<Vec<_>>()
                    .join(", "),
                self.host()
            ),
            other => format!("its certificate was refused: {other}"),
        }
    }
}

/// The first error of type `T` in `e`'s chain of causes (looking inside
/// io::Errors too, whose `source()` skips the error they wrap).
fn find<'a, T: Error + 'static>(e: &'a (dyn Error + 'static)) -> Option<&'a T> {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(t) = c.downcast_ref::<T>() {
            return Some(t);
        }
        cur = match c
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner),
            None => c.source(),
        };
    }
    None
}

/// `DnsName("example.org")` (how webpki lists a certificate's names) as
/// `example.org`.
fn unquote(s: &str) -> &str {
    s.split_once('"')
        .and_then(|(_, r)| r.rsplit_once('"'))
        .map_or(s, |(n, _)| n)
}

/// A past span in its largest whole unit.
fn span(secs: u64) -> String {
    match secs {
        s if s >= 2 * 86400 => format!("{} days", s / 86400),
        s if s >= 2 * 3600 => format!("{} hours", s / 3600),
        s => format!("{} minutes", s.div_ceil(60)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn who(user: Option<&str>, api_key: bool) -> Who {
        Who {
            url: "https://es.example:9200".into(),
            user: user.map(str::to_string),
            api_key,
            ca: None,
            prefix: "esfs".into(),
        }
    }

    #[test]
    fn a_403_names_the_user_the_action_and_the_privileges() {
        // As Elasticsearch 9 answers a user without index privileges.
        let body = json!({"error": {"type": "security_exception", "reason":
            "action [indices:admin/create] is unauthorized for user [u] with effective roles \
             [viewer] on indices [esfs-entries], this action is granted by the index privileges \
             [create_index,manage,all]"}, "status": 403});
        assert_eq!(
            who(Some("u"), false).answer(403, &body).unwrap(),
            "Elasticsearch at https://es.example:9200: permission denied for user u \
             (to indices:admin/create): it needs the cluster privilege monitor and the index \
             privilege all on the indices esfs-*"
        );
        let msg = who(None, true).answer(403, &json!(null)).unwrap();
        assert!(
            msg.contains("permission denied for the API key: it needs"),
            "{msg}"
        );
    }

    #[test]
    fn names_spans_and_other_answers() {
        assert_eq!(
            unquote("DnsName(\"elsewhere.example\")"),
            "elsewhere.example"
        );
        assert_eq!(unquote("10.0.0.1"), "10.0.0.1");
        assert_eq!(span(3 * 86400 + 5), "3 days");
        assert_eq!(span(5 * 3600), "5 hours");
        assert_eq!(span(61), "2 minutes");
        assert_eq!(who(None, false).answer(400, &json!("bad")), None);
        assert_eq!(who(None, false).answer(404, &json!(null)), None);
        let msg = who(None, false).answer(401, &json!(null)).unwrap();
        assert!(msg.contains("needs credentials: give --es-user"), "{msg}");
    }
}
