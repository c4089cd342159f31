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

use es_test_server::EsTestServer;

fn usage() -> ! {
    eprintln!("usage: es_test_server [--listen ADDR:PORT]   (default 127.0.0.1:9200)");
    std::process::exit(2);
}

fn main() {
    let mut listen = String::from("127.0.0.1:9200");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next().unwrap_or_else(|| usage()),
            s if s.starts_with("--listen=") => listen = s["--listen=".len()..].to_string(),
            "-h" | "--help" => usage(),
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
