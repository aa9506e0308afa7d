//! Point-to-point exchange between ranks, the one primitive the collective algorithms need.
//!
//! A [`Transport`] sends one message to a peer while receiving one from a peer (possibly the same),
//! and either copies or reduces what it receives. The TCP transport overlaps the send, the receive
//! and the reduction in chunks; [`LocalTransport`] runs ranks as threads of one process so that the
//! algorithms can be tested without sockets.
//!
//! [`Subgroup`] runs the same algorithms over a subset of a transport's ranks (the ranks of one
//! channel of a hierarchical allreduce).
//!
//! Guarantees: messages between two ranks arrive in the order sent; a receive whose length differs
//! from the sent length is a [`CommError::Mismatch`], never a silent desynchronisation.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::Duration;

use super::{CommError, Peer, ReduceOp, kernel};

/// What to do with received elements.
#[derive(Debug)]
pub enum Recv<'a> {
    /// Overwrite the buffer.
    Copy(&'a mut [f32]),
    /// Combine into the buffer with the op (`Average` sums): `buf[i] ⊕ incoming[i]`, or
    /// `incoming[i] ⊕ buf[i]` with `incoming_first` — partners that combine each other's values
    /// pass opposite orders so that both compute the same bits.
    Reduce {
        /// The buffer combined into.
        buf: &'a mut [f32],
        /// The op.
        op: ReduceOp,
        /// Whether the received operand comes first.
        incoming_first: bool,
    },
}

impl<'a> Recv<'a> {
    /// `buf[i] ⊕= incoming[i]`.
    pub fn reduce(buf: &'a mut [f32], op: ReduceOp) -> Self {
        Recv::Reduce { buf, op, incoming_first: false }
    }

    /// Elements expected.
    pub fn len(&self) -> usize {
        match self {
            Recv::Copy(b) | Recv::Reduce { buf: b, .. } => b.len(),
        }
    }

    /// Whether no elements are expected.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Applies `incoming` (of the expected length) to the buffer.
    pub fn apply(self, incoming: &[f32]) {
        match self {
            Recv::Copy(dst) => dst.copy_from_slice(incoming),
            Recv::Reduce { buf, op, incoming_first } => kernel::combine(op, buf, incoming, incoming_first),
        }
    }
}

/// Ordered, reliable messages between the ranks of a group.
pub trait Transport {
    /// This rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Sends `send.1` to rank `send.0` while receiving into `recv.1` from rank `recv.0`; returns when
    /// both are done. Either side may be absent.
    fn exchange(
        &mut self,
        send: Option<(usize, &[f32])>,
        recv: Option<(usize, Recv<'_>)>,
    ) -> Result<(), CommError>;

    /// Sends `buf` to `peer` while receiving as many elements from it and combining them into
    /// `buf` (`incoming_first` as in [`Recv::Reduce`]); what is sent is `buf` as it was before.
    /// The default copies `buf` into `scratch` first; transports that pipeline override it to
    /// combine each chunk only once it has been sent, saving that copy.
    fn swap_reduce(
        &mut self,
        peer: usize,
        buf: &mut [f32],
        op: ReduceOp,
        incoming_first: bool,
        scratch: &mut Vec<f32>,
    ) -> Result<(), CommError> {
        scratch.clear();
        scratch.extend_from_slice(buf);
        self.exchange(Some((peer, scratch)), Some((peer, Recv::Reduce { buf, op, incoming_first })))
    }
}

impl<T: Transport + ?Sized> Transport for &mut T {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn size(&self) -> usize {
        (**self).size()
    }
    fn exchange(
        &mut self,
        send: Option<(usize, &[f32])>,
        recv: Option<(usize, Recv<'_>)>,
    ) -> Result<(), CommError> {
        (**self).exchange(send, recv)
    }
    fn swap_reduce(
        &mut self,
        peer: usize,
        buf: &mut [f32],
        op: ReduceOp,
        incoming_first: bool,
        scratch: &mut Vec<f32>,
    ) -> Result<(), CommError> {
        (**self).swap_reduce(peer, buf, op, incoming_first, scratch)
    }
}

/// The ranks `members` (global ranks, in their new rank order) of a transport, as a transport of
/// their own: rank `i` of the subgroup is `members[i]`. This rank must be a member.
pub struct Subgroup<'a, T: ?Sized> {
    inner: &'a mut T,
    members: &'a [usize],
    rank: usize,
}

impl<'a, T: Transport + ?Sized> Subgroup<'a, T> {
    /// The subgroup of `members`; `None` when this rank is not one of them.
    pub fn new(inner: &'a mut T, members: &'a [usize]) -> Option<Self> {
        let me = inner.rank();
        let rank = members.iter().position(|&m| m == me)?;
        Some(Self { inner, members, rank })
    }
}

impl<T: Transport + ?Sized> Transport for Subgroup<'_, T> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.members.len()
    }
    fn exchange(
        &mut self,
        send: Option<(usize, &[f32])>,
        recv: Option<(usize, Recv<'_>)>,
    ) -> Result<(), CommError> {
        let send = send.map(|(to, data)| (self.members[to], data));
        let recv = recv.map(|(from, sink)| (self.members[from], sink));
        self.inner.exchange(send, recv)
    }
    fn swap_reduce(
        &mut self,
        peer: usize,
        buf: &mut [f32],
        op: ReduceOp,
        incoming_first: bool,
        scratch: &mut Vec<f32>,
    ) -> Result<(), CommError> {
        self.inner.swap_reduce(self.members[peer], buf, op, incoming_first, scratch)
    }
}

