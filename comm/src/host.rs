//! Which ranks share a host, in the sense that matters for collectives: which can map the same
//! shared memory.
//!
//! Expected flow: every rank computes its [`HostId`] ([`HostId::detect`], or a given string),
//! the ranks exchange them at rendezvous, and [`Layout::from_ids`] groups equal ids into hosts. The
//! grouping is only a candidate: the ranks of a host then try to map one segment
//! ([`super::shm`]), and a host where any rank cannot is split back into single ranks
//! ([`Layout::split`]).
//!
//! The identity is the kernel's boot id (`/proc/sys/kernel/random/boot_id`: one per running kernel,
//! so two machines, or one machine before and after a reboot, never match) and the device and
//! inode of `/dev/shm` (each tmpfs mount has its own device number, so two containers on one node
//! with private `/dev/shm` mounts do not match, while the containers of one pod, which share
//! theirs, do). IP addresses say nothing: pods on one node have different ones, and a NAT or a
//! reused address can make different machines look alike. The hostname is carried for logs only.
//!
//! Guarantees: every rank computes the same [`Layout`] from the same ids; hosts are ordered by
//! their lowest rank and ranks inside a host by rank.

use std::os::unix::fs::MetadataExt;

/// Environment variable that gives a process its host identity instead of the detected one
/// ([`HostId::given`]): the local runner sets it to the node's name for a process it places on a
/// node (`tandem train --node`), so ranks on different network namespaces of one machine never
/// share memory and their traffic crosses the nodes' links, as between real hosts.
pub const HOST_ID_ENV: &str = "TANDEM_HOST_ID";

/// What identifies this rank's host for shared memory, and a name for logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostId {
    /// Equal for ranks that may share memory.
    pub id: String,
    /// The hostname, for logs.
    pub hostname: String,
}

impl HostId {
    /// This process's host identity.
    pub fn detect() -> Self {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "no-boot-id".to_owned());
        let shm = std::fs::metadata("/dev/shm")
            .map(|m| format!("{}:{}", m.dev(), m.ino()))
            .unwrap_or_else(|_| format!("no-dev-shm-{}", std::process::id()));
        Self { id: format!("boot={boot} shm={shm}"), hostname: hostname() }
    }

    /// An identity given by the caller (tests and benchmarks that simulate hosts).
    pub fn given(id: &str) -> Self {
        Self { id: format!("given={id}"), hostname: format!("{} as {id}", hostname()) }
    }

    /// Wire form: `id \n hostname`.
    pub fn encode(&self) -> Vec<u8> {
        format!("{}\n{}", self.id, self.hostname).into_bytes()
    }

    /// Parses [`HostId::encode`]'s output.
    pub fn decode(bytes: &[u8]) -> Self {
        let text = String::from_utf8_lossy(bytes);
        let (id, hostname) = text.split_once('\n').unwrap_or((&text, "?"));
        Self { id: id.to_owned(), hostname: hostname.to_owned() }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".to_owned())
}

/// The ranks of a group, by host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Ranks on each host, hosts ordered by their lowest rank, ranks in order.
    pub hosts: Vec<Vec<usize>>,
    /// A name for each host, for logs.
    pub names: Vec<String>,
}

impl Layout {
    /// Groups ranks with equal ids (`ids[rank]`).
    pub fn from_ids(ids: &[HostId]) -> Self {
        let mut hosts: Vec<Vec<usize>> = Vec::new();
        let mut names = Vec::new();
        let mut keys: Vec<&str> = Vec::new();
        for (rank, id) in ids.iter().enumerate() {
            match keys.iter().position(|k| *k == id.id) {
                Some(h) => hosts[h].push(rank),
                None => {
                    keys.push(&id.id);
                    hosts.push(vec![rank]);
                    names.push(id.hostname.clone());
                }
            }
        }
        Self { hosts, names }
    }

    /// The same layout with host `host` split into one host per rank.
    pub fn split(&self, host: usize) -> Self {
        let mut hosts = Vec::new();
        let mut names = Vec::new();
        for (h, ranks) in self.hosts.iter().enumerate() {
            if h == host {
                for &r in ranks {
                    hosts.push(vec![r]);
                    names.push(self.names[h].clone());
                }
            } else {
                hosts.push(ranks.clone());
                names.push(self.names[h].clone());
            }
        }
        let mut order: Vec<usize> = (0..hosts.len()).collect();
        order.sort_by_key(|&h| hosts[h][0]);
        Self {
            hosts: order.iter().map(|&h| hosts[h].clone()).collect(),
            names: order.iter().map(|&h| names[h].clone()).collect(),
        }
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.hosts.iter().map(Vec::len).sum()
    }

    /// The host of `rank` and its index there.
    pub fn place(&self, rank: usize) -> (usize, usize) {
        for (h, ranks) in self.hosts.iter().enumerate() {
            if let Some(i) = ranks.iter().position(|&r| r == rank) {
                return (h, i);
            }
        }
        (0, 0)
    }

    /// Cross-host channels of a hierarchical allreduce: the smallest number of ranks on any host.
    pub fn channels(&self) -> usize {
        self.hosts.iter().map(Vec::len).min().unwrap_or(1)
    }

    /// The ranks of channel `c`: local rank `c` of every host, in host order.
    pub fn channel(&self, c: usize) -> Vec<usize> {
        self.hosts.iter().map(|ranks| ranks[c]).collect()
    }

    /// `2×2`, `3+1`: ranks per host, for logs.
    pub fn shape(&self) -> String {
        let sizes: Vec<usize> = self.hosts.iter().map(Vec::len).collect();
        if sizes.iter().all(|&s| s == sizes[0]) {
            format!("{}×{}", sizes.len(), sizes[0])
        } else {
            sizes.iter().map(ToString::to_string).collect::<Vec<_>>().join("+")
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ids(keys: &[&str]) -> Vec<HostId> {
        keys.iter().map(|k| HostId::given(k)).collect()
    }

    #[test]
    fn ranks_with_equal_ids_form_hosts_in_rank_order() {
        let l = Layout::from_ids(&ids(&["b", "a", "b", "c", "a"]));
        assert_eq!(l.hosts, vec![vec![0, 2], vec![1, 4], vec![3]]);
        assert_eq!(l.place(4), (1, 1));
        assert_eq!(l.channels(), 1);
        assert_eq!(l.channel(0), vec![0, 1, 3]);
        assert_eq!(l.shape(), "2+2+1");
        let even = Layout::from_ids(&ids(&["x", "x", "y", "y"]));
        assert_eq!((even.channels(), even.shape()), (2, "2×2".to_owned()));
        assert_eq!(even.channel(1), vec![1, 3]);
    }

    #[test]
    fn a_split_host_becomes_single_ranks_in_order() {
        let l = Layout::from_ids(&ids(&["a", "b", "a", "b"])).split(0);
        assert_eq!(l.hosts, vec![vec![0], vec![1, 3], vec![2]]);
        assert_eq!(l.size(), 4);
    }

    #[test]
    fn detection_is_stable_and_the_wire_form_round_trips() {
        let (a, b) = (HostId::detect(), HostId::detect());
        assert_eq!(a, b);
        assert!(a.id.starts_with("boot="), "{a:?}");
        assert_eq!(HostId::decode(&a.encode()), a);
        assert_ne!(HostId::given("x").id, a.id);
    }
}
