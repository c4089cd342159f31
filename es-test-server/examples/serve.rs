//! Runs the es-test-server test double as its own process:
//!
//! ```sh
//! cargo run --release --example es_test_server -- --listen 127.0.0.1:9200
//! ```
//!
//! It speaks the subset of the Elasticsearch REST API that esfs uses. It is a test double,
//! not Elasticsearch. Administration for tests lives under `/_test/...`
//! (`POST /_test/fail?status=429&count=3`, `POST /_test/latency?ms=50`,
//! `POST /_test/outage?ms=2000`, `POST /_test/reset`, `POST /_test/wipe`, `GET /_test/stats`).

fn main() {
    es_test_server::main_with_args(std::env::args().skip(1))
}
