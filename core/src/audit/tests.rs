//! Tests of the audit devices: leaf hashing, the file options, the probe and the devices' health.

use super::*;

#[test]
fn hashes_every_string_leaf() {
    let v = json!({"password": "p", "n": 3, "list": ["a", true], "o": {"x": "y"}});
    let h = hash_leaves(b"k", &v);
    assert_eq!(h["password"], json!(hash(b"k", "p")));
    assert_eq!(h["n"], json!(3));
    assert_eq!(h["list"][0], json!(hash(b"k", "a")));
    assert_eq!(h["list"][1], json!(true));
    assert_eq!(h["o"]["x"], json!(hash(b"k", "y")));
    assert!(!h.to_string().contains("\"p\""));
}

#[test]
fn node_emits_request_and_response_lines_with_hashed_secrets() {
    use crate::node::{Input, Node};
    use crate::storage::MemStorage;
    let mut n = Node::dev_in_memory([7; 32], "root-unit");
    let run = |n: &mut Node<MemStorage>, req: Request| {
        n.handle(2_000, Input::Request(req));
        let mut out = Vec::new();
        while let Some(o) = n.poll_output() {
            out.push(o);
        }
        out
    };
    let enable = Request::new(1, Method::Put, "sys/audit/f")
        .with_token("root-unit")
        .with_json(json!({"type": "file", "options": {"file_path": "/tmp/a.log"}}));
    let out = run(&mut n, enable);
    assert!(out.iter().all(|o| !matches!(o, Output::Audit { .. })));
    assert!(out.iter().any(
            |o| matches!(o, Output::AuditProbe { id: 1, file_path, mode: 0o600 } if file_path == "/tmp/a.log")
        ));
    n.handle(
        2_000,
        Input::AuditProbed {
            id: 1,
            result: Ok(()),
        },
    );
    let done: Vec<Output> = std::iter::from_fn(|| n.poll_output()).collect();
    assert!(done
        .iter()
        .any(|o| matches!(o, Output::Response(r) if r.id == 1 && r.status == 204)));
    let write = Request::new(2, Method::Put, "secret/s")
        .with_token("root-unit")
        .with_json(json!({"password": "very-secret-value"}));
    let out = run(&mut n, write);
    let lines: Vec<Value> = out
        .iter()
        .filter_map(|o| match o {
            Output::Audit {
                file_path,
                line,
                required: true,
                ..
            } if file_path == "/tmp/a.log" => serde_json::from_str(line).ok(),
            _ => None,
        })
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["type"], json!("request"));
    assert_eq!(lines[1]["type"], json!("response"));
    assert_eq!(lines[1]["response"]["status"], json!(204));
    assert_eq!(lines[0]["time"], json!("1970-01-01T00:00:02.000Z"));
    for l in &lines {
        let t = l.to_string();
        assert!(
            !t.contains("very-secret-value") && !t.contains("root-unit"),
            "{t}"
        );
    }
    let h = run(
        &mut n,
        Request::new(3, Method::Post, "sys/audit-hash/f")
            .with_token("root-unit")
            .with_json(json!({"input": "very-secret-value"})),
    );
    let Some(Output::Response(r)) = h.iter().find(|o| matches!(o, Output::Response(_))) else {
        panic!("no response")
    };
    let body = r.body.clone().unwrap_or_default();
    assert_eq!(
        body["data"]["hash"],
        lines[0]["request"]["data"]["password"]
    );
}

#[test]
fn auth_keeps_policies_hashes_tokens() {
    let a = json!({"client_token": "s.x", "accessor": "acc", "policies": ["default"]});
    let h = hash_auth(b"k", &a);
    assert_eq!(h["policies"], json!(["default"]));
    assert!(h["client_token"]
        .as_str()
        .unwrap_or("")
        .starts_with("hmac-sha256:"));
    assert!(h["accessor"]
        .as_str()
        .unwrap_or("")
        .starts_with("hmac-sha256:"));
}

