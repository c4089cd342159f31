//! `es-test-server`: a stateful test double that speaks the subset of the Elasticsearch REST
//! API that esfs uses, with Elasticsearch's status codes and response bodies.
//!
//! **It is not Elasticsearch.** It was written from the official Elasticsearch documentation
//! to stand in for a server in tests and benchmarks on machines where none can be installed.
//! See README.md for what it implements and what it deliberately does not.
//!
//! ```no_run
//! let mut server = es_test_server::EsTestServer::start("127.0.0.1:0").unwrap();
//! println!("{}", server.url());
//! server.fail_next(2, 429);           // the next two requests get a real-looking 429
//! server.stop();                      // connection refused from now on, state kept
//! server.restart().unwrap();          // same port, same documents
//! ```

// Errors carry Elasticsearch's whole error object; their size does not matter here.
#![allow(clippy::result_large_err)]
// `pub` marks the API a test uses (`EsTestServer` and what it returns);
// everything else is `pub(crate)` or narrower.
#![warn(unreachable_pub)]
// No function over 120 lines (clippy.toml) outside the integration tests.
#![warn(clippy::too_many_lines)]

mod aggs;
mod analysis;
mod api;
mod error;
mod hits;
mod mapping;
mod query;
mod search;
mod settings;
mod sort;
mod store;
mod target;
mod time;
mod wildcard;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::api::{Body, Outcome, Req, Resp};
use crate::error::EsError;

/// The Elasticsearch version this server reports in `GET /`.
pub const VERSION: &str = "9.1.0";
/// `index.version.created` reported in index settings.
pub(crate) const INDEX_VERSION_CREATED: &str = "9033000";
pub(crate) const NODE_ID: &str = "es-test-server-node";
/// Request bodies larger than this get 413, like `http.max_content_length`.
pub const MAX_CONTENT_LENGTH: usize = 100 * 1024 * 1024;

struct Injection {
    remaining: usize,
    status: u16,
}

pub(crate) struct Shared {
    pub(crate) state: Mutex<store::Cluster>,
    inject: Mutex<Injection>,
    /// Writes still to be applied with their answer lost (the connection
    /// closed instead), as when a node dies after applying a request.
    lose_answers: std::sync::atomic::AtomicUsize,
    replay_bulks: std::sync::atomic::AtomicUsize,
    /// Conditional bulk items still to be overtaken, and the `X-Opaque-Id`
    /// of the requests whose items are (see [`EsTestServer::overtake_next_items`]).
    overtake_items: std::sync::atomic::AtomicUsize,
    overtake_of: Mutex<(String, Option<String>)>,
    latency: Mutex<Duration>,
    requests: AtomicU64,
    /// Non-admin requests in arrival order, while `journaling` (see
    /// [`EsTestServer::take_journal`]; off by default: it grows).
    journal: Mutex<Vec<Logged>>,
    journaling: std::sync::atomic::AtomicBool,
    listener: Mutex<Option<Listening>>,
    addr: Mutex<SocketAddr>,
}

/// One request as the double received it.
#[derive(Clone, Debug, PartialEq)]
pub struct Logged {
    pub method: String,
    /// The path, percent-decoded, without the query string.
    pub path: String,
    /// The `X-Opaque-Id` header (Elasticsearch echoes it in its task list
    /// and slow logs; clients name the caller with it), if sent.
    pub opaque_id: Option<String>,
}

