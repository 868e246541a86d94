//! The Go `text/template` subset that `userfilter` and `groupfilter` use: literal text and
//! field actions `{{.Name}}`, with Go's whitespace-trim markers (`{{- ` and ` -}}`) and
//! comments (`{{/* ... */}}`). Anything else Go would accept (pipelines, functions,
//! `if`/`range`) is refused at configuration time rather than failing at every login;
//! so is a field the filter's context does not have.

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Field(String),
}

fn line_of(src: &str, at: usize) -> usize {
    src[..at.min(src.len())].matches('\n').count() + 1
}

fn err(src: &str, at: usize, msg: impl std::fmt::Display) -> String {
    format!("template: queryTemplate:{}: {msg}", line_of(src, at))
}

/// Parses `src`; `fields` are the names the context offers (e.g. `UserAttr`, `Username`).
pub fn parse(src: &str, fields: &[&str]) -> Result<Template, String> {
    let mut parts: Vec<Part> = Vec::new();
    let mut rest = src;
    let mut offset = 0;
    let mut trim_next = false;
    while let Some(open) = rest.find("{{") {
        let mut text = &rest[..open];
        if trim_next {
            text = text.trim_start();
        }
        let after_open = &rest[open + 2..];
        // `{{- ` trims the text before the action.
        let (trim_before, body_start) = match after_open.as_bytes() {
            [b'-', w, ..] if w.is_ascii_whitespace() => (true, 2),
            _ => (false, 0),
        };
        if trim_before {
            text = text.trim_end();
        }
        if !text.is_empty() {
            parts.push(Part::Text(text.to_string()));
        }
        let body_and_more = &after_open[body_start..];
        let at = offset + open;
        let close = if body_and_more.trim_start().starts_with("/*") {
            // A comment runs to `*/` and must be followed directly by the close.
            let c = body_and_more
                .find("*/")
                .ok_or_else(|| err(src, at, "unclosed comment"))?;
            let tail = &body_and_more[c + 2..];
            let ws = tail.len() - tail.trim_start().len();
            let tail_t = tail.trim_start();
            if tail_t.starts_with("-}}") && ws > 0 {
                c + 2 + ws + 1
            } else if tail.starts_with("}}") {
                c + 2
            } else {
                return Err(err(src, at, "comment ends before closing delimiter"));
            }
        } else {
            body_and_more
                .find("}}")
                .ok_or_else(|| err(src, at, "unclosed action"))?
        };
        let mut body = &body_and_more[..close];
        // ` -}}` trims the text after the action.
        let trim_after = body.len() >= 2
            && body.ends_with('-')
            && body.as_bytes()[body.len() - 2].is_ascii_whitespace();
        if trim_after {
            body = &body[..body.len() - 1];
        }
        let b = body.trim();
        if b.starts_with("/*") {
            // comment: nothing to emit
        } else if b.is_empty() {
            return Err(err(src, at, "missing value for command"));
        } else if let Some(name) = b.strip_prefix('.') {
            if name.is_empty()
                || !name
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                return Err(err(
                    src,
                    at,
                    format!("unsupported action {{{{{b}}}}}: only fields like {{{{.Name}}}} are allowed"),
                ));
            }
            if !fields.contains(&name) {
                return Err(err(
                    src,
                    at,
                    format!(
                        "can't evaluate field {name}: the context has only {}",
                        fields.join(", ")
                    ),
                ));
            }
            parts.push(Part::Field(name.to_string()));
        } else {
            return Err(err(
                src,
                at,
                format!(
                    "unsupported action {{{{{b}}}}}: only fields like {{{{.Name}}}} are allowed"
                ),
            ));
        }
        let consumed = open + 2 + body_start + close + 2;
        offset += consumed;
        rest = &rest[consumed..];
        trim_next = trim_after;
    }
    let mut text = rest;
    if trim_next {
        text = text.trim_start();
    }
    if !text.is_empty() {
        parts.push(Part::Text(text.to_string()));
    }
    Ok(Template { parts })
}

impl Template {
    /// Renders with `vars` (name, already-escaped value); a field missing from `vars`
    /// renders empty (parse already refused names outside the context).
    pub fn render(&self, vars: &[(&str, &str)]) -> String {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Field(f) => {
                    if let Some((_, v)) = vars.iter().find(|(k, _)| k == f) {
                        out.push_str(v);
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const USER: &[&str] = &["UserAttr", "Username"];

    #[test]
    fn renders_fields_and_text() {
        let t = parse("({{.UserAttr}}={{ .Username }})", USER).unwrap();
        assert_eq!(
            t.render(&[("UserAttr", "uid"), ("Username", "bob")]),
            "(uid=bob)"
        );
        let t = parse(
            "(&(objectClass=person) {{- /* who */ -}} (uid={{.Username}}))",
            USER,
        )
        .unwrap();
        assert_eq!(
            t.render(&[("Username", "a")]),
            "(&(objectClass=person)(uid=a))"
        );
        let t = parse("no actions }} here", USER).unwrap();
        assert_eq!(t.render(&[]), "no actions }} here");
    }

    #[test]
    fn refuses_what_does_not_parse() {
        for bad in [
            "({{.UserAttr}}={{.Username)",
            "({{}}",
            "({{.UserDN}})",
            "({{if .Username}}x{{end}})",
            "({{.Username | printf \"%s\"}})",
            "({{/* open comment }})",
        ] {
            let e = parse(bad, USER).unwrap_err();
            assert!(e.starts_with("template: queryTemplate:1:"), "{bad}: {e}");
        }
    }
}
