//! A cluster in a box: the local runner places a job's processes on "nodes", network namespaces
//! of this machine with an address each, so that what crosses between PS replicas and ranks goes
//! through real links that can be rate-limited (`bench/cluster.sh` builds them: a veth per node to
//! one bridge, `tc … tbf` on both ends).
//!
//! Expected flow: `tandem train --node NAME=ADDR …` parses each [`Node`]; [`Placement::check`]
//! refuses what cannot run (a namespace that does not exist, an address used twice, an `mpi`
//! group, whose `mpirun` would start every rank on its launcher's node); the runner then gives
//! every process the endpoint [`Placement::endpoint`] names and starts it inside its node's
//! namespace with `ip netns exec`.
//!
//! Guarantees: processes go round-robin over the nodes in launch-contract order — PS replicas
//! first, then each group's ranks — so with as many nodes as processes each runs alone on its
//! node, and with fewer the placement is still deterministic. Every process binds its node's
//! address, on a port of its own ([`BASE_PORT`] plus its slot), so two processes sharing a node
//! never collide. Each process on a node gets that node as its host identity
//! ([`tandem_comm::host::HOST_ID_ENV`]): the namespaces share one kernel and one `/dev/shm`, so
//! ranks would otherwise find each other on "one host" and reduce through shared memory, and the
//! group's traffic would never touch the links. Without nodes nothing changes: everything binds
//! 127.0.0.1 on free ports.
//!
//! Caveats: the namespaces and their addresses must be reachable from the runner's own (the
//! bridge holds an address in the nodes' subnet), since the runner evaluates the final model by
//! pulling the PS weights.

use std::net::Ipv4Addr;
use std::str::FromStr;

use tandem_api::TrainingJobSpec;
use tandem_api::contract::{Endpoint, Role};
use tandem_api::job::Backend;

use super::RunnerError;

/// The port of slot 0 on a node; slot `s` listens on `BASE_PORT + s`.
pub const BASE_PORT: u16 = 20_000;

/// Where `ip netns add` keeps the named network namespaces.
const NETNS_DIR: &str = "/run/netns";

/// One node: a network namespace and the address its processes bind and are reached at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// Name of the network namespace (`ip netns list`).
    pub netns: String,
    /// The node's address inside it.
    pub addr: Ipv4Addr,
}

impl FromStr for Node {
    type Err = String;

    /// `NAME=ADDR`, e.g. `tnode1=10.77.0.1`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let usage = "expected NAME=ADDR: a network namespace (ip netns list) and its IPv4 address, e.g. tnode1=10.77.0.1";
        let (netns, addr) = text.split_once('=').ok_or_else(|| format!("`{text}`: {usage}"))?;
        let valid_name = !netns.is_empty()
            && netns.len() <= 64
            && netns.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !valid_name || netns.starts_with('.') {
            return Err(format!("`{text}`: `{netns}` is not a namespace name; {usage}"));
        }
        let addr = addr.parse().map_err(|e| format!("`{text}`: `{addr}`: {e}; {usage}"))?;
        Ok(Self { netns: netns.to_owned(), addr })
    }
}

impl Node {
    /// `program` started inside the node's namespace (`ip netns exec`), with the node as its host
    /// identity: ranks on different nodes share no memory, so their traffic crosses the links.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
        let mut cmd = std::process::Command::new("ip");
        cmd.args(["netns", "exec", &self.netns]).arg(program);
        cmd.env(tandem_comm::host::HOST_ID_ENV, format!("node={}", self.netns));
        cmd
    }

    /// The interface that holds the node's address inside its namespace (`eth0` as
    /// bench/cluster.sh builds nodes), if `ip` finds one.
    pub fn interface(&self) -> Option<String> {
        let out =
            std::process::Command::new("ip").args(["-n", &self.netns, "-o", "-4", "addr", "show"]).output();
        let text = String::from_utf8(out.ok()?.stdout).ok()?;
        let inet = format!(" inet {}/", self.addr);
        // `2: eth0    inet 10.77.0.1/24 brd … scope global eth0 …`
        let line = text.lines().find(|l| l.contains(&inet))?;
        line.split_whitespace().nth(1).map(str::to_owned)
    }
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.netns, self.addr)
    }
}

/// Which node each process of a job runs on; empty: all on this machine's loopback.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    nodes: Vec<Node>,
}

impl Placement {
    /// The placement over `nodes`, in the order given.
    pub fn new(nodes: Vec<Node>) -> Self {
        Self { nodes }
    }

