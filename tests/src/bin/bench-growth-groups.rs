//! `bench-growth-groups [GROUPS=1,10,35,200] [SECONDS=4] [CLIENTS=8] [PAGE=20]`: LDAP
//! logins/s through a real `cairn` (release build, `cairn server --dev`) as the user's group
//! count grows, against the throwaway slapd of `scripts/dev-ldap.sh`, next to the same
//! directory round trips made directly with ldap3 (the baseline, same run, same
//! concurrency). Run through `scripts/bench.sh growth-groups`; writes `growth-groups.csv`
//! and `.svg`.
//!
//! For each count N a user `growN` is added to the directory with N `groupOfNames` groups.
//! Cairn's LDAP method searches groups with the default group filter and `max_page_size =
//! PAGE`: a user with more groups than PAGE gets them over several pages (slapd's size
//! limit of 50 entries would refuse 200 without paging). The last of the user's groups is
//! mapped to a policy, and every login answer must carry a token and that policy (so a
//! lost page is an error, never a faster login). The direct baseline connects, binds as the
//! service account, searches the user, binds as the user, binds again as the service account
//! (as Cairn does) and searches the groups with the same page size, checking it got N.
//! The phases alternate (direct, Cairn; twice) for SECONDS / 2 each.

use cairn_tests::growth::{num, sizes, Table};
use cairn_tests::keepalive::KeepAlive;
use cairn_tests::loadgen::{self, MakeOp, Op, Phase};
use cairn_tests::{start_dev_ldap, Server};
use ldap3::adapters::{Adapter, EntriesOnly, PagedResults};
use ldap3::{LdapConn, Scope, SearchEntry};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::Arc;

const BASE: &str = "dc=cairn,dc=test";
const GROUPFILTER: &str =
    "(|(memberUid={{.Username}})(member={{.UserDN}})(uniqueMember={{.UserDN}}))";

fn user_dn(n: u64) -> String {
    format!("uid=grow{n},ou=people,{BASE}")
}

fn password(n: u64) -> String {
    format!("grow{n}-pw")
}

/// Adds user `growN` and its N groups `grow{N}-{i}` to the directory as its administrator.
fn populate(url: &str, admin: &str, admin_pw: &str, n: u64) {
    let mut c = LdapConn::new(url).expect("connect to slapd");
    c.simple_bind(admin, admin_pw)
        .and_then(|r| r.success())
        .expect("admin bind");
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<HashSet<String>>();
    let uid = format!("grow{n}");
    c.add(
        &user_dn(n),
        vec![
            ("objectClass".to_string(), set(&["inetOrgPerson"])),
            ("uid".to_string(), set(&[&uid])),
            ("cn".to_string(), set(&[&uid])),
            ("sn".to_string(), set(&["Grow"])),
            ("userPassword".to_string(), set(&[&password(n)])),
        ],
    )
    .and_then(|r| r.success())
    .expect("add user");
    for i in 0..n {
        let cn = format!("grow{n}-{i}");
        c.add(
            &format!("cn={cn},ou=groups,{BASE}"),
            vec![
                ("objectClass".to_string(), set(&["groupOfNames"])),
                ("cn".to_string(), set(&[&cn])),
                ("member".to_string(), set(&[&user_dn(n)])),
            ],
        )
        .and_then(|r| r.success())
        .expect("add group");
    }
    let _ = c.unbind();
}

