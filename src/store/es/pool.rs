//! The cluster's nodes as the client sees them: requests spread round-robin
//! over the URLs given (`--es URL1,URL2,...`), and a node that failed at the
//! transport level (refused, reset, timed out) is skipped for a cool-down,
//! so a dead node costs one failed attempt, not one per request.
//!
//! The `elasticsearch` crate's own `MultiNodeConnectionPool` round-robins but
//! never skips a dead node (and its sniffing panics when a node is down), so
//! this is its `ConnectionPool` trait with health added. Which node a request
//! went to is known to the thread that sent it: `EsStore::once` drives its
//! request on the calling thread (`block_on`), where `next` recorded it.

use elasticsearch::http::Url;
use elasticsearch::http::transport::{Connection, ConnectionPool};
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a node that failed is skipped. Long enough that a dead node is
/// not retried by every request; short enough that one back from a restart
/// takes its share again within seconds.
const COOL_DOWN: Duration = Duration::from_secs(5);

thread_local! {
    /// The node this thread's last request was sent to.
    static LAST: Cell<Option<usize>> = const { Cell::new(None) };
}

#[derive(Debug)]
struct Nodes {
    conns: Vec<Connection>,
    /// Per node: skipped until this many ms after `epoch` (0: it answered
    /// its last request; a past time: it failed, and may be tried again).
    dead_until: Vec<AtomicU64>,
    next: AtomicUsize,
    epoch: Instant,
}

/// Shared by every client of one store, so all callers agree on which node is down.
#[derive(Debug, Clone)]
pub(super) struct NodePool {
    nodes: Arc<Nodes>,
}

impl NodePool {
    pub(super) fn new(urls: &[Url]) -> NodePool {
        assert!(!urls.is_empty(), "a node pool needs a URL");
        NodePool {
            nodes: Arc::new(Nodes {
                conns: urls.iter().cloned().map(Connection::new).collect(),
                dead_until: urls.iter().map(|_| AtomicU64::new(0)).collect(),
                next: AtomicUsize::new(0),
                epoch: Instant::now(),
            }),
        }
    }

    fn now_ms(&self) -> u64 {
        self.nodes.epoch.elapsed().as_millis() as u64
    }

    /// The node chosen for the next request: the next live one in turn, or,
    /// when every node is cooling down, the one whose cool-down ends first
    /// (a request must go somewhere; the retry loop bounds how long).
    fn choose(&self) -> usize {
        let n = self.nodes.conns.len();
        let start = self.nodes.next.fetch_add(1, Ordering::Relaxed);
        let now = self.now_ms();
        (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| self.nodes.dead_until[i].load(Ordering::Relaxed) <= now)
            .unwrap_or_else(|| {
                (0..n)
                    .min_by_key(|&i| self.nodes.dead_until[i].load(Ordering::Relaxed))
                    .unwrap_or(0)
            })
    }

    /// The request this thread just sent failed at the transport level:
    /// skip its node for a while. Returns the node's URL when it was healthy
    /// until now (for one log line per outage, not one per request).
    pub(super) fn failed_here(&self) -> Option<Arc<Url>> {
        let i = LAST.with(|l| l.get())?;
        let until = self.now_ms() + COOL_DOWN.as_millis() as u64;
        // 0 means it answered since its last failure: a new outage
        let was = self.nodes.dead_until[i].swap(until.max(1), Ordering::Relaxed);
        (was == 0 && self.nodes.conns.len() > 1).then(|| self.nodes.conns[i].url())
    }

    /// The request this thread just sent was answered: its node is healthy.
    pub(super) fn answered_here(&self) {
        if let Some(i) = LAST.with(|l| l.get()) {
            self.nodes.dead_until[i].store(0, Ordering::Relaxed);
        }
    }
}

impl ConnectionPool for NodePool {
    fn next(&self) -> Connection {
        let i = self.choose();
        LAST.with(|l| l.set(Some(i)));
        self.nodes.conns[i].clone()
    }
}

/// `--es` as given: one URL or several separated by commas (every node of
/// one cluster, tried in turn).
pub(super) fn split_urls(spec: &str) -> Vec<&str> {
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> NodePool {
        let urls: Vec<Url> = (0..n)
            .map(|i| Url::parse(&format!("http://127.0.0.1:{}", 9200 + i)).unwrap())
            .collect();
        NodePool::new(&urls)
    }

    fn port(c: &Connection) -> u16 {
        c.url().port().unwrap()
    }

    #[test]
    fn requests_go_round_robin() {
        let p = pool(3);
        let ports: Vec<u16> = (0..6).map(|_| port(&p.next())).collect();
        assert_eq!(ports, [9200, 9201, 9202, 9200, 9201, 9202]);
    }

    #[test]
    fn a_failed_node_is_skipped_until_it_answers_again() {
        let p = pool(3);
        assert_eq!(port(&p.next()), 9200);
        assert_eq!(
            p.failed_here().map(|u| u.port().unwrap()),
            Some(9200),
            "the first failure of a healthy node is reported"
        );
        assert_eq!(p.failed_here(), None, "a second one is not");
        p.nodes.dead_until[0].store(1, Ordering::Relaxed); // its cool-down over
        LAST.with(|l| l.set(Some(0)));
        assert_eq!(p.failed_here(), None, "nor one after the cool-down");
        let ports: Vec<u16> = (0..4).map(|_| port(&p.next())).collect();
        assert!(
            !ports.contains(&9200),
            "skipped while cooling down: {ports:?}"
        );
        // a request that reaches it again (the cool-down over) marks it healthy
        LAST.with(|l| l.set(Some(0)));
        p.answered_here();
        let ports: Vec<u16> = (0..3).map(|_| port(&p.next())).collect();
        assert!(ports.contains(&9200), "back in turn: {ports:?}");
    }

    #[test]
    fn with_every_node_down_the_one_down_longest_is_tried() {
        let p = pool(2);
        assert_eq!(port(&p.next()), 9200);
        p.failed_here();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(port(&p.next()), 9201);
        p.failed_here();
        assert_eq!(port(&p.next()), 9200);
        assert_eq!(port(&p.next()), 9200);
    }

    #[test]
    fn urls_split_on_commas() {
        assert_eq!(
            split_urls("http://a:1, http://b:2,"),
            ["http://a:1", "http://b:2"]
        );
        assert_eq!(split_urls("http://a:1"), ["http://a:1"]);
    }
}
