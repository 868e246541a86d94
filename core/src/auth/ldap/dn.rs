//! Parsing of distinguished names (RFC 4514 string form): used to take the first `cn` of a
//! group DN (a `memberOf` value, a group entry's own DN) and, in the fake directory, to
//! compare DNs the way a server does.

/// One RDN: its attribute type/value pairs (more than one when joined with `+`).
pub type Rdn = Vec<(String, String)>;

/// Parses a DN into its RDNs, most specific first. Attribute types keep their spelling;
/// values are unescaped. A value written as `#hex` (BER) is kept as written.
pub fn parse(dn: &str) -> Result<Vec<Rdn>, String> {
    let b = dn.as_bytes();
    let mut i = 0;
    let mut out: Vec<Rdn> = Vec::new();
    skip_spaces(b, &mut i);
    if i == b.len() {
        return Ok(out);
    }
    let mut rdn: Rdn = Vec::new();
    loop {
        skip_spaces(b, &mut i);
        let start = i;
        while i < b.len() && b[i] != b'=' {
            i += 1;
        }
        if i == b.len() {
            return Err(format!(
                "missing '=' after attribute type at offset {start}"
            ));
        }
        let ty = dn[start..i].trim();
        if !valid_type(ty) {
            return Err(format!("invalid attribute type {ty:?}"));
        }
        i += 1; // '='
        let value = parse_value(dn, &mut i)?;
        rdn.push((ty.to_string(), value));
        if i == b.len() {
            out.push(std::mem::take(&mut rdn));
            return Ok(out);
        }
        match b[i] {
            b'+' => {}
            b',' | b';' => out.push(std::mem::take(&mut rdn)),
            c => return Err(format!("unexpected {:?} at offset {i}", c as char)),
        }
        i += 1;
    }
}

fn skip_spaces(b: &[u8], i: &mut usize) {
    while *i < b.len() && b[*i] == b' ' {
        *i += 1;
    }
}

fn valid_type(t: &str) -> bool {
    let mut chars = t.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() => chars.all(|c| c.is_ascii_alphanumeric() || c == '-'),
        Some(c) if c.is_ascii_digit() => {
            !t.ends_with('.')
                && !t.contains("..")
                && t.chars().all(|c| c.is_ascii_digit() || c == '.')
        }
        _ => false,
    }
}

/// Reads one attribute value up to an unescaped `,`, `;`, `+` or the end.
fn parse_value(dn: &str, i: &mut usize) -> Result<String, String> {
    let b = dn.as_bytes();
    skip_spaces(b, i);
    if *i < b.len() && b[*i] == b'#' {
        let start = *i;
        *i += 1;
        while *i < b.len() && b[*i].is_ascii_hexdigit() {
            *i += 1;
        }
        let v = dn[start..*i].to_string();
        skip_spaces(b, i);
        return Ok(v);
    }
    let mut bytes: Vec<u8> = Vec::new();
    // Length of `bytes` up to the last escaped byte: trailing spaces after it are kept.
    let mut keep = 0;
    while *i < b.len() {
        let c = b[*i];
        match c {
            b',' | b';' | b'+' => break,
            b'\\' => {
                let n1 = *b.get(*i + 1).ok_or("dangling '\\' at end of DN")?;
                if n1.is_ascii_hexdigit() {
                    let n2 = *b.get(*i + 2).ok_or("truncated hex escape in DN")?;
                    if !n2.is_ascii_hexdigit() {
                        return Err(format!("invalid hex escape at offset {}", *i));
                    }
                    bytes.push(hex(n1) << 4 | hex(n2));
                    *i += 3;
                } else if matches!(
                    n1,
                    b' ' | b'"' | b'#' | b'+' | b',' | b';' | b'<' | b'=' | b'>' | b'\\'
                ) {
                    bytes.push(n1);
                    *i += 2;
                } else {
                    return Err(format!("invalid escape at offset {}", *i));
                }
                keep = bytes.len();
            }
            b'"' | b'<' | b'>' | 0 => {
                return Err(format!("unescaped {:?} in DN value", c as char));
            }
            _ => {
                bytes.push(c);
                *i += 1;
                if c != b' ' {
                    keep = bytes.len();
                }
            }
        }
    }
    bytes.truncate(keep);
    String::from_utf8(bytes).map_err(|_| "DN value is not valid UTF-8".to_string())
}

fn hex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => c - b'A' + 10,
    }
}

/// The first `cn` value of a DN, or `None` when `s` is not a DN or has no `cn`.
pub fn first_cn(s: &str) -> Option<String> {
    parse(s).ok()?.into_iter().flatten().find_map(|(t, v)| {
        if t.eq_ignore_ascii_case("cn") {
            Some(v)
        } else {
            None
        }
    })
}

/// The group name a value stands for: its first `cn` when it is a DN with one, else the
/// value itself (already a plain name).
pub fn group_name(value: &str) -> String {
    first_cn(value).unwrap_or_else(|| value.to_string())
}

/// A canonical form for comparing DNs: types and values lower-cased, no spaces around
/// separators. `None` when `s` is not a DN.
pub fn normalize(s: &str) -> Option<String> {
    let rdns = parse(s).ok()?;
    let parts: Vec<String> = rdns
        .into_iter()
        .map(|mut rdn| {
            rdn.sort();
            rdn.into_iter()
                .map(|(t, v)| {
                    format!(
                        "{}={}",
                        t.to_ascii_lowercase(),
                        crate::auth::ldap::escape::dn_value(&v.to_lowercase())
                    )
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    Some(parts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_escapes_and_multivalued_rdns() {
        let r = parse("cn=o'brien\\, jr\\+x#\\=\\\\*+uid=7, ou=people ,dc=example").unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(r[0][0], ("cn".into(), "o'brien, jr+x#=\\*".into()));
        assert_eq!(r[0][1], ("uid".into(), "7".into()));
        assert_eq!(r[1], vec![("ou".into(), "people".into())]);
        assert_eq!(
            parse("cn=Zo\\c3\\ab").unwrap()[0][0].1,
            "Zoë",
            "hex pairs decode as UTF-8"
        );
        assert_eq!(parse("").unwrap().len(), 0);
        assert!(parse("admins").is_err());
        assert!(parse("cn=a\\").is_err());
    }

    #[test]
    fn first_cn_of_dns_and_plain_names() {
        assert_eq!(group_name("cn=Admins,ou=groups,dc=x"), "Admins");
        assert_eq!(group_name("CN=Ops Team,OU=g"), "Ops Team");
        assert_eq!(group_name("ou=g,dc=x"), "ou=g,dc=x");
        assert_eq!(group_name("admins"), "admins");
        assert_eq!(group_name("uid=a+cn=b,dc=x"), "b");
    }

    #[test]
    fn normalizes_case_and_spacing() {
        assert_eq!(
            normalize("CN=Alice , OU=People,dc=Example"),
            normalize("cn=alice,ou=people,dc=example")
        );
        assert_eq!(normalize("not a dn"), None);
    }
}