struct Listening {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// A running test double. Dropping it stops the server and its runtime.
pub struct EsTestServer {
    shared: Arc<Shared>,
    rt: Option<Runtime>,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

impl EsTestServer {
    /// Binds `addr` (e.g. `"127.0.0.1:0"` for a free port) and serves on background threads.
    pub fn start(addr: &str) -> io::Result<EsTestServer> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(8)
            .thread_name("es-test-server")
            .enable_all()
            .build()?;
        let std_listener = std::net::TcpListener::bind(addr)?;
        let local = std_listener.local_addr()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(store::Cluster::default()),
            lose_answers: std::sync::atomic::AtomicUsize::new(0),
            replay_bulks: std::sync::atomic::AtomicUsize::new(0),
            overtake_items: std::sync::atomic::AtomicUsize::new(0),
            overtake_of: Mutex::new((String::new(), None)),
            inject: Mutex::new(Injection {
                remaining: 0,
                status: 503,
            }),
            latency: Mutex::new(Duration::ZERO),
            requests: AtomicU64::new(0),
            journal: Mutex::new(Vec::new()),
            journaling: std::sync::atomic::AtomicBool::new(false),
            listener: Mutex::new(None),
            addr: Mutex::new(local),
        });
        {
            let _g = rt.enter();
            start_listening(&shared, std_listener)?;
        }
        let ticker = rt.spawn(ticker(Arc::downgrade(&shared)));
        Ok(EsTestServer {
            shared,
            rt: Some(rt),
            ticker: Some(ticker),
        })
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    pub fn addr(&self) -> SocketAddr {
        *self.shared.addr.lock()
    }

    /// Stops listening and closes every open connection. The documents are kept.
    pub fn stop(&mut self) {
        if let Some(rt) = &self.rt {
            block_on(rt, stop_listening(&self.shared));
        }
    }

    /// Listens again on the same address, with the same state.
    pub fn restart(&mut self) -> io::Result<()> {
        let rt = self.rt.as_ref().expect("runtime");
        block_on(rt, stop_listening(&self.shared));
        let addr = self.addr();
        let l = bind_retry(addr)?;
        let _g = rt.enter();
        start_listening(&self.shared, l)
    }

    /// The next `n` requests (admin `/_test/...` requests excepted) get `status` with an
    /// Elasticsearch-shaped error body (429: `es_rejected_execution_exception`,
    /// 503: `cluster_block_exception`, ...).
    pub fn fail_next(&self, n: usize, status: u16) {
        *self.shared.inject.lock() = Injection {
            remaining: n,
            status,
        };
    }

    /// The next `n` writes (POST, PUT and DELETE requests, admin ones
    /// excepted) are applied, then their connection is closed without an
    /// answer: what a client sees when the node dies right after applying.
    pub fn lose_next_answers(&self, n: usize) {
        self.shared.lose_answers.store(n, Ordering::Relaxed);
    }

    /// The next `n` `_bulk` requests run every item twice and answer the second run: what
    /// Elasticsearch answers when a primary dies after replicating a bulk and the
    /// coordinating node retries it on the promoted replica (a create answered 409, in a
    /// clean 200, for the document it just made).
    pub fn replay_next_bulks(&self, n: usize) {
        self.shared.replay_bulks.store(n, Ordering::Relaxed);
    }

    /// The next `n` conditional `_bulk` items (`if_seq_no`) on a document of `index` that
    /// exists, in bulks of at least two conditional items (batches: a paged rewrite, a
    /// background indexer's claims) whose `X-Opaque-Id` is `of` (any request: None), are
    /// overtaken: the document is written again as it stands just before the item runs,
    /// so the item meets a version conflict, as when another writer (another mount, a
    /// background indexer) wrote it between the client's read and its write.
    pub fn overtake_next_items(&self, n: usize, index: &str, of: Option<&str>) {
        *self.shared.overtake_of.lock() = (index.to_string(), of.map(String::from));
        self.shared.overtake_items.store(n, Ordering::Relaxed);
    }

    /// Overtakes asked for by [`Self::overtake_next_items`] and not yet made.
    pub fn overtakes_pending(&self) -> usize {
        self.shared.overtake_items.load(Ordering::Relaxed)
    }

    /// Replays asked for by [`Self::replay_next_bulks`] and not yet made.
    pub fn replays_pending(&self) -> usize {
        self.shared.replay_bulks.load(Ordering::Relaxed)
    }

