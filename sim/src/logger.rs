//! The simulator's logger: the core's `log` records (a commit that failed, state that
//! could not be loaded, LDAP lockouts, reindex progress) become trace lines.
//!
//! Every record at INFO or above is kept (per thread: a seed runs on one thread) until the
//! driver collects it with [`take_records`] after each event and writes it to the trace at
//! the simulated time of that event (`core <LEVEL> <target>: <message>`), so the records
//! are part of the trace hash and of failure reports. What is captured does not depend on
//! the environment, so the trace stays a pure function of the seed. `CAIRN_SIM_LOG=warn`
//! (or `info`, `debug`, `trace`, `off`; errors by default) additionally prints records to
//! stderr as they happen.
//!
//! Every ERROR record is also kept until [`take_errors`] collects it: the core logs an
//! error only when something went wrong that it could not answer with a status, so
//! [`crate::run`] fails a seed whose core logged one (invariant `core-logged-no-error`).

use log::{Level, LevelFilter, Log, Metadata, Record};
use std::cell::RefCell;

/// Most error records kept per seed (the first ones tell the story).
const MAX_KEPT: usize = 16;

/// Records at this level or above reach the trace, whatever is printed.
const CAPTURE: LevelFilter = LevelFilter::Info;

/// Most records kept between two collections (a driver collects after every event).
const MAX_RECORDS: usize = 1_000;

thread_local! {
    static ERRORS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    static RECORDS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// What `CAIRN_SIM_LOG` asks to print to stderr.
static PRINTED: std::sync::OnceLock<LevelFilter> = std::sync::OnceLock::new();

struct SimLogger;

fn tag(l: Level) -> &'static str {
    match l {
        Level::Error => "ERROR",
        Level::Warn => "WARN",
        Level::Info => "INFO",
        Level::Debug => "DEBUG",
        Level::Trace => "TRACE",
    }
}

impl Log for SimLogger {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &Record) {
        if r.level() <= CAPTURE {
            let line = format!("core {} {}: {}", tag(r.level()), r.target(), r.args());
            RECORDS.with(|c| {
                let mut c = c.borrow_mut();
                if c.len() < MAX_RECORDS {
                    c.push(line);
                }
            });
        }
        if r.level() == Level::Error {
            let line = format!("{}: {}", r.target(), r.args());
            ERRORS.with(|e| {
                let mut e = e.borrow_mut();
                if e.len() < MAX_KEPT {
                    e.push(line);
                }
            });
        }
        if r.level() <= *PRINTED.get().unwrap_or(&LevelFilter::Error) {
            eprintln!("[{} {}] {}", tag(r.level()), r.target(), r.args());
        }
    }
    fn flush(&self) {}
}

static LOGGER: SimLogger = SimLogger;

/// Installs the logger (once) and makes sure its level is set before the caller goes on.
pub fn init() {
    let level = match std::env::var("CAIRN_SIM_LOG").as_deref() {
        Ok("off") => LevelFilter::Off,
        Ok("warn") => LevelFilter::Warn,
        Ok("info") => LevelFilter::Info,
        Ok("debug") => LevelFilter::Debug,
        Ok("trace") => LevelFilter::Trace,
        _ => LevelFilter::Error,
    };
    let _ = log::set_logger(&LOGGER);
    // Every caller sets the level before it goes on: a thread that lost the race to install
    // the logger must not run while the level is still the default (off), or its records
    // would be missing from its trace.
    let printed = *PRINTED.get_or_init(|| level);
    // Records down to CAPTURE always reach the trace, whatever is printed.
    log::set_max_level(printed.max(CAPTURE));
}

/// The error records logged on this thread since the last call.
pub fn take_errors() -> Vec<String> {
    ERRORS.with(|e| std::mem::take(&mut *e.borrow_mut()))
}

/// The records (INFO and above) logged on this thread since the last call, oldest first.
pub fn take_records() -> Vec<String> {
    RECORDS.with(|c| std::mem::take(&mut *c.borrow_mut()))
}
