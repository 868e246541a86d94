//! A lean HTTP/1.1 client for load generators: one keep-alive connection, requests written
//! in one `write`, responses read into a reused buffer (`Content-Length` bodies only, which
//! is what Cairn sends). It exists so that a benchmark's client, which shares the machine's
//! cores with the server it measures, spends as little CPU as it can; tests use ureq.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// One connection to `host:port`, reopened when the server closes it.
pub struct KeepAlive {
    addr: String,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
    timeout: Duration,
}

/// A response: status and body.
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

impl KeepAlive {
    /// `addr` is `host:port` (no scheme).
    pub fn new(addr: &str, timeout: Duration) -> KeepAlive {
        KeepAlive {
            addr: addr.trim_start_matches("http://").to_string(),
            stream: None,
            buf: Vec::with_capacity(4096),
            timeout,
        }
    }

    fn connect(&mut self) -> Result<&mut TcpStream, String> {
        if self.stream.is_none() {
            let s = TcpStream::connect(&self.addr)
                .map_err(|e| format!("connect {}: {e}", self.addr))?;
            let _ = s.set_nodelay(true);
            s.set_read_timeout(Some(self.timeout))
                .map_err(|e| e.to_string())?;
            self.stream = Some(s);
        }
        self.stream.as_mut().ok_or_else(|| "no connection".into())
    }

    /// Sends `method path` with the given headers and body; on a connection the server had
    /// closed, reconnects and sends once more.
    pub fn call(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Reply, String> {
        let mut req = Vec::with_capacity(256 + body.len());
        let _ = write!(
            req,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (k, v) in headers {
            let _ = write!(req, "{k}: {v}\r\n");
        }
        req.extend_from_slice(b"\r\n");
        req.extend_from_slice(body);
        let fresh = self.stream.is_none();
        match self.exchange(&req) {
            Ok(r) => Ok(r),
            // Only a kept connection the server had closed is retried: any other failure
            // (a timeout, a malformed answer) may follow a request the server carried out.
            Err(Failure::Closed(e)) if !fresh => self
                .exchange(&req)
                .map_err(|e2| format!("{e}; again: {}", e2.message())),
            Err(e) => Err(e.message()),
        }
    }

    fn exchange(&mut self, req: &[u8]) -> Result<Reply, Failure> {
        let s = self.connect().map_err(Failure::Other)?;
        let r = match s.write_all(req) {
            Err(e) => Err(Failure::Closed(format!("write: {e}"))),
            Ok(()) => self.read_reply(),
        };
        if r.is_err() {
            self.stream = None;
        }
        r
    }

    fn read_reply(&mut self) -> Result<Reply, Failure> {
        self.buf.clear();
        let s = self
            .stream
            .as_mut()
            .ok_or_else(|| Failure::Other("no connection".into()))?;
        let mut chunk = [0u8; 4096];
        // Headers.
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            // Closed or reset before any byte of an answer: the server had dropped the kept
            // connection without reading the request.
            let closed = |buf: &[u8], msg: String| {
                if buf.is_empty() {
                    Failure::Closed(msg)
                } else {
                    Failure::Other(msg)
                }
            };
            let n = match s.read(&mut chunk) {
                Ok(0) => return Err(closed(&self.buf, "connection closed by the server".into())),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return Err(closed(&self.buf, format!("read: {e}")))
                }
                Err(e) => return Err(Failure::Other(format!("read: {e}"))),
            };
            self.buf.extend_from_slice(&chunk[..n]);
        };
        self.read_body(head_end).map_err(Failure::Other)
    }

