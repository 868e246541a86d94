//! End-to-end tests of observability: the file audit device (HMAC'd secrets, `sys/audit-hash`,
//! fail-closed writes) and `sys/metrics?format=prometheus` (ACL, counters, latency histograms).

use cairn_tests::{tmpdir, Server};
use serde_json::{json, Value};

fn audit_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("audit line is not JSON ({e}): {l}"))
        })
        .collect()
}

#[test]
fn file_audit_device_hashes_secrets_and_fails_closed() {
    let s = Server::dev();
    let dir = tmpdir("audit");
    let file = dir.join("audit.log");
    let r = s.put(
        "sys/audit/file1",
        json!({"type": "file", "description": "e2e", "options": {"file_path": file.to_string_lossy()}}),
    );
    assert_eq!(r.status, 204, "{:?}", r.body);
    let r = s.get("sys/audit");
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["data"]["file1/"]["type"], json!("file"));
    assert!(!r.body.to_string().contains("hmac_key"));
    // A second device at the same path is refused.
    let r = s.put(
        "sys/audit/file1",
        json!({"type": "file", "options": {"file_path": "/tmp/x"}}),
    );
    assert_eq!(r.status, 400);

    // A login-free flow: a child token writes and reads a secret.
    let r = s.post(
        "auth/token/create",
        json!({"policies": ["root"], "ttl": "1h"}),
    );
    assert_eq!(r.status, 200, "{:?}", r.body);
    let token = r.body["auth"]["client_token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let accessor = r.body["auth"]["accessor"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!token.is_empty() && !accessor.is_empty());
    let secret = "correct-horse-battery-staple-e2e";
    let r = s.call_as(
        Some(&token),
        "PUT",
        "secret/app/db",
        Some(json!({"password": secret})),
    );
    assert_eq!(r.status, 204, "{:?}", r.body);
    let r = s.call_as(Some(&token), "GET", "secret/app/db", None);
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["data"]["password"], json!(secret));

    let text = std::fs::read_to_string(&file).unwrap_or_default();
    for raw in [token.as_str(), accessor.as_str(), secret, "root-e2e"] {
        assert!(
            !text.contains(raw),
            "audit file contains a raw secret {raw:?}"
        );
    }
    let lines = audit_lines(&file);
    let kinds = |path: &str, op: &str| {
        lines
            .iter()
            .filter(|l| {
                l["request"]["path"] == json!(path) && l["request"]["operation"] == json!(op)
            })
            .map(|l| l["type"].as_str().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        kinds("secret/app/db", "update"),
        vec!["request", "response"]
    );
    assert_eq!(kinds("secret/app/db", "read"), vec!["request", "response"]);
    assert_eq!(
        kinds("auth/token/create", "update"),
        vec!["request", "response"]
    );
    for l in &lines {
        assert!(
            l["time"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z') && t.contains('T')),
            "{l}"
        );
    }

    // The hash the device computes for the secret is what the file holds.
    let r = s.post("sys/audit-hash/file1", json!({"input": secret}));
    assert_eq!(r.status, 200, "{:?}", r.body);
    let h = r.body["data"]["hash"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(h.starts_with("hmac-sha256:"), "{h}");
    let write = lines
        .iter()
        .find(|l| {
            l["type"] == json!("request")
                && l["request"]["path"] == json!("secret/app/db")
                && l["request"]["operation"] == json!("update")
        })
        .cloned()
        .unwrap_or_default();
    assert_eq!(write["request"]["data"]["password"], json!(h));
    let read = lines
        .iter()
        .find(|l| {
            l["type"] == json!("response")
                && l["request"]["path"] == json!("secret/app/db")
                && l["request"]["operation"] == json!("read")
        })
        .cloned()
        .unwrap_or_default();
    assert_eq!(read["response"]["data"]["password"], json!(h));
    assert_eq!(read["response"]["status"], json!(200));
    // The caller's token and accessor are hashed too, and its policies kept.
    let r = s.post("sys/audit-hash/file1", json!({"input": token}));
    let th = r.body["data"]["hash"].clone();
    assert_eq!(read["auth"]["client_token"], th);
    assert_eq!(read["request"]["client_token"], th);
    assert_eq!(read["auth"]["policies"], json!(["root"]));
    let create = lines
        .iter()
        .find(|l| {
            l["type"] == json!("response") && l["request"]["path"] == json!("auth/token/create")
        })
        .cloned()
        .unwrap_or_default();
    assert_eq!(create["response"]["auth"]["client_token"], th);

    // Fail closed: the audit file becomes a directory, so appends fail even for root.
    std::fs::remove_file(&file).expect("remove audit file");
    std::fs::create_dir(&file).expect("directory in its place");
    let r = s.put("secret/app/new", json!({"password": "never-stored-value"}));
    assert_eq!(r.status, 500, "{:?}", r.body);
    assert!(r.errors().contains("audit device failed"), "{}", r.errors());
    let r = s.get("secret/app/db");
    assert_eq!(r.status, 500, "reads fail closed too: {:?}", r.body);
    // Fix the device: the write was not stored. A failed device is tried again after a
    // second; until then requests are refused with the reason.
    std::fs::remove_dir(&file).expect("remove directory");
    let mut r = s.get("secret/app/new");
    for _ in 0..50 {
        if r.status != 500 {
            break;
        }
        assert!(r.errors().contains("tried again"), "{}", r.errors());
        std::thread::sleep(std::time::Duration::from_millis(100));
        r = s.get("secret/app/new");
    }
    assert_eq!(
        r.status, 404,
        "the failed write must not be stored: {:?}",
        r.body
    );
    assert_eq!(
        s.get("secret/app/db").body["data"]["password"],
        json!(secret)
    );
    assert!(!std::fs::read_to_string(&file)
        .unwrap_or_default()
        .contains("never-stored-value"));

    // Disabling the device stops the entries.
    assert_eq!(s.delete("sys/audit/file1").status, 204);
    let before = audit_lines(&file).len();
    assert_eq!(s.put("secret/app/after", json!({"v": "x"})).status, 204);
    assert_eq!(audit_lines(&file).len(), before);
    assert_eq!(
        s.post("sys/audit-hash/file1", json!({"input": "x"})).status,
        400
    );
}

/// The file device's options (the reference's): an unknown option or a bad value refuses
/// the enable with a 400 saying which, before any file is touched (they were stored
/// unchecked and unused); `mode` is the file's permission bits, `prefix` starts every line,
/// `log_raw` logs values as they are (hashed by default), `hmac_accessor` false leaves
/// accessors as they are, `elide_list_responses` logs a list's keys as their number.
#[test]
fn file_audit_device_options_are_checked_and_honoured() {
    let s = Server::dev();
    let dir = tmpdir("audit-options");
    let raw = dir.join("raw.log");
    let raw_path = raw.to_string_lossy().to_string();
    for (options, says) in [
        (
            json!({"log_row": "true"}),
            "\"log_row\" is not an option of a file audit device",
        ),
        (json!({"mode": "0755"}), "is not an octal file mode"),
        (json!({"mode": "rw-------"}), "is not an octal file mode"),
        (
            json!({"log_raw": "maybe"}),
            "options.log_raw: \"maybe\" is not a boolean",
        ),
        (json!({"hmac_accessor": 2}), "options.hmac_accessor"),
        (
            json!({"format": "jsonx"}),
            "\"jsonx\" (XML) is not supported",
        ),
        (json!({"format": "yaml"}), "unknown format type \"yaml\""),
    ] {
        let mut o = options.clone();
        o["file_path"] = json!(raw_path);
        let r = s.put("sys/audit/raw", json!({"type": "file", "options": o}));
        assert_eq!(r.status, 400, "{options}: {:?}", r.body);
        let message = r.body["errors"][0].as_str().unwrap_or_default();
        assert!(message.contains(says), "{options}: {message}");
        assert!(!raw.exists(), "{options}: the file was opened");
    }
    assert_eq!(s.get("sys/audit").body["data"], json!({}));

    let r = s.put(
        "sys/audit/raw",
        json!({"type": "file", "options": {"file_path": raw_path, "mode": "0640",
               "prefix": "cairn: ", "log_raw": true, "elide_list_responses": "true"}}),
    );
    assert_eq!(r.status, 204, "{:?}", r.body);
    let acc = dir.join("acc.log");
    let r = s.put(
        "sys/audit/acc",
        json!({"type": "file", "options": {"file_path": acc.to_string_lossy(),
               "hmac_accessor": "false"}}),
    );
    assert_eq!(r.status, 204, "{:?}", r.body);
    let listed = s.get("sys/audit").body["data"].clone();
    assert_eq!(
        listed["raw/"]["options"],
        json!({"file_path": raw_path, "mode": "0640", "prefix": "cairn: ", "log_raw": "true",
               "elide_list_responses": "true"})
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &std::path::Path| {
            std::fs::metadata(p)
                .expect("audit file")
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode(&raw), 0o640);
        assert_eq!(mode(&acc), 0o600);
    }

    let value = "not-a-real-secret-logged-raw";
    assert_eq!(s.put("secret/opt/k", json!({"v": value})).status, 204);
    assert_eq!(s.list("secret/opt/").status, 200);
    let text = std::fs::read_to_string(&raw).expect("raw.log");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| {
            let json = l
                .strip_prefix("cairn: ")
                .unwrap_or_else(|| panic!("no prefix: {l}"));
            serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {l}"))
        })
        .collect();
    let write = lines
        .iter()
        .find(|l| l["type"] == json!("request") && l["request"]["path"] == json!("secret/opt/k"))
        .unwrap_or_else(|| panic!("no write in {text}"));
    assert_eq!(write["request"]["data"]["v"], json!(value));
    let list = lines
        .iter()
        .find(|l| l["type"] == json!("response") && l["request"]["operation"] == json!("list"))
        .unwrap_or_else(|| panic!("no list in {text}"));
    assert_eq!(list["response"]["data"]["keys"], json!(1), "{list}");

    let hashed = audit_lines(&acc);
    let write = hashed
        .iter()
        .find(|l| l["type"] == json!("request") && l["request"]["path"] == json!("secret/opt/k"))
        .unwrap_or_else(|| panic!("no write in {hashed:?}"));
    assert_eq!(
        write["request"]["data"]["v"],
        s.post("sys/audit-hash/acc", json!({"input": value})).body["data"]["hash"]
    );
    assert_eq!(
        write["request"]["client_token"],
        s.post("sys/audit-hash/acc", json!({"input": s.root_token}))
            .body["data"]["hash"]
    );
    let accessor = s.get("auth/token/lookup-self").body["data"]["accessor"].clone();
    assert!(
        accessor.as_str().is_some_and(|a| !a.is_empty()),
        "{accessor}"
    );
    assert_eq!(write["auth"]["accessor"], accessor);
    assert_eq!(write["request"]["client_token_accessor"], accessor);
}

fn metrics(s: &Server, token: Option<&str>) -> (u16, String, String) {
    let url = format!("{}/v1/sys/metrics?format=prometheus", s.addr);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut b = ureq::http::Request::builder().method("GET").uri(&url);
    if let Some(t) = token {
        b = b.header("X-Vault-Token", t);
    }
    let mut resp = agent
        .run(b.body(Vec::new()).expect("request"))
        .expect("response");
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    (status, ct, text)
}

fn sample(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.trim().parse().ok()))
        .unwrap_or(0)
}

