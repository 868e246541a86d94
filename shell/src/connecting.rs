//! Which failed cluster calls sent nothing.
//!
//! A standby forwards a client's request to the active node once and never again once it
//! may have left (at most once). A call that failed while its connection was being made
//! (the TCP connect, the TLS handshake) wrote nothing, so it may be tried again, through
//! another route if need be; one that failed later may have been applied. ureq reports both
//! as the same I/O errors (a reset during the handshake looks like a reset after the body),
//! so the cluster agents connect through [`Connecting`], which marks every error of making a
//! connection, and [`while_connecting`] reads the mark.

use std::fmt;
use ureq::unversioned::transport::{ConnectionDetails, Connector, DefaultConnector, Transport};

/// ureq's connector chain (TCP, then TLS), with its errors marked as made while connecting.
#[derive(Debug, Default)]
pub struct Connecting(DefaultConnector);

/// The mark: an error of making a connection.
#[derive(Debug)]
struct WhileConnecting(String);

impl fmt::Display for WhileConnecting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "while connecting: {}", self.0)
    }
}

impl std::error::Error for WhileConnecting {}

impl Connector<()> for Connecting {
    type Out = Box<dyn Transport>;

    fn connect(
        &self,
        details: &ConnectionDetails,
        chained: Option<()>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        self.0.connect(details, chained).map_err(mark)
    }
}

/// `e` marked as an error of connecting (timeouts keep their own kind: ureq names the
/// phase of those itself).
fn mark(e: ureq::Error) -> ureq::Error {
    match e {
        ureq::Error::Timeout(t) => ureq::Error::Timeout(t),
        ureq::Error::Io(io) => {
            let kind = io.kind();
            ureq::Error::Io(std::io::Error::new(kind, WhileConnecting(io.to_string())))
        }
        other => ureq::Error::Io(std::io::Error::other(WhileConnecting(other.to_string()))),
    }
}

/// Whether `e` happened while the call's connection was being made: its request was not
/// written.
pub fn while_connecting(e: &ureq::Error) -> bool {
    match e {
        ureq::Error::Io(io) => io
            .get_ref()
            .is_some_and(|inner| inner.is::<WhileConnecting>()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_of_connecting_are_marked_and_others_are_not() {
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let marked = mark(ureq::Error::Io(reset));
        assert!(while_connecting(&marked));
        assert!(marked.to_string().contains("while connecting"), "{marked}");
        let later = ureq::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(!while_connecting(&later));
        assert!(while_connecting(&mark(ureq::Error::ConnectionFailed)));
        assert!(!while_connecting(&mark(ureq::Error::Timeout(
            ureq::Timeout::Connect
        ))));
    }

    /// A TLS client meeting a listener that is not (yet) TLS fails in the handshake: the
    /// failure is marked, so a forward over it is known not to have been sent.
    #[test]
    fn a_tls_handshake_with_a_plain_listener_fails_while_connecting() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = std::thread::spawn(move || {
            if let Ok((mut sock, _)) = listener.accept() {
                use std::io::{Read, Write};
                let mut buf = [0u8; 512];
                let _ = sock.read(&mut buf);
                let _ = sock.write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n");
            }
        });
        let agent = crate::resolve::agent(
            ureq::Agent::config_builder()
                .timeout_global(Some(std::time::Duration::from_secs(5)))
                .build(),
        );
        let e = agent
            .post(&format!("https://{addr}/v1/cluster/forward"))
            .send(&b"{}"[..])
            .expect_err("no TLS there");
        assert!(while_connecting(&e), "{e:?}");
        let _ = server.join();
    }
}
