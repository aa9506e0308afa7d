//! How a reader proves the job token to a PS status endpoint without sending it: an HMAC-SHA256
//! of the job token over the request and a fresh timestamp and nonce, in the `Authorization`
//! header. The operator (`progress.rs`) signs with it, `tandem ps` (`ps::server::http`) checks it.
//!
//! ```text
//! Authorization: Tandem-HMAC ts=<unix seconds>, nonce=<32 hex digits>, mac=<64 hex digits>
//! mac = HMAC-SHA256(job token, "tandem-status-v1\n" method "\n" target "\n" ts "\n" nonce)
//! ```
//!
//! By hand: `ts=$(date +%s); n=$(openssl rand -hex 16); mac=$(printf 'tandem-status-v1\nGET\n/status\n%s\n%s'
//! $ts $n | openssl dgst -sha256 -hmac "$(cat token)" -r | cut -d' ' -f1)`, then `curl -H
//! "Authorization: Tandem-HMAC ts=$ts, nonce=$n, mac=$mac" http://<ps>:7072/status`.
//!
//! Guarantees: the token never crosses the wire; a MAC covers one method and target, and the
//! server accepts a timestamp at most [`MAX_SKEW_SECONDS`] away from its clock and each nonce once
//! within that window, so a captured header cannot be reused for long or at all.

/// The scheme's name in the `Authorization` header.
pub const SCHEME: &str = "Tandem-HMAC";
/// Largest difference between the request's timestamp and the server's clock, in seconds.
pub const MAX_SKEW_SECONDS: u64 = 300;
/// Hex digits of a nonce (16 random bytes).
pub const NONCE_HEX_LEN: usize = 32;

/// The bytes the MAC covers for `method` on `target` (the request target, e.g. `/status`).
pub fn message(method: &str, target: &str, timestamp: u64, nonce: &str) -> Vec<u8> {
    format!("tandem-status-v1\n{method}\n{target}\n{timestamp}\n{nonce}").into_bytes()
}

/// The `Authorization` header's value.
pub fn header(timestamp: u64, nonce: &str, mac_hex: &str) -> String {
    format!("{SCHEME} ts={timestamp}, nonce={nonce}, mac={mac_hex}")
}

/// What an `Authorization` header of this scheme carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    /// Unix seconds the client signed at.
    pub timestamp: u64,
    /// The client's nonce, hex.
    pub nonce: String,
    /// The MAC, hex.
    pub mac: String,
}

/// Parses an `Authorization` value of this scheme; `None` for another scheme or a malformed one.
pub fn parse(value: &str) -> Option<Credentials> {
    let rest = value.trim().strip_prefix(SCHEME)?.strip_prefix(' ')?;
    let (mut ts, mut nonce, mut mac) = (None, None, None);
    for part in rest.split(',') {
        let (key, v) = part.trim().split_once('=')?;
        let slot = match key {
            "ts" => &mut ts,
            "nonce" => &mut nonce,
            "mac" => &mut mac,
            _ => return None,
        };
        if slot.replace(v.to_owned()).is_some() {
            return None;
        }
    }
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    let (nonce, mac) = (nonce?, mac?);
    if !hex(&nonce, NONCE_HEX_LEN) || !hex(&mac, 64) {
        return None;
    }
    Some(Credentials { timestamp: ts?.parse().ok()?, nonce, mac: mac.to_ascii_lowercase() })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_header_round_trips_and_strangers_do_not_parse() {
        let nonce = "00112233445566778899aabbccddeeff";
        let mac = "7d8f647cdb62af56414e7fdf6317e46ea012a04fadc39ae3481e8908af0fa1e3";
        let value = header(1_700_000_000, nonce, mac);
        let parsed = parse(&value).unwrap();
        assert_eq!(
            (parsed.timestamp, parsed.nonce.as_str(), parsed.mac.as_str()),
            (1_700_000_000, nonce, mac)
        );
        for bad in [
            "Bearer abc".to_owned(),
            format!("{SCHEME} ts=1, nonce={nonce}"),
            format!("{SCHEME} ts=x, nonce={nonce}, mac={mac}"),
            format!("{SCHEME} ts=1, nonce=zz, mac={mac}"),
            format!("{SCHEME} ts=1, ts=2, nonce={nonce}, mac={mac}"),
        ] {
            assert_eq!(parse(&bad), None, "{bad}");
        }
        assert_eq!(
            message("GET", "/status", 1_700_000_000, nonce),
            b"tandem-status-v1\nGET\n/status\n1700000000\n00112233445566778899aabbccddeeff".to_vec()
        );
    }
}