/// The file device's options as the reference reads them: known names only, values
/// checked (the reference's booleans, octal modes without execute bits, `json`), and
/// stored as strings.
#[test]
fn file_options_are_checked_and_stored_as_strings() {
    let parse = |o: Value| {
        let Value::Object(m) = o else {
            panic!("object")
        };
        parse_options(&m)
    };
    let err = |o: Value| match parse(o) {
        Err(ApiError::BadRequest(m)) => m,
        other => panic!("not a 400: {other:?}"),
    };
    let (o, stored) = parse(json!({"file_path": "/a.log"})).expect("minimal");
    assert_eq!(
        o,
        FileOptions {
            file_path: "/a.log".into(),
            ..FileOptions::default()
        }
    );
    assert_eq!((o.mode, o.log_raw, o.hmac_accessor), (0o600, false, true));
    assert_eq!(Value::Object(stored), json!({"file_path": "/a.log"}));
    let (o, stored) = parse(json!({
        "path": "/b.log", "mode": "640", "format": "json", "prefix": "@cee: ",
        "log_raw": "t", "hmac_accessor": false, "elide_list_responses": "1",
    }))
    .expect("every option");
    assert_eq!(
        o,
        FileOptions {
            file_path: "/b.log".into(),
            mode: 0o640,
            prefix: "@cee: ".into(),
            log_raw: true,
            hmac_accessor: false,
            elide_list_responses: true,
        }
    );
    assert_eq!(
        Value::Object(stored),
        json!({"path": "/b.log", "file_path": "/b.log", "mode": "0640", "format": "json",
                   "prefix": "@cee: ", "log_raw": "true", "hmac_accessor": "false",
                   "elide_list_responses": "true"})
    );
    assert_eq!(
        parse(json!({"file_path": "/a", "mode": "0000"}))
            .expect("0")
            .0
            .mode,
        0
    );
    assert_eq!(
        parse(json!({"file_path": "/a", "mode": 644}))
            .expect("n")
            .0
            .mode,
        0o644
    );
    assert!(err(json!({"file_path": "/a", "log_row": "true"}))
        .contains("\"log_row\" is not an option of a file audit device (known: file_path"));
    assert!(err(json!({"file_path": "/a", "fallback": "true"})).contains("\"fallback\""));
    for mode in [
        "0755", "0700", "1600", "4600", "abc", "", "0o600", "-600", "00600", "8",
    ] {
        let m = err(json!({"file_path": "/a", "mode": mode}));
        assert!(m.contains("is not an octal file mode"), "{mode}: {m}");
    }
    assert!(err(json!({"file_path": "/a", "mode": true})).contains("options.mode"));
    for (k, v) in [
        ("log_raw", json!("yes")),
        ("hmac_accessor", json!("")),
        ("elide_list_responses", json!(1)),
    ] {
        let m = err(json!({"file_path": "/a", k: v}));
        assert!(m.starts_with(&format!("options.{k}: ")), "{m}");
    }
    assert!(err(json!({"file_path": "/a", "format": "jsonx"})).contains("not supported"));
    assert!(err(json!({"file_path": "/a", "format": "xml"})).contains("unknown format"));
    assert!(err(json!({"file_path": "/a", "prefix": 3})).contains("expected a string"));
    assert!(err(json!({"mode": "0600"})).contains("file_path: required"));
    assert!(err(json!({"file_path": "rel.log"})).contains("absolute path"));
}

/// An enable with a bad option is refused before the file is opened: nothing stored,
/// no probe.
#[test]
fn a_bad_option_refuses_the_enable_before_the_file_is_opened() {
    let mut n = dev_node();
    let (r, out) = enable(
        &mut n,
        "f",
        json!({"file_path": "/tmp/f.log", "mode": "0777"}),
    );
    assert_eq!(r.status, 400, "{r:?}");
    assert!(out.iter().all(|o| !matches!(o, Output::AuditProbe { .. })));
    let (list, _) = call(
        &mut n,
        2_000,
        Request::new(2, Method::Get, "sys/audit").with_token("root-unit"),
    );
    assert_eq!(list.body.unwrap_or_default()["data"], json!({}));
}

