//! Escaping of user input for LDAP: values inside search filters (RFC 4515) and attribute
//! values inside distinguished names (RFC 4514). The login username goes through one of
//! these before it reaches the directory, so a name made of metacharacters can never change
//! the shape of a filter or a DN.

/// Escapes a value for use inside a search filter (RFC 4515 section 3): `*`, `(`, `)`,
/// `\`, NUL and every byte outside ASCII become `\xx` (lower-case hex).
pub fn filter_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b == b'*' || b == b'(' || b == b')' || b == b'\\' || b == 0 || b > 0x7f {
            out.push('\\');
            out.push(hex_digit(b >> 4));
            out.push(hex_digit(b & 0x0f));
        } else {
            out.push(b as char);
        }
    }
    out
}

fn hex_digit(n: u8) -> char {
    char::from(b"0123456789abcdef"[usize::from(n & 0x0f)])
}

/// Escapes an attribute value for use inside a DN (RFC 4514 section 2.4): `"`, `+`, `,`,
/// `;`, `<`, `>`, `\`, `=` and `#` are backslash-escaped wherever they occur (the last two
/// so Active Directory reads them literally too), a leading or trailing space is escaped,
/// NUL becomes `\00`. Other characters, including non-ASCII, are kept as UTF-8.
pub fn dn_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    let n = s.chars().count();
    for (i, c) in s.chars().enumerate() {
        match c {
            '"' | '+' | ',' | ';' | '<' | '>' | '\\' | '=' | '#' => {
                out.push('\\');
                out.push(c);
            }
            ' ' if i == 0 || i + 1 == n => out.push_str("\\ "),
            '\0' => out.push_str("\\00"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::ldap::dn;
    use crate::auth::ldap::filter::{self, Filter};
    use quickcheck::quickcheck;

    #[test]
    fn filter_escapes_metacharacters() {
        assert_eq!(filter_value("a*b(c)d\\e\0"), "a\\2ab\\28c\\29d\\5ce\\00");
        assert_eq!(filter_value("é"), "\\c3\\a9");
        assert_eq!(filter_value("plain-name.1"), "plain-name.1");
    }

    #[test]
    fn dn_escapes_specials() {
        assert_eq!(
            dn_value("o'brien, jr+x#=\\*"),
            "o'brien\\, jr\\+x\\#\\=\\\\*"
        );
        assert_eq!(dn_value(" lead"), "\\ lead");
        assert_eq!(dn_value("trail "), "trail\\ ");
        assert_eq!(dn_value("#x"), "\\#x");
        assert_eq!(dn_value("Zoë"), "Zoë");
    }

    quickcheck! {
        /// Any username placed in a DN parses back to exactly itself, in one RDN.
        fn dn_round_trips(s: String) -> bool {
            if s.is_empty() {
                return true;
            }
            let full = format!("cn={},ou=people,dc=example", dn_value(&s));
            match dn::parse(&full) {
                Ok(rdns) => {
                    rdns.len() == 3
                        && rdns[0].len() == 1
                        && rdns[0][0].0 == "cn"
                        && rdns[0][0].1 == s
                        && rdns[1] == vec![("ou".to_string(), "people".to_string())]
                }
                Err(_) => false,
            }
        }

        /// Any username placed in a filter is one equality assertion on exactly its bytes.
        fn filter_round_trips(s: String) -> bool {
            let f = format!("(uid={})", filter_value(&s));
            matches!(filter::parse(&f), Ok(Filter::Eq(a, v)) if a == "uid" && v == s.as_bytes())
        }

        /// The escaped filter value contains no character that could open, close or
        /// widen an assertion.
        fn filter_has_no_bare_metacharacters(s: String) -> bool {
            let e = filter_value(&s);
            let b = e.as_bytes();
            let mut i = 0;
            while i < b.len() {
                match b[i] {
                    b'*' | b'(' | b')' | 0 => return false,
                    b'\\' => {
                        if i + 2 >= b.len() {
                            return false;
                        }
                        if !(b[i + 1].is_ascii_hexdigit() && b[i + 2].is_ascii_hexdigit()) {
                            return false;
                        }
                        i += 3;
                    }
                    _ => i += 1,
                }
            }
            true
        }

        /// Distinct usernames never produce the same escaped form.
        fn escaping_is_injective(a: String, b: String) -> bool {
            (a == b) == (dn_value(&a) == dn_value(&b))
                && (a == b) == (filter_value(&a) == filter_value(&b))
        }
    }
}
