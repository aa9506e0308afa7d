//! Secret material the operator generates once per job: the job token and the SSH keys of
//! `backend: mpi` jobs (the launcher's user key pair and the job's host CA, with which each worker
//! certifies the host key it makes at start); and reading the token back ([`token_of`]) to read
//! the PS status endpoint.
//!
//! Guarantees: keys and tokens come from the operating system's CSPRNG (through `ring`); the SSH
//! keys are Ed25519 in OpenSSH's own formats, which OpenSSH's `ssh`, `sshd` and `ssh-keygen` read
//! directly.
//! Generation happens only when the Secret does not exist yet, so a reconcile never rotates a
//! key under running pods.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::core::v1::Secret;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{Ed25519KeyPair, KeyPair};
use tandem_api::contract;

use crate::builder::SshKeys;

/// The system's random source failed.
#[derive(Debug, thiserror::Error)]
#[error("the system random number generator failed; check /dev/urandom and the getrandom syscall")]
pub struct RandomError;

fn random<const N: usize>() -> Result<[u8; N], RandomError> {
    let mut bytes = [0u8; N];
    SystemRandom::new().fill(&mut bytes).map_err(|_| RandomError)?;
    Ok(bytes)
}

/// A fresh job token: 32 random bytes, hex-encoded.
pub fn job_token() -> Result<String, RandomError> {
    Ok(random::<32>()?.iter().map(|b| format!("{b:02x}")).collect())
}

/// The job token a `<job>-token` Secret holds (key [`contract::TOKEN_KEY`]), trimmed; `None` if
/// the key is missing, empty or not UTF-8.
pub fn token_of(secret: &Secret) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(contract::TOKEN_KEY)?;
    let token = std::str::from_utf8(&bytes.0).ok()?.trim();
    (!token.is_empty()).then(|| token.to_owned())
}

/// A job's fresh SSH keys: the user key pair labelled `comment` and a host CA key pair labelled
/// `<comment>-host-ca`.
pub fn ssh_keys(comment: &str) -> Result<SshKeys, RandomError> {
    let (private_key, public_key) = ed25519_pair(comment)?;
    let (host_ca_private_key, host_ca_public_key) = ed25519_pair(&format!("{comment}-host-ca"))?;
    Ok(SshKeys { private_key, public_key, host_ca_private_key, host_ca_public_key })
}

/// A fresh Ed25519 key pair: (OpenSSH private key, public-key line).
fn ed25519_pair(comment: &str) -> Result<(String, String), RandomError> {
    let seed = random::<32>()?;
    let check = u32::from_be_bytes(random::<4>()?);
    let pair = Ed25519KeyPair::from_seed_unchecked(&seed).map_err(|_| RandomError)?;
    Ok(openssh_keys(&seed, pair.public_key().as_ref(), check, comment))
}