/// `prefix`, `log_raw`, `hmac_accessor` and `elide_list_responses` shape the device's
/// lines; `mode` goes to the shell with the probe and every line.
#[test]
fn the_options_shape_the_lines() {
    let mut n = dev_node();
    let enable = |id, name: &str, options: Value| {
        Request::new(id, Method::Put, &format!("sys/audit/{name}"))
            .with_token("root-unit")
            .with_json(json!({"type": "file", "options": options}))
    };
    let (_, out) = call(
        &mut n,
        2_000,
        enable(
            1,
            "raw",
            json!({"file_path": "/tmp/raw.log", "mode": "0640", "prefix": "cairn: ",
                       "log_raw": "true", "elide_list_responses": "true"}),
        ),
    );
    assert!(out.iter().any(|o| matches!(o,
            Output::AuditProbe { id: 1, file_path, mode: 0o640 } if file_path == "/tmp/raw.log")));
    probed_ok(&mut n, 1);
    call(
        &mut n,
        2_000,
        enable(
            2,
            "acc",
            json!({"file_path": "/tmp/acc.log", "hmac_accessor": "false"}),
        ),
    );
    probed_ok(&mut n, 2);
    let lines = |out: &[Output], file: &str| -> Vec<(u32, String)> {
        out.iter()
            .filter_map(|o| match o {
                Output::Audit {
                    file_path,
                    mode,
                    line,
                    ..
                } if file_path == file => Some((*mode, line.clone())),
                _ => None,
            })
            .collect()
    };
    let json_of = |line: &str, prefix: &str| -> Value {
        let rest = line
            .strip_prefix(prefix)
            .unwrap_or_else(|| panic!("{line}"));
        serde_json::from_str(rest).unwrap_or_else(|e| panic!("{e}: {line}"))
    };
    let (_, out) = call(
        &mut n,
        3_000,
        Request::new(3, Method::Put, "secret/dir/k")
            .with_token("root-unit")
            .with_json(json!({"password": "raw-secret-value"})),
    );
    let raw = lines(&out, "/tmp/raw.log");
    assert_eq!(raw.len(), 2);
    assert!(raw.iter().all(|(m, _)| *m == 0o640));
    let req = json_of(&raw[0].1, "cairn: ");
    assert_eq!(
        req["request"]["data"]["password"],
        json!("raw-secret-value")
    );
    assert_eq!(req["request"]["client_token"], json!("root-unit"));
    let acc = lines(&out, "/tmp/acc.log");
    assert!(acc.iter().all(|(m, _)| *m == 0o600));
    let req = json_of(&acc[0].1, "");
    assert!(req["request"]["data"]["password"]
        .as_str()
        .is_some_and(|p| p.starts_with("hmac-sha256:")));
    assert!(req["request"]["client_token"]
        .as_str()
        .is_some_and(|p| p.starts_with("hmac-sha256:")));
    let accessor = req["auth"]["accessor"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        !accessor.is_empty() && !accessor.starts_with("hmac-sha256:"),
        "{req}"
    );
    assert_eq!(req["request"]["client_token_accessor"], json!(accessor));
    // A new token's accessor in the response's auth: as it is, the token hashed.
    let (r, out) = call(
        &mut n,
        3_000,
        Request::new(4, Method::Post, "auth/token/create").with_token("root-unit"),
    );
    let auth = r.body.unwrap_or_default()["auth"].clone();
    let resp = json_of(&lines(&out, "/tmp/acc.log")[1].1, "");
    assert_eq!(resp["response"]["auth"]["accessor"], auth["accessor"]);
    assert_ne!(
        resp["response"]["auth"]["client_token"],
        auth["client_token"]
    );
    // A list: elided where asked, hashed keys elsewhere.
    let (_, out) = call(
        &mut n,
        3_000,
        Request::new(5, Method::List, "secret/dir").with_token("root-unit"),
    );
    let resp = json_of(&lines(&out, "/tmp/raw.log")[1].1, "cairn: ");
    assert_eq!(resp["response"]["data"]["keys"], json!(1), "{resp}");
    let resp = json_of(&lines(&out, "/tmp/acc.log")[1].1, "");
    assert_eq!(
        resp["response"]["data"]["keys"].as_array().map(Vec::len),
        Some(1)
    );
    assert!(resp["response"]["data"]["keys"][0]
        .as_str()
        .is_some_and(|k| k.starts_with("hmac-sha256:")));
    // A read is not a list: nothing elided.
    let (_, out) = call(
        &mut n,
        3_000,
        Request::new(6, Method::Get, "secret/dir/k").with_token("root-unit"),
    );
    let resp = json_of(&lines(&out, "/tmp/raw.log")[1].1, "cairn: ");
    assert_eq!(
        resp["response"]["data"]["password"],
        json!("raw-secret-value")
    );
}

fn dev_node() -> crate::node::Node<crate::storage::MemStorage> {
    use crate::node::{Admin, Input, Node, NodeConfig};
    let mut n = Node::new(
        crate::storage::MemStorage::new(),
        [9; 32],
        NodeConfig::default(),
    );
    n.handle(
        1_000,
        Input::Admin {
            id: 1,
            cmd: Admin::DevSetup {
                root_token_id: Some("root-unit".into()),
            },
        },
    );
    while n.poll_output().is_some() {}
    n
}

/// Request 1 at 2 s: root enables the file audit device `name` with `options`.
fn enable(
    n: &mut crate::node::Node<crate::storage::MemStorage>,
    name: &str,
    options: Value,
) -> (Response, Vec<Output>) {
    call(
        n,
        2_000,
        Request::new(1, Method::Put, &format!("sys/audit/{name}"))
            .with_token("root-unit")
            .with_json(json!({"type": "file", "options": options})),
    )
}

/// The driver opened the file of request `id`'s device (at 2 s); outputs drained.
fn probed_ok(n: &mut crate::node::Node<crate::storage::MemStorage>, id: u64) {
    n.handle(
        2_000,
        crate::node::Input::AuditProbed { id, result: Ok(()) },
    );
    while n.poll_output().is_some() {}
}

