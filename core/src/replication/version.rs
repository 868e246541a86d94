//! The versioning rule of replication: data flows from a cluster to one of the same or a
//! newer version, never to an older one ("upstream clusters must run older versions than
//! downstream clusters when upgrading"; a newer primary may write what an older secondary
//! misreads).
//!
//! Enforced on both sides: a secondary refuses an activation credential minted by a newer
//! primary (enable and update-primary change nothing), and a primary refuses every request of
//! a secondary that reports an older version (code [`TOO_OLD`]), so an upgrade of the primary
//! alone stops the stream with a status that names both versions instead of sending data.

/// The refusal code a primary answers an older secondary with.
pub const TOO_OLD: &str = "version-too-old";

/// `major.minor.patch` of a version string (`v` prefix, pre-release and build suffixes and
/// missing parts tolerated); `None` when it does not start with a number.
fn parts(v: &str) -> Option<[u64; 3]> {
    let core = v.trim().trim_start_matches('v');
    let core = core.split(['-', '+']).next().unwrap_or_default();
    let mut out = [0u64; 3];
    let mut any = false;
    for (slot, p) in out.iter_mut().zip(core.split('.')) {
        *slot = p.parse().ok()?;
        any = true;
    }
    any.then_some(out)
}

/// Whether `mine` is older than `theirs`. An unknown version on either side (a peer from
/// before versions were exchanged, or a string that is not a version) is not judged.
pub fn older(mine: &str, theirs: &str) -> bool {
    match (parts(mine), parts(theirs)) {
        (Some(a), Some(b)) => a < b,
        _ => false,
    }
}

/// What a secondary at `secondary` is told about a primary at `primary`.
pub fn refusal(secondary: &str, primary: &str) -> String {
    format!(
        "this secondary runs version {secondary}, older than its primary's {primary}: \
         replication from a newer version to an older one is unsafe; upgrade the secondary \
         cluster to {primary} or newer first (secondaries are upgraded before their primary)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::quickcheck;

    #[test]
    fn versions_compare_by_number_not_text() {
        assert!(older("0.9.0", "0.10.0"));
        assert!(older("1.2.3", "1.3.0"));
        assert!(older("v1.2.3", "1.2.4-rc1"));
        assert!(!older("1.3.0", "1.2.9"));
        assert!(!older("1.2.3", "1.2.3"));
        assert!(!older("1.2", "1.2.0"));
        // Unknown versions are not judged.
        assert!(!older("", "9.9.9"));
        assert!(!older("1.0.0", "dev"));
        assert!(refusal("0.1.0", "0.2.0").contains("0.1.0"));
    }

    quickcheck! {
        fn older_is_a_strict_order(a: (u8, u8, u8), b: (u8, u8, u8)) -> bool {
            let (x, y) = (format!("{}.{}.{}", a.0, a.1, a.2), format!("{}.{}.{}", b.0, b.1, b.2));
            let lt = older(&x, &y);
            lt == (a < b) && !(lt && older(&y, &x))
        }
    }
}
