//! Search filters (RFC 4515 string form): a parser into a small AST, used to refuse a
//! configured `userfilter`/`groupfilter` that would not render into a valid filter, and an
//! evaluator the fake directory uses to answer searches.

/// A parsed filter. Assertion values are raw bytes (escapes decoded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    And(Vec<Filter>),
    Or(Vec<Filter>),
    Not(Box<Filter>),
    Eq(String, Vec<u8>),
    Present(String),
    Substring {
        attr: String,
        initial: Option<Vec<u8>>,
        any: Vec<Vec<u8>>,
        last: Option<Vec<u8>>,
    },
    Ge(String, Vec<u8>),
    Le(String, Vec<u8>),
    Approx(String, Vec<u8>),
    Extensible {
        attr: Option<String>,
        rule: Option<String>,
        dn_attrs: bool,
        value: Vec<u8>,
    },
}

/// Active Directory's LDAP_MATCHING_RULE_IN_CHAIN (transitive `member`/`memberOf`).
pub const IN_CHAIN: &str = "1.2.840.113556.1.4.1941";

/// Parses a complete filter; it must be parenthesised and nothing may follow it.
pub fn parse(s: &str) -> Result<Filter, String> {
    let mut p = Parser {
        b: s.as_bytes(),
        i: 0,
        depth: 0,
    };
    let f = p.filter()?;
    if p.i != p.b.len() {
        return Err(format!(
            "unexpected text after the filter at offset {}",
            p.i
        ));
    }
    Ok(f)
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        match self.peek() {
            Some(x) if x == c => {
                self.i += 1;
                Ok(())
            }
            Some(x) => Err(format!(
                "expected {:?} at offset {}, found {:?}",
                c as char, self.i, x as char
            )),
            None => Err(format!("expected {:?} at end of filter", c as char)),
        }
    }

    fn filter(&mut self) -> Result<Filter, String> {
        self.depth += 1;
        if self.depth > 64 {
            return Err("filter nested too deeply".into());
        }
        self.expect(b'(')?;
        let f = match self.peek() {
            Some(b'&') => {
                self.i += 1;
                Filter::And(self.list()?)
            }
            Some(b'|') => {
                self.i += 1;
                Filter::Or(self.list()?)
            }
            Some(b'!') => {
                self.i += 1;
                Filter::Not(Box::new(self.filter()?))
            }
            Some(_) => self.item()?,
            None => return Err("unexpected end of filter".into()),
        };
        self.expect(b')')?;
        self.depth -= 1;
        Ok(f)
    }

    fn list(&mut self) -> Result<Vec<Filter>, String> {
        let mut v = Vec::new();
        while self.peek() == Some(b'(') {
            v.push(self.filter()?);
        }
        Ok(v)
    }

    fn attr_desc(&mut self) -> Result<String, String> {
        let start = self.i;
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == b'-' || c == b'.' || c == b';' {
                self.i += 1;
            } else {
                break;
            }
        }
        let a = std::str::from_utf8(&self.b[start..self.i]).unwrap_or_default();
        let base = a.split(';').next().unwrap_or_default();
        let ok = match base.as_bytes().first() {
            Some(c) if c.is_ascii_alphabetic() => {
                base.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
            }
            Some(c) if c.is_ascii_digit() => base.bytes().all(|c| c.is_ascii_digit() || c == b'.'),
            _ => false,
        };
        if !ok {
            return Err(format!("invalid attribute description at offset {start}"));
        }
        Ok(a.to_string())
    }

    fn item(&mut self) -> Result<Filter, String> {
        if self.peek() == Some(b':') {
            return self.extensible(None);
        }
        let attr = self.attr_desc()?;
        match self.peek() {
            Some(b'=') => {
                self.i += 1;
                self.eq_or_substring(attr)
            }
            Some(b'>') => {
                self.i += 1;
                self.expect(b'=')?;
                Ok(Filter::Ge(attr, self.value(false)?.0))
            }
            Some(b'<') => {
                self.i += 1;
                self.expect(b'=')?;
                Ok(Filter::Le(attr, self.value(false)?.0))
            }
            Some(b'~') => {
                self.i += 1;
                self.expect(b'=')?;
                Ok(Filter::Approx(attr, self.value(false)?.0))
            }
            Some(b':') => self.extensible(Some(attr)),
            _ => Err(format!("expected a filter type at offset {}", self.i)),
        }
    }

    fn extensible(&mut self, attr: Option<String>) -> Result<Filter, String> {
        let mut dn_attrs = false;
        let mut rule = None;
        // We are at ':'.
        self.i += 1;
        if self.b[self.i..].starts_with(b"dn:") || self.b[self.i..].starts_with(b"DN:") {
            dn_attrs = true;
            self.i += 3;
        } else if self.b[self.i..].starts_with(b"dn") && self.b.get(self.i + 2) == Some(&b'=') {
            return Err(format!("invalid extensible match at offset {}", self.i));
        }
        if self.peek() != Some(b'=') {
            rule = Some(self.attr_desc()?);
            self.expect(b':')?;
        }
        self.expect(b'=')?;
        if attr.is_none() && rule.is_none() {
            return Err("extensible match needs an attribute or a matching rule".into());
        }
        let (value, _) = self.value(false)?;
        Ok(Filter::Extensible {
            attr,
            rule,
            dn_attrs,
            value,
        })
    }

    fn eq_or_substring(&mut self, attr: String) -> Result<Filter, String> {
        let mut parts: Vec<Vec<u8>> = Vec::new();
        loop {
            let (v, star) = self.value(true)?;
            parts.push(v);
            if !star {
                break;
            }
            self.i += 1; // '*'
        }
        if parts.len() == 1 {
            let v = parts.pop().unwrap_or_default();
            return Ok(Filter::Eq(attr, v));
        }
        if parts.len() == 2 && parts[0].is_empty() && parts[1].is_empty() {
            return Ok(Filter::Present(attr));
        }
        let last = parts.pop().filter(|p| !p.is_empty());
        let mut it = parts.into_iter();
        let initial = it.next().filter(|p| !p.is_empty());
        let any: Vec<Vec<u8>> = it.collect();
        if any.iter().any(Vec::is_empty) {
            return Err("empty substring between two '*'".into());
        }
        Ok(Filter::Substring {
            attr,
            initial,
            any,
            last,
        })
    }

    /// Reads an assertion value up to `)` (or `*` when `stars` allows it); returns the
    /// bytes and whether it stopped at a `*`.
    fn value(&mut self, stars: bool) -> Result<(Vec<u8>, bool), String> {
        let mut v = Vec::new();
        loop {
            match self.peek() {
                None => return Err("unterminated assertion value".into()),
                Some(b')') => return Ok((v, false)),
                Some(b'*') if stars => return Ok((v, true)),
                Some(b'*') | Some(b'(') | Some(0) => {
                    return Err(format!("unescaped special character at offset {}", self.i))
                }
                Some(b'\\') => {
                    let h = self.b.get(self.i + 1..self.i + 3).ok_or_else(|| {
                        format!("truncated escape at offset {} in filter value", self.i)
                    })?;
                    if !(h[0].is_ascii_hexdigit() && h[1].is_ascii_hexdigit()) {
                        return Err(format!("invalid escape at offset {}", self.i));
                    }
                    let s = std::str::from_utf8(h).unwrap_or("00");
                    v.push(u8::from_str_radix(s, 16).unwrap_or(0));
                    self.i += 3;
                }
                Some(c) => {
                    v.push(c);
                    self.i += 1;
                }
            }
        }
    }
}

