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
            Err(e) if !fresh => {
                self.stream = None;
                self.exchange(&req)
                    .map_err(|e2| format!("{e}; again: {e2}"))
            }
            Err(e) => Err(e),
        }
    }

    fn exchange(&mut self, req: &[u8]) -> Result<Reply, String> {
        let s = self.connect()?;
        if let Err(e) = s.write_all(req) {
            self.stream = None;
            return Err(format!("write: {e}"));
        }
        let r = self.read_reply();
        if r.is_err() {
            self.stream = None;
        }
        r
    }

    fn read_reply(&mut self) -> Result<Reply, String> {
        self.buf.clear();
        let s = self.stream.as_mut().ok_or("no connection")?;
        let mut chunk = [0u8; 4096];
        // Headers.
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            let n = s.read(&mut chunk).map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err("connection closed before the response".into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        };
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
}
