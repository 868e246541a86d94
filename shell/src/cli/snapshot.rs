//! `operator snapshot save FILE` and `operator snapshot restore FILE`: the storage snapshot
//! (`sys/storage/raft/snapshot`) moved between the server and a file, byte for byte.

use super::{CliError, Client, CmdResult, Common, Ctx, Format};
use cairn_core::replication::index_state::IndexState;
use clap::Subcommand;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The API path of snapshots.
const PATH: &str = "sys/storage/raft/snapshot";
/// Largest snapshot the client reads from the server.
const MAX_SNAPSHOT: u64 = 16 << 30;

#[derive(Subcommand, Debug)]
pub enum SnapshotCmd {
    /// Save a snapshot of the server's storage (encrypted values, as stored) to FILE.
    Save(FileArgs),
    /// Restore the server's storage from a snapshot FILE taken on this cluster.
    Restore(FileArgs),
}

#[derive(clap::Args, Debug)]
pub struct FileArgs {
    /// The snapshot file.
    pub file: PathBuf,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(cmd: SnapshotCmd) -> CmdResult {
    match cmd {
        SnapshotCmd::Save(a) => {
            let c = Client::new(&a.common)?;
            let (status, body, index) = c
                .send_bytes("GET", PATH, Vec::new(), MAX_SNAPSHOT)
                .ctx(|| "saving a snapshot".into())?;
            if status >= 400 {
                let r = super::client::ApiResponse {
                    status,
                    body: serde_json::from_slice(&body).unwrap_or_default(),
                };
                return Err(c.api_error("GET", PATH, &r)).ctx(|| "saving a snapshot".into());
            }
            write_atomically(&a.file, &body)?;
            if a.common.format == Format::Table {
                // A primary names the point in its write order the snapshot holds.
                let at = index
                    .and_then(|i| IndexState::decode(&i).ok())
                    .map(|i| format!(", at WAL index {}", i.index))
                    .unwrap_or_default();
                println!(
                    "Success! Snapshot saved to {} ({} bytes{at}).",
                    a.file.display(),
                    body.len()
                );
            }
            Ok(0)
        }
        SnapshotCmd::Restore(a) => {
            let c = Client::new(&a.common)?;
            let file = std::fs::read(&a.file).map_err(|e| {
                CliError::Local(format!(
                    "cannot read snapshot file {}: {e}",
                    a.file.display()
                ))
            })?;
            let (status, body, _) = c
                .send_bytes("POST", PATH, file, 1 << 20)
                .ctx(|| "restoring a snapshot".into())?;
            if status >= 400 {
                let r = super::client::ApiResponse {
                    status,
                    body: serde_json::from_slice(&body).unwrap_or_default(),
                };
                return Err(c.api_error("POST", PATH, &r)).ctx(|| "restoring a snapshot".into());
            }
            if a.common.format == Format::Table {
                println!("Success! Snapshot restored from {}.", a.file.display());
            }
            Ok(0)
        }
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory, synced and then
/// renamed, so an interrupted save never leaves a partial file under the name.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    let err = |e: std::io::Error| {
        CliError::Local(format!(
            "cannot write snapshot file {}: {e}",
            path.display()
        ))
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".partial");
    let tmp = PathBuf::from(tmp);
    // Readable by its owner only (it names every key and token accessor), and never
    // through a file or link that is already there.
    let mut f = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    CliError::Local(format!(
                        "cannot write snapshot file {}: {} exists (an interrupted save?); \
                         remove it and save again",
                        path.display(),
                        tmp.display()
                    ))
                } else {
                    err(e)
                }
            })?
    };
    f.write_all(bytes).map_err(err)?;
    f.sync_all().map_err(err)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(err)
}
