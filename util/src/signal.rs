//! The preemption flag: SIGTERM (the kubelet's notice of an eviction, a preemption, a node drain
//! or a spot interruption) and SIGINT set it once installed, and the training loop stops at the next step
//! boundary after saving its state (see `tandem_compute::train::Cadence::stop`).

use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Installs the SIGTERM and SIGINT handlers (once) and returns the flag they set. From then on
/// those signals no longer end the process: whoever asked for the flag must read it.
pub fn stop_flag() -> &'static AtomicBool {
    INSTALL.call_once(|| {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        for signal in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: the handler only stores to an atomic, which is async-signal-safe; glibc's
            // signal(2) restarts interrupted system calls, so blocking socket I/O is unaffected.
            unsafe { libc::signal(signal, handler) };
        }
    });
    &STOP
}
