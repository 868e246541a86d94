//! `bench-hello PORT`: the baseline of `bench-openbao kv-read-limit`, an HTTP server that does
//! nothing but answer every request 200 with a fixed JSON body (the bytes a Cairn KV read of
//! the benchmark returns, given in `BENCH_HELLO_BODY`, else `{"ok":true}`). It uses the same
//! vendored tiny_http and the same thread model as `cairn server` (`shell/src/http.rs`): a
//! listener with `TCP_NODELAY`, tiny_http's own connection threads reading requests, and 32
//! worker threads taking them with `Server::recv` and writing the answers.

use std::sync::Arc;

/// As many workers as `cairn server` runs (`shell/src/server.rs`).
const WORKERS: usize = 32;

fn main() -> Result<(), String> {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .ok_or("usage: bench-hello PORT")?;
    let body: Arc<Vec<u8>> = Arc::new(
        std::env::var("BENCH_HELLO_BODY")
            .unwrap_or_else(|_| r#"{"ok":true}"#.into())
            .into_bytes(),
    );
    let listener = std::net::TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| format!("cannot listen on port {port}: {e}"))?;
    socket2::SockRef::from(&listener)
        .set_tcp_nodelay(true)
        .map_err(|e| format!("TCP_NODELAY: {e}"))?;
    let server = tiny_http::Server::from_listener_with_limits(
        listener,
        None,
        None,
        tiny_http::ConnectionLimits::default(),
    )
    .map_err(|e| format!("tiny_http: {e}"))?;
    let server = Arc::new(server);
    let json = tiny_http::Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..])
        .map_err(|_| "bad header")?;
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (server, body, json) = (server.clone(), body.clone(), json.clone());
            std::thread::spawn(move || loop {
                match server.recv() {
                    Ok(rq) => {
                        let r =
                            tiny_http::Response::from_data(body.to_vec()).with_header(json.clone());
                        let _ = rq.respond(r);
                    }
                    Err(e) => eprintln!("accept: {e}"),
                }
            })
        })
        .collect();
    println!("listening on 127.0.0.1:{port}");
    for w in workers {
        let _ = w.join();
    }
    Ok(())
}
