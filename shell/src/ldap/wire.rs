//! What goes over the wire to a directory and what comes back, in ldap3's terms: a search
//! (with the paged results control and alias dereferencing when asked), its entries turned
//! into the core's [`LdapEntry`], and ldap3's errors and result codes classified into the
//! core's [`LdapFailure`] kinds (what a login reports to the user).

use super::*;

pub(super) fn search(c: &mut Conn, spec: &SearchSpec) -> Result<LdapDone, LdapFailure> {
    let scope = match spec.scope {
        Scope::Base => ldap3::Scope::Base,
        Scope::One => ldap3::Scope::OneLevel,
        Scope::Sub => ldap3::Scope::Subtree,
    };
    let deref = match spec.deref {
        Deref::Never => DerefAliases::Never,
        Deref::Finding => DerefAliases::Finding,
        Deref::Searching => DerefAliases::Searching,
        Deref::Always => DerefAliases::Always,
    };
    let attrs: Vec<String> = spec.attrs.clone();
    // Read at most one entry past the core's limit: enough for it to refuse the search with
    // a clear error, without holding an unbounded result in memory.
    let cap = cairn_core::auth::ldap::login::MAX_SEARCH_ENTRIES + 1;
    let ldap = c.ldap.with_search_options(
        SearchOptions::new()
            .deref(deref)
            .sizelimit(i32::try_from(cap).unwrap_or(i32::MAX)),
    );
    let ldap = match c.timeout {
        Some(t) => ldap.with_timeout(t),
        None => ldap,
    };
    let mut out = Vec::new();
    if spec.page_size > 0 {
        let size = i32::try_from(spec.page_size).unwrap_or(i32::MAX);
        let adapters: Vec<Box<dyn Adapter<String, Vec<String>>>> = vec![
            Box::new(EntriesOnly::new()),
            Box::new(PagedResults::new(size)),
        ];
        let mut stream = ldap
            .streaming_search_with(adapters, &spec.base, scope, &spec.filter, attrs)
            .map_err(|e| classify(&e))?;
        loop {
            match stream.next() {
                Ok(Some(e)) => {
                    out.push(entry(SearchEntry::construct(e)));
                    if out.len() >= cap {
                        // Stop reading: finish the stream handle, then abandon the search
                        // on the server.
                        let id = stream.last_id();
                        let _ = stream.result();
                        let _ = c.ldap.abandon(id);
                        return Ok(LdapDone::Entries(out));
                    }
                }
                Ok(None) => break,
                Err(e) => return Err(classify(&e)),
            }
        }
        stream.result().success().map_err(|e| classify(&e))?;
    } else {
        let res = ldap
            .search(&spec.base, scope, &spec.filter, attrs)
            .map_err(|e| classify(&e))?;
        // sizeLimitExceeded (4) with the cap reached: hand the capped entries to the core,
        // which refuses the search; any other non-success code is an error.
        let entries = if res.1.rc == 4 && res.0.len() >= cap {
            res.0
        } else {
            res.success().map_err(|e| classify(&e))?.0
        };
        // Search references (continuation referrals: Active Directory returns them next
        // to the entries of a subtree search from the domain root, naming the
        // Configuration and DNS partitions) are not followed: the entries found are the
        // answer. Intermediate responses are skipped likewise.
        out.extend(
            entries
                .into_iter()
                .filter(|e| !e.is_ref() && !e.is_intermediate())
                .map(|e| entry(SearchEntry::construct(e))),
        );
    }
    Ok(LdapDone::Entries(out))
}

/// The core's entry: the text attributes, and the binary values of SID attributes
/// (`objectSid`, `tokenGroups`) in their string form `S-1-5-...`; other binary values are
/// dropped (no configured attribute of the core's is binary).
fn entry(e: SearchEntry) -> LdapEntry {
    let mut attrs = BTreeMap::new();
    let mut bin_attrs = e.bin_attrs;
    for (name, values) in e.attrs {
        if ad::is_sid_attribute(&name) {
            // ldap3 keeps an attribute whose values all happen to be valid UTF-8 (a SID
            // may be) as text: these are binary SIDs all the same.
            bin_attrs
                .entry(name)
                .or_default()
                .extend(values.into_iter().map(String::into_bytes));
        } else {
            attrs.insert(name, values);
        }
    }
    for (name, values) in bin_attrs {
        if !ad::is_sid_attribute(&name) {
            continue;
        }
        let sids: Vec<String> = values.iter().filter_map(|v| ad::sid_to_string(v)).collect();
        if !sids.is_empty() {
            attrs.entry(name).or_default().extend(sids);
        }
    }
    LdapEntry { dn: e.dn, attrs }
}

