//! The durability inspection ([`Checker::inspect`]): a throwaway node booted on a copy of
//! a crashed host's durable storage must hold everything the model says was acknowledged.

use super::*;

/// Seed of the throwaway nodes [`Checker::inspect`] boots (they share nothing with the run).
const INSPECT_SEED: [u8; 32] = [0xA5; 32];

/// Sends one request to a node and returns its answer.
fn call(node: &mut Node<SimStorage>, now: u64, req: Request) -> Option<Response> {
    let id = req.id;
    node.handle(now, Input::Request(req));
    let mut found = None;
    while let Some(o) = node.poll_output() {
        if let Output::Response(r) = o {
            if r.id == id {
                found = Some(r);
            }
        }
    }
    found
}

impl Checker {
    /// Boots a throwaway node on a copy of host `h`'s durable storage at time `now`,
    /// unseals it with the model's shares and compares everything readable with the model.
    /// Returns a one-line summary.
    pub fn inspect(
        &mut self,
        h: HostId,
        durable: &SimStorage,
        now: u64,
    ) -> Result<String, Violation> {
        let e = &self.hosts[h];
        if !e.initialized {
            return Ok("not initialised, nothing to inspect".into());
        }
        bump(&mut self.counts, "durability");
        let config = NodeConfig {
            node_id: format!("n{h}-inspect"),
            ..NodeConfig::default()
        };
        let mut node = Node::new(durable.clone(), INSPECT_SEED, config);
        let mut id = 0;
        let mut next = || {
            id += 1;
            id
        };
        for key in e.shares_hex.iter().take(e.threshold.max(1)) {
            let req = Request::new(next(), Method::Put, "sys/unseal")
                .with_json(serde_json::json!({ "key": key }));
            call(&mut node, now, req);
        }
        if node.is_sealed() {
            return fail(
                "durability",
                format!("n{h}: after the crash the durable storage no longer unseals with the key shares"),
            );
        }
        let root = e.root_secret().to_string();
        let what = |r: &Option<Response>| match r {
            Some(r) => format!("{} {}", r.status, body_text(r)),
            None => "no answer".into(),
        };
        let keys = key_universe();
        for key in &keys {
            let r = call(
                &mut node,
                now,
                Request::new(next(), Method::Get, key).with_token(&root),
            );
            let want = if e.mounted {
                e.kv.get(key).map(|k| &k.value)
            } else {
                None
            };
            let ok = match (&r, want) {
                (Some(r), None) => r.status == 404,
                (Some(r), Some(v)) => {
                    r.status == 200 && r.body.as_ref().map(|b| &b["data"]) == Some(v)
                }
                (None, _) => false,
            };
            if !ok {
                let want = want
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "absent (404)".into());
                return fail(
                    "durability",
                    format!(
                        "n{h}: after the crash {key} reads {}, acknowledged state is {want}",
                        what(&r)
                    ),
                );
            }
        }
        let dirs = dir_universe();
        for dir in &dirs {
            let r = call(
                &mut node,
                now,
                Request::new(next(), Method::List, dir).with_token(&root),
            );
            let want = if e.mounted {
                e.children(dir)
            } else {
                BTreeSet::new()
            };
            let got: Option<BTreeSet<String>> = match &r {
                Some(r) if r.status == 404 => Some(BTreeSet::new()),
                Some(r) if r.status == 200 => r
                    .body
                    .as_ref()
                    .map(|b| str_list(&b["data"]["keys"]).into_iter().collect()),
                _ => None,
            };
            if got.as_ref() != Some(&want) {
                return fail(
                    "durability",
                    format!(
                        "n{h}: after the crash LIST {dir} answers {}, expected {want:?}",
                        what(&r)
                    ),
                );
            }
        }
        let mut tokens = 0;
        for (secret, f) in &e.tokens {
            if f.kind != TokenKind::Service {
                continue;
            }
            tokens += 1;
            let auth = e.auth(secret, now);
            let valid = matches!(auth, Auth::Limited { .. });
            let use_limited = f.uses_left.is_some();
            let r = call(
                &mut node,
                now,
                Request::new(next(), Method::Get, "auth/token/lookup-self").with_token(secret),
            );
            let status = r.as_ref().map(|r| r.status).unwrap_or(0);
            if valid && !use_limited && status != 200 {
                return fail(
                    "durability",
                    format!(
                        "n{h}: after the crash valid token {} answers {}",
                        f.label,
                        what(&r)
                    ),
                );
            }
            if !valid && status != 403 {
                return fail(
                    deny_invariant(&auth),
                    format!(
                        "n{h}: after the crash dead token {} answers {}",
                        f.label,
                        what(&r)
                    ),
                );
            }
        }
        for name in crate::operator::POLICY_NAMES {
            let r = call(
                &mut node,
                now,
                Request::new(next(), Method::Get, &format!("sys/policies/acl/{name}"))
                    .with_token(&root),
            );
            let ok = match (&r, e.policy_texts.get(*name)) {
                (Some(r), None) => r.status == 404,
                (Some(r), Some(text)) => {
                    r.status == 200
                        && r.body.as_ref().and_then(|b| b["data"]["policy"].as_str())
                            == Some(text.as_str())
                }
                (None, _) => false,
            };
            if !ok {
                return fail(
                    "durability",
                    format!(
                        "n{h}: after the crash policy {name} reads {}, acknowledged text is {:?}",
                        what(&r),
                        e.policy_texts.get(*name)
                    ),
                );
            }
        }
        // The tenant: its namespace, its policy (read in the namespace) and its live tokens
        // (which act only in it).
        let in_tenant = |mut r: Request| {
            r.namespace = Some(TENANT.into());
            r
        };
        if e.tenant_namespace {
            let r = call(
                &mut node,
                now,
                Request::new(next(), Method::Get, &format!("sys/namespaces/{TENANT}"))
                    .with_token(&root),
            );
            if r.as_ref().map(|r| r.status) != Some(200) {
                return fail(
                    "durability",
                    format!(
                        "n{h}: after the crash namespace {TENANT}/ reads {}",
                        what(&r)
                    ),
                );
            }
        }
        if e.tenant_policy {
            let r = call(
                &mut node,
                now,
                in_tenant(
                    Request::new(
                        next(),
                        Method::Get,
                        &format!("sys/policies/acl/{TENANT_POLICY}"),
                    )
                    .with_token(&root),
                ),
            );
            let text = r
                .as_ref()
                .and_then(|r| r.body.as_ref())
                .and_then(|b| b["data"]["policy"].as_str());
            if text != Some(TENANT_POLICY_TEXT) {
                return fail(
                    "durability",
                    format!(
                        "n{h}: after the crash policy {TENANT_POLICY} of {TENANT}/ reads {}",
                        what(&r)
                    ),
                );
            }
        }
        for (secret, expire_at) in &e.tenant_tokens {
            if expire_at.is_some_and(|x| now >= x) {
                continue;
            }
            tokens += 1;
            let r = call(
                &mut node,
                now,
                in_tenant(
                    Request::new(next(), Method::Get, "auth/token/lookup-self").with_token(secret),
                ),
            );
            if r.as_ref().map(|r| r.status) != Some(200) {
                return fail(
                    "durability",
                    format!(
                        "n{h}: after the crash tenant token {} answers {}",
                        short(secret),
                        what(&r)
                    ),
                );
            }
        }
        let mut wraps = 0;
        for (secret, w) in &e.wraps {
            wraps += 1;
            let valid = w.valid(now);
            let r = call(
                &mut node,
                now,
                Request::new(next(), Method::Post, "sys/wrapping/lookup")
                    .with_json(serde_json::json!({ "token": secret })),
            );
            let status = r.as_ref().map(|r| r.status).unwrap_or(0);
            if valid && status != 200 {
                return fail(
                    "wrapping",
                    format!(
                        "n{h}: after the crash valid wrapping token {} answers {}",
                        w.label,
                        what(&r)
                    ),
                );
            }
            if !valid && status != 400 {
                let inv = w.dead_invariant();
                return fail(
                    inv,
                    format!(
                        "n{h}: after the crash spent wrapping token {} answers {}",
                        w.label,
                        what(&r)
                    ),
                );
            }
        }
        Ok(format!(
            "durable state matches the model: {} keys, {} dirs, {tokens} tokens, {} policies, {wraps} wrapping tokens",
            keys.len(),
            dirs.len(),
            e.policy_texts.len()
        ))
    }
}
