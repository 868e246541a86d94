//! Strict request framing on both listeners (API and cluster).
//!
//! A request whose body length is in doubt is refused before its body is read and before
//! anything reaches the core: a front end and this server that read a different length would
//! take different bytes for the next request (request smuggling). [`head_check`] runs on
//! tiny_http's connection thread (the patched `Server::from_listener_with_head_check` in
//! `shell/vendor/tiny_http`): a refused request is answered in the API's error envelope with
//! `Connection: close`, and its connection is closed, so nothing after its head is read as a
//! request.
//!
//! Refused (400): more than one `Content-Length` (even with equal values), a `Content-Length`
//! that is not plain ASCII digits fitting a u64 (`+5`, `-1`, `5x`, `5, 5`, empty), more than
//! one `Transfer-Encoding`, and `Content-Length` together with `Transfer-Encoding`. A
//! `Transfer-Encoding` other than exactly `chunked` (any case) is a transfer coding this
//! server does not implement (501, as RFC 9112 section 6.1 advises).

use std::io::Cursor;

/// Why a request's framing is refused: the HTTP status and a message for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub status: u16,
    pub message: String,
}

fn bad(message: String) -> Refused {
    Refused {
        status: 400,
        message,
    }
}

/// A header value as a client may read it back in a message: quoted, cut at 40 characters.
fn shown(v: &str) -> String {
    let cut: String = v.chars().take(40).collect();
    if cut.len() < v.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}

/// Checks the framing headers of a request head (every header as sent, by name and value;
/// names compare without case). `Ok` when the body length is unambiguous: no body, one valid
/// `Content-Length`, or `Transfer-Encoding: chunked` alone.
pub fn check<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<(), Refused> {
    let mut lengths = Vec::new();
    let mut encodings = Vec::new();
    for (name, value) in headers {
        // Optional whitespace around a field value is not part of it (RFC 9110 5.5).
        let value = value.trim_matches([' ', '\t']);
        if name.eq_ignore_ascii_case("content-length") {
            lengths.push(value);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            encodings.push(value);
        }
    }
    if lengths.len() > 1 {
        return Err(bad(format!(
            "request has {} Content-Length headers; send exactly one",
            lengths.len()
        )));
    }
    if encodings.len() > 1 {
        return Err(bad(format!(
            "request has {} Transfer-Encoding headers; send at most one, \"chunked\"",
            encodings.len()
        )));
    }
    match (lengths.first(), encodings.first()) {
        (Some(_), Some(_)) => Err(bad(
            "request has both Content-Length and Transfer-Encoding; send only one of them"
                .to_string(),
        )),
        (Some(len), None) => {
            let digits = !len.is_empty() && len.bytes().all(|b| b.is_ascii_digit());
            if digits && len.parse::<u64>().is_ok() {
                Ok(())
            } else {
                Err(bad(format!(
                    "Content-Length {} is not a byte count; send plain digits 0-9 only",
                    shown(len)
                )))
            }
        }
        (None, Some(te)) if te.eq_ignore_ascii_case("chunked") => Ok(()),
        (None, Some(te)) => Err(Refused {
            status: 501,
            message: format!(
                "Transfer-Encoding {} is not supported; send \"chunked\" alone, or a Content-Length",
                shown(te)
            ),
        }),
        (None, None) => Ok(()),
    }
}

/// The head check both listeners give tiny_http: [`check`] over the request's headers, and
/// for a refusal the answer in the API's error envelope (tiny_http adds `Connection: close`
/// and closes the connection after it).
pub fn head_check(headers: &[tiny_http::Header]) -> Option<tiny_http::Response<Cursor<Vec<u8>>>> {
    let refused = check(
        headers
            .iter()
            .map(|h| (h.field.as_str().as_str(), h.value.as_str())),
    )
    .err()?;
    log::info!(
        "refused a request ({}) and closed its connection: {}",
        refused.status,
        refused.message
    );
    Some(answer(&refused))
}

