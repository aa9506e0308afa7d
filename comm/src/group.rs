//! The built-in backend's communicator: which ranks share a host is found at rendezvous, and each
//! collective then takes the fastest path — shared memory inside a host ([`super::shm`]), TCP
//! between hosts ([`super::tcp`]), and for allreduce over several hosts with several ranks each,
//! the hierarchical algorithm.
//!
//! Expected flow: [`super::tcp::connect`] forms the authenticated TCP mesh, then [`assemble`]:
//! 1. every rank sends its host identity ([`super::host`]) to every other;
//! 2. on each host with several ranks, the lowest creates a segment ([`super::shm::segment`]) and
//!    sends its nonce and geometry to the others over their authenticated connections; they
//!    attach (or say why they cannot);
//! 3. every rank tells every other whether its host's memory is shared; a host where any rank
//!    failed (or has shared memory turned off) is split into single ranks, so every rank computes
//!    the same [`Layout`]; the creator unlinks the segment;
//! 4. the choice is logged (`collectives: …` at info).
//!
//! Paths, by layout (one host: all ranks share one; `H` hosts):
//!
//! | layout | allreduce | reduce-scatter, allgather, broadcast, barrier |
//! |---|---|---|
//! | every rank on its own host | TCP ([`super::algo`]'s table) | TCP |
//! | one host | shared memory | shared memory |
//! | several hosts, some with several ranks | hierarchical | TCP |
//!
//! Hierarchical allreduce, with `C` = the fewest ranks on any host: reduce inside each host over
//! shared memory into `C` blocks (local rank `c` owns block `c`); allreduce block `c` over TCP
//! among local rank `c` of every host (`C` channels in parallel); copy the blocks back to every
//! rank of the host over shared memory. Uneven layouts work (`3+1`: one channel; local ranks
//! beyond `C` contribute and receive but own nothing).
//!
//! Guarantees: as every [`Communicator`] — any length, bit-identical results (each block is reduced
//! once inside its host, once across hosts by an algorithm that is bit-identical itself, divided
//! once by the group size, then copied). A failure on any path poisons the communicator, tells
//! every rank which peer failed, and every later call returns that error.

use std::ops::Range;

use super::algo::{AlgoConfig, Algorithms};
use super::auth;
use super::host::{HostId, Layout};
use super::shm::segment::Segment;
use super::shm::{ShmConfig, ShmGroup};
use super::tcp::rendezvous::Mesh;
use super::tcp::{TcpConfig, TcpTransport};
use super::transport::Subgroup;
use super::{CommError, Communicator, ReduceOp, block_range, check_root};

/// Which paths this group uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// TCP only.
    Tcp,
    /// One host: shared memory only.
    Shm,
    /// Shared memory inside hosts, TCP between them.
    Hierarchical,
}

/// The communicator of the `tcp` backend (see the module docs).
pub struct Group {
    tcp: TcpTransport,
    algorithms: Algorithms,
    layout: Layout,
    path: Path,
    shm: Option<ShmGroup>,
    failed: Option<CommError>,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("tcp", &self.tcp)
            .field("path", &self.path)
            .field("layout", &self.layout)
            .finish()
    }
}

/// What the creator of a host's segment tells the others.
enum Offer {
    Segment { nonce: [u8; auth::NONCE_LEN], slots: usize, slot_bytes: usize },
    Declined(String),
}

impl Offer {
    fn encode(&self) -> Vec<u8> {
        match self {
            Offer::Segment { nonce, slots, slot_bytes } => {
                let mut b = vec![1];
                b.extend_from_slice(nonce);
                b.extend_from_slice(&(*slots as u32).to_le_bytes());
                b.extend_from_slice(&(*slot_bytes as u64).to_le_bytes());
                b
            }
            Offer::Declined(why) => {
                let mut b = vec![0];
                b.extend_from_slice(why.as_bytes());
                b
            }
        }
    }

    fn decode(b: &[u8]) -> Self {
        const N: usize = auth::NONCE_LEN;
        if b.first() == Some(&1) && b.len() == 1 + N + 12 {
            let mut nonce = [0u8; N];
            nonce.copy_from_slice(&b[1..1 + N]);
            let slots = u32::from_le_bytes([b[1 + N], b[2 + N], b[3 + N], b[4 + N]]) as usize;
            let mut sb = [0u8; 8];
            sb.copy_from_slice(&b[5 + N..13 + N]);
            Offer::Segment { nonce, slots, slot_bytes: u64::from_le_bytes(sb) as usize }
        } else {
            Offer::Declined(String::from_utf8_lossy(b.get(1..).unwrap_or_default()).into_owned())
        }
    }
}

/// Whether a rank's host shares memory: empty for yes, else why not.
fn outcome(result: &Result<(), String>) -> Vec<u8> {
    match result {
        Ok(()) => Vec::new(),
        Err(why) => why.clone().into_bytes(),
    }
}

