//! Lockout tests: failed logins counted per user (one counter whatever the spelling of the
//! name), the threshold refusing without asking the directory, unlocking through
//! `sys/locked-users`, and lockout turned off per mount.

use super::tests::{accessor, authenticated_search, error, World};
use super::*;

fn locked_users(w: &mut World) -> Value {
    let r = w.admin(Method::Get, "sys/locked-users", json!({}));
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body.unwrap()["data"].clone()
}

#[test]
fn lockout_after_threshold_refuses_without_the_directory_and_unlocks() {
    let mut w = World::new();
    let mut c = authenticated_search();
    c["user_lockout_threshold"] = json!(3);
    c["user_lockout_duration"] = json!("60s");
    c["user_lockout_counter_reset"] = json!("30s");
    w.configure(c);
    let acc = accessor(&mut w);
    for _ in 0..3 {
        let r = w.login("alice", "wrong");
        assert_eq!(r.status, 400);
        assert_eq!(error(&r), "ldap operation failed: failed to bind as user");
    }
    // Locked: even the right password is refused, and the directory is not asked.
    let n = w.dir.log.len();
    let r = w.login("alice", "alicepw");
    assert_eq!(r.status, 403, "{:?}", r.body);
    assert_eq!(error(&r), "permission denied");
    assert_eq!(
        w.login("ALICE", "alicepw").status,
        403,
        "names are canonical"
    );
    assert_eq!(w.dir.log.len(), n);
    // Another user is not affected.
    assert_eq!(w.login("bob", "bobpw").status, 200);
    // Listed by mount accessor; the lock is stored cluster-local.
    let d = locked_users(&mut w);
    assert_eq!(d["total"], 1);
    assert_eq!(
        d["by_namespace"][0]["mount_accessors"][0],
        json!({"mount_accessor": acc, "counts": 1, "alias_identifiers": ["alice"]})
    );
    assert!(w
        .node
        .storage()
        .map
        .keys()
        .any(|k| k == &lockout::key(&acc, "alice")));
    let r = w.call(Method::Get, "sys/locked-users", json!({}), None);
    assert_eq!(r.status, 403, "needs a token");
    // Unlock (idempotent), then the right password works.
    for _ in 0..2 {
        let r = w.admin(
            Method::Post,
            &format!("sys/locked-users/{acc}/unlock/ALICE"),
            json!({}),
        );
        assert_eq!(r.status, 204, "{:?}", r.body);
    }
    assert_eq!(locked_users(&mut w)["total"], 0);
    assert_eq!(w.login("alice", "alicepw").status, 200);
    assert!(!w
        .node
        .storage()
        .map
        .keys()
        .any(|k| k.starts_with(lockout::PREFIX)));
    // Locked again, the lock ends after the duration.
    for _ in 0..3 {
        w.login("alice", "wrong");
    }
    assert_eq!(w.login("alice", "alicepw").status, 403);
    w.now += 61_000;
    assert_eq!(
        locked_users(&mut w)["total"],
        0,
        "expired locks are not listed"
    );
    assert_eq!(w.login("alice", "alicepw").status, 200);
    // The count restarts after counter_reset without failures, and after a success.
    for _ in 0..2 {
        w.login("alice", "wrong");
    }
    w.now += 31_000;
    for _ in 0..2 {
        w.login("alice", "wrong");
    }
    assert_eq!(w.login("alice", "alicepw").status, 200);
    for _ in 0..2 {
        w.login("alice", "wrong");
    }
    assert_eq!(w.login("alice", "alicepw").status, 200);
    // Unknown users count too (the answer does not tell them apart).
    for _ in 0..3 {
        assert_eq!(w.login("nobody", "x").status, 400);
    }
    assert_eq!(w.login("nobody", "x").status, 403);
    // A directory that cannot be reached is not the user's fault.
    w.dir.dead_urls.insert("ldap://dir.example:389".into());
    for _ in 0..4 {
        assert_eq!(w.login("bob", "bobpw").status, 400);
    }
    w.dir.dead_urls.clear();
    assert_eq!(w.login("bob", "bobpw").status, 200);
}

