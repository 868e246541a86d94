use std::io::Error as IoError;
use std::io::Result as IoResult;
use std::io::{BufReader, BufWriter, Cursor, ErrorKind, Read};

use std::net::SocketAddr;

use crate::common::{HTTPVersion, Method};
use crate::util::RefinedTcpStream;
use crate::util::{SequentialReader, SequentialReaderBuilder, SequentialWriterBuilder};
use crate::{HeadCheck, Request, Response};

/// A ClientConnection is an object that will store a socket to a client
/// and return Request objects.
pub struct ClientConnection {
    // address of the client
    remote_addr: IoResult<Option<SocketAddr>>,

    // sequence of Readers to the stream, so that the data is not read in
    //  the wrong order
    source: SequentialReaderBuilder<BufReader<RefinedTcpStream>>,

    // sequence of Writers to the stream, to avoid writing response #2 before
    //  response #1
    sink: SequentialWriterBuilder<BufWriter<RefinedTcpStream>>,

    // Reader to read the next header from
    next_header_source: SequentialReader<BufReader<RefinedTcpStream>>,

    // set to true if we know that the previous request is the last one
    no_more_requests: bool,

    // true if the connection goes through SSL
    secure: bool,

    // Cairn patch: checks each request's head before its body is read
    head_check: Option<HeadCheck>,
}

/// Cairn patch: the answer refusing a request's head (see [`HeadCheck`]).
struct Refusal(Response<Cursor<Vec<u8>>>);

impl std::fmt::Debug for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Refusal({})", self.0.status_code().0)
    }
}