/// Finds the hosts, maps shared memory between the ranks of each, and builds the communicator.
pub fn assemble(mut mesh: Mesh, token: &[u8], config: TcpConfig) -> Result<Group, CommError> {
    let (rank, size) = (mesh.rank, mesh.size());
    let me = match &config.host {
        Some(id) => HostId::given(id),
        None => HostId::detect(),
    };
    let ids: Vec<HostId> = mesh.all_to_all(&me.encode())?.iter().map(|b| HostId::decode(b)).collect();
    let mut layout = Layout::from_ids(&ids);
    let (host, local) = layout.place(rank);
    let ranks = layout.hosts[host].clone();

    let mut segment = None;
    let mine: Result<(), String> = if ranks.len() < 2 {
        Ok(())
    } else if local == 0 {
        let (offer, result) = match create(&config.shm, token, ranks.len()) {
            Ok((seg, offer)) => {
                segment = Some(seg);
                (offer, Ok(()))
            }
            Err(why) => (Offer::Declined(why.clone()), Err(why)),
        };
        for &peer in &ranks[1..] {
            mesh.send_frame(peer, &offer.encode())?;
        }
        result
    } else {
        match Offer::decode(&mesh.recv_frame(ranks[0])?) {
            Offer::Declined(why) => Err(format!("local rank 0 declined: {why}")),
            Offer::Segment { .. } if !config.shm.enabled => Err("shared memory is turned off".to_owned()),
            Offer::Segment { nonce, slots, slot_bytes } => {
                Segment::attach(&config.shm.dir, token, &nonce, ranks.len(), slots, slot_bytes).map(|seg| {
                    segment = Some(seg);
                })
            }
        }
    };
    let outcomes = mesh.all_to_all(&outcome(&mine))?;
    if let Some(seg) = segment.as_mut() {
        // Everyone has attached or given up: nobody may open it any more.
        seg.unlink();
    }
    let original = layout.clone();
    for ranks in original.hosts.iter().filter(|r| r.len() > 1) {
        if let Some((r, why)) = ranks.iter().map(|&r| (r, &outcomes[r])).find(|(_, o)| !o.is_empty()) {
            tracing::info!(
                rank,
                "collectives: ranks {ranks:?} share a host but not memory (rank {r}: {}); they use TCP",
                String::from_utf8_lossy(why)
            );
            let h = layout.hosts.iter().position(|h| h == ranks).unwrap_or(0);
            layout = layout.split(h);
        }
    }
    let (host, local) = layout.place(rank);
    let shm = match (segment, layout.hosts[host].len() > 1) {
        (Some(seg), true) => Some(ShmGroup::new(seg, local, layout.hosts[host].clone(), config.shm.spin)),
        _ => None,
    };
    let path = if size == 1 || layout.hosts.iter().all(|h| h.len() == 1) {
        Path::Tcp
    } else if layout.hosts.len() == 1 {
        Path::Shm
    } else {
        Path::Hierarchical
    };
    if rank == 0 || local == 0 {
        tracing::info!(
            rank,
            size,
            hosts = layout.hosts.len(),
            shape = %layout.shape(),
            "collectives: {}",
            describe(path, &layout)
        );
    }
    let tcp = mesh.into_transport(&config)?;
    Ok(Group { tcp, algorithms: Algorithms::new(config.algo), layout, path, shm, failed: None })
}

fn describe(path: Path, layout: &Layout) -> String {
    let hosts: Vec<String> =
        layout.hosts.iter().zip(&layout.names).map(|(r, n)| format!("{n}: ranks {r:?}")).collect();
    match path {
        Path::Tcp => format!("TCP between every rank ({})", hosts.join("; ")),
        Path::Shm => format!("shared memory between all ranks on one host ({})", hosts.join("; ")),
        Path::Hierarchical => format!(
            "hierarchical: shared memory inside each host, TCP between hosts over {} channel(s) ({})",
            layout.channels(),
            hosts.join("; ")
        ),
    }
}

fn create(config: &ShmConfig, token: &[u8], ranks: usize) -> Result<(Segment, Offer), String> {
    if !config.enabled {
        return Err("shared memory is turned off".to_owned());
    }
    let nonce = auth::nonce().map_err(|e| format!("no randomness for the segment name: {e}"))?;
    let seg = Segment::create(&config.dir, token, &nonce, ranks, config.slots, config.slot_bytes)?;
    Ok((seg, Offer::Segment { nonce, slots: config.slots, slot_bytes: config.slot_bytes }))
}

impl Group {
    /// Which paths the collectives take.
    pub fn path(&self) -> Path {
        self.path
    }

    /// The ranks by host, as found at rendezvous.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The TCP transport underneath (the liveness of every path).
    pub fn tcp(&self) -> &TcpTransport {
        &self.tcp
    }

