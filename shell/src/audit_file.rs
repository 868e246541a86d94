//! The file audit device's I/O: appends the audit lines of one batch to their files before
//! the batch commits, and opens the file of a device being enabled. A failure to write a
//! required line fails the whole batch closed (the runtime rolls the batch back, answers
//! its requests with 500 and tells the node which device failed).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};

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

/// Opens `path` for appending. A file that is not there is created with the permission bits
/// `mode` (the device's `mode` option; 0, "leave the mode alone", creates it 0600), set as
/// they are (the umask does not narrow them), as the reference sets them.
fn open(path: &str, mode: u32) -> std::io::Result<File> {
    match OpenOptions::new().append(true).open(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => create(path, mode),
        r => r,
    }
}

fn create(path: &str, mode: u32) -> std::io::Result<File> {
    let mode = if mode == 0 { 0o600 } else { mode };
    let mut opts = OpenOptions::new();
    opts.append(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(mode);
    }
    match opts.open(path) {
        Ok(f) => {
            set_mode(&f, mode)?;
            Ok(f)
        }
        // Created meanwhile by someone else: append to it.
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            OpenOptions::new().append(true).open(path)
        }
        Err(e) => Err(e),
    }
}

#[cfg(unix)]
fn set_mode(f: &File, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(std::fs::Permissions::from_mode(mode))
}

#[cfg(not(unix))]
fn set_mode(_: &File, _: u32) -> std::io::Result<()> {
    Ok(())
}

/// Opens (creating it) the file of a device being enabled: can the server append to it?
/// An existing regular file is given the permission bits `mode` unless it is 0 (a device,
/// such as `/dev/null`, keeps its own).
pub fn probe(path: &str, mode: u32) -> Result<(), String> {
    let f = open(path, mode).map_err(|e| e.to_string())?;
    let regular = f.metadata().map(|m| m.is_file()).unwrap_or(false);
    if mode != 0 && regular {
        set_mode(&f, mode)
            .map_err(|e| format!("opened, but cannot set its mode to {mode:04o}: {e}"))?;
    }
    Ok(())
}

/// Appends `(file_path, mode, line)` triples, one line each, in order per file; flushed on
/// return. A file that is not there (rotated away) is created with its device's `mode`.
pub fn append(lines: &[(String, u32, String)]) -> Result<(), Failure> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut by_file: BTreeMap<&str, (u32, Vec<u8>)> = BTreeMap::new();
    for (path, mode, line) in lines {
        let (_, buf) = by_file.entry(path.as_str()).or_insert((*mode, Vec::new()));
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
    }
    for (path, (mode, buf)) in by_file {
        let fail = |what: &str, e: std::io::Error| Failure {
            file_path: path.to_string(),
            error: format!("cannot {what} audit file {path}: {e}"),
        };
        let mut f = open(path, mode).map_err(|e| fail("open", e))?;
        f.write_all(&buf)
            .and_then(|_| f.flush())
            .map_err(|e| fail("write", e))?;
    }
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode_of(path: &std::path::Path) -> u32 {
        std::fs::metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o7777
    }

    /// The device's `mode` is the file's: set on an existing file when the device is
    /// enabled (as the reference does; 0 leaves it alone), and given to a file the server
    /// creates, also after the file was rotated away (the umask does not narrow it).
    #[test]
    fn the_device_mode_is_the_files_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.log");
        let p = path.to_str().expect("utf-8 path").to_string();
        probe(&p, 0o640).expect("probe");
        assert_eq!(mode_of(&path), 0o640);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o604)).expect("chmod");
        probe(&p, 0o600).expect("probe");
        assert_eq!(mode_of(&path), 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o604)).expect("chmod");
        probe(&p, 0).expect("probe");
        assert_eq!(
            mode_of(&path),
            0o604,
            "mode 0000 leaves the file's mode alone"
        );
        // Appends do not touch an existing file's mode.
        append(&[(p.clone(), 0o600, "x".into())]).expect("append");
        assert_eq!(mode_of(&path), 0o604);
        // Rotated away: the next line creates it with the device's mode, 0666 included.
        std::fs::remove_file(&path).expect("rm");
        append(&[(p.clone(), 0o666, "y".into())]).expect("append");
        assert_eq!(mode_of(&path), 0o666);
        std::fs::remove_file(&path).expect("rm");
        append(&[(p.clone(), 0, "z".into())]).expect("append");
        assert_eq!(mode_of(&path), 0o600);
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "z\n");
        // A device file keeps its own mode.
        probe("/dev/null", 0o600).expect("/dev/null");
    }
}
