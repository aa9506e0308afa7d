//! Mutual authentication of a connection by the job token, without sending the token.
//!
//! Expected flow (connector C dials acceptor A):
//! 1. C → A: `HELLO` = magic, version, channel, C's rank, group size, a fresh 16-byte nonce `nc`.
//! 2. A → C: magic, version, A's rank, group size, a fresh nonce `na`, `HMAC(token, "accept"‖T)`.
//! 3. C checks A's rank, size and MAC, then → A: `HMAC(token, "connect"‖T)`.
//! 4. A checks the MAC and answers one byte, [`ACCEPTED`]. Otherwise it closes the connection.
//!
//! `T` is the transcript: channel, both ranks, size and both nonces, so a MAC cannot be replayed on
//! another connection, and the two directions use distinct labels so A cannot be used as an oracle
//! for C's answer. HMAC-SHA256 (RFC 2104) over the `sha2` crate.
//!
//! Guarantees: a peer without the token is refused before any collective data flows; the token
//! itself never crosses the wire.

use std::io::{Read, Write};

use tandem_util::token;

/// Protocol magic at the start of every handshake message.
pub const MAGIC: [u8; 4] = *b"TNDM";
/// Handshake version; peers of different versions refuse each other.
pub const VERSION: u8 = 1;
/// The acceptor's final byte when the connector's MAC is valid.
pub const ACCEPTED: u8 = 0xA5;

/// Length of a MAC.
pub const MAC_LEN: usize = token::MAC_LEN;
/// Length of a nonce.
pub const NONCE_LEN: usize = 16;

/// Compares MACs in time independent of where they differ.
pub fn macs_equal(a: &[u8; MAC_LEN], b: &[u8; MAC_LEN]) -> bool {
    token::same_bytes(a, b)
}

/// A fresh random nonce from the kernel.
pub fn nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    token::random_bytes()
}

/// What the handshake binds a connection to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Channel of the connection (data or control).
    pub channel: u8,
    /// Rank of the sender of this hello.
    pub rank: u32,
    /// Group size the sender believes in.
    pub size: u32,
    /// Sender's nonce.
    pub nonce: [u8; NONCE_LEN],
}

const HELLO_LEN: usize = 4 + 1 + 1 + 4 + 4 + NONCE_LEN;

impl Hello {
    fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = self.channel;
        b[6..10].copy_from_slice(&self.rank.to_le_bytes());
        b[10..14].copy_from_slice(&self.size.to_le_bytes());
        b[14..].copy_from_slice(&self.nonce);
        b
    }

    fn decode(b: &[u8; HELLO_LEN]) -> Result<Self, String> {
        if b[..4] != MAGIC {
            return Err("it is not a tandem collective endpoint (bad magic)".to_owned());
        }
        if b[4] != VERSION {
            return Err(format!("it speaks handshake version {}, this build speaks {VERSION}", b[4]));
        }
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[14..]);
        Ok(Self { channel: b[5], rank: word(6), size: word(10), nonce })
    }

    /// Writes the hello.
    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&self.encode())
    }

    /// Reads a hello; `Err(Ok(reason))` for a malformed one.
    pub fn read_from(r: &mut impl Read) -> std::io::Result<Result<Self, String>> {
        let mut b = [0u8; HELLO_LEN];
        r.read_exact(&mut b)?;
        Ok(Self::decode(&b))
    }
}

/// The MAC that proves knowledge of `token` for the connection between `connector` and `acceptor`;
/// `label` is `b"accept"` or `b"connect"`.
pub fn transcript_mac(token: &[u8], label: &[u8], connector: &Hello, acceptor: &Hello) -> [u8; MAC_LEN] {
    token::hmac(
        token,
        &[
            b"tandem-comm-v1/",
            label,
            &[connector.channel],
            &connector.rank.to_le_bytes(),
            &acceptor.rank.to_le_bytes(),
            &connector.size.to_le_bytes(),
            &connector.nonce,
            &acceptor.nonce,
        ],
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_rejects_strangers() {
        let h = Hello { channel: 1, rank: 3, size: 5, nonce: [7; NONCE_LEN] };
        let mut wire = Vec::new();
        h.write_to(&mut wire).unwrap();
        assert_eq!(Hello::read_from(&mut wire.as_slice()).unwrap().unwrap(), h);
        wire[0] = b'G';
        assert!(Hello::read_from(&mut wire.as_slice()).unwrap().is_err());
    }
}
