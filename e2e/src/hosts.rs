//! Name resolution of pods: a marked block in a hosts file (normally `/etc/hosts`).
//!
//! The test machine has no cluster DNS. A pod's names — its hostname, and
//! `<hostname>.<subdomain>.<namespace>.svc[.cluster.local]` through its headless Service — are written
//! into one block between `# BEGIN tandem-node <node>` and `# END tandem-node <node>` lines, which the
//! glibc resolver reads on every lookup.
//!
//! Guarantees: lines outside the block are never changed; every update holds an exclusive lock
//! (`flock` on `<path>.tandem-node.lock`, shared by every agent on the machine, plus this agent's
//! mutex) across read-modify-write, so concurrent updates never lose lines; the new content is written
//! to a temporary file and renamed over the old one, so the resolver never reads a half-written file —
//! where the file cannot be renamed over (`/etc/hosts` is often a bind mount), it is rewritten in
//! place under the same lock; the newest pod of a name is listed first,
//! so a restarted pod's new IP wins over an old entry that is still being removed; [`HostsFile::clear`]
//! removes the block.
//!
//! Caveats: the short hostname is shared by every namespace on this machine (a kubelet writes it into
//! each pod's own `/etc/hosts`); pods of the same name in two namespaces resolve to the newest.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One pod's entry.
#[derive(Clone, Debug)]
struct Entry {
    ip: String,
    names: Vec<String>,
}

/// The hosts file and this node's entries in it, keyed by pod UID in start order.
#[derive(Debug)]
pub struct HostsFile {
    path: PathBuf,
    begin: String,
    end: String,
    entries: Mutex<BTreeMap<(u64, String), Entry>>,
}

impl HostsFile {
    /// The block of node `node` in the file at `path` (nothing is written yet).
    pub fn new(path: impl Into<PathBuf>, node: &str) -> Self {
        Self {
            path: path.into(),
            begin: format!("# BEGIN tandem-node {node}"),
            end: format!("# END tandem-node {node}"),
            entries: Mutex::new(BTreeMap::new()),
        }
    }

    /// Adds (or replaces) the names of pod `uid`, started as the `seq`-th pod, at `ip`.
    pub fn add(&self, seq: u64, uid: &str, ip: &str, names: Vec<String>) -> io::Result<()> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|(_, u), _| u != uid);
        entries.insert((seq, uid.to_owned()), Entry { ip: ip.to_owned(), names });
        self.write(&self.block(&entries))
    }

    /// Removes the names of pod `uid`.
    pub fn remove(&self, uid: &str) -> io::Result<()> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let before = entries.len();
        entries.retain(|(_, u), _| u != uid);
        if entries.len() == before {
            return Ok(());
        }
        self.write(&self.block(&entries))
    }

    /// Removes the whole block (on exit).
    pub fn clear(&self) -> io::Result<()> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.clear();
        self.write("")
    }

    fn block(&self, entries: &BTreeMap<(u64, String), Entry>) -> String {
        if entries.is_empty() {
            return String::new();
        }
        // Newest first: the resolver takes the first line that names a host.
        let lines: String =
            entries.values().rev().map(|e| format!("{} {}\n", e.ip, e.names.join(" "))).collect();
        format!("{}\n{lines}{}\n", self.begin, self.end)
    }

    /// Replaces this node's block; the caller holds `entries`' lock.
    fn write(&self, block: &str) -> io::Result<()> {
        let _lock = FileLock::acquire(&lock_path(&self.path))?;
        let current = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        let mut kept = String::new();
        let mut inside = false;
        for line in current.lines() {
            if line == self.begin {
                inside = true;
            } else if line == self.end {
                inside = false;
            } else if !inside {
                kept.push_str(line);
                kept.push('\n');
            }
        }
        kept.push_str(block);
        replace(&self.path, kept.as_bytes())
    }
}

fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".tandem-node.lock");
    path.with_file_name(name)
}

/// Writes `bytes` to a temporary file beside `path` and renames it over `path`; where that is
/// impossible (a bind-mounted file), rewrites `path` in place.
fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(format!(".tandem-node.{}.tmp", std::process::id()));
    let tmp = path.with_file_name(name);
    let renamed = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        if let Ok(meta) = std::fs::metadata(path) {
            f.set_permissions(meta.permissions())?;
        }
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    match renamed {
        Ok(()) => Ok(()),
        Err(_) => {
            let _ = std::fs::remove_file(&tmp);
            std::fs::write(path, bytes)
        }
    }
}

/// An exclusive `flock` on a lock file, released on drop.
struct FileLock(File);

impl FileLock {
    fn acquire(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().create(true).truncate(false).write(true).open(path)?;
        // SAFETY: flock(2) on a descriptor this function owns; it touches no memory.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self(file))
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // SAFETY: as above; unlocking a descriptor we hold.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// The names a pod answers to: `<hostname>.<subdomain>.<ns>.svc.cluster.local`,
/// `<hostname>.<subdomain>.<ns>.svc` (both only with a subdomain) and `<hostname>`.
pub fn pod_names(hostname: &str, subdomain: Option<&str>, namespace: &str) -> Vec<String> {
    let mut names = Vec::new();
    if let Some(sub) = subdomain.filter(|s| !s.is_empty()) {
        names.push(format!("{hostname}.{sub}.{namespace}.svc.cluster.local"));
        names.push(format!("{hostname}.{sub}.{namespace}.svc"));
    }
    names.push(hostname.to_owned());
    names
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn block_is_added_replaced_and_removed_keeping_other_lines() {
        let dir = std::env::temp_dir().join(format!("tandem-hosts-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("hosts");
        std::fs::write(&path, "127.0.0.1 localhost\n::1 localhost\n").unwrap();
        let hosts = HostsFile::new(&path, "n1");
        hosts.add(1, "u1", "127.1.0.1", pod_names("j-ps-0", Some("j"), "ns")).unwrap();
        hosts.add(2, "u2", "127.1.0.2", vec!["j-ps-0".into()]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("127.0.0.1 localhost\n::1 localhost\n# BEGIN tandem-node n1\n"), "{text}");
        // The newer pod of the same name comes first.
        let first = text.find("127.1.0.2").unwrap();
        let second = text.find("127.1.0.1 j-ps-0.j.ns.svc.cluster.local j-ps-0.j.ns.svc j-ps-0").unwrap();
        assert!(first < second, "{text}");
        hosts.remove("u2").unwrap();
        assert!(!std::fs::read_to_string(&path).unwrap().contains("127.1.0.2"));
        hosts.clear().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "127.0.0.1 localhost\n::1 localhost\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn concurrent_updates_of_two_agents_never_lose_other_lines() {
        let dir = std::env::temp_dir().join(format!("tandem-hosts-race-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("hosts");
        let base = "127.0.0.1 localhost\n::1 localhost\n";
        std::fs::write(&path, base).unwrap();
        let agents = [HostsFile::new(&path, "a"), HostsFile::new(&path, "b")];
        std::thread::scope(|s| {
            for (n, hosts) in agents.iter().enumerate() {
                for t in 0..4u64 {
                    s.spawn(move || {
                        for i in 0..50u64 {
                            let uid = format!("{n}-{t}-{i}");
                            hosts.add(t * 100 + i, &uid, "127.1.0.1", vec![format!("p{uid}")]).unwrap();
                            hosts.remove(&uid).unwrap();
                        }
                    });
                }
            }
        });
        // Every pod was removed again: only the lines outside the blocks are left, intact.
        assert_eq!(std::fs::read_to_string(&path).unwrap(), base);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