    /// Delays every response by `d` (admin requests excepted).
    pub fn set_latency(&self, d: Duration) {
        *self.shared.latency.lock() = d;
    }

    /// Requests received so far (admin requests included).
    pub fn request_count(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Start (or stop) recording requests for [`EsTestServer::take_journal`].
    pub fn set_journaling(&self, on: bool) {
        self.shared.journaling.store(on, Ordering::Relaxed);
    }

    /// The requests received (admin requests excepted) since the last
    /// `take_journal`, while journaling, oldest first; the journal is emptied.
    pub fn take_journal(&self) -> Vec<Logged> {
        std::mem::take(&mut *self.shared.journal.lock())
    }

    /// Makes every acknowledged write of every index visible to search now.
    pub fn refresh_all(&self) {
        let mut st = self.shared.state.lock();
        for ix in st.indices.values_mut() {
            ix.refresh();
        }
    }

    /// Deletes every index and point in time.
    pub fn wipe(&self) {
        let mut st = self.shared.state.lock();
        st.indices.clear();
        st.pits.clear();
    }
}

impl Drop for EsTestServer {
    fn drop(&mut self) {
        self.stop();
        if let Some(t) = self.ticker.take() {
            t.abort();
        }
        if let Some(rt) = self.rt.take() {
            // A runtime cannot be dropped from async code: do it on a plain thread.
            let _ = std::thread::spawn(move || rt.shutdown_timeout(Duration::from_secs(1))).join();
        }
    }
}

/// Runs `f` to completion on the server's runtime, from any thread (including a caller's
/// own tokio runtime, where `Runtime::block_on` would panic).
fn block_on<F: std::future::Future + Send>(rt: &Runtime, f: F) -> F::Output
where
    F::Output: Send,
{
    if tokio::runtime::Handle::try_current().is_ok() {
        let h = rt.handle().clone();
        std::thread::scope(|s| {
            s.spawn(move || h.block_on(f))
                .join()
                .expect("block_on thread")
        })
    } else {
        rt.block_on(f)
    }
}

fn bind_retry(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match std::net::TcpListener::bind(addr) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Must be called inside the runtime context.
fn start_listening(shared: &Arc<Shared>, l: std::net::TcpListener) -> io::Result<()> {
    l.set_nonblocking(true)?;
    let listener = TcpListener::from_std(l)?;
    let (tx, rx) = watch::channel(false);
    let task = tokio::spawn(accept_loop(shared.clone(), listener, rx));
    *shared.listener.lock() = Some(Listening { stop: tx, task });
    Ok(())
}

async fn stop_listening(shared: &Arc<Shared>) {
    let l = shared.listener.lock().take();
    if let Some(l) = l {
        let _ = l.stop.send(true);
        let _ = l.task.await;
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let sh = shared.clone();
                    conns.spawn(async move {
                        let svc = service_fn(move |req: Request<Incoming>| {
                            let sh = sh.clone();
                            async move {
                                let write = matches!(req.method().as_str(), "POST" | "PUT" | "DELETE")
                                    && !req.uri().path().starts_with("/_test/");
                                let resp = handle(sh.clone(), req).await;
                                let lose = write
                                    && sh
                                        .lose_answers
                                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                                        .is_ok();
                                // an error from the service closes the connection unanswered
                                if lose { Err("answer lost (lose_next_answers)") } else { Ok(resp) }
                            }
                        });
                        let _ = http1::Builder::new().keep_alive(true).serve_connection(TokioIo::new(stream), svc).await;
                    });
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    conns.shutdown().await;
}

/// Periodic refreshes, PIT expiry.
async fn ticker(shared: std::sync::Weak<Shared>) {
    let mut iv = tokio::time::interval(Duration::from_millis(50));
    loop {
        iv.tick().await;
        let Some(sh) = shared.upgrade() else { return };
        let now = Instant::now();
        let mut st = sh.state.lock();
        for ix in st.indices.values_mut() {
            ix.tick(now);
        }
        st.pits.retain(|_, p| p.expires > now);
    }
}

fn response(status: u16, body: Bytes, head: bool) -> Response<Full<Bytes>> {
    let mut b = Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("X-elastic-product", "Elasticsearch");
    if !body.is_empty() || !head {
        b = b.header("content-type", "application/json");
    }
    b.body(Full::new(if head { Bytes::new() } else { body }))
        .expect("response")
}

fn render(
    resp: Resp,
    params: &std::collections::HashMap<String, String>,
    head: bool,
) -> Response<Full<Bytes>> {
    let pretty = params
        .get("pretty")
        .is_some_and(|v| v.is_empty() || v == "true");
    let fp = params.get("filter_path");
    let text = match resp.body {
        Body::Empty => String::new(),
        Body::Json(v) => {
            let v = match fp {
                Some(f) => api::filter_path(v, f),
                None => v,
            };
            if pretty {
                serde_json::to_string_pretty(&v).unwrap_or_default()
            } else {
                v.to_string()
            }
        }
        Body::Text(t) => {
            if fp.is_some() || pretty {
                let v: Value = serde_json::from_str(&t).unwrap_or(Value::Null);
                let v = match fp {
                    Some(f) => api::filter_path(v, f),
                    None => v,
                };
                if pretty {
                    serde_json::to_string_pretty(&v).unwrap_or_default()
                } else {
                    v.to_string()
                }
            } else {
                t
            }
        }
    };
    response(resp.status, Bytes::from(text), head)
}

fn error_resp(e: EsError) -> Resp {
    Resp::json(e.status, e.to_body())
}

fn decode_query(q: &str) -> std::collections::HashMap<String, String> {
    let mut out = std::collections::HashMap::new();
    for part in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        let dec = |s: &str| {
            let s = s.replace('+', " ");
            percent_encoding::percent_decode_str(&s)
                .decode_utf8_lossy()
                .into_owned()
        };
        out.insert(dec(k), dec(v));
    }
    out
}

async fn handle(sh: Arc<Shared>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    sh.requests.fetch_add(1, Ordering::Relaxed);
    let method = req.method().as_str().to_string();
    let head = method == "HEAD";
    let path = req.uri().path().to_string();
    let params = decode_query(req.uri().query().unwrap_or(""));
    let opaque_id = req
        .headers()
        .get("x-opaque-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from);

    if let Some(rest) = path.strip_prefix("/_test/") {
        let r = admin(&sh, &method, rest, &params);
        return render(r, &params, head);
    }
    if sh.journaling.load(Ordering::Relaxed) {
        log_request(&sh, &method, &path, &req);
    }
    if let Some(r) = faults(&sh).await {
        return render(r, &params, head);
    }
    let body = match read_body(req).await {
        Ok(b) => b,
        Err(Refusal::TooLarge) => return too_large(),
        Err(Refusal::Answer(r)) => return render(r, &params, head),
    };
    let segs = match decode_segments(&path) {
        Ok(s) => s,
        Err(r) => return render(r, &params, head),
    };
    let api_req = Req {
        method,
        path,
        segs,
        params: params.clone(),
        body,
        opaque_id,
    };
    render(call_api(&sh, api_req).await, &params, head)
}

/// The journal's record of a request.
fn log_request(sh: &Shared, method: &str, path: &str, req: &Request<Incoming>) {
    sh.journal.lock().push(Logged {
        method: method.to_string(),
        path: percent_encoding::percent_decode_str(path)
            .decode_utf8_lossy()
            .into_owned(),
        opaque_id: req
            .headers()
            .get("x-opaque-id")
            .and_then(|v| v.to_str().ok())
            .map(String::from),
    });
}

/// The faults a test asked for: the added latency, then an injected error
/// (the answer, if one is due).
async fn faults(sh: &Shared) -> Option<Resp> {
    let latency = *sh.latency.lock();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let mut inj = sh.inject.lock();
    if inj.remaining > 0 {
        inj.remaining -= 1;
        return Some(error_resp(error::injected(inj.status)));
    }
    None
}

/// Why a request is answered before the API sees it.
enum Refusal {
    /// Its body is over the size limit: 413, and the connection closes.
    TooLarge,
    Answer(Resp),
}

fn too_large() -> Response<Full<Bytes>> {
    let mut r = response(413, Bytes::new(), true);
    r.headers_mut().insert(
        "connection",
        hyper::header::HeaderValue::from_static("close"),
    );
    r
}

/// The request's body, within the size limit, of a type the API reads.
async fn read_body(req: Request<Incoming>) -> Result<Bytes, Refusal> {
    let header = |name| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let too_big = header(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|n| n > MAX_CONTENT_LENGTH);
    if too_big {
        return Err(Refusal::TooLarge);
    }
    let content_type = header(hyper::header::CONTENT_TYPE);
    let encoding = header(hyper::header::CONTENT_ENCODING);
    let body = match Limited::new(req.into_body(), MAX_CONTENT_LENGTH)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                return Err(Refusal::TooLarge);
            }
            return Err(Refusal::Answer(error_resp(EsError::bad_request(
                "failed to read the request body",
            ))));
        }
    };
    if !body.is_empty() {
        check_body_type(encoding, content_type.as_deref()).map_err(Refusal::Answer)?;
    }
    Ok(body)
}