    /// The allreduce thresholds.
    pub fn algo(&self) -> &AlgoConfig {
        self.algorithms.config()
    }

    /// Runs `f` unless the group already failed; a failure poisons it and is told to every rank.
    fn guarded<R>(
        &mut self,
        f: impl FnOnce(&mut TcpTransport, &mut Algorithms, Option<&mut ShmGroup>, &Layout) -> Result<R, CommError>,
    ) -> Result<R, CommError> {
        if let Some(e) = self.failed.as_ref().or(self.tcp.failure()) {
            return Err(e.clone());
        }
        let result = f(&mut self.tcp, &mut self.algorithms, self.shm.as_mut(), &self.layout);
        if let Err(e) = &result {
            self.tcp.fail(e);
            self.failed = Some(e.clone());
        }
        result
    }

    fn shm_only(&self) -> bool {
        self.path == Path::Shm
    }
}

/// Hierarchical allreduce (module docs).
fn hierarchical(
    tcp: &mut TcpTransport,
    algorithms: &mut Algorithms,
    shm: Option<&mut ShmGroup>,
    layout: &Layout,
    buf: &mut [f32],
    op: ReduceOp,
) -> Result<(), CommError> {
    let size = layout.size();
    let channels = layout.channels();
    let (_, local) = layout.place(tcp_rank(tcp));
    let across = if op == ReduceOp::Average { ReduceOp::Sum } else { op };
    let mut shm = shm;
    if let Some(g) = shm.as_deref_mut() {
        g.reduce(buf, across, channels, false, None, tcp)?;
    }
    if local < channels {
        // A host without shared memory has one rank, so then there is one channel: the whole buffer.
        let block = block_range(buf.len(), channels, local);
        let members = layout.channel(local);
        let part = &mut buf[block];
        if let Some(mut sub) = Subgroup::new(tcp, &members) {
            algorithms.allreduce(&mut sub, part, across)?;
        }
        if op == ReduceOp::Average {
            op.finish(part, size);
        }
    }
    if let Some(g) = shm {
        g.gather(buf, channels, tcp)?;
    }
    Ok(())
}

fn tcp_rank(tcp: &TcpTransport) -> usize {
    super::transport::Transport::rank(tcp)
}

impl Communicator for Group {
    fn rank(&self) -> usize {
        tcp_rank(&self.tcp)
    }

    fn size(&self) -> usize {
        self.layout.size()
    }

    fn backend(&self) -> &'static str {
        match self.path {
            Path::Tcp => "tcp",
            Path::Shm => "shm",
            Path::Hierarchical => "tcp+shm",
        }
    }

    fn allreduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        if self.size() == 1 {
            return Ok(());
        }
        let path = self.path;
        self.guarded(|tcp, algorithms, shm, layout| match (path, shm) {
            (Path::Shm, Some(g)) => {
                let n = g.size();
                g.reduce(buf, op, n, true, Some(n), tcp)
            }
            (Path::Hierarchical, shm) => hierarchical(tcp, algorithms, shm, layout, buf, op),
            _ => algorithms.allreduce(tcp, buf, op),
        })
    }

    fn reduce_scatter(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<Range<usize>, CommError> {
        let (rank, size) = (self.rank(), self.size());
        if size == 1 {
            return Ok(0..buf.len());
        }
        let shm_only = self.shm_only();
        self.guarded(|tcp, algorithms, shm, _| match shm.filter(|_| shm_only) {
            Some(g) => {
                g.reduce(buf, op, size, false, Some(size), tcp)?;
                Ok(block_range(buf.len(), size, rank))
            }
            None => algorithms.reduce_scatter(tcp, buf, op),
        })
    }

    fn allgather(&mut self, buf: &mut [f32]) -> Result<(), CommError> {
        let size = self.size();
        if size == 1 {
            return Ok(());
        }
        let shm_only = self.shm_only();
        self.guarded(|tcp, algorithms, shm, _| match shm.filter(|_| shm_only) {
            Some(g) => g.gather(buf, size, tcp),
            None => algorithms.allgather(tcp, buf),
        })
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        let size = self.size();
        check_root(root, size)?;
        if size == 1 {
            return Ok(());
        }
        let shm_only = self.shm_only();
        self.guarded(|tcp, algorithms, shm, _| match shm.filter(|_| shm_only) {
            Some(g) => g.broadcast(buf, root, tcp),
            None => algorithms.broadcast(tcp, buf, root),
        })
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        if self.size() == 1 {
            return Ok(());
        }
        let shm_only = self.shm_only();
        self.guarded(|tcp, algorithms, shm, _| match shm.filter(|_| shm_only) {
            Some(g) => g.barrier(tcp),
            None => algorithms.barrier(tcp),
        })
    }
}
