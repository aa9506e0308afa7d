//! Child processes: how one ended, tying a child's life to its parent's, and free loopback ports;
//! and this machine's available memory. Shared by the local runner, `tandem launcher`, `tandem
//! bench`, `tandem train` and `tandem ps`.

use std::fmt;
use std::process::{Command, ExitStatus};

use tandem_api::policy::FailureKind;

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl Exit {
    /// The exit of a finished child.
    pub fn from_status(status: ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => Exit::Code(code),
            (None, Some(signal)) => Exit::Signal(signal),
            // Neither a code nor a signal cannot happen for a waited child on Unix.
            (None, None) => Exit::Code(-1),
        }
    }

    /// The code a shell (or a kubelet) reports for it: the exit code, or 128 + the signal that
    /// killed it.
    pub fn shell_code(self) -> i32 {
        match self {
            Exit::Code(code) => code,
            Exit::Signal(signal) => 128 + signal,
        }
    }

    /// Whether it exited cleanly.
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }

    /// The failure the run policy judges, for an exit that is not a [`Exit::success`].
    pub fn failure_kind(self) -> FailureKind {
        match self {
            Exit::Code(code) => FailureKind::Exit(code),
            Exit::Signal(signal) => FailureKind::Signal(signal),
        }
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Code(code) => write!(f, "exit code {code}"),
            Exit::Signal(signal) => write!(f, "signal {signal}"),
        }
    }
}

/// Makes the kernel send `signal` to the process `cmd` starts when the process that started it
/// dies (Linux `PR_SET_PDEATHSIG`; nothing elsewhere), so no child outlives a killed parent.
pub fn die_with_parent(cmd: &mut Command, signal: libc::c_int) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe and allocates nothing, as pre_exec requires.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, signal) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (cmd, signal);
}

/// Lowest port [`free_ports`] hands out: above the well-known and registered services' usual
/// fixed ports.
const FREE_PORTS_LOW: u16 = 16384;

/// Every descendant of process `pid` alive now (children first, then theirs), from Linux's
/// `/proc/<pid>/task/<tid>/children`; empty where that is not readable. mpirun puts each rank in a
/// process group of its own, so signalling the launcher's group misses them: signal these too.
pub fn descendants(pid: libc::pid_t) -> Vec<libc::pid_t> {
    let mut found = Vec::new();
    let mut next = vec![pid];
    while let Some(parent) = next.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else { continue };
        for task in tasks.flatten() {
            let Ok(text) = std::fs::read_to_string(task.path().join("children")) else { continue };
            for child in text.split_whitespace().filter_map(|c| c.parse().ok()) {
                if !found.contains(&child) {
                    found.push(child);
                    next.push(child);
                }
            }
        }
    }
    found
}

/// `n` distinct loopback ports that were free a moment ago, all held at once so that they differ.
/// They are chosen below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`, from which
/// every outgoing connection and every `bind(…:0)` takes its port), from a random start, so that
/// between this call and the port's use no connection of another program takes it; only a
/// program that binds that fixed port can. Where the ephemeral range leaves no room below it, the
/// kernel picks (`bind(…:0)`).
pub fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let high = ephemeral_low().unwrap_or(32768);
    if high > FREE_PORTS_LOW {
        let span = u32::from(high - FREE_PORTS_LOW);
        // A failed read only makes every caller start at the bottom of the range.
        let start = crate::token::random_bytes::<4>().map_or(0, u32::from_le_bytes) % span;
        let mut held = Vec::with_capacity(n);
        for i in 0..span {
            if held.len() == n {
                break;
            }
            let port = FREE_PORTS_LOW + ((start + i) % span) as u16;
            if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
                held.push(listener);
            }
        }
        if held.len() == n {
            return held.iter().map(|l| l.local_addr().map(|a| a.port())).collect();
        }
    }
    let listeners =
        (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<Result<Vec<_>, _>>()?;
    listeners.iter().map(|l| l.local_addr().map(|a| a.port())).collect()
}

/// The first port of the kernel's ephemeral range, `None` where it cannot be read.
fn ephemeral_low() -> Option<u16> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// `MemAvailable` of `/proc/meminfo`, in bytes; `None` where it cannot be read.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_reads_as_128_plus_its_number_and_as_a_signal_to_the_policy() {
        assert_eq!(Exit::Signal(9).shell_code(), 137);
        assert_eq!(Exit::Code(3).shell_code(), 3);
        assert_eq!(Exit::Signal(9).failure_kind(), FailureKind::Signal(9));
        assert_eq!(Exit::Code(200).failure_kind(), FailureKind::Exit(200));
        assert!(Exit::Code(0).success() && !Exit::Signal(15).success());
    }

    #[test]
    fn free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() {
        let ports = free_ports(8).unwrap_or_default();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!((ports.len(), unique.len()), (8, 8));
        let high = ephemeral_low().unwrap_or(32768);
        for port in ports {
            assert!((FREE_PORTS_LOW..high).contains(&port), "{port} is not in {FREE_PORTS_LOW}..{high}");
            assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(), "{port} is not free");
        }
        // Two calls start at different places, so that concurrent callers rarely meet.
        let firsts: Vec<Vec<u16>> = (0..4).map(|_| free_ports(1).unwrap_or_default()).collect();
        assert!(firsts.iter().any(|p| *p != firsts[0]), "every call chose {:?}", firsts[0]);
    }

    #[test]
    fn descendants_include_grandchildren_in_process_groups_of_their_own() {
        // sh starts a grandchild in a process group of its own (as mpirun starts ranks).
        let mut child = Command::new("sh")
            .args(["-c", "setsid sleep 30 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line)
            .unwrap();
        let grandchild: libc::pid_t = line.trim().parse().unwrap();
        let found = descendants(child.id() as libc::pid_t);
        assert!(found.contains(&grandchild), "{found:?} lacks {grandchild}");
        for pid in found {
            // SAFETY: kill(2) touches no memory.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = child.wait();
    }
}