/// A body must be plain (no Content-Encoding) JSON or NDJSON.
fn check_body_type(encoding: Option<String>, content_type: Option<&str>) -> Result<(), Resp> {
    if let Some(enc) = encoding.filter(|e| e != "identity") {
        return Err(error_resp(EsError::unsupported(&format!(
            "Content-Encoding [{enc}] request bodies"
        ))));
    }
    let Some(ct) = content_type else {
        return Err(Resp::json(
            406,
            json!({"error": "Content-Type header is missing", "status": 406}),
        ));
    };
    let base = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let ok = matches!(
        base.as_str(),
        "application/json"
            | "application/x-ndjson"
            | "application/vnd.elasticsearch+json"
            | "application/vnd.elasticsearch+x-ndjson"
    );
    if !ok {
        return Err(Resp::json(
            406,
            json!({"error": format!("Content-Type header [{ct}] is not supported"), "status": 406}),
        ));
    }
    Ok(())
}

/// The path's segments, percent-decoded.
fn decode_segments(path: &str) -> Result<Vec<String>, Resp> {
    let mut segs = Vec::new();
    for s in path.split('/').filter(|s| !s.is_empty()) {
        match percent_encoding::percent_decode_str(s).decode_utf8() {
            Ok(d) => segs.push(d.into_owned()),
            Err(_) => {
                return Err(error_resp(EsError::bad_request(format!(
                    "unable to decode [{s}] as UTF-8"
                ))));
            }
        }
    }
    Ok(segs)
}