fn put_string(out: &mut Vec<u8>, bytes: &[u8]) {
    // Lengths here are at most a few hundred bytes.
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// Encodes a key pair in the `openssh-key-v1` format (unencrypted) and the public-key line.
fn openssh_keys(seed: &[u8; 32], public: &[u8], check: u32, comment: &str) -> (String, String) {
    const KEY_TYPE: &[u8] = b"ssh-ed25519";
    let mut public_blob = Vec::new();
    put_string(&mut public_blob, KEY_TYPE);
    put_string(&mut public_blob, public);

    let mut private = Vec::new();
    private.extend_from_slice(&check.to_be_bytes());
    private.extend_from_slice(&check.to_be_bytes());
    put_string(&mut private, KEY_TYPE);
    put_string(&mut private, public);
    let mut secret = seed.to_vec();
    secret.extend_from_slice(public);
    put_string(&mut private, &secret);
    put_string(&mut private, comment.as_bytes());
    let mut pad = 1u8;
    while private.len() % 8 != 0 {
        private.push(pad);
        pad += 1;
    }

    let mut blob = b"openssh-key-v1\0".to_vec();
    put_string(&mut blob, b"none");
    put_string(&mut blob, b"none");
    put_string(&mut blob, b"");
    blob.extend_from_slice(&1u32.to_be_bytes());
    put_string(&mut blob, &public_blob);
    put_string(&mut blob, &private);

    let encoded = STANDARD.encode(&blob);
    let mut pem = String::from("-----BEGIN OPENSSH PRIVATE KEY-----\n");
    for line in encoded.as_bytes().chunks(70) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END OPENSSH PRIVATE KEY-----\n");
    (pem, format!("ssh-ed25519 {} {comment}\n", STANDARD.encode(&public_blob)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_reads_back_from_the_secret_the_builder_makes() {
        let job: tandem_api::TrainingJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": "j", "namespace": "n", "uid": "u"},
            "spec": {"training": {"algorithm": "hybrid", "steps": 10}}
        }))
        .unwrap();
        let secret = crate::builder::token_secret(&job, "abc123");
        assert_eq!(token_of(&secret).as_deref(), Some("abc123"));
        assert_eq!(token_of(&Secret::default()), None);
    }

    #[test]
    fn tokens_are_fresh_hex() {
        let (a, b) = (job_token().unwrap(), job_token().unwrap());
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    /// OpenSSH itself must read the private key and derive the same public key from it.
    #[test]
    fn ssh_keygen_reads_the_private_key_back() {
        let keys = ssh_keys("tandem@test").unwrap();
        let dir = std::env::temp_dir().join(format!("tandem-ssh-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("id_ed25519");
        std::fs::write(&path, &keys.private_key).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let out = std::process::Command::new("ssh-keygen").arg("-y").arg("-f").arg(&path).output();
        let _ = std::fs::remove_dir_all(&dir);
        let out = out.expect("ssh-keygen (openssh-client) must be installed for this test");
        assert!(
            out.status.success(),
            "ssh-keygen rejected the key: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let derived = String::from_utf8_lossy(&out.stdout);
        let derived_key = derived.split_whitespace().nth(1).unwrap();
        let our_key = keys.public_key.split_whitespace().nth(1).unwrap();
        assert_eq!(derived_key, our_key);
    }

    /// What a worker's tandem-sshd does at start: ssh-keygen certifies a fresh host key with the
    /// job's CA key, and the certificate names that CA, as the launcher's known_hosts expects.
    #[test]
    fn ssh_keygen_certifies_a_host_key_with_the_job_ca() {
        use std::os::unix::fs::PermissionsExt;
        let keys = ssh_keys("tandem@test").unwrap();
        assert_ne!(keys.host_ca_public_key, keys.public_key);
        let dir = std::env::temp_dir().join(format!("tandem-ssh-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("host-ca-key");
        std::fs::write(&ca, &keys.host_ca_private_key).unwrap();
        std::fs::set_permissions(&ca, std::fs::Permissions::from_mode(0o600)).unwrap();
        let host = dir.join("ssh_host_ed25519_key");
        let run = |args: &[&std::ffi::OsStr]| {
            let out = std::process::Command::new("ssh-keygen").args(args).output().expect("ssh-keygen");
            assert!(out.status.success(), "ssh-keygen {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        run(&["-q", "-t", "ed25519", "-N", "", "-f"]
            .map(std::ffi::OsStr::new)
            .into_iter()
            .chain([host.as_os_str()])
            .collect::<Vec<_>>());
        let public = host.with_extension("pub");
        let principals = "w-0.j.ns.svc,w-0";
        let mut sign: Vec<&std::ffi::OsStr> = ["-q", "-s"].map(std::ffi::OsStr::new).into_iter().collect();
        sign.push(ca.as_os_str());
        sign.extend(["-h", "-I", "w-0", "-n", principals].map(std::ffi::OsStr::new));
        sign.push(public.as_os_str());
        run(&sign);
        let cert = dir.join("ssh_host_ed25519_key-cert.pub");
        let listing = run(&[std::ffi::OsStr::new("-L"), std::ffi::OsStr::new("-f"), cert.as_os_str()]);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(listing.contains("host certificate"), "{listing}");
        assert!(listing.contains("w-0.j.ns.svc"), "{listing}");
        // The CA's fingerprint in the certificate is that of the public key in known_hosts.
        let ca_line = crate::builder::known_hosts(&keys);
        assert!(ca_line.starts_with("@cert-authority * ssh-ed25519 "), "{ca_line}");
        assert!(ca_line.contains(keys.host_ca_public_key.split_whitespace().nth(1).unwrap()));
    }
}
