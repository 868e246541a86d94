//! A small stderr logger for the `log` facade; the level comes from `--log-level` or the
//! `CAIRN_LOG` environment variable. Secrets never reach it: the core logs no values.

use log::{Level, LevelFilter, Metadata, Record};

struct Stderr;

/// Whether `target`'s debug and trace records are dropped whatever the level: the
/// PostgreSQL client logs every statement with its parameters there (storage keys and
/// values), which no log should hold (and which would flood a debug log); rustls narrates
/// every handshake (each database connection, each cluster call) at debug.
fn quiet_below_info(target: &str) -> bool {
    target.starts_with("tokio_postgres")
        || target == "postgres"
        || target.starts_with("postgres::")
        || target == "rustls"
        || target.starts_with("rustls::")
        || target.starts_with("tokio_rustls")
}

impl log::Log for Stderr {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= log::max_level() && (m.level() <= Level::Info || !quiet_below_info(m.target()))
    }
    fn log(&self, r: &Record) {
        if self.enabled(r.metadata()) {
            let ts = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0);
            let lvl = match r.level() {
                Level::Error => "ERROR",
                Level::Warn => "WARN ",
                Level::Info => "INFO ",
                Level::Debug => "DEBUG",
                Level::Trace => "TRACE",
            };
            // One write per line: stderr is unbuffered, and formatting straight into it
            // would cost a system call per formatted piece (and interleave threads' lines).
            let line = format!(
                "{} [{lvl}] {}: {}\n",
                cairn_core::time::rfc3339(ts),
                r.target(),
                r.args()
            );
            use std::io::Write;
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
    }
    fn flush(&self) {}
}

static LOGGER: Stderr = Stderr;

pub fn parse_level(s: &str) -> Result<LevelFilter, String> {
    match s.to_ascii_lowercase().as_str() {
        "trace" => Ok(LevelFilter::Trace),
        "debug" => Ok(LevelFilter::Debug),
        "info" => Ok(LevelFilter::Info),
        "warn" | "warning" => Ok(LevelFilter::Warn),
        "error" | "err" => Ok(LevelFilter::Error),
        "off" => Ok(LevelFilter::Off),
        _ => Err(format!(
            "invalid log level {s:?} (trace, debug, info, warn, error, off)"
        )),
    }
}

/// Installs the logger; `flag` wins over `CAIRN_LOG`; default `info`.
pub fn init(flag: Option<&str>) -> Result<(), String> {
    let level = match flag
        .map(str::to_string)
        .or_else(|| std::env::var("CAIRN_LOG").ok())
    {
        Some(s) => parse_level(&s)?,
        None => LevelFilter::Info,
    };
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(level);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use log::Log;

    #[test]
    fn the_database_clients_statements_are_not_logged() {
        log::set_max_level(LevelFilter::Trace);
        let meta = |level, target| Metadata::builder().level(level).target(target).build();
        let l = Stderr;
        assert!(!l.enabled(&meta(Level::Debug, "tokio_postgres::query")));
        assert!(!l.enabled(&meta(Level::Trace, "postgres")));
        assert!(l.enabled(&meta(Level::Info, "tokio_postgres::connection")));
        assert!(l.enabled(&meta(Level::Debug, "cairn::postgres")));
        assert!(l.enabled(&meta(Level::Debug, "cairn_core::node")));
    }
}