    /// Whether every process stays on loopback.
    pub fn is_local(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Refuses a placement this job cannot run on, saying what to change.
    pub fn check(&self, spec: &TrainingJobSpec) -> Result<(), RunnerError> {
        if self.is_local() {
            return Ok(());
        }
        if spec.workers.backend == Backend::Mpi && spec.workers.group_size > 1 {
            return Err(RunnerError::Config(
                "--node places each process on a node, but mpirun starts every rank of an `mpi` group on its \
                 launcher's node; use `workers.backend: tcp` to place ranks on nodes"
                    .into(),
            ));
        }
        for (i, node) in self.nodes.iter().enumerate() {
            if let Some(other) = self.nodes[..i].iter().find(|n| n.netns == node.netns || n.addr == node.addr)
            {
                return Err(RunnerError::Config(format!(
                    "--node {node} and --node {other} share a namespace or an address; give each node its own"
                )));
            }
        }
        for node in &self.nodes {
            let path = std::path::Path::new(NETNS_DIR).join(&node.netns);
            if !path.exists() {
                return Err(RunnerError::Config(format!(
                    "--node {node}: no network namespace `{}` ({} is missing); create it with `ip netns add {}` \
                     and give it the address, or run bench/cluster.sh, which builds the nodes",
                    node.netns,
                    path.display(),
                    node.netns
                )));
            }
        }
        Ok(())
    }

    /// The node `role` runs on, if any.
    pub fn node(&self, spec: &TrainingJobSpec, role: Role) -> Option<&Node> {
        match self.nodes.len() {
            0 => None,
            n => Some(&self.nodes[slot(spec, role) as usize % n]),
        }
    }

    /// Where `role` listens: its node's address on its own port, or `local` (a free loopback
    /// port) without nodes.
    pub fn endpoint(&self, spec: &TrainingJobSpec, role: Role, local: u16) -> Endpoint {
        match self.node(spec, role) {
            None => Endpoint::new("127.0.0.1", local),
            Some(node) => Endpoint::new(node.addr.to_string(), BASE_PORT + slot(spec, role) as u16),
        }
    }

    /// The address `role` binds.
    pub fn bind(&self, spec: &TrainingJobSpec, role: Role) -> String {
        self.node(spec, role).map_or_else(|| "127.0.0.1".to_owned(), |n| n.addr.to_string())
    }
}

/// A process's place in launch-contract order: PS replicas, then every group's ranks (a group's
/// launcher shares its rank 0's slot).
pub fn slot(spec: &TrainingJobSpec, role: Role) -> u32 {
    let ps = spec.parameter_servers.replicas;
    let size = spec.workers.group_size;
    match role {
        Role::Ps { index } => index,
        Role::Worker { group, rank } => ps + group * size + rank,
        Role::Launcher { group } => ps + group * size,
    }
}

/// How many slots a job has: one per PS replica and per rank.
pub fn slots(spec: &TrainingJobSpec) -> u32 {
    spec.processes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(ps: u32, groups: u32, size: u32) -> TrainingJobSpec {
        let yaml = format!(
            "model: {{kind: mlp}}\ndata: {{source: digits}}\ntraining: {{algorithm: hybrid}}\n\
             parameterServers: {{replicas: {ps}}}\nworkers: {{groups: {groups}, groupSize: {size}}}\n"
        );
        serde_yaml::from_str(&yaml).expect("spec")
    }

    fn nodes(n: u8) -> Placement {
        Placement::new(
            (1..=n).map(|i| Node { netns: format!("n{i}"), addr: Ipv4Addr::new(10, 9, 0, i) }).collect(),
        )
    }

    #[test]
    fn a_node_reads_as_name_equals_address_and_bad_ones_say_why() {
        assert_eq!(
            "tnode1=10.77.0.1".parse::<Node>(),
            Ok(Node { netns: "tnode1".into(), addr: Ipv4Addr::new(10, 77, 0, 1) })
        );
        for bad in ["tnode1", "=10.0.0.1", "a/b=10.0.0.1", "n=10.0.0", "n=::1"] {
            let err = bad.parse::<Node>().unwrap_err();
            assert!(err.contains("expected NAME=ADDR"), "{bad}: {err}");
        }
    }

    #[test]
    fn processes_go_round_robin_in_launch_order_each_on_a_port_of_its_own() {
        let spec = spec(2, 2, 2);
        let p = nodes(3);
        let at = |role| p.endpoint(&spec, role, 1).to_string();
        assert_eq!(at(Role::Ps { index: 0 }), "10.9.0.1:20000");
        assert_eq!(at(Role::Ps { index: 1 }), "10.9.0.2:20001");
        assert_eq!(at(Role::Worker { group: 0, rank: 0 }), "10.9.0.3:20002");
        assert_eq!(at(Role::Worker { group: 0, rank: 1 }), "10.9.0.1:20003");
        assert_eq!(at(Role::Worker { group: 1, rank: 1 }), "10.9.0.3:20005");
        assert_eq!(at(Role::Launcher { group: 1 }), "10.9.0.2:20004");
        assert_eq!(p.bind(&spec, Role::Worker { group: 0, rank: 1 }), "10.9.0.1");
        assert_eq!(slots(&spec), 6);
    }

    #[test]
    fn without_nodes_everything_stays_on_loopback() {
        let spec = spec(1, 1, 2);
        let p = Placement::default();
        assert!(p.is_local() && p.check(&spec).is_ok());
        assert_eq!(p.endpoint(&spec, Role::Worker { group: 0, rank: 1 }, 4242).to_string(), "127.0.0.1:4242");
        assert_eq!(p.bind(&spec, Role::Ps { index: 0 }), "127.0.0.1");
    }

    #[test]
    fn a_missing_namespace_a_shared_address_and_mpi_groups_are_refused() {
        let spec = spec(1, 1, 2);
        let missing = Placement::new(vec!["tandem-no-such-ns=10.9.9.1".parse().unwrap()]);
        let err = missing.check(&spec).unwrap_err().to_string();
        assert!(
            err.contains("no network namespace `tandem-no-such-ns`") && err.contains("ip netns add"),
            "{err}"
        );
        let shared = Placement::new(vec!["a=10.9.9.1".parse().unwrap(), "b=10.9.9.1".parse().unwrap()]);
        let err = shared.check(&spec).unwrap_err().to_string();
        assert!(err.contains("share a namespace or an address"), "{err}");
        let mut mpi = spec.clone();
        mpi.workers.backend = Backend::Mpi;
        let err = nodes(2).check(&mpi).unwrap_err().to_string();
        assert!(err.contains("backend: tcp"), "{err}");
    }
}
