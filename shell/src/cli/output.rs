//! Output formatting for the CLI: Vault-style `Key/Value` tables, column tables, JSON, and
//! durations such as `768h` or `1h2m3s`.

use serde_json::Value;

/// One cell of a table: strings as-is, lists as `[a b]`, null as `n/a`, objects as JSON.
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "n/a".into(),
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Array(a) if a.iter().all(|x| !x.is_array() && !x.is_object()) => {
            format!("[{}]", a.iter().map(cell).collect::<Vec<_>>().join(" "))
        }
        other => other.to_string(),
    }
}

/// `1h2m3s`-style duration; `∞` for zero (no expiry), as the reference CLI prints.
pub fn duration(secs: u64) -> String {
    if secs == 0 {
        return "∞".into();
    }
    cairn_core::time::short_duration(secs)
}

/// A table with a header row, a dashes row and left-aligned columns four spaces apart.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let n = headers.len();
    let mut width: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(n) {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                let pad = width[i] - c.chars().count() + 4;
                s.push_str(c);
                s.push_str(&" ".repeat(pad));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = Vec::new();
    out.push(line(headers.iter().map(|h| h.to_string()).collect()));
    out.push(line(
        headers
            .iter()
            .map(|h| "-".repeat(h.chars().count()))
            .collect(),
    ));
    for r in rows {
        let mut cells = r.clone();
        cells.resize(n, String::new());
        out.push(line(cells));
    }
    out.join("\n")
}

/// The `Key / Value` table.
pub fn kv_table(rows: &[(String, String)]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|(k, v)| vec![k.clone(), v.clone()])
        .collect();
    table(&["Key", "Value"], &rows)
}

/// Rows for every field of a JSON object, sorted by key.
pub fn object_rows(v: &Value) -> Vec<(String, String)> {
    match v {
        Value::Object(m) => m.iter().map(|(k, v)| (k.clone(), cell(v))).collect(),
        Value::Null => Vec::new(),
        other => vec![("value".into(), cell(other))],
    }
}

pub fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn durations_read_like_the_reference() {
        assert_eq!(duration(0), "∞");
        assert_eq!(duration(59), "59s");
        assert_eq!(duration(3600 * 768), "768h");
        assert_eq!(duration(3723), "1h2m3s");
        assert_eq!(duration(120), "2m");
    }

    #[test]
    fn tables_align_and_cells_flatten() {
        let t = kv_table(&[
            ("a".into(), "1".into()),
            ("longer_key".into(), cell(&json!(["x", "y"]))),
        ]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "Key           Value");
        assert_eq!(lines[1], "---           -----");
        assert_eq!(lines[2], "a             1");
        assert_eq!(lines[3], "longer_key    [x y]");
        assert_eq!(cell(&json!(null)), "n/a");
        assert_eq!(cell(&json!({"a": 1})), "{\"a\":1}");
    }
}
