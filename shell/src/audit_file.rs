//! The file audit device's I/O: appends the audit lines of one batch to their files before
//! the batch commits. Any failure fails the whole batch closed (the runtime rolls the
//! batch back and answers its requests with 500).

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;

/// Appends `(file_path, line)` pairs, one line each, in order per file; flushed on return.
pub fn append(lines: &[(String, String)]) -> Result<(), String> {
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
        let mut opts = OpenOptions::new();
        opts.append(true).create(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts
            .open(path)
            .map_err(|e| format!("cannot open audit file {path}: {e}"))?;
        f.write_all(&buf)
            .and_then(|_| f.flush())
            .map_err(|e| format!("cannot write audit file {path}: {e}"))?;
    }
    Ok(())
}