/// Error that can happen when reading a request.
///
/// Cairn patch: a malformed request line or header carries the reason the client is told
/// (a constant: it is put in a JSON string as it is, see [`malformed_answer`]).
#[derive(Debug)]
enum ReadError {
    WrongRequestLine(&'static str),
    WrongHeader(HTTPVersion, &'static str),
    /// the client sent an unrecognized `Expect` header
    ExpectationFailed(HTTPVersion),
    /// Cairn patch: the head check refused the request
    Refused(HTTPVersion, Refusal),
    ReadIoError(IoError),
}

/// Cairn patch: the reasons a request line is refused.
const BAD_REQUEST_LINE: &str =
    "malformed request line: send METHOD /path HTTP/1.1, with single spaces";
const REQUEST_LINE_NOT_UTF8: &str =
    "malformed request line: the request target is not UTF-8; percent-encode other bytes";
const REQUEST_LINE_CONTROL: &str =
    "malformed request line: it has a control character; percent-encode it";
const BAD_HEADER: &str = "malformed header line: send Name: value";
const HEADER_NAME_NOT_ASCII: &str =
    "malformed header line: a header name has a character outside ASCII";
const HEADER_CONTROL: &str =
    "malformed header line: it has a control character (a bare CR or LF, NUL, ...)";

impl ClientConnection {
    /// Creates a new `ClientConnection` that takes ownership of the `TcpStream`.
    pub fn new(
        write_socket: RefinedTcpStream,
        mut read_socket: RefinedTcpStream,
        head_check: Option<HeadCheck>,
    ) -> ClientConnection {
        let remote_addr = read_socket.peer_addr();
        let secure = read_socket.secure();

        let mut source = SequentialReaderBuilder::new(BufReader::with_capacity(1024, read_socket));
        let first_header = source.next().unwrap();

        ClientConnection {
            source,
            sink: SequentialWriterBuilder::new(BufWriter::with_capacity(1024, write_socket)),
            remote_addr,
            next_header_source: first_header,
            no_more_requests: false,
            secure,
            head_check,
        }
    }

    /// true if the connection is HTTPS
    pub fn secure(&self) -> bool {
        self.secure
    }

    /// Reads the next line from self.next_header_source.
    ///
    /// Reads until `CRLF` is reached. The next read will start
    ///  at the first byte of the new line.
    ///
    /// Cairn patch: the line's bytes as they came; the caller decides what they may be
    /// (before, a byte outside ASCII anywhere in the head dropped the connection without
    /// an answer).
    fn read_next_line(&mut self) -> IoResult<Vec<u8>> {
        let mut buf = Vec::new();
        let mut prev_byte_was_cr = false;

        loop {
            let byte = self.next_header_source.by_ref().bytes().next();

            let byte = match byte {
                Some(b) => b?,
                None => return Err(IoError::new(ErrorKind::ConnectionAborted, "Unexpected EOF")),
            };

            if byte == b'\n' && prev_byte_was_cr {
                buf.pop(); // removing the '\r'
                return Ok(buf);
            }

            prev_byte_was_cr = byte == b'\r';

            buf.push(byte);
        }
    }

    /// Reads a request from the stream.
    /// Blocks until the header has been read.
    fn read(&mut self) -> Result<Request, ReadError> {
        let (method, path, version, headers) = {
            // reading the request line
            let (method, path, version) = {
                let line = self.read_next_line().map_err(ReadError::ReadIoError)?;
                // Cairn patch: no control character (a bare CR or LF, which a front end
                // may take for the end of the line, NUL, a tab); a request target in UTF-8
                // is served as it came (as the reference's Go server does); any other byte
                // is a malformed request line (400). Before, a byte outside ASCII anywhere
                // in the head closed the connection without an answer.
                if line.iter().any(|&b| b < b' ' || b == 0x7f) {
                    return Err(ReadError::WrongRequestLine(REQUEST_LINE_CONTROL));
                }
                let line = String::from_utf8(line)
                    .map_err(|_| ReadError::WrongRequestLine(REQUEST_LINE_NOT_UTF8))?;
                // Cairn patch: only spaces are trimmed (`str::trim` would take Unicode
                // spaces off a UTF-8 line too)
                parse_request_line(line.trim_matches(' '))?
            };

            // getting all headers
            let headers = {
                let mut headers = Vec::new();
                loop {
                    let line = self.read_next_line().map_err(ReadError::ReadIoError)?;

                    if line.is_empty() {
                        break;
                    };
                    headers.push(parse_header_line(line, &version)?);
                }

                headers
            };

            (method, path, version, headers)
        };

        // Cairn patch: the head check, before the body is read (`new_request` reads a small
        // one at once) and so before anything after it can be parsed as the next request
        if let Some(refusal) = self.head_check.and_then(|check| check(&headers)) {
            return Err(ReadError::Refused(version, Refusal(refusal)));
        }

        // building the writer for the request
        let writer = self.sink.next().unwrap();

        // follow-up for next potential request
        let mut data_source = self.source.next().unwrap();
        std::mem::swap(&mut self.next_header_source, &mut data_source);

        // building the next reader
        let request = crate::request::new_request(
            self.secure,
            method,
            path,
            version.clone(),
            headers,
            *self.remote_addr.as_ref().unwrap(),
            data_source,
            writer,
        )
        .map_err(|e| {
            use crate::request;
            match e {
                request::RequestCreationError::CreationIoError(e) => ReadError::ReadIoError(e),
                request::RequestCreationError::ExpectationFailed => {
                    ReadError::ExpectationFailed(version)
                }
            }
        })?;

        // return the request
        Ok(request)
    }
}

impl Iterator for ClientConnection {
    type Item = Request;

    /// Blocks until the next Request is available.
    /// Returns None when no new Requests will come from the client.
    fn next(&mut self) -> Option<Request> {
        use crate::{Response, StatusCode};

        // the client sent a "connection: close" header in this previous request
        //  or is using HTTP 1.0, meaning that no new request will come
        if self.no_more_requests {
            return None;
        }

        loop {
            let rq = match self.read() {
                // Cairn patch: a malformed head is answered in the API's error envelope,
                // saying what is wrong, with `Connection: close` (before, an empty 400 or,
                // for a byte outside ASCII, no answer at all)
                Err(ReadError::WrongRequestLine(why)) => {
                    if let Some(writer) = self.sink.next() {
                        malformed_answer(why)
                            .raw_print(writer, HTTPVersion(1, 1), &[], false, None)
                            .ok();
                    }
                    return None; // we don't know where the next request would start,
                                 // se we have to close
                }

                Err(ReadError::WrongHeader(ver, why)) => {
                    if let Some(writer) = self.sink.next() {
                        malformed_answer(why)
                            .raw_print(writer, ver, &[], false, None)
                            .ok();
                    }
                    return None; // we don't know where the next request would start,
                                 // se we have to close
                }

                Err(ReadError::ReadIoError(ref err)) if err.kind() == ErrorKind::TimedOut => {
                    // request timeout
                    let writer = self.sink.next().unwrap();
                    let response = Response::new_empty(StatusCode(408));
                    response
                        .raw_print(writer, HTTPVersion(1, 1), &[], false, None)
                        .ok();
                    return None; // closing the connection
                }

                Err(ReadError::ExpectationFailed(ver)) => {
                    let writer = self.sink.next().unwrap();
                    let response = Response::new_empty(StatusCode(417));
                    response.raw_print(writer, ver, &[], true, None).ok();
                    return None; // TODO: should be recoverable, but needs handling in case of body
                }

                Err(ReadError::Refused(ver, Refusal(response))) => {
                    if let Some(writer) = self.sink.next() {
                        response
                            .with_connection_close()
                            .raw_print(writer, ver, &[], false, None)
                            .ok();
                    }
                    return None; // closing the connection: what follows this head (a body
                                 // whose length is in doubt) is never read as a request
                }

                Err(ReadError::ReadIoError(_)) => return None,

                Ok(rq) => rq,
            };

            // checking HTTP version
            if *rq.http_version() > (1, 1) {
                let writer = self.sink.next().unwrap();
                let response = Response::from_string(
                    "This server only supports HTTP versions 1.0 and 1.1".to_owned(),
                )
                .with_status_code(StatusCode(505));
                response
                    .raw_print(writer, HTTPVersion(1, 1), &[], false, None)
                    .ok();
                continue;
            }

            // updating the status of the connection
            let connection_header = rq
                .headers()
                .iter()
                .find(|h| h.field.equiv("Connection"))
                .map(|h| h.value.as_str());

            let lowercase = connection_header.map(|h| h.to_ascii_lowercase());

            match lowercase {
                Some(ref val) if val.contains("close") => self.no_more_requests = true,
                Some(ref val) if val.contains("upgrade") => self.no_more_requests = true,
                Some(ref val)
                    if !val.contains("keep-alive") && *rq.http_version() == HTTPVersion(1, 0) =>
                {
                    self.no_more_requests = true
                }
                None if *rq.http_version() == HTTPVersion(1, 0) => self.no_more_requests = true,
                _ => (),
            };

            // returning the request
            return Some(rq);
        }
    }
}

/// Parses a "HTTP/1.1" string.
fn parse_http_version(version: &str) -> Result<HTTPVersion, ReadError> {
    let (major, minor) = match version {
        "HTTP/0.9" => (0, 9),
        "HTTP/1.0" => (1, 0),
        "HTTP/1.1" => (1, 1),
        "HTTP/2.0" => (2, 0),
        "HTTP/3.0" => (3, 0),
        _ => return Err(ReadError::WrongRequestLine(BAD_REQUEST_LINE)),
    };

    Ok(HTTPVersion(major, minor))
}

/// Cairn patch: the answer to a malformed head: 400 in the API's error envelope, with
/// `Connection: close` and `Cache-Control: no-store` as every API answer. `why` is one of
/// the constants above (no `"` or `\`, so it is a JSON string as it is).
fn malformed_answer(why: &'static str) -> Response<Cursor<Vec<u8>>> {
    let mut r = Response::from_data(format!(r#"{{"errors":["{why}"]}}"#).into_bytes())
        .with_status_code(400)
        .with_connection_close();
    for (k, v) in [
        (&b"Content-Type"[..], &b"application/json"[..]),
        (&b"Cache-Control"[..], &b"no-store"[..]),
    ] {
        if let Ok(h) = crate::Header::from_bytes(k, v) {
            r.add_header(h);
        }
    }
    r
}

/// Cairn patch: parses a header line as it came. The name must be ASCII (without
/// whitespace, as before); the value may hold bytes outside ASCII (obs-text, which the
/// reference's Go server accepts too), read as UTF-8 with any other byte replaced by U+FFFD:
/// every value this server interprets (token, namespace, lengths, codings) is ASCII, so such
/// a value fails its check there (an unknown token, an invalid length) instead of the
/// connection being dropped. No control character but a tab (a bare CR or LF could end the
/// line for a front end and not here), and only spaces and tabs are trimmed around the
/// value (RFC 9110 5.5: `str::trim` would also take Unicode spaces off, reading
/// `Content-Length: 5\u{a0}` as 5 where a front end refuses it).
fn parse_header_line(line: Vec<u8>, version: &HTTPVersion) -> Result<crate::Header, ReadError> {
    let bad = |why| ReadError::WrongHeader(version.clone(), why);
    if line.iter().any(|&b| (b < b' ' && b != b'\t') || b == 0x7f) {
        return Err(bad(HEADER_CONTROL));
    }
    let colon = line
        .iter()
        .position(|&b| b == b':')
        .ok_or_else(|| bad(BAD_HEADER))?;
    let (name, value) = line.split_at(colon);
    let name = std::str::from_utf8(name)
        .ok()
        .filter(|n| n.is_ascii())
        .ok_or_else(|| bad(HEADER_NAME_NOT_ASCII))?;
    let field = name.parse().map_err(|()| bad(BAD_HEADER))?;
    let value = String::from_utf8_lossy(&value[1..]);
    Ok(crate::Header {
        field,
        value: value.trim_matches([' ', '\t']).to_owned(),
    })
}

/// Parses the request line of the request.
/// eg. GET / HTTP/1.1
fn parse_request_line(line: &str) -> Result<(Method, String, HTTPVersion), ReadError> {
    let mut parts = line.split(' ');

    let method = parts.next().and_then(|w| w.parse().ok());
    let path = parts.next().map(ToOwned::to_owned);
    let version = parts.next().and_then(|w| parse_http_version(w).ok());

    method
        .and_then(|method| Some((method, path?, version?)))
        .ok_or(ReadError::WrongRequestLine(BAD_REQUEST_LINE))
}

#[cfg(test)]
mod test {
    #[test]
    fn test_parse_request_line() {
        let (method, path, ver) = super::parse_request_line("GET /hello HTTP/1.1").unwrap();

        assert!(method == crate::Method::Get);
        assert!(path == "/hello");
        assert!(ver == crate::common::HTTPVersion(1, 1));

        assert!(super::parse_request_line("GET /hello").is_err());
        assert!(super::parse_request_line("qsd qsd qsd").is_err());
    }
}