/// One login made directly (see the module doc); checks that N groups came back.
fn direct_login(url: &str, binddn: &str, bindpw: &str, n: u64, page: i32) -> Result<(), String> {
    let mut c = LdapConn::new(url).map_err(|e| format!("connect: {e}"))?;
    let r = (|| {
        c.simple_bind(binddn, bindpw)
            .and_then(|r| r.success())
            .map_err(|e| format!("service bind: {e}"))?;
        let (users, _) = c
            .search(
                &format!("ou=people,{BASE}"),
                Scope::Subtree,
                &format!("(uid=grow{n})"),
                vec!["uid"],
            )
            .and_then(|r| r.success())
            .map_err(|e| format!("user search: {e}"))?;
        if users.len() != 1 {
            return Err(format!("user search matched {} entries", users.len()));
        }
        let dn = SearchEntry::construct(users.into_iter().next().expect("one entry")).dn;
        c.simple_bind(&dn, &password(n))
            .and_then(|r| r.success())
            .map_err(|e| format!("user bind: {e}"))?;
        c.simple_bind(binddn, bindpw)
            .and_then(|r| r.success())
            .map_err(|e| format!("service re-bind: {e}"))?;
        let filter = GROUPFILTER
            .replace("{{.Username}}", &format!("grow{n}"))
            .replace("{{.UserDN}}", &dn);
        let adapters: Vec<Box<dyn Adapter<_, _>>> = if page > 0 {
            vec![
                Box::new(EntriesOnly::new()),
                Box::new(PagedResults::new(page)),
            ]
        } else {
            vec![Box::new(EntriesOnly::new())]
        };
        let mut s = c
            .streaming_search_with(
                adapters,
                &format!("ou=groups,{BASE}"),
                Scope::Subtree,
                &filter,
                vec!["cn"],
            )
            .map_err(|e| format!("group search: {e}"))?;
        let mut got = 0u64;
        while let Some(_e) = s.next().map_err(|e| format!("group search: {e}"))? {
            got += 1;
        }
        s.result()
            .success()
            .map_err(|e| format!("group search: {e}"))?;
        if got != n {
            return Err(format!("{got} groups for grow{n}, want {n}"));
        }
        Ok(())
    })();
    let _ = c.unbind();
    r
}

/// Whether a login answer carries a token and the policy of the user's last group.
fn check(n: u64, status: u16, body: &[u8]) -> Result<(), String> {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let token = v["auth"]["client_token"]
        .as_str()
        .is_some_and(|t| !t.is_empty());
    let want = format!("last{n}");
    let policy = v["auth"]["policies"]
        .as_array()
        .is_some_and(|p| p.iter().any(|p| p == want.as_str()));
    if status == 200 && token && policy {
        Ok(())
    } else {
        Err(format!(
            "login grow{n}: {status} {}",
            String::from_utf8_lossy(body)
        ))
    }
}