/// One rank of an in-process group whose ranks are threads; built by [`LocalTransport::group`].
pub struct LocalTransport {
    rank: usize,
    to: Vec<Sender<Vec<f32>>>,
    from: Vec<Receiver<Vec<f32>>>,
    timeout: Duration,
}

impl LocalTransport {
    /// `size` connected ranks; a receive waiting longer than `timeout` fails naming the sender.
    pub fn group(size: usize, timeout: Duration) -> Vec<LocalTransport> {
        // channels[i][j] carries messages from i to j.
        let mut senders: Vec<Vec<Sender<Vec<f32>>>> = (0..size).map(|_| Vec::new()).collect();
        let mut receivers: Vec<Vec<Option<Receiver<Vec<f32>>>>> =
            (0..size).map(|_| (0..size).map(|_| None).collect()).collect();
        for (i, row) in senders.iter_mut().enumerate() {
            for slots in receivers.iter_mut() {
                let (tx, rx) = channel();
                row.push(tx);
                slots[i] = Some(rx);
            }
        }
        senders
            .into_iter()
            .zip(receivers)
            .enumerate()
            .map(|(rank, (to, from))| LocalTransport {
                rank,
                to,
                from: from.into_iter().flatten().collect(),
                timeout,
            })
            .collect()
    }

    fn peer(rank: usize) -> Peer {
        Peer { rank, addr: "in-process".to_owned() }
    }
}

impl Transport for LocalTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.to.len()
    }

    fn exchange(
        &mut self,
        send: Option<(usize, &[f32])>,
        recv: Option<(usize, Recv<'_>)>,
    ) -> Result<(), CommError> {
        if let Some((to, data)) = send {
            self.to[to].send(data.to_vec()).map_err(|_| CommError::PeerFailed {
                peer: Self::peer(to),
                reason: "its thread has ended".to_owned(),
            })?;
        }
        if let Some((from, sink)) = recv {
            let msg = self.from[from].recv_timeout(self.timeout).map_err(|e| match e {
                RecvTimeoutError::Timeout => {
                    CommError::PeerTimeout { peer: Self::peer(from), timeout_s: self.timeout.as_secs_f64() }
                }
                RecvTimeoutError::Disconnected => CommError::PeerFailed {
                    peer: Self::peer(from),
                    reason: "its thread has ended".to_owned(),
                },
            })?;
            if msg.len() != sink.len() {
                return Err(CommError::Mismatch {
                    peer: Self::peer(from),
                    got: msg.len(),
                    expected: sink.len(),
                });
            }
            sink.apply(&msg);
        }
        Ok(())
    }
}