#[test]
fn prometheus_metrics_count_requests_and_need_a_token() {
    let s = Server::dev();
    let (status, _, _) = metrics(&s, None);
    assert_eq!(status, 403);
    // A token without read on sys/metrics is refused too.
    assert_eq!(
        s.put(
            "sys/policies/acl/kvonly",
            json!({"policy": "path \"secret/*\" { capabilities = [\"read\"] }"})
        )
        .status,
        204
    );
    let r = s.post("auth/token/create", json!({"policies": ["kvonly"]}));
    let limited = r.body["auth"]["client_token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(metrics(&s, Some(&limited)).0, 403);

    let (status, ct, text) = metrics(&s, Some("root-e2e"));
    assert_eq!(status, 200, "{text}");
    assert!(
        ct.starts_with("text/plain") && ct.contains("version=0.0.4"),
        "{ct}"
    );
    assert!(
        text.contains("# TYPE cairn_requests_total counter"),
        "{text}"
    );
    assert!(text.contains("cairn_sealed 0"), "{text}");
    let put = r#"cairn_requests_total{method="PUT",path="secret",status="204"}"#;
    let before = sample(&text, put);
    for i in 0..3 {
        assert_eq!(
            s.put(&format!("secret/m{i}"), json!({"v": "x"})).status,
            204
        );
    }
    assert_eq!(s.get("secret/missing").status, 404);
    let (_, _, text) = metrics(&s, Some("root-e2e"));
    assert_eq!(sample(&text, put), before + 3, "{text}");
    assert!(
        sample(
            &text,
            r#"cairn_requests_total{method="GET",path="secret",status="404"}"#
        ) >= 1
    );
    assert!(
        sample(
            &text,
            r#"cairn_requests_total{method="GET",path="sys/metrics",status="403"}"#
        ) >= 2,
        "{text}"
    );
    // Latency histograms from the listener.
    assert!(
        text.contains("# TYPE cairn_request_duration_seconds histogram"),
        "{text}"
    );
    assert!(
        sample(
            &text,
            r#"cairn_request_duration_seconds_count{method="PUT",path="secret"}"#
        ) >= 3,
        "{text}"
    );
    assert!(text.contains("cairn_wal_last_index"), "{text}");
    // Without format: JSON counters.
    let r = s.get("sys/metrics");
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert!(r.body["requests"].as_array().is_some_and(|a| !a.is_empty()));
}
