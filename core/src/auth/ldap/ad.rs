//! Active Directory specifics: security identifiers (SIDs) in their binary form (the values
//! of `objectSid` and `tokenGroups`) and their string form `S-1-5-21-...`, and the reasons
//! behind AD's refusals of a bind (the `data XXX` code in the diagnostic message).

/// Longest SID: revision, count, 6-byte authority and at most 15 sub-authorities.
pub const MAX_SUB_AUTHORITIES: usize = 15;

/// The string form (`S-1-5-21-1-2-3-513`) of a binary SID, or `None` when `b` is not one:
/// revision 1, a count of sub-authorities, a 48-bit big-endian authority, then that many
/// 32-bit little-endian sub-authorities, and nothing after them.
pub fn sid_to_string(b: &[u8]) -> Option<String> {
    if b.len() < 8 || b[0] != 1 {
        return None;
    }
    let n = usize::from(b[1]);
    if n > MAX_SUB_AUTHORITIES || b.len() != 8 + 4 * n {
        return None;
    }
    let authority = b[2..8]
        .iter()
        .fold(0u64, |acc, &x| (acc << 8) | u64::from(x));
    let mut s = format!("S-1-{authority}");
    for i in 0..n {
        let o = 8 + 4 * i;
        let sub = u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        s.push('-');
        s.push_str(&sub.to_string());
    }
    Some(s)
}

/// The binary form of a SID in string form, or `None` when `s` is not one.
pub fn sid_from_string(s: &str) -> Option<Vec<u8>> {
    let rest = s.strip_prefix("S-1-").or_else(|| s.strip_prefix("s-1-"))?;
    let mut parts = rest.split('-');
    let authority: u64 = parse_decimal(parts.next()?)?;
    if authority >= 1 << 48 {
        return None;
    }
    let subs: Vec<u32> = parts
        .map(|p| parse_decimal(p).and_then(|v| u32::try_from(v).ok()))
        .collect::<Option<_>>()?;
    if subs.len() > MAX_SUB_AUTHORITIES {
        return None;
    }
    let mut out = vec![1u8, subs.len() as u8];
    out.extend_from_slice(&authority.to_be_bytes()[2..]);
    for s in subs {
        out.extend_from_slice(&s.to_le_bytes());
    }
    Some(out)
}

/// Digits only (no sign, no leading `+`), at most 20 of them.
fn parse_decimal(p: &str) -> Option<u64> {
    if p.is_empty() || p.len() > 20 || !p.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    p.parse().ok()
}

/// Attributes whose binary values are SIDs: the shell hands them to the core in string form.
pub fn is_sid_attribute(name: &str) -> bool {
    [
        "objectSid",
        "tokenGroups",
        "tokenGroupsGlobalAndUniversal",
        "tokenGroupsNoGCAcceptable",
    ]
    .iter()
    .any(|a| a.eq_ignore_ascii_case(name))
}

/// Why Active Directory refused a bind, from the `data XXX` code of its diagnostic message
/// (`80090308: LdapErr: DSID-0C0903A9, comment: AcceptSecurityContext error, data 52e,
/// v1db1`). For the server's log only: the client gets the same answer for every one.
pub fn bind_refusal(message: &str) -> Option<(&'static str, &'static str)> {
    let i = message.find("data ")?;
    let code: String = message[i + 5..]
        .chars()
        .take_while(|c| c.is_ascii_hexdigit())
        .collect::<String>()
        .to_ascii_lowercase();
    REFUSALS.iter().find(|(c, _)| *c == code).copied()
}

/// AD's `data` codes of a refused bind and what each means.
pub const REFUSALS: &[(&str, &str)] = &[
    ("525", "user not found"),
    (
        "52e",
        "invalid credentials (wrong password or unknown user)",
    ),
    ("530", "not permitted to log on at this time"),
    ("531", "not permitted to log on at this workstation"),
    ("532", "password expired"),
    ("533", "account disabled"),
    ("568", "too many security identifiers in the user's token"),
    ("701", "account expired"),
    ("773", "user must change password"),
    ("775", "account locked out"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::quickcheck;

    #[test]
    fn known_sids_format_and_parse() {
        // S-1-5-32-544 (BUILTIN\Administrators).
        let b = [1u8, 2, 0, 0, 0, 0, 0, 5, 32, 0, 0, 0, 0x20, 2, 0, 0];
        assert_eq!(sid_to_string(&b).unwrap(), "S-1-5-32-544");
        assert_eq!(sid_from_string("S-1-5-32-544").unwrap(), b);
        let d = "S-1-5-21-3623811015-3361044348-30300820-1013";
        assert_eq!(sid_to_string(&sid_from_string(d).unwrap()).unwrap(), d);
        // Everyone: no sub-authority besides 0.
        assert_eq!(
            sid_to_string(&sid_from_string("S-1-1-0").unwrap()).unwrap(),
            "S-1-1-0"
        );
    }

    #[test]
    fn malformed_sids_are_refused() {
        assert_eq!(sid_to_string(&[]), None);
        assert_eq!(sid_to_string(&[2, 0, 0, 0, 0, 0, 0, 5]), None);
        assert_eq!(sid_to_string(&[1, 1, 0, 0, 0, 0, 0, 5]), None);
        assert_eq!(sid_to_string(&[1, 0, 0, 0, 0, 0, 0, 5, 0]), None);
        for s in [
            "",
            "S-1",
            "S-2-5",
            "S-1-x",
            "S-1-5-4294967296",
            "S-1-5--1",
            "S-1-5-+1",
            "S-1-281474976710656",
            "S-1-5-1-2-3-4-5-6-7-8-9-10-11-12-13-14-15-16",
        ] {
            assert_eq!(sid_from_string(s), None, "{s}");
        }
    }

    quickcheck! {
        fn sid_round_trip(authority: u64, subs: Vec<u32>) -> bool {
            let authority = authority % (1 << 48);
            let subs: Vec<u32> = subs.into_iter().take(MAX_SUB_AUTHORITIES).collect();
            let mut s = format!("S-1-{authority}");
            for x in &subs {
                s.push_str(&format!("-{x}"));
            }
            let b = sid_from_string(&s).unwrap();
            b.len() == 8 + 4 * subs.len() && sid_to_string(&b).as_deref() == Some(s.as_str())
        }

        fn binary_round_trip(b: Vec<u8>) -> bool {
            match sid_to_string(&b) {
                Some(s) => sid_from_string(&s) == Some(b),
                None => true,
            }
        }
    }

    #[test]
    fn bind_refusals_are_named() {
        let m = |c: &str| {
            format!("LDAP result code 49 (invalidCredentials): 80090308: LdapErr: DSID-0C0903A9, comment: AcceptSecurityContext error, data {c}, v1db1")
        };
        assert_eq!(bind_refusal(&m("52e")).unwrap().0, "52e");
        assert_eq!(
            bind_refusal(&m("773")).unwrap().1,
            "user must change password"
        );
        assert_eq!(bind_refusal(&m("533")).unwrap().1, "account disabled");
        assert_eq!(bind_refusal(&m("775")).unwrap().1, "account locked out");
        assert_eq!(bind_refusal(&m("701")).unwrap().1, "account expired");
        assert_eq!(bind_refusal(&m("532")).unwrap().1, "password expired");
        assert_eq!(bind_refusal("invalid credentials"), None);
        assert_eq!(bind_refusal(&m("999")), None);
    }
}
