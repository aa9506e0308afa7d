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
use crate::names;
use crate::validate::ValidatedJob;

/// Group of the trainer image's `tandem` user (uid 1000): the `fsGroup` of MPI worker and
/// launcher pods whose template sets none, so that it can read the mounted SSH key.
pub const TRAINER_FS_GROUP: i64 = 1000;

/// The SSH key pair of a `backend: mpi` job, in OpenSSH formats.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshKeys {
    /// `-----BEGIN OPENSSH PRIVATE KEY-----` block.
    pub private_key: String,
    /// `ssh-ed25519 AAAA… comment` line.
    pub public_key: String,
}

/// The SSH key Secret of a `backend: mpi` job (`kubernetes.io/ssh-auth`).
pub fn ssh_secret(job: &ValidatedJob<'_>, keys: &SshKeys) -> Secret {
    Secret {
        metadata: meta(job, names::ssh_secret(job.name), "launcher"),
        type_: Some("kubernetes.io/ssh-auth".to_owned()),
        data: Some(BTreeMap::from([
            ("ssh-privatekey".to_owned(), ByteString(keys.private_key.as_bytes().to_vec())),
            ("ssh-publickey".to_owned(), ByteString(keys.public_key.as_bytes().to_vec())),
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

/// What `backend: mpi` adds to the pod of `role`: a worker runs sshd (ready once it listens) with
/// the job's key as authorized key; a launcher gets the key, its group's hostfile and OpenMPI's
/// settings. A PS is unchanged.
pub(super) fn parts(job: &ValidatedJob<'_>, role: Role) -> Parts {
    match role {
        Role::Ps { .. } => Parts::default(),
        Role::Worker { .. } => Parts {
            command: Some(
                ["/usr/sbin/sshd", "-De", "-p", &names::SSH_PORT.to_string()].map(str::to_owned).to_vec(),
            ),
            ports: vec![container_port(names::SSH_PORT_NAME, names::SSH_PORT)],
            ready_port: Some(names::SSH_PORT),
            mounts: vec![mount("tandem-ssh", names::SSH_DIR, true)],
            volumes: vec![ssh_volume(job)],
            fs_group: Some(TRAINER_FS_GROUP),
            ..Parts::default()
        },
        Role::Launcher { group } => Parts {
            env: launcher_env(),
            mounts: vec![
                mount("tandem-ssh", names::SSH_DIR, true),
                mount("tandem-hostfile", names::HOSTFILE_DIR, true),
            ],
            volumes: vec![ssh_volume(job), hostfile_volume(job, group)],
            fs_group: Some(TRAINER_FS_GROUP),
            ..Parts::default()
        },
    }
}

/// OpenMPI settings of a launcher: the group's hostfile, sshd on the workers' port, patience
/// while worker DNS records appear.
fn launcher_env() -> Vec<k8s_openapi::api::core::v1::EnvVar> {
    [
        ("OMPI_MCA_orte_default_hostfile", format!("{}/{}", names::HOSTFILE_DIR, names::HOSTFILE)),
        ("OMPI_MCA_prte_default_hostfile", format!("{}/{}", names::HOSTFILE_DIR, names::HOSTFILE)),
        ("OMPI_MCA_orte_keep_fqdn_hostnames", "true".to_owned()),
        (
            "OMPI_MCA_plm_rsh_args",
            format!(
                "-p {} -i {}/ssh-privatekey -o ConnectionAttempts=10 -o StrictHostKeyChecking=no",
                names::SSH_PORT,
                names::SSH_DIR
            ),
        ),
    ]
    .into_iter()
    .map(|(k, v)| plain_env(k, &v))
    .collect()
}

/// The SSH key Secret, readable by the `fsGroup` (Secret files are root-owned 0600; with an
/// fsGroup the kubelet makes them readable by it), with the public key as `authorized_keys`.
fn ssh_volume(job: &ValidatedJob<'_>) -> Volume {
    let item = |key: &str, path: &str| KeyToPath { key: key.to_owned(), path: path.to_owned(), mode: None };
    Volume {
        name: "tandem-ssh".to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(names::ssh_secret(job.name)),
            default_mode: Some(0o600),
            items: Some(vec![
                item("ssh-privatekey", "ssh-privatekey"),
                item("ssh-publickey", "ssh-publickey"),
                item("ssh-publickey", "authorized_keys"),
            ]),
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