/// Names of common LDAP result codes (RFC 4511 appendix A).
fn rc_name(rc: u32) -> &'static str {
    match rc {
        1 => "operationsError",
        2 => "protocolError",
        3 => "timeLimitExceeded",
        4 => "sizeLimitExceeded",
        7 => "authMethodNotSupported",
        8 => "strongerAuthRequired",
        11 => "adminLimitExceeded",
        13 => "confidentialityRequired",
        32 => "noSuchObject",
        34 => "invalidDNSyntax",
        48 => "inappropriateAuthentication",
        49 => "invalidCredentials",
        50 => "insufficientAccessRights",
        51 => "busy",
        52 => "unavailable",
        53 => "unwillingToPerform",
        80 => "other",
        _ => "error",
    }
}

/// Turns an ldap3 error into a failure the core understands.
pub(super) fn classify(e: &LdapError) -> LdapFailure {
    match e {
        LdapError::LdapResult { result } => {
            let kind = match result.rc {
                49 => FailKind::InvalidCredentials,
                4 => FailKind::SizeLimit,
                3 => FailKind::Timeout,
                _ => FailKind::Ldap,
            };
            let mut msg = format!("LDAP result code {} ({})", result.rc, rc_name(result.rc));
            if !result.text.is_empty() {
                msg.push_str(": ");
                msg.push_str(&result.text);
            }
            LdapFailure::new(kind, Some(result.rc), msg)
        }
        LdapError::Io { source } => {
            if let Some(t) = source
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            {
                return LdapFailure::new(FailKind::Tls, None, format!("TLS handshake failed: {t}"));
            }
            LdapFailure::new(FailKind::Connect, None, source.to_string())
        }
        LdapError::Rustls { source } => {
            LdapFailure::new(FailKind::Tls, None, format!("TLS error: {source}"))
        }
        LdapError::DNSName { source } => LdapFailure::new(
            FailKind::Tls,
            None,
            format!("the host is not a valid TLS server name: {source}"),
        ),
        LdapError::Timeout { .. } => LdapFailure::new(FailKind::Timeout, None, "timed out"),
        LdapError::FilterParsing => {
            LdapFailure::new(FailKind::Ldap, None, "the search filter does not parse")
        }
        LdapError::UrlParsing { .. } | LdapError::UnknownScheme(_) => {
            LdapFailure::new(FailKind::Connect, None, e.to_string())
        }
        LdapError::OpSend { .. }
        | LdapError::ResultRecv { .. }
        | LdapError::EndOfStream
        | LdapError::IdScrubSend { .. }
        | LdapError::MiscSend { .. } => {
            LdapFailure::new(FailKind::Connect, None, "the connection was closed")
        }
        other => LdapFailure::new(FailKind::Ldap, None, other.to_string()),
    }
}

#[cfg(test)]
mod entry_tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn sid_values_become_strings_whether_ldap3_kept_them_as_text_or_bytes() {
        // S-1-5-32-545 is valid UTF-8 byte for byte; a domain SID usually is not.
        let builtin = ad::sid_from_string("S-1-5-32-545").unwrap();
        let domain = ad::sid_from_string("S-1-5-21-4294967295-1-2-1101").unwrap();
        let e = SearchEntry {
            dn: "CN=alice,CN=Users,DC=cairn,DC=test".into(),
            attrs: HashMap::from([
                (
                    "tokenGroups".to_string(),
                    vec![String::from_utf8(builtin).unwrap()],
                ),
                ("cn".to_string(), vec!["alice".to_string()]),
            ]),
            bin_attrs: HashMap::from([
                ("tokenGroups".to_string(), vec![domain]),
                ("thumbnailPhoto".to_string(), vec![vec![0xff, 0xd8]]),
            ]),
        };
        let got = entry(e);
        let mut tg = got.attrs["tokenGroups"].clone();
        tg.sort();
        assert_eq!(tg, ["S-1-5-21-4294967295-1-2-1101", "S-1-5-32-545"]);
        assert_eq!(got.attrs["cn"], ["alice"]);
        assert!(!got.attrs.contains_key("thumbnailPhoto"));
    }
}