fn answer(refused: &Refused) -> tiny_http::Response<Cursor<Vec<u8>>> {
    let body = serde_json::json!({ "errors": [refused.message] });
    let mut r = tiny_http::Response::from_data(serde_json::to_vec(&body).unwrap_or_default())
        .with_status_code(refused.status);
    for (k, v) in [
        ("Content-Type", "application/json"),
        ("Cache-Control", "no-store"),
    ] {
        if let Ok(h) = tiny_http::Header::from_bytes(k.as_bytes(), v.as_bytes()) {
            r.add_header(h);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::time::Duration;

    fn status(headers: &[(&str, &str)]) -> Result<(), u16> {
        check(headers.iter().copied()).map_err(|r| r.status)
    }

    fn message(headers: &[(&str, &str)]) -> String {
        check(headers.iter().copied())
            .err()
            .map(|r| r.message)
            .unwrap_or_default()
    }

    #[test]
    fn normal_framing_is_accepted() {
        assert_eq!(status(&[]), Ok(()));
        assert_eq!(status(&[("Host", "x"), ("Accept", "*/*")]), Ok(()));
        assert_eq!(status(&[("Content-Length", "0")]), Ok(()));
        assert_eq!(status(&[("Content-Length", "5")]), Ok(()));
        assert_eq!(status(&[("content-length", "007")]), Ok(()));
        assert_eq!(
            status(&[("Content-Length", "18446744073709551615")]),
            Ok(())
        );
        assert_eq!(status(&[("Content-Length", " 5\t")]), Ok(()));
        assert_eq!(status(&[("Transfer-Encoding", "chunked")]), Ok(()));
        assert_eq!(status(&[("transfer-encoding", "Chunked")]), Ok(()));
        assert_eq!(status(&[("TRANSFER-ENCODING", "CHUNKED")]), Ok(()));
    }

    #[test]
    fn two_content_lengths_are_refused_equal_or_not() {
        for (a, b) in [("5", "5"), ("5", "80"), ("0", "0")] {
            let h = [("Content-Length", a), ("Host", "x"), ("content-length", b)];
            assert_eq!(status(&h), Err(400), "{h:?}");
            assert_eq!(
                message(&h),
                "request has 2 Content-Length headers; send exactly one"
            );
        }
        let three = [("Content-Length", "1"); 3];
        assert!(message(&three).contains("has 3 Content-Length headers"));
    }

    #[test]
    fn content_length_must_be_plain_digits() {
        for v in [
            "+5",
            "-1",
            " 5x",
            "5x",
            "",
            "5, 5",
            "5,5",
            "0x10",
            "5 5",
            "1e3",
            "18446744073709551616",
            "99999999999999999999999999",
        ] {
            let h = [("Content-Length", v)];
            assert_eq!(status(&h), Err(400), "{v:?}");
            assert!(message(&h).contains("send plain digits 0-9 only"), "{v:?}");
        }
        assert_eq!(
            message(&[("Content-Length", "+5")]),
            "Content-Length \"+5\" is not a byte count; send plain digits 0-9 only"
        );
        // A long value is cut in the message.
        let long = "9".repeat(500) + "x";
        assert!(message(&[("Content-Length", &long)]).len() < 120);
    }

    #[test]
    fn content_length_with_transfer_encoding_is_refused() {
        for h in [
            [("Content-Length", "5"), ("Transfer-Encoding", "chunked")],
            [("Transfer-Encoding", "chunked"), ("Content-Length", "0")],
            [("Content-Length", "5"), ("Transfer-Encoding", "gzip")],
        ] {
            assert_eq!(status(&h), Err(400), "{h:?}");
            assert!(message(&h).contains("both Content-Length and Transfer-Encoding"));
        }
    }

    #[test]
    fn transfer_encoding_must_be_chunked_alone() {
        for v in [
            "gzip",
            "gzip, chunked",
            "chunked, chunked",
            "chunked;x",
            "identity",
            "",
        ] {
            let h = [("Transfer-Encoding", v)];
            assert_eq!(status(&h), Err(501), "{v:?}");
            assert!(message(&h).contains("send \"chunked\" alone"), "{v:?}");
        }
        let two = [
            ("Transfer-Encoding", "chunked"),
            ("transfer-encoding", "chunked"),
        ];
        assert_eq!(status(&two), Err(400));
        assert!(message(&two).contains("2 Transfer-Encoding headers"));
    }

    #[test]
    fn the_answer_is_the_api_error_envelope() {
        let h = |k: &str, v: &str| tiny_http::Header::from_bytes(k, v).expect("header");
        assert!(head_check(&[h("Content-Length", "3")]).is_none());
        let r = head_check(&[h("Content-Length", "3"), h("Content-Length", "4")]).expect("refused");
        assert_eq!(r.status_code().0, 400);
        assert!(r
            .headers()
            .iter()
            .any(|x| x.field.equiv("Content-Type") && x.value.as_str() == "application/json"));
        let body: serde_json::Value =
            serde_json::from_slice(r.into_reader().get_ref()).expect("json");
        assert_eq!(
            body,
            serde_json::json!({"errors": ["request has 2 Content-Length headers; send exactly one"]})
        );
    }

    /// The patched tiny_http: a refused head is answered with `Connection: close`, the
    /// connection is closed, and the request smuggled in its body never reaches a worker.
    #[test]
    fn a_refused_head_closes_the_connection_and_nothing_after_it_is_served() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let server =
            tiny_http::Server::from_listener_with_head_check(listener, None, Some(head_check))
                .expect("server");
        let addr = server.server_addr().to_ip().expect("ip");
        let smuggled = "GET /v1/smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
        let body = format!("{{}}{smuggled}");
        let mut sock = std::net::TcpStream::connect(addr).expect("connect");
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        write!(
            sock,
            "PUT /v1/outer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("write");
        let mut got = Vec::new();
        // Read to the end: the server closes the connection after its answer.
        let _ = sock.read_to_end(&mut got);
        let got = String::from_utf8_lossy(&got);
        assert!(got.starts_with("HTTP/1.1 400 "), "{got}");
        assert!(got.contains("Connection: close\r\n"), "{got}");
        assert!(got.contains("send exactly one"), "{got}");
        assert_eq!(got.matches("HTTP/1.1 ").count(), 1, "{got}");
        // Neither the refused request nor the smuggled one was handed out.
        let served = server
            .recv_timeout(Duration::from_millis(300))
            .expect("recv");
        assert!(served.is_none(), "{served:?}");
        // The listener still serves well-framed requests.
        let mut ok = std::net::TcpStream::connect(addr).expect("connect");
        ok.write_all(b"POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            .expect("write");
        let mut rq = server
            .recv_timeout(Duration::from_secs(10))
            .expect("recv")
            .expect("a request");
        let mut got = String::new();
        rq.as_reader().read_to_string(&mut got).expect("body");
        assert_eq!((rq.url(), got.as_str()), ("/v1/x", "{}"));
    }

    /// A listener with the head check, and a client that sends `head` on a new connection
    /// and reads until the server closes it.
    fn head_server() -> (tiny_http::Server, impl Fn(&[u8]) -> String) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let server =
            tiny_http::Server::from_listener_with_head_check(listener, None, Some(head_check))
                .expect("server");
        let addr = server.server_addr().to_ip().expect("ip");
        let exchange = move |head: &[u8]| {
            let mut sock = std::net::TcpStream::connect(addr).expect("connect");
            sock.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("timeout");
            sock.write_all(head).expect("write");
            let mut got = Vec::new();
            let _ = sock.read_to_end(&mut got);
            String::from_utf8_lossy(&got).into_owned()
        };
        (server, exchange)
    }

    /// The request the server hands out next (within 10 s).
    fn served(server: &tiny_http::Server) -> tiny_http::Request {
        server
            .recv_timeout(Duration::from_secs(10))
            .expect("recv")
            .expect("a request")
    }

    /// `got` is one 400 in the error envelope, with `Connection: close` and no-store, whose
    /// message contains `says`.
    fn assert_malformed(got: &str, says: &str) {
        assert!(got.starts_with("HTTP/1.1 400 "), "{got}");
        assert_eq!(
            got.matches("HTTP/1.1 ").count(),
            1,
            "one answer only: {got}"
        );
        assert!(got.contains("Connection: close\r\n"), "{got}");
        assert!(got.contains("Cache-Control: no-store\r\n"), "{got}");
        assert!(got.contains("Content-Type: application/json\r\n"), "{got}");
        let body = got.split("\r\n\r\n").nth(1).unwrap_or_default();
        let body: serde_json::Value = serde_json::from_str(body).expect("json");
        let message = body["errors"][0].as_str().unwrap_or_default();
        assert!(message.contains(says), "{body}");
    }

    /// The patched tiny_http: a byte outside ASCII in a request's head is never a connection
    /// dropped without an answer (it was: tiny_http read the head as ASCII only). As the
    /// reference's Go server: a header value outside ASCII (obs-text: a user agent `café`, a
    /// Latin-1 token) is accepted (bytes that are not UTF-8 read as U+FFFD, so a token is
    /// then unknown: 403 in the core), a UTF-8 request target is served as it came; a header
    /// name outside ASCII or a request line that is not UTF-8 is a malformed head: 400 in
    /// the error envelope, connection closed.
    #[test]
    fn a_head_outside_ascii_is_answered_not_dropped() {
        let (server, exchange) = head_server();
        let addr = server.server_addr().to_ip().expect("ip");
        let mut sock = std::net::TcpStream::connect(addr).expect("connect");
        sock.write_all(
            b"GET /v1/sys/health HTTP/1.1\r\nHost: x\r\nUser-Agent: caf\xc3\xa9 \r\n\
              X-Vault-Token: r\xe9\r\n\r\n",
        )
        .expect("write");
        let rq = served(&server);
        let value = |name: &'static str| {
            rq.headers()
                .iter()
                .find(|h| h.field.equiv(name))
                .map(|h| h.value.as_str().to_string())
        };
        assert_eq!(value("User-Agent").as_deref(), Some("caf\u{e9}"));
        assert_eq!(value("X-Vault-Token").as_deref(), Some("r\u{fffd}"));
        // Answered (dropped) before the next one: tiny_http writes answers in request order,
        // so the next request's answer would wait for this one's.
        drop(rq);
        // A UTF-8 path reaches the server as it was sent.
        sock.write_all("GET /v1/secret/\u{fc} HTTP/1.1\r\nHost: x\r\n\r\n".as_bytes())
            .expect("write");
        assert_eq!(served(&server).url(), "/v1/secret/\u{fc}");

        // A header name outside ASCII.
        let got = exchange(b"GET /v1/sys/health HTTP/1.1\r\nX-F\xe9o: a\r\n\r\n");
        assert_malformed(&got, "a header name has a character outside ASCII");
        // A request line that is not UTF-8, or has a byte outside ASCII in the method.
        let got = exchange(b"GET /v1/secret/\xff HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_malformed(&got, "the request target is not UTF-8");
        let got = exchange("G\u{c9}T /v1/x HTTP/1.1\r\nHost: x\r\n\r\n".as_bytes());
        assert_malformed(&got, "malformed request line");
        // Unicode spaces are not trimmed: the version is `HTTP/1.1` plus one.
        let got = exchange("GET /v1/x HTTP/1.1\u{a0}\r\nHost: x\r\n\r\n".as_bytes());
        assert_malformed(&got, "malformed request line");
        let next = server
            .recv_timeout(Duration::from_millis(300))
            .expect("recv");
        assert!(next.is_none(), "{next:?}");
    }

    /// The patched tiny_http: a control character in the head (a bare LF or CR, which a
    /// front end may take for the end of a line where tiny_http does not, NUL, a vertical
    /// tab) is a malformed head: 400, connection closed, and the request a front end would
    /// have read in it (here a `Content-Length` smuggling a second request) never runs.
    /// Around a value only spaces and tabs are trimmed, so a length or a coding followed by
    /// another space character is refused by the framing check, not read as the plain one.
    #[test]
    fn a_control_character_or_an_odd_space_in_the_head_is_refused() {
        let (server, exchange) = head_server();
        // A front end that reads the `Content-Length` below takes this for the body.
        let smuggled = "GET /v1/smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
        let n = smuggled.len();
        for (head, says) in [
            (
                format!("X-A: a\nContent-Length: {n}"),
                "a control character",
            ),
            (
                format!("X-A: a\rContent-Length: {n}"),
                "a control character",
            ),
            (format!("Content-Length: {n}\x0b"), "a control character"),
            ("X-A: a\0".to_string(), "a control character"),
            ("X-A\x7f: a".to_string(), "a control character"),
            // A line folded onto the previous one (obs-fold) is no header of its own.
            (format!(" Content-Length: {n}"), "send Name: value"),
            (format!("Content-Length : {n}"), "send Name: value"),
            ("no colon here".to_string(), "send Name: value"),
            (format!("Content-Length: {n}\u{a0}"), "not a byte count"),
        ] {
            let got = exchange(
                format!("PUT /v1/x HTTP/1.1\r\nHost: x\r\n{head}\r\n\r\n{smuggled}").as_bytes(),
            );
            assert_malformed(&got, says);
        }
        let got = exchange(
            format!("PUT /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\u{85}\r\n\r\n{smuggled}")
                .as_bytes(),
        );
        assert!(got.starts_with("HTTP/1.1 501 "), "{got}");
        for line in [
            "GET /v1/x\0 HTTP/1.1",
            "GET /v1/x\tHTTP/1.1",
            "GET /v1/\nx HTTP/1.1",
        ] {
            let got = exchange(format!("{line}\r\nHost: x\r\n\r\n{smuggled}").as_bytes());
            assert_malformed(&got, "a control character");
        }
        let next = server
            .recv_timeout(Duration::from_millis(300))
            .expect("recv");
        assert!(next.is_none(), "{next:?}");
        // A tab in a value is whitespace (trimmed around it) and allowed inside.
        let addr = server.server_addr().to_ip().expect("ip");
        let mut sock = std::net::TcpStream::connect(addr).expect("connect");
        sock.write_all(b"GET /v1/x HTTP/1.1\r\nHost: x\r\nX-A:\ta\tb\t\r\n\r\n")
            .expect("write");
        let rq = served(&server);
        let a = rq.headers().iter().find(|h| h.field.equiv("X-A"));
        assert_eq!(a.map(|h| h.value.as_str()), Some("a\tb"));
    }
}