fn main() {
    if std::env::var_os("CAIRN_E2E_LOG_LEVEL").is_none() {
        std::env::set_var("CAIRN_E2E_LOG_LEVEL", "info");
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let counts = sizes(args.first(), &[1, 10, 35, 200]);
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(4.0);
    let clients: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(8);
    let page: i32 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(20);

    let env = start_dev_ldap("growth-groups");
    let url = env["CAIRN_LDAP_URL"].clone();
    let (binddn, bindpw) = (
        env["CAIRN_LDAP_BINDDN"].clone(),
        env["CAIRN_LDAP_BINDPASS"].clone(),
    );
    let slapd: u32 = env["CAIRN_LDAP_PID"].parse().unwrap_or(0);
    for &n in &counts {
        populate(
            &url,
            &env["CAIRN_LDAP_ADMIN_DN"],
            &env["CAIRN_LDAP_ADMIN_PASS"],
            n,
        );
    }

    let s = Server::dev();
    // The LDAP method is mounted at auth/ldap/ from the start.
    let r = s.post(
        "auth/ldap/config",
        json!({
            "url": url,
            "binddn": binddn,
            "bindpass": bindpw,
            "userdn": format!("ou=people,{BASE}"),
            "userattr": "uid",
            "groupdn": format!("ou=groups,{BASE}"),
            "groupfilter": GROUPFILTER,
            "groupattr": "cn",
            "max_page_size": page,
        }),
    );
    assert!(r.status < 300, "config: {} {}", r.status, r.errors());
    for &n in &counts {
        let r = s.post(
            &format!("auth/ldap/groups/grow{n}-{}", n - 1),
            json!({ "policies": format!("last{n}") }),
        );
        assert_eq!(r.status, 204, "group mapping: {}", r.errors());
    }
    let pids = [std::process::id(), s.pid(), slapd];

    let mut table = Table::new(
        "growth-groups",
        &[
            ("groups", "groups per user"),
            ("pages", "pages (PAGE entries each)"),
            ("direct_per_s", "baseline: direct ldap3 logins/s"),
            ("direct_p50_ms", "direct p50 (ms)"),
            ("direct_p99_ms", "direct p99 (ms)"),
            ("cairn_per_s", "Cairn logins/s"),
            ("cairn_p50_ms", "Cairn p50 (ms)"),
            ("cairn_p99_ms", "Cairn p99 (ms)"),
            ("cairn_vs_direct", "Cairn / direct"),
            ("cairn_cpu_ms", "Cairn CPU ms/login"),
            ("errors", "errors (direct, Cairn)"),
        ],
    );
    for &n in &counts {
        let direct: MakeOp = {
            let (url, binddn, bindpw) = (url.clone(), binddn.clone(), bindpw.clone());
            Arc::new(move |_| {
                let (url, binddn, bindpw) = (url.clone(), binddn.clone(), bindpw.clone());
                Box::new(move |_: &mut KeepAlive, _| direct_login(&url, &binddn, &bindpw, n, page))
                    as Op
            })
        };
        let cairn: MakeOp = Arc::new(move |_| {
            let path = format!("/v1/auth/ldap/login/grow{n}");
            let body = json!({ "password": password(n) }).to_string().into_bytes();
            Box::new(move |c: &mut KeepAlive, _| {
                let r = c
                    .call(
                        "POST",
                        &path,
                        &[("Content-Type", "application/json")],
                        &body,
                    )
                    .map_err(|e| format!("login grow{n}: {e}"))?;
                check(n, r.status, &r.body)
            }) as Op
        });
        let (mut d, mut c) = (Phase::default(), Phase::default());
        for _ in 0..2 {
            let add = |acc: &mut Phase, p: Phase| {
                acc.lat.extend(p.lat);
                acc.ok += p.ok;
                acc.errors += p.errors;
                acc.secs += p.secs;
                acc.total += p.total;
                if acc.cpu.is_empty() {
                    acc.cpu = vec![0.0; p.cpu.len()];
                }
                for (a, b) in acc.cpu.iter_mut().zip(&p.cpu) {
                    *a += b;
                }
                for e in p.samples {
                    eprintln!("{e}");
                }
            };
            add(
                &mut d,
                loadgen::run(&s.addr, clients, secs / 2.0, &pids, direct.clone()),
            );
            add(
                &mut c,
                loadgen::run(&s.addr, clients, secs / 2.0, &pids, cairn.clone()),
            );
        }
        for p in [&mut d, &mut c] {
            p.lat
                .sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        }
        let pages = if page > 0 {
            n.div_ceil(page as u64).max(1)
        } else {
            1
        };
        table.row(vec![
            n.to_string(),
            pages.to_string(),
            num(d.rate(), 0),
            num(d.pct(0.5), 2),
            num(d.pct(0.99), 2),
            num(c.rate(), 0),
            num(c.pct(0.5), 2),
            num(c.pct(0.99), 2),
            num(c.rate() / d.rate().max(1e-9), 2),
            num(c.cpu_us(1) / 1000.0, 3),
            format!("{} / {}", d.errors, c.errors),
        ]);
    }
    println!(
        "{clients} clients, {secs} s per side per count (two alternating rounds), pages of \
         {page} entries (max_page_size; slapd refuses more than 50 entries without paging).\n"
    );
    table.finish(&[
        "--x",
        "groups",
        "--logx",
        "--y",
        "direct_per_s,cairn_per_s",
        "--y2",
        "direct_p99_ms,cairn_p99_ms",
        "--title",
        "LDAP logins vs groups per user",
        "--xlabel",
        "groups per user",
        "--ylabel",
        "logins/s",
        "--y2label",
        "p99 (ms)",
    ]);
}
