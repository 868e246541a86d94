//! The `ldap_filter` target: filter templates, RFC 4514/4515 escaping and the filter and
//! DN parsers.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)] // a broken promise panics: that is the finding

use super::Bytes;
use crate::auth::ldap::config::{LdapConfig, DEFAULT_GROUPFILTER, DEFAULT_USERFILTER};
use crate::auth::ldap::login::Login;
use crate::auth::ldap::{dn, escape, filter, template, LdapDone, LdapEntry, LdapOp, Secret};
use crate::mounts::MountEntry;
use serde_json::json;

/// The LDAP filter templates a login renders the username into.
const USER_TEMPLATES: &[&str] = &[
    DEFAULT_USERFILTER,
    "(&(objectClass=person)({{.UserAttr}}={{.Username}}))",
    "(&({{.UserAttr}}={{.Username}})(!(disabled=TRUE)))",
    "(|({{.UserAttr}}={{ .Username }})(mail={{.Username}}))",
];
const GROUP_TEMPLATES: &[&str] = &[
    DEFAULT_GROUPFILTER,
    "(&(objectClass=group)(member:1.2.840.113556.1.4.1941:={{.UserDN}}))",
    "(&(objectClass=posixGroup)(memberUid={{.Username}}))",
];

fn entry_values<'a>(pairs: &'a [(&'a str, String)]) -> impl Fn(&str) -> Vec<String> + 'a {
    move |a: &str| {
        pairs
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(a))
            .map(|(_, v)| v.clone())
            .collect()
    }
}

fn ldap_mount() -> MountEntry {
    // Through serde, so fields added later with defaults need no change here.
    let v = json!({
        "path": "ldap/", "type": "ldap", "description": "", "uuid": "fuzz",
        "accessor": "auth_ldap_fuzz", "local": false,
    });
    match serde_json::from_value(v) {
        Ok(m) => m,
        Err(e) => panic!("mount entry: {e}"),
    }
}

/// LDAP filter template rendering and RFC 4514/4515 escaping. Property: for any username
/// (and user DN the directory returns), the filters a login sends parse, and the user
/// filter matches exactly the entries whose `userattr` value is the literal username
/// (compared case-insensitively, as the directory does), nothing else; the group filter
/// matches the literal DN and username only. Arbitrary templates, filters and DNs never
/// panic the parsers.
pub fn ldap_filter(data: &[u8]) {
    let mut b = Bytes::new(data);
    let flags = b.byte();
    let username = b.string();
    let other = b.string();
    let user_dn_value = b.string();
    let tail = b.rest();
    let text = String::from_utf8_lossy(tail);

    // Parsers on arbitrary text.
    let _ = filter::parse(&text).map(|f| f.matches(&|_: &str| vec![username.clone()]));
    let _ = dn::parse(&text);
    let _ = dn::normalize(&text);
    let _ = dn::group_name(&text);
    if let Ok(t) = template::parse(&text, crate::auth::ldap::config::USER_FIELDS) {
        let _ = filter::parse(&t.render(&[
            ("UserAttr", "uid"),
            ("Username", &escape::filter_value(&username)),
        ]));
    }

    // Escaping round trips.
    let f = format!("(uid={})", escape::filter_value(&username));
    match filter::parse(&f) {
        Ok(filter::Filter::Eq(a, v)) => {
            assert!(a == "uid" && v == username.as_bytes(), "{f:?}")
        }
        other => panic!("escaped username {username:?} gave {f:?} = {other:?}"),
    }
    if !username.is_empty() {
        let full = format!("cn={},dc=example", escape::dn_value(&username));
        let rdns = dn::parse(&full).unwrap_or_else(|e| panic!("{full:?}: {e}"));
        assert!(
            rdns.len() == 2 && rdns[0] == vec![("cn".to_string(), username.clone())],
            "{full:?} parsed as {rdns:?}"
        );
    }

    // The filters of a real login.
    let attrs = ["uid", "cn", "sAMAccountName"];
    let userattr = attrs[usize::from(flags % 3)];
    let upn = flags & 0x80 != 0;
    let cfg = LdapConfig {
        binddn: "cn=admin,dc=example".into(),
        bindpass: Secret::new("adminpw"),
        userdn: "ou=people,dc=example".into(),
        groupdn: "ou=groups,dc=example".into(),
        userattr: userattr.into(),
        userfilter: USER_TEMPLATES[usize::from(flags >> 2) % USER_TEMPLATES.len()].into(),
        groupfilter: GROUP_TEMPLATES[usize::from(flags >> 4) % GROUP_TEMPLATES.len()].into(),
        upndomain: if upn {
            "example.com".into()
        } else {
            String::new()
        },
        ..Default::default()
    };
    let user_dn = if user_dn_value.is_empty() {
        format!("{userattr}=x,ou=people,dc=example")
    } else {
        format!(
            "{userattr}={},ou=people,dc=example",
            escape::dn_value(&user_dn_value)
        )
    };
    let (mut login, first) = Login::start(1, ldap_mount(), cfg, &username, "pw", 1, "");
    let mut filters: Vec<(String, String)> = Vec::new();
    let _ = login.run(first, |op, _| match op {
        LdapOp::Connect(_) | LdapOp::ConnectBound { .. } => Ok(LdapDone::Connected {
            url: "ldap://fake".into(),
        }),
        LdapOp::Bind { .. } | LdapOp::CheckBind { .. } => Ok(LdapDone::Bound),
        LdapOp::Search(s) => {
            filters.push((s.base.clone(), s.filter.clone()));
            Ok(LdapDone::Entries(if s.base.starts_with("ou=people") {
                vec![LdapEntry {
                    dn: user_dn.clone(),
                    attrs: Default::default(),
                }]
            } else {
                Vec::new()
            }))
        }
        _ => Ok(LdapDone::Closed),
    });
    let name = if upn {
        format!("{username}@example.com")
    } else {
        username.clone()
    };
    let key = if upn { "userPrincipalName" } else { userattr };
    let fold = |s: &str| s.to_lowercase();
    for (i, (base, text)) in filters.iter().enumerate() {
        let f = filter::parse(text)
            .unwrap_or_else(|e| panic!("login filter {text:?} does not parse: {e}"));
        if i == 0 {
            assert!(base.starts_with("ou=people"), "first search {base:?}");
            // Exactly the literal username matches.
            for cand in [&name, &other, &format!("{name}x"), &"*".to_string()] {
                let entry = [
                    ("objectClass", "person".to_string()),
                    (key, cand.clone()),
                    ("mail", cand.clone()),
                ];
                let m = f.matches(&entry_values(&entry));
                assert_eq!(
                    m,
                    fold(cand) == fold(&name),
                    "user filter {text:?} for {name:?} on {key}={cand:?}"
                );
            }
        } else if base.starts_with("ou=groups") {
            let me = [
                ("objectClass", "group".to_string()),
                ("objectClass", "groupOfNames".to_string()),
                ("objectClass", "posixGroup".to_string()),
                ("member", user_dn.clone()),
                ("memberUid", username.clone()),
            ];
            assert!(f.matches(&entry_values(&me)), "group filter {text:?}");
            let not_me = [
                ("objectClass", "group".to_string()),
                ("objectClass", "posixGroup".to_string()),
                ("member", "cn=someone-else,dc=example".to_string()),
                ("memberUid", format!("{username}-not")),
            ];
            assert!(!f.matches(&entry_values(&not_me)), "group filter {text:?}");
        }
    }
}
