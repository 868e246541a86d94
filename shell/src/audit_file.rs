//! The file audit device's I/O: appends the audit lines of one batch to their files before
//! the batch commits, and opens the file of a device being enabled. A failure to write a
//! required line fails the whole batch closed (the runtime rolls the batch back, answers
//! its requests with 500 and tells the node which device failed).

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;

/// A device whose file could not be written.
#[derive(Debug)]
pub struct Failure {
    pub file_path: String,
    pub error: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.error)
    }
}

fn open(path: &str) -> std::io::Result<std::fs::File> {
    let mut opts = OpenOptions::new();
    opts.append(true).create(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    opts.open(path)
}

/// Opens (creating it) the file of a device being enabled: can the server append to it?
pub fn probe(path: &str) -> Result<(), String> {
    open(path).map(|_| ()).map_err(|e| e.to_string())
}

/// Appends `(file_path, line)` pairs, one line each, in order per file; flushed on return.
pub fn append(lines: &[(String, String)]) -> Result<(), Failure> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut by_file: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
    for (path, line) in lines {
        let buf = by_file.entry(path.as_str()).or_default();
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
    }
    for (path, buf) in by_file {
        let fail = |what: &str, e: std::io::Error| Failure {
            file_path: path.to_string(),
            error: format!("cannot {what} audit file {path}: {e}"),
        };
        let mut f = open(path).map_err(|e| fail("open", e))?;
        f.write_all(&buf)
            .and_then(|_| f.flush())
            .map_err(|e| fail("write", e))?;
    }
    Ok(())
}
