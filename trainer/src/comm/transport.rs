//! Point-to-point exchange between ranks, the one primitive the collective algorithms need.
//!
//! A [`Transport`] sends one message to a peer while receiving one from a peer (possibly the same),
//! and either copies or reduces what it receives. The TCP transport overlaps the send, the receive
//! and the reduction in chunks; [`LocalTransport`] runs ranks as threads of one process so that the
//! algorithms can be tested without sockets.
//!
//! Guarantees: messages between two ranks arrive in the order sent; a receive whose length differs
//! from the sent length is a [`CommError::Mismatch`], never a silent desynchronisation.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::Duration;

use super::{CommError, Peer, ReduceOp};

/// What to do with received elements.
#[derive(Debug)]
pub enum Recv<'a> {
    /// Overwrite the buffer.
    Copy(&'a mut [f32]),
    /// Combine into the buffer with the op (`Average` sums).
    Reduce(&'a mut [f32], ReduceOp),
}

impl Recv<'_> {
    /// Elements expected.
    pub fn len(&self) -> usize {
        match self {
            Recv::Copy(b) | Recv::Reduce(b, _) => b.len(),
        }
    }

    /// Whether no elements are expected.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
            match sink {
                Recv::Copy(dst) => dst.copy_from_slice(&msg),
                Recv::Reduce(dst, op) => op.combine(dst, &msg),
            }
        }
        Ok(())
    }
}
