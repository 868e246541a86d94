//! The `snapshot_file` fuzz target: hostile snapshot files through the reader and the restore's
//! write set.

use crate::snapshot::{self, Header, Keys, Snapshot};
use crate::storage::{MemStorage, Storage};

/// The rows of the valid file the target starts from.
fn sample_rows() -> Vec<(String, Vec<u8>)> {
    vec![
        ("core/mounts".into(), b"\x01mounts".to_vec()),
        ("core/seal-config".into(), b"{}".to_vec()),
        ("logical/u1/a".into(), vec![1, 2, 3]),
        ("logical/u1/b".into(), Vec::new()),
        ("sys/policy/p".into(), vec![0xff; 40]),
    ]
}

/// Snapshot files: the first byte chooses raw bytes as the file (odd) or a valid file of
/// [`sample_rows`] with the rest as edits (pairs of a two-byte position and a byte; a
/// position past the end truncates there). The reader never panics; a file it accepts
/// holds exactly the rows it was written with (an edited file is refused or unchanged);
/// the restore's write set turns any storage into those rows, the kept keys aside.
pub fn snapshot_file(data: &[u8]) {
    let keys = Keys::from_barrier_key(&[7; 32]);
    let header = Header {
        cluster: keys.cluster_id().to_string(),
        index: 42,
        rows: 5,
        taken_at: 1_000,
        node_id: "n".into(),
        on_secondary: false,
    };
    let rows = sample_rows();
    let valid = snapshot::encode(&header, &rows, &keys);
    let (file, edited) = match data.split_first() {
        Some((m, rest)) if m % 2 == 1 => (rest.to_vec(), true),
        Some((_, rest)) => {
            let mut f = valid.clone();
            for e in rest.chunks(3) {
                let pos = usize::from(e[0]) | usize::from(e.get(1).copied().unwrap_or(0)) << 8;
                let byte = e.get(2).copied().unwrap_or(0);
                if pos < f.len() {
                    f[pos] ^= byte;
                } else {
                    f.truncate(pos % (f.len() + 1));
                }
            }
            (f, false)
        }
        None => (valid.clone(), false),
    };
    let _ = snapshot::inspect(&file);
    let Ok(snap) = snapshot::read(&file, &keys) else {
        return;
    };
    if !edited {
        assert_eq!(file, valid, "an altered file was accepted");
        assert_eq!(snap.rows, rows);
        assert_eq!(snap.header, header);
    }
    restore_holds(&snap);
}

/// Applying the restore's write set to storage holding other data leaves exactly the
/// snapshot's rows (and the kept keys as they were).
fn restore_holds(snap: &Snapshot) {
    let mut s = MemStorage::new();
    for (k, v) in [
        ("core/keyring", &b"ring"[..]),
        ("logical/u1/a", b"old"),
        ("logical/u1/c", b"gone"),
        ("node/wal/meta", b"{}"),
    ] {
        s.map.insert(k.into(), v.to_vec());
    }
    let kept: Vec<(String, Vec<u8>)> = s
        .map
        .iter()
        .filter(|(k, _)| snapshot::kept(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let writes = snapshot::restore_writes(&s, snap).unwrap();
    s.apply(&writes).unwrap();
    let mut want: Vec<(String, Vec<u8>)> = snap
        .rows
        .iter()
        .filter(|(k, _)| !snapshot::kept(k))
        .cloned()
        .chain(kept)
        .collect();
    want.sort();
    let got: Vec<(String, Vec<u8>)> = s.map.into_iter().collect();
    assert_eq!(got, want);
    // A second restore changes nothing.
    let mut again = MemStorage::new();
    again.map = got.into_iter().collect();
    assert!(snapshot::restore_writes(&again, snap).unwrap().is_empty());
}