fn call(
    n: &mut crate::node::Node<crate::storage::MemStorage>,
    now: u64,
    req: Request,
) -> (Response, Vec<Output>) {
    let id = req.id;
    n.handle(now, crate::node::Input::Request(req));
    let out: Vec<Output> = std::iter::from_fn(|| n.poll_output()).collect();
    let r = out
        .iter()
        .find_map(|o| match o {
            Output::Response(r) if r.id == id => Some(r.clone()),
            _ => None,
        })
        .unwrap_or_else(|| Response::no_content(u64::MAX));
    (r, out)
}

#[test]
fn a_file_that_cannot_be_opened_is_refused_and_nothing_is_stored() {
    let mut n = dev_node();
    let (r, out) = enable(
        &mut n,
        "bad",
        json!({"file_path": "/nonexistent/dir/a.log"}),
    );
    assert_eq!(r.id, u64::MAX, "answered before the file was tried: {r:?}");
    assert!(out.iter().any(|o| matches!(o, Output::AuditProbe { .. })));
    n.handle(
        2_000,
        crate::node::Input::AuditProbed {
            id: 1,
            result: Err("No such file or directory".into()),
        },
    );
    let out: Vec<Output> = std::iter::from_fn(|| n.poll_output()).collect();
    let r = out
        .iter()
        .find_map(|o| match o {
            Output::Response(r) if r.id == 1 => Some(r.clone()),
            _ => None,
        })
        .expect("an answer to the enable");
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r
        .body
        .unwrap()
        .to_string()
        .contains("/nonexistent/dir/a.log"));
    let (list, _) = call(
        &mut n,
        2_000,
        Request::new(2, Method::Get, "sys/audit").with_token("root-unit"),
    );
    assert_eq!(list.body.unwrap()["data"], json!({}));
    // Every later request runs unaudited, as before the attempt.
    let (w, out) = call(
        &mut n,
        2_000,
        Request::new(3, Method::Put, "secret/x")
            .with_token("root-unit")
            .with_json(json!({"v": 1})),
    );
    assert_eq!(w.status, 204);
    assert!(out.iter().all(|o| !matches!(o, Output::Audit { .. })));
}

/// A dev node with device `f` writing to `/tmp/f.log`, which failed at 3 s.
fn failed_device_node() -> crate::node::Node<crate::storage::MemStorage> {
    let mut n = dev_node();
    enable(&mut n, "f", json!({"file_path": "/tmp/f.log"}));
    probed_ok(&mut n, 1);
    n.audit_device_failed(3_000, "/tmp/f.log", "disk full");
    n
}

#[test]
fn a_failing_device_refuses_audited_requests_but_not_health_or_its_removal() {
    let mut n = failed_device_node();
    let write = |id| {
        Request::new(id, Method::Put, "secret/y")
            .with_token("root-unit")
            .with_json(json!({"v": 1}))
    };
    let (w, out) = call(&mut n, 3_000, write(2));
    assert_eq!(w.status, 500, "{w:?}");
    assert!(w.body.unwrap().to_string().contains("disk full"));
    assert!(out.iter().all(|o| !matches!(o, Output::Audit { .. })));
    let (g, _) = call(
        &mut n,
        3_000,
        Request::new(3, Method::Get, "secret/y").with_token("root-unit"),
    );
    assert_eq!(
        g.status, 500,
        "nothing was written and reads are refused too"
    );
    for (id, p) in [(4, "sys/health"), (5, "sys/seal-status")] {
        let (r, out) = call(&mut n, 3_000, Request::new(id, Method::Get, p));
        assert_eq!(r.status, 200, "{p}: {r:?}");
        assert!(out.iter().all(|o| !matches!(o, Output::Audit { .. })));
    }
    // The device removed by a root token: requests run again.
    let (d, _) = call(
        &mut n,
        3_000,
        Request::new(6, Method::Delete, "sys/audit/f").with_token("root-unit"),
    );
    assert_eq!(d.status, 204, "{d:?}");
    let (w, _) = call(&mut n, 3_000, write(7));
    assert_eq!(w.status, 204);
}

#[test]
fn a_failed_device_is_tried_again_after_the_retry_interval() {
    let mut n = failed_device_node();
    let r = |id| Request::new(id, Method::Get, "sys/mounts").with_token("root-unit");
    assert_eq!(call(&mut n, 3_000 + RETRY_MS - 1, r(2)).0.status, 500);
    let (ok, out) = call(&mut n, 3_000 + RETRY_MS, r(3));
    assert_eq!(ok.status, 200);
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::Audit { required: true, .. })));
}