/// The API's answer (on a blocking thread), once any delay or wait it
/// asks for is over.
async fn call_api(sh: &Arc<Shared>, api_req: Req) -> Resp {
    let sh2 = sh.clone();
    let outcome = tokio::task::spawn_blocking(move || api::dispatch(&sh2, &api_req)).await;
    let outcome = match outcome {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => Outcome::Done(error_resp(e)),
        Err(_) => Outcome::Done(error_resp(EsError::new(
            500,
            "exception",
            "es-test-server: handler panicked",
        ))),
    };
    match outcome {
        Outcome::Done(r) => r,
        Outcome::Delay(d, r) => {
            tokio::time::sleep(d).await;
            r
        }
        Outcome::WaitFor(waits, r) => {
            for (mut rx, seq) in waits {
                let _ = rx.wait_for(|v| *v >= seq).await;
            }
            r
        }
    }
}

/// `/_test/...` administration for process mode.
fn admin(
    sh: &Arc<Shared>,
    method: &str,
    rest: &str,
    params: &std::collections::HashMap<String, String>,
) -> Resp {
    let num = |k: &str, d: u64| {
        params
            .get(k)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(d)
    };
    match (method, rest.trim_end_matches('/')) {
        ("POST", "fail") | ("PUT", "fail") => {
            let status = num("status", 503) as u16;
            let count = num("count", 1) as usize;
            *sh.inject.lock() = Injection {
                remaining: count,
                status,
            };
            Resp::json(
                200,
                json!({"acknowledged": true, "status": status, "count": count}),
            )
        }
        ("POST", "latency") | ("PUT", "latency") => {
            let ms = num("ms", 0);
            *sh.latency.lock() = Duration::from_millis(ms);
            Resp::json(200, json!({"acknowledged": true, "latency_ms": ms}))
        }
        ("POST", "reset") => {
            *sh.inject.lock() = Injection {
                remaining: 0,
                status: 503,
            };
            *sh.latency.lock() = Duration::ZERO;
            Resp::json(200, json!({"acknowledged": true}))
        }
        ("POST", "wipe") => {
            let mut st = sh.state.lock();
            st.indices.clear();
            st.pits.clear();
            Resp::json(200, json!({"acknowledged": true}))
        }
        ("POST", "refresh") => {
            let mut st = sh.state.lock();
            for ix in st.indices.values_mut() {
                ix.refresh();
            }
            Resp::json(200, json!({"acknowledged": true}))
        }
        ("POST", "outage") => {
            // Stop listening for `ms` milliseconds (connections are closed), then come back.
            let ms = num("ms", 1000);
            let sh2 = sh.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                stop_listening(&sh2).await;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                let addr = *sh2.addr.lock();
                if let Ok(l) = tokio::task::spawn_blocking(move || bind_retry(addr))
                    .await
                    .unwrap_or_else(|e| Err(io::Error::other(e)))
                {
                    let _ = start_listening(&sh2, l);
                }
            });
            Resp::json(200, json!({"acknowledged": true, "outage_ms": ms}))
        }
        ("GET", "stats") => {
            let st = sh.state.lock();
            let indices: serde_json::Map<String, Value> = st
                .indices
                .iter()
                .map(|(n, ix)| (n.clone(), json!({"docs": ix.live.len(), "searchable_docs": ix.snapshot.docs.len(), "next_seq_no": ix.next_seq})))
                .collect();
            Resp::json(
                200,
                json!({
                    "requests": sh.requests.load(Ordering::Relaxed),
                    "pending_failures": sh.inject.lock().remaining,
                    "latency_ms": sh.latency.lock().as_millis() as u64,
                    "open_pits": st.pits.len(),
                    "indices": indices,
                }),
            )
        }
        _ => Resp::json(
            400,
            json!({"error": format!("unknown es-test-server admin endpoint [{method} /_test/{rest}]; known: POST fail?status=&count=, latency?ms=, reset, wipe, refresh, outage?ms=; GET stats"), "status": 400}),
        ),
    }
}

/// The `es_test_server` command: `[--listen ADDR:PORT]` (default
/// 127.0.0.1:9200); prints one line once listening and serves until killed.
/// Shared by the crate's `serve` example and esfs's `es_test_server` example.
pub fn main_with_args(args: impl IntoIterator<Item = String>) -> ! {
    fn usage() -> ! {
        eprintln!("usage: es_test_server [--listen ADDR:PORT]   (default 127.0.0.1:9200)");
        std::process::exit(2);
    }
    let mut listen = String::from("127.0.0.1:9200");
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next().unwrap_or_else(|| usage()),
            s if s.starts_with("--listen=") => listen = s["--listen=".len()..].to_string(),
            _ => usage(),
        }
    }
    let server = match EsTestServer::start(&listen) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("es_test_server: cannot listen on {listen}: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "es_test_server listening on {} (a test double, not Elasticsearch)",
        server.url()
    );
    loop {
        std::thread::park();
    }
}