#[test]
fn lockout_can_be_disabled_per_mount() {
    let mut w = World::new();
    let mut c = authenticated_search();
    c["user_lockout_disable"] = json!(true);
    w.configure(c);
    for _ in 0..8 {
        assert_eq!(w.login("alice", "wrong").status, 400);
    }
    assert_eq!(w.login("alice", "alicepw").status, 200);
    let r = w.admin(Method::Get, "auth/ldap/config", json!({}));
    let d = r.body.unwrap()["data"].clone();
    assert_eq!(d["user_lockout_disable"], true);
    assert_eq!(d["user_lockout_threshold"], 5);
    // Default threshold: five failures lock.
    w.configure(json!({"user_lockout_disable": false}));
    for _ in 0..5 {
        assert_eq!(w.login("alice", "wrong").status, 400);
    }
    assert_eq!(w.login("alice", "alicepw").status, 403);
}

#[test]
fn padded_and_cased_names_count_against_one_lockout_counter() {
    let mut w = World::new();
    let mut c = authenticated_search();
    c["user_lockout_threshold"] = json!(4);
    w.configure(c);
    let acc = accessor(&mut w);
    for name in [" alice", "alice  ", "ALICE", "alice"] {
        let r = w.login(name, "wrong");
        assert_eq!(r.status, 400, "{name:?}: {:?}", r.body);
    }
    for name in ["alice", "  Alice ", "alice\t"] {
        assert_eq!(w.login(name, "alicepw").status, 403, "{name:?}");
    }
    let d = locked_users(&mut w);
    assert_eq!(
        d["by_namespace"][0]["mount_accessors"][0]["alias_identifiers"],
        json!(["alice"])
    );
    // Unlocking any spelling unlocks the canonical alias.
    let r = w.admin(
        Method::Post,
        &format!("sys/locked-users/{acc}/unlock/ Alice "),
        json!({}),
    );
    assert_eq!(r.status, 204, "{:?}", r.body);
    assert_eq!(locked_users(&mut w)["total"], 0);
    assert_eq!(w.login("alice", "alicepw").status, 200);
}

#[test]
fn names_resolving_to_one_entry_share_a_lockout_counter() {
    let mut w = World::new();
    let mut c = authenticated_search();
    // Alice logs in by uid or by her userPrincipalName.
    c["userfilter"] = json!("(|({{.UserAttr}}={{.Username}})(userPrincipalName={{.Username}}))");
    c["user_lockout_threshold"] = json!(3);
    w.configure(c);
    let acc = accessor(&mut w);
    assert_eq!(w.login("alice@example.org", "alicepw").status, 200);
    for name in ["alice@example.org", "alice@example.org", "alice"] {
        assert_eq!(w.login(name, "wrong").status, 400, "{name}");
    }
    // The entry (uid alice) has three failures: locked by either name, whatever the
    // password; the UPN spelling has only two of its own.
    assert_eq!(w.login("alice", "alicepw").status, 403);
    let r = w.login("alice@example.org", "alicepw");
    assert_eq!(r.status, 403, "{:?}", r.body);
    let r = w.login("alice@example.org", "wrong");
    assert_eq!(
        r.status, 403,
        "a locked entry tells nothing of the password"
    );
    let d = locked_users(&mut w);
    assert_eq!(
        d["by_namespace"][0]["mount_accessors"][0]["alias_identifiers"],
        json!(["alice"])
    );
    // Unlocking the user's name unlocks the entry.
    let r = w.admin(
        Method::Post,
        &format!("sys/locked-users/{acc}/unlock/alice"),
        json!({}),
    );
    assert_eq!(r.status, 204);
    assert_eq!(w.login("alice@example.org", "alicepw").status, 200);
    assert_eq!(w.login("alice", "alicepw").status, 200);
    // Bob's entry is another counter.
    for _ in 0..2 {
        w.login("alice@example.org", "wrong");
    }
    assert_eq!(w.login("bob", "bobpw").status, 200);
}
