//! Helpers shared by the operator's cluster tests: the in-process operator's log, kept so that a
//! request the API server denied (403) fails the test that caused it, and the pinned `helm`.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

/// Everything the in-process operator logs in this test process (at debug level).
pub static LOG: Mutex<String> = Mutex::new(String::new());

struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap_or_else(PoisonError::into_inner).push_str(&String::from_utf8_lossy(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Sends the operator's logs (debug) into [`LOG`]; once per test process.
pub fn capture_logs() {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("tandem_operator=debug,kube_runtime=warn"))
            .with_ansi(false)
            .with_writer(|| LogWriter)
            .try_init();
    });
}

/// The logged lines in which the API server denied `user` a request.
pub fn denied(user: &str) -> Vec<String> {
    let log = LOG.lock().unwrap_or_else(PoisonError::into_inner);
    log.lines().filter(|l| l.contains(user) && l.contains("forbidden")).map(str::to_owned).collect()
}

/// `helm` of the pinned version (`$TANDEM_K8S_BIN`, as `make test-cluster` sets it), else from PATH.
pub fn helm() -> PathBuf {
    std::env::var_os("TANDEM_K8S_BIN").map_or_else(|| "helm".into(), |bin| PathBuf::from(bin).join("helm"))
}
