//! The simulator's logger: the core's `log` records (a commit that failed, state that
//! could not be loaded) reach stderr, so the runs built to find faults do not swallow what
//! the core says about them. Errors by default; `CAIRN_SIM_LOG=warn` (or `info`, `debug`,
//! `trace`, `off`) changes what is printed. Records go to stderr only: traces and their
//! hashes never see them.
//!
//! Every ERROR record is also kept (per thread: a seed runs on one thread) until
//! [`take_errors`] collects it: the core logs an error only when something went wrong that
//! it could not answer with a status, so [`crate::run`] fails a seed whose core logged one
//! (invariant `core-logged-no-error`).

use log::{Level, LevelFilter, Log, Metadata, Record};
use std::cell::RefCell;

/// Most error records kept per seed (the first ones tell the story).
const MAX_KEPT: usize = 16;

thread_local! {
    static ERRORS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

struct SimLogger;

impl Log for SimLogger {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= log::max_level() || m.level() == Level::Error
    }
    fn log(&self, r: &Record) {
        if r.level() == Level::Error {
            let line = format!("{}: {}", r.target(), r.args());
            ERRORS.with(|e| {
                let mut e = e.borrow_mut();
                if e.len() < MAX_KEPT {
                    e.push(line);
                }
            });
        }
        if r.level() <= log::max_level() {
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
        Ok("warn") => LevelFilter::Warn,
        Ok("info") => LevelFilter::Info,
        Ok("debug") => LevelFilter::Debug,
        Ok("trace") => LevelFilter::Trace,
        _ => LevelFilter::Error,
    };
    if log::set_logger(&LOGGER).is_ok() {
        // Errors are always collected, whatever is printed.
        log::set_max_level(level.max(LevelFilter::Error));
    }
}

/// The error records logged on this thread since the last call.
pub fn take_errors() -> Vec<String> {
    ERRORS.with(|e| std::mem::take(&mut *e.borrow_mut()))
}
