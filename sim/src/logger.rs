//! The simulator's logger: the core's `log` records (a commit that failed, state that
//! could not be loaded) reach stderr, so the runs built to find faults do not swallow what
//! the core says about them. Warnings and errors by default; `CAIRN_SIM_LOG=info` (or
//! `debug`, `trace`, `off`) changes the level. Records go to stderr only: traces and their
//! hashes never see them.

use log::{Level, LevelFilter, Log, Metadata, Record};

struct SimLogger;

impl Log for SimLogger {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &Record) {
        if self.enabled(r.metadata()) {
            let tag = match r.level() {
                Level::Error => "ERROR",
                Level::Warn => "WARN",
                Level::Info => "INFO",
                Level::Debug => "DEBUG",
                Level::Trace => "TRACE",
            };
            eprintln!("[{tag} {}] {}", r.target(), r.args());
        }
    }
    fn flush(&self) {}
}

static LOGGER: SimLogger = SimLogger;

/// Installs the logger (once; later calls change nothing).
pub fn init() {
    let level = match std::env::var("CAIRN_SIM_LOG").as_deref() {
        Ok("off") => LevelFilter::Off,
        Ok("error") => LevelFilter::Error,
        Ok("info") => LevelFilter::Info,
        Ok("debug") => LevelFilter::Debug,
        Ok("trace") => LevelFilter::Trace,
        _ => LevelFilter::Warn,
    };
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}
