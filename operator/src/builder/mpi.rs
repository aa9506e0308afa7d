//! `backend: mpi`: each group's workers run sshd, and its launcher runs `tandem launcher`, which
//! starts the ranks with mpirun over ssh from the group's hostfile. This module adds the SSH key
//! Secret, the hostfiles and what the workers' and launchers' pods need of them.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, KeyToPath, Secret, SecretVolumeSource, Volume,
};
use tandem_api::Role;

use super::meta;
use super::pod::{Parts, container_port, mount, plain_env};
use crate::validate::ValidatedJob;
use tandem_api::names;

/// Key (and file name) of the host CA's private key in a job's SSH Secret.
pub const SSH_HOST_CA_KEY: &str = "host-ca-key";
/// Key (and file name) of the `known_hosts` in a job's SSH Secret.
pub const SSH_KNOWN_HOSTS: &str = "known_hosts";
/// The trainer image's sshd wrapper that MPI workers run (docker/tandem-sshd): it makes the pod's
/// host key, certifies it with the job's host CA and execs sshd with the given arguments.
pub const SSHD_COMMAND: &str = "tandem-sshd";

/// The SSH keys of a `backend: mpi` job, in OpenSSH formats: the user key pair the launcher logs
/// in with, and the job's host CA, which certifies the host key every worker makes at start (so
/// that the launcher checks host keys without any being baked into the image).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshKeys {
    /// `-----BEGIN OPENSSH PRIVATE KEY-----` block.
    pub private_key: String,
    /// `ssh-ed25519 AAAA… comment` line.
    pub public_key: String,
    /// The host CA's private key (mounted on workers only, as `host-ca-key`).
    pub host_ca_private_key: String,
    /// The host CA's public-key line (trusted through `known_hosts`).
    pub host_ca_public_key: String,
}

/// The `known_hosts` of a job's pods: any host showing a certificate of the job's host CA.
pub fn known_hosts(keys: &SshKeys) -> String {
    format!("@cert-authority * {}\n", keys.host_ca_public_key.trim())
}

/// The SSH key Secret of a `backend: mpi` job (`kubernetes.io/ssh-auth`): the user key pair, the
/// host CA key and the `known_hosts` that trusts it.
pub fn ssh_secret(job: &ValidatedJob<'_>, keys: &SshKeys) -> Secret {
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    Secret {
        metadata: meta(job, names::ssh_secret(job.name), "launcher"),
        type_: Some("kubernetes.io/ssh-auth".to_owned()),
        data: Some(BTreeMap::from([
            ("ssh-privatekey".to_owned(), bytes(&keys.private_key)),
            ("ssh-publickey".to_owned(), bytes(&keys.public_key)),
            (SSH_HOST_CA_KEY.to_owned(), bytes(&keys.host_ca_private_key)),
            (SSH_KNOWN_HOSTS.to_owned(), bytes(&known_hosts(keys))),
        ])),
        ..Secret::default()
    }
}

/// Group `group`'s OpenMPI hostfile: one line per rank, in rank order, one slot each.
pub fn hostfile(job: &ValidatedJob<'_>, group: u32) -> ConfigMap {
    let text: String = (0..job.spec.workers.group_size)
        .map(|rank| {
            format!("{} slots=1\n", names::pod_host(job.name, job.namespace, Role::Worker { group, rank }))
        })
        .collect();
    let mut metadata = meta(job, names::hostfile(job.name, group), "launcher");
    if let Some(labels) = metadata.labels.as_mut() {
        labels.insert(names::LABEL_GROUP.to_owned(), group.to_string());
    }
    ConfigMap {
        metadata,
        data: Some(BTreeMap::from([(names::HOSTFILE.to_owned(), text)])),
        ..ConfigMap::default()
    }
}

/// What `backend: mpi` adds to the pod of `role`: a worker runs sshd through `tandem-sshd` (ready
/// once it listens) with the job's key as authorized key and a host key certified by the job's host
/// CA; a launcher gets the key, the `known_hosts` trusting that CA, its group's hostfile and
/// OpenMPI's settings. A PS is unchanged.
pub(super) fn parts(job: &ValidatedJob<'_>, role: Role) -> Parts {
    match role {
        Role::Ps { .. } => Parts::default(),
        Role::Worker { .. } => Parts {
            command: Some([SSHD_COMMAND, "-p", &names::SSH_PORT.to_string()].map(str::to_owned).to_vec()),
            ports: vec![container_port(names::SSH_PORT_NAME, names::SSH_PORT)],
            ready_port: Some(names::SSH_PORT),
            mounts: vec![mount("tandem-ssh", names::SSH_DIR, true)],
            volumes: vec![ssh_volume(job, role)],
            ..Parts::default()
        },
        Role::Launcher { group } => Parts {
            env: launcher_env(),
            mounts: vec![
                mount("tandem-ssh", names::SSH_DIR, true),
                mount("tandem-hostfile", names::HOSTFILE_DIR, true),
            ],
            volumes: vec![ssh_volume(job, role), hostfile_volume(job, group)],
            ..Parts::default()
        },
    }
}

/// OpenMPI settings of a launcher: the group's hostfile, sshd on the workers' port, their host
/// certificates checked against the job's CA, patience while worker DNS records appear.
fn launcher_env() -> Vec<k8s_openapi::api::core::v1::EnvVar> {
    [
        ("OMPI_MCA_orte_default_hostfile", format!("{}/{}", names::HOSTFILE_DIR, names::HOSTFILE)),
        ("OMPI_MCA_prte_default_hostfile", format!("{}/{}", names::HOSTFILE_DIR, names::HOSTFILE)),
        ("OMPI_MCA_orte_keep_fqdn_hostnames", "true".to_owned()),
        (
            "OMPI_MCA_plm_rsh_args",
            format!(
                "-p {port} -i {dir}/ssh-privatekey -o ConnectionAttempts=10 -o StrictHostKeyChecking=yes \
                 -o UserKnownHostsFile={dir}/{SSH_KNOWN_HOSTS} -o GlobalKnownHostsFile=/dev/null",
                port = names::SSH_PORT,
                dir = names::SSH_DIR
            ),
        ),
    ]
    .into_iter()
    .map(|(k, v)| plain_env(k, &v))
    .collect()
}

/// The SSH key Secret of `role`'s pod, readable by the pod's `fsGroup` (Secret files are
/// root-owned 0600; with an fsGroup the kubelet makes them readable by it), with the public key as
/// `authorized_keys` and the `known_hosts`; only workers get the host CA key, since only they
/// certify a host key (the launcher only checks certificates).
fn ssh_volume(job: &ValidatedJob<'_>, role: Role) -> Volume {
    let item = |key: &str, path: &str| KeyToPath { key: key.to_owned(), path: path.to_owned(), mode: None };
    let mut items = vec![
        item("ssh-privatekey", "ssh-privatekey"),
        item("ssh-publickey", "ssh-publickey"),
        item("ssh-publickey", "authorized_keys"),
        item(SSH_KNOWN_HOSTS, SSH_KNOWN_HOSTS),
    ];
    if let Role::Worker { .. } = role {
        items.push(item(SSH_HOST_CA_KEY, SSH_HOST_CA_KEY));
    }
    Volume {
        name: "tandem-ssh".to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(names::ssh_secret(job.name)),
            default_mode: Some(0o600),
            items: Some(items),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn hostfile_volume(job: &ValidatedJob<'_>, group: u32) -> Volume {
    Volume {
        name: "tandem-hostfile".to_owned(),
        config_map: Some(ConfigMapVolumeSource {
            name: names::hostfile(job.name, group),
            default_mode: Some(0o444),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }
}
