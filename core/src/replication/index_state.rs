//! Client-controlled consistency: the replication state a write leaves behind, carried by
//! the `X-Vault-Index` header.
//!
//! A primary (of either mode) answers every request that appended to its WAL with its
//! state: `v1:<performance cluster id>:<DR cluster id>:<WAL index>`, base64, an id left
//! empty in a mode the node is not primary of. A client that sends the state back to a
//! performance secondary of that primary is refused with 412 while the secondary has not
//! applied that WAL index, so it can retry there or go to the primary; a state of another
//! cluster is ignored (nothing here can be compared with it). DR secondaries refuse client
//! requests anyway: a client compares the index with their status' `last_remote_wal`.

use super::state::Role;
use super::{Mode, Replication};
use crate::api::{ApiError, ApiResult};
use base64::Engine;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// What `X-Vault-Index` carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexState {
    /// The performance primary's cluster id ("" when the node is not one).
    pub perf_cluster_id: String,
    /// The DR primary's cluster id ("" when the node is not one).
    pub dr_cluster_id: String,
    /// The last WAL index the write appended (or later).
    pub index: u64,
}

impl IndexState {
    pub fn encode(&self) -> String {
        B64.encode(format!(
            "v1:{}:{}:{}",
            self.perf_cluster_id, self.dr_cluster_id, self.index
        ))
    }

    pub fn decode(header: &str) -> Result<IndexState, String> {
        let raw = B64
            .decode(header.trim())
            .map_err(|e| format!("X-Vault-Index is not base64: {e}"))?;
        let text = String::from_utf8(raw).map_err(|_| "X-Vault-Index is not UTF-8".to_string())?;
        let mut parts = text.split(':');
        let (Some("v1"), Some(perf), Some(dr), Some(index), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(
                "X-Vault-Index is not a state this server issued (v1:perf:dr:index)".into(),
            );
        };
        let index = index
            .parse()
            .map_err(|_| format!("X-Vault-Index: {index:?} is not a WAL index"))?;
        Ok(IndexState {
            perf_cluster_id: perf.to_string(),
            dr_cluster_id: dr.to_string(),
            index,
        })
    }
}

fn primary_id(r: &Replication, m: Mode) -> String {
    let rt = r.mode(m);
    if rt.role.role == Role::Primary {
        rt.role.cluster_id.clone()
    } else {
        String::new()
    }
}

/// The state to return after a request, given the WAL's last index before it: `None` when
/// the request appended nothing to the WAL or the node is no primary.
pub fn after_request(r: &Replication, wal_before: u64) -> Option<String> {
    if r.wal.last <= wal_before {
        return None;
    }
    current(r)
}

/// The state this node is at (its WAL's last index), `None` when it is no primary: what a
/// snapshot's answer carries, naming the point in the write order the snapshot captured.
pub fn current(r: &Replication) -> Option<String> {
    let perf = primary_id(r, Mode::Performance);
    let dr = primary_id(r, Mode::Dr);
    if perf.is_empty() && dr.is_empty() {
        return None;
    }
    Some(
        IndexState {
            perf_cluster_id: perf,
            dr_cluster_id: dr,
            index: r.wal.last,
        }
        .encode(),
    )
}

/// Refuses a request whose `X-Vault-Index` names a state of this performance secondary's
/// primary that it has not applied yet (412; a malformed header was refused with 400 when
/// the request head was read).
pub fn check(r: &Replication, want: Option<&IndexState>) -> ApiResult<()> {
    let Some(want) = want else {
        return Ok(());
    };
    let perf = r.mode(Mode::Performance);
    if perf.role.role != Role::Secondary || want.perf_cluster_id.is_empty() {
        return Ok(());
    }
    let Some(creds) = &perf.role.creds else {
        return Ok(());
    };
    if creds.primary_cluster_id != want.perf_cluster_id || perf.role.last_remote_wal >= want.index {
        return Ok(());
    }
    Err(ApiError::NotCaughtUp(format!(
        "this performance secondary has applied its primary's WAL up to index {}, not yet {} \
         as X-Vault-Index requires: retry shortly, or send the request to the primary",
        perf.role.last_remote_wal, want.index
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::quickcheck;

    #[test]
    fn garbage_is_refused_with_a_reason() {
        for bad in [
            "%%%",
            "djE6YTpi",
            &B64.encode("v2:a:b:1"),
            &B64.encode("v1:a:b:x"),
        ] {
            assert!(IndexState::decode(bad).is_err(), "{bad}");
        }
    }

    quickcheck! {
        fn encode_then_decode_is_identity(perf: String, dr: String, index: u64) -> bool {
            let clean = |s: String| s.replace(':', "");
            let st = IndexState { perf_cluster_id: clean(perf), dr_cluster_id: clean(dr), index };
            IndexState::decode(&st.encode()).as_ref() == Ok(&st)
        }
    }
}