/// Case-insensitive comparison used by the evaluator (a caseIgnore matching rule).
fn fold(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_lowercase()
}

impl Filter {
    /// Evaluates the filter on an entry given as a lookup from attribute name to values;
    /// values compare case-insensitively (DN-valued attributes after normalisation).
    pub fn matches(&self, values: &dyn Fn(&str) -> Vec<String>) -> bool {
        let norm = |a: &str, v: &str| -> String {
            let dnish = matches!(
                a.to_ascii_lowercase().as_str(),
                "member" | "uniquemember" | "memberof" | "aliasedobjectname" | "manager"
            );
            if dnish {
                crate::auth::ldap::dn::normalize(v).unwrap_or_else(|| v.to_lowercase())
            } else {
                v.to_lowercase()
            }
        };
        match self {
            Filter::And(v) => v.iter().all(|f| f.matches(values)),
            Filter::Or(v) => v.iter().any(|f| f.matches(values)),
            Filter::Not(f) => !f.matches(values),
            Filter::Present(a) => a.eq_ignore_ascii_case("objectclass") || !values(a).is_empty(),
            Filter::Eq(a, want) | Filter::Approx(a, want) => {
                let want = norm(a, &fold(want));
                values(a).iter().any(|v| norm(a, v) == want)
            }
            Filter::Extensible {
                attr: Some(a),
                rule,
                value,
                ..
            } => {
                let want = norm(a, &fold(value));
                // LDAP_MATCHING_RULE_IN_CHAIN: the evaluator also asks for
                // `<attr>;in-chain`, the values reached through nested groups.
                // Direct values are in the chain too.
                let mut vals = values(a);
                if rule.as_deref() == Some(IN_CHAIN) {
                    vals.extend(values(&format!("{a};in-chain")));
                }
                vals.iter().any(|v| norm(a, v) == want)
            }
            Filter::Extensible { attr: None, .. } => false,
            Filter::Ge(a, want) => {
                let want = fold(want);
                values(a).iter().any(|v| v.to_lowercase() >= want)
            }
            Filter::Le(a, want) => {
                let want = fold(want);
                values(a).iter().any(|v| v.to_lowercase() <= want)
            }
            Filter::Substring {
                attr,
                initial,
                any,
                last,
            } => values(attr).iter().any(|v| {
                let v = v.to_lowercase();
                let mut rest: &str = &v;
                if let Some(i) = initial {
                    let i = fold(i);
                    match rest.strip_prefix(i.as_str()) {
                        Some(r) => rest = r,
                        None => return false,
                    }
                }
                for a in any {
                    let a = fold(a);
                    match rest.find(a.as_str()) {
                        Some(p) => rest = &rest[p + a.len()..],
                        None => return false,
                    }
                }
                match last {
                    Some(l) => rest.ends_with(fold(l).as_str()),
                    None => true,
                }
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_default_group_filter() {
        let f = parse("(|(memberUid=bob)(member=cn=bob,dc=x)(uniqueMember=cn=bob,dc=x))").unwrap();
        let Filter::Or(v) = f else { panic!() };
        assert_eq!(v.len(), 3);
        assert_eq!(v[1], Filter::Eq("member".into(), b"cn=bob,dc=x".to_vec()));
    }

    #[test]
    fn parses_all_item_kinds() {
        assert_eq!(parse("(cn=*)").unwrap(), Filter::Present("cn".into()));
        assert!(matches!(
            parse("(cn=a*b*c)").unwrap(),
            Filter::Substring {
                initial: Some(_),
                last: Some(_),
                ..
            }
        ));
        assert!(matches!(parse("(uidNumber>=10)").unwrap(), Filter::Ge(..)));
        assert!(matches!(
            parse("(member:1.2.840.113556.1.4.1941:=cn=x)").unwrap(),
            Filter::Extensible { .. }
        ));
        assert!(matches!(
            parse("(&(objectClass=group)(!(cn=a\\2a)))").unwrap(),
            Filter::And(_)
        ));
        assert_eq!(
            parse("(cn=a\\2ab)").unwrap(),
            Filter::Eq("cn".into(), b"a*b".to_vec())
        );
    }

    #[test]
    fn refuses_malformed_filters() {
        for bad in [
            "cn=x",
            "(cn=x",
            "(cn=x))",
            "(cn=a(b)",
            "(=x)",
            "(cn=\\zz)",
            "(cn=x)(cn=y)",
            "",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn evaluates_case_insensitively() {
        let f = parse("(&(objectClass=person)(|(uid=Bob)(cn=x*)))").unwrap();
        let entry = |a: &str| -> Vec<String> {
            match a.to_ascii_lowercase().as_str() {
                "objectclass" => vec!["person".into()],
                "uid" => vec!["bob".into()],
                _ => vec![],
            }
        };
        assert!(f.matches(&entry));
        let g = parse("(member=CN=Bob, dc=X)").unwrap();
        assert!(g.matches(&|_: &str| vec!["cn=bob,dc=x".to_string()]));
    }
}
