//! Address resolution for the cluster channel's outbound calls.
//!
//! ureq resolves a call's host before it looks for a pooled connection, and with a timeout
//! set (the cluster agents set one) its default resolver starts a thread for every lookup, so
//! that the lookup can be abandoned. A secondary pulls its primary's WAL many times a second,
//! so that was a thread started and ended per pull (about 1.5 a second on a busy secondary,
//! five thousand an hour), each with its own stack and allocator heap. Cluster addresses are
//! IP addresses as a rule (`cluster_addr`, the addresses a primary lists): [`LiteralResolver`]
//! takes those as they are, with no thread and no lookup, and leaves host names to ureq's
//! resolver as before.

use std::net::{IpAddr, SocketAddr};
use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// Takes an IP address in the URL as it is; resolves host names with ureq's resolver.
#[derive(Debug, Default)]
pub struct LiteralResolver {
    names: DefaultResolver,
}

impl Resolver for LiteralResolver {
    fn resolve(
        &self,
        uri: &Uri,
        config: &Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        match literal_addr(uri) {
            Some(addr) => {
                let mut out = self.empty();
                out.push(addr);
                Ok(out)
            }
            None => self.names.resolve(uri, config, timeout),
        }
    }
}

/// The socket address of a URL whose host is an IP address (IPv6 in brackets); the port
/// defaults by scheme. `None` for a host name or an unknown scheme without a port.
pub fn literal_addr(uri: &Uri) -> Option<SocketAddr> {
    let authority = uri.authority()?;
    let host = authority.host();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let ip: IpAddr = host.parse().ok()?;
    let port = match (authority.port_u16(), uri.scheme_str()) {
        (Some(p), _) => p,
        (None, Some("https")) => 443,
        (None, Some("http")) => 80,
        (None, _) => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// An agent of `config` that resolves with [`LiteralResolver`] and marks the errors of
/// connecting ([`crate::connecting`]).
pub fn agent(config: Config) -> ureq::Agent {
    ureq::Agent::with_parts(
        config,
        crate::connecting::Connecting::default(),
        LiteralResolver::default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ureq::unversioned::transport::time::Duration;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    #[test]
    fn ip_addresses_are_taken_as_they_are() {
        assert_eq!(
            literal_addr(&uri("https://127.0.0.1:8201/v1/cluster/replication")),
            Some("127.0.0.1:8201".parse().unwrap())
        );
        assert_eq!(
            literal_addr(&uri("http://[::1]:8201/x")),
            Some("[::1]:8201".parse().unwrap())
        );
        assert_eq!(
            literal_addr(&uri("https://10.0.0.7/x")),
            Some("10.0.0.7:443".parse().unwrap())
        );
        assert_eq!(
            literal_addr(&uri("http://10.0.0.7/x")),
            Some("10.0.0.7:80".parse().unwrap())
        );
        assert_eq!(literal_addr(&uri("https://node-2.example:8201/x")), None);
        assert_eq!(literal_addr(&uri("https://localhost:8201/x")), None);
    }

    /// An IP address needs no lookup: it resolves even when the deadline has passed, which
    /// fails any lookup; a name is still looked up.
    #[test]
    fn an_ip_address_resolves_without_a_lookup() {
        let config = Config::default();
        let r = LiteralResolver::default();
        let expired = NextTimeout {
            after: Duration::from_millis(0),
            reason: ureq::Timeout::Resolve,
            ..Default::default()
        };
        let got = r
            .resolve(&uri("https://127.0.0.1:8201/x"), &config, expired)
            .unwrap();
        assert_eq!(&got[..], &["127.0.0.1:8201".parse::<SocketAddr>().unwrap()]);
        let ample = NextTimeout {
            after: Duration::from_secs(10),
            reason: ureq::Timeout::Resolve,
            ..Default::default()
        };
        let name = r
            .resolve(&uri("http://localhost:8201/x"), &config, ample)
            .unwrap();
        assert!(name
            .iter()
            .all(|a| a.ip().is_loopback() && a.port() == 8201));
    }
}
