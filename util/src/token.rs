//! Secrets of a job: random tokens and nonces from the kernel, HMAC-SHA256, and comparison in
//! constant time. The collectives' handshake (`tandem_comm::auth`), the parameter server's hello
//! and its HTTP endpoint, and the local runner's job token all use these, so each exists once.
//!
//! Guarantees: randomness comes from `/dev/urandom` (an error, never a weak fallback);
//! [`same_bytes`] takes time independent of where two equal-length inputs differ.

use std::io::Read;

use sha2::{Digest, Sha256};

/// Length of an HMAC-SHA256 tag.
pub const MAC_LEN: usize = 32;

/// `N` random bytes from the kernel.
pub fn random_bytes<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes)
}

/// A random job token: 32 bytes from the kernel as 64 hex digits.
pub fn random_token() -> std::io::Result<String> {
    Ok(hex(&random_bytes::<32>()?))
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `a` and `b` are equal, in time independent of where they differ (their lengths are not
/// secret).
pub fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// HMAC-SHA256 (RFC 2104) of `parts`, concatenated, under `key`.
pub fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    for p in parts {
        inner.update(p);
    }
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_test_case_2() {
        let mac = hmac(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(hex(&mac), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    #[test]
    fn tokens_are_fresh_hex_and_comparison_needs_equal_bytes() {
        let (a, b) = (random_token().unwrap(), random_token().unwrap());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert!(same_bytes(a.as_bytes(), a.clone().as_bytes()));
        assert!(!same_bytes(a.as_bytes(), b.as_bytes()));
        assert!(!same_bytes(b"abc", b"abcd"));
    }
}