    /// Parses the head that ends at `head_end` in the buffer and reads the body after it.
    fn read_body(&mut self, head_end: usize) -> Result<Reply, String> {
        let s = self.stream.as_mut().ok_or("no connection")?;
        let mut chunk = [0u8; 4096];
        let head = std::str::from_utf8(&self.buf[..head_end]).map_err(|_| "non-UTF-8 head")?;
        let status: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("bad status line: {head:?}"))?;
        let mut length = None;
        let mut close = false;
        for line in head.split("\r\n").skip(1) {
            if let Some((k, v)) = line.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse::<usize>().ok();
                } else if k.eq_ignore_ascii_case("transfer-encoding") {
                    return Err("chunked responses are not supported".into());
                } else if k.eq_ignore_ascii_case("connection") {
                    close = v.trim().eq_ignore_ascii_case("close");
                }
            }
        }
        let length = length.unwrap_or(0);
        while self.buf.len() < head_end + length {
            let n = s.read(&mut chunk).map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err("connection closed inside the body".into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
        let body = self.buf[head_end..head_end + length].to_vec();
        if close {
            self.stream = None;
        }
        Ok(Reply { status, body })
    }
}

/// Why an exchange failed: `Closed` when the server had closed the connection before taking
/// the request (safe to send again on a new one), `Other` for anything else.
enum Failure {
    Closed(String),
    Other(String),
}

impl Failure {
    fn message(self) -> String {
        match self {
            Failure::Closed(m) | Failure::Other(m) => m,
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A server that answers two requests on one connection, then closes it; the client
    /// reads both answers and reconnects for a third.
    #[test]
    fn keeps_the_connection_and_reconnects_after_close() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for answers in [2usize, 1] {
                let (mut c, _) = l.accept().unwrap();
                for n in 0..answers {
                    let mut got = Vec::new();
                    let mut b = [0u8; 1024];
                    while find(&got, b"\r\n\r\nxy").is_none() {
                        let k = c.read(&mut b).unwrap();
                        got.extend_from_slice(&b[..k]);
                    }
                    seen.push(String::from_utf8(got).unwrap());
                    let close = if n + 1 == answers {
                        "Connection: close\r\n"
                    } else {
                        ""
                    };
                    write!(
                        c,
                        "HTTP/1.1 201 Created\r\n{close}Content-Length: 5\r\n\r\nhello"
                    )
                    .unwrap();
                }
            }
            seen
        });
        let mut k = KeepAlive::new(&addr, Duration::from_secs(5));
        for _ in 0..3 {
            let r = k.call("POST", "/v1/x", &[("X-T", "1")], b"xy").unwrap();
            assert_eq!(r.status, 201);
            assert_eq!(r.body, b"hello");
        }
        let seen = server.join().unwrap();
        assert_eq!(seen.len(), 3);
        assert!(seen[0].starts_with("POST /v1/x HTTP/1.1\r\n"));
        assert!(seen[0].contains("Content-Length: 2\r\n") && seen[0].contains("X-T: 1\r\n"));
    }

    /// Reads one request (ending in `body`) from `c`.
    fn read_request(c: &mut TcpStream, body: &[u8]) {
        let mut got = Vec::new();
        let mut b = [0u8; 1024];
        while !got.ends_with(body) {
            let k = c.read(&mut b).unwrap();
            assert!(k > 0, "client closed");
            got.extend_from_slice(&b[..k]);
        }
    }

    /// A kept connection the server closed silently is reopened and the request sent again;
    /// a request that timed out is not sent twice.
    #[test]
    fn resends_only_on_a_connection_the_server_had_closed() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            read_request(&mut c, b"a");
            write!(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").unwrap();
            drop(c);
            let (mut c, _) = l.accept().unwrap();
            read_request(&mut c, b"b");
            write!(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").unwrap();
            // The next request is read and never answered.
            read_request(&mut c, b"c");
            l.set_nonblocking(true).unwrap();
            std::thread::sleep(Duration::from_millis(500));
            let again = l.accept().is_ok();
            drop(c);
            again
        });
        let mut k = KeepAlive::new(&addr, Duration::from_millis(200));
        assert_eq!(k.call("POST", "/", &[], b"a").unwrap().body, b"ok");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(k.call("POST", "/", &[], b"b").unwrap().body, b"ok");
        assert!(k.call("POST", "/", &[], b"c").is_err());
        assert!(
            !server.join().unwrap(),
            "a timed-out request was sent again"
        );
    }
}
