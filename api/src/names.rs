//! Names and labels of every object the operator owns, derived only from the job's name; the
//! kubectl plugin and the tests find the objects through the same definitions.
//!
//! Guarantees: names are deterministic (the same job always yields the same names, so a reconcile
//! after a crash finds what the last one created) and every child carries the labels in
//! [`child_labels`], so orphans are found by label, never by name patterns.

use std::collections::BTreeMap;

use crate::Role;

/// The one field manager of every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "tandem-operator";
/// `runPolicy.managedBy` value (or absence) that this operator reconciles.
pub const MANAGED_BY: &str = "tandem.dev/operator";

/// `app.kubernetes.io/name` of every child.
pub const APP_NAME: &str = "tandem";
/// Standard label: the application.
pub const LABEL_NAME: &str = "app.kubernetes.io/name";
/// Standard label: the instance (the job name).
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
/// Standard label: the component (`ps`, `worker`, `launcher`, `job`).
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
/// Standard label: who manages the object.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Tandem label: the owning TrainingJob's name.
pub const LABEL_JOB: &str = "tandem.dev/job-name";
/// Tandem label: the role of a pod (`ps`, `worker`, `launcher`).
pub const LABEL_ROLE: &str = "tandem.dev/role";
/// Tandem label: the worker group of a pod or hostfile.
pub const LABEL_GROUP: &str = "tandem.dev/group";
/// Tandem label: the rank of a worker pod in its group.
pub const LABEL_RANK: &str = "tandem.dev/rank";
/// Tandem label: the index of a PS pod.
pub const LABEL_PS_INDEX: &str = "tandem.dev/ps-index";
/// Tandem label: the attempt (restart count of its unit) a pod was launched for.
pub const LABEL_ATTEMPT: &str = "tandem.dev/attempt";

/// Name of the container that runs `tandem` in every pod.
pub const CONTAINER: &str = "tandem";
/// Port name of the PS endpoint.
pub const PS_PORT_NAME: &str = "ps";
/// Port name of the worker collective endpoint.
pub const WORKER_PORT_NAME: &str = "collective";
/// Port of the sshd that `backend: mpi` workers run for mpirun.
pub const SSH_PORT: u16 = 2222;
/// Port name of the sshd.
pub const SSH_PORT_NAME: &str = "ssh";

/// Where the job ConfigMap is mounted.
pub const CONFIG_DIR: &str = "/etc/tandem";
/// Where the job token Secret is mounted.
pub const TOKEN_DIR: &str = "/var/run/tandem";
/// Where checkpoints and outputs go.
pub const OUTPUT_DIR: &str = "/var/lib/tandem";
/// Where the SSH key Secret is mounted (`backend: mpi`).
pub const SSH_DIR: &str = "/etc/tandem/ssh";
/// Where a group's hostfile is mounted on its launcher (`backend: mpi`).
pub const HOSTFILE_DIR: &str = "/etc/tandem/mpi";
/// File name of the hostfile.
pub const HOSTFILE: &str = "hostfile";

/// The headless Service: `<job>`, so pods resolve as `<pod>.<job>.<namespace>.svc`.
pub fn service(job: &str) -> String {
    job.to_owned()
}

/// The job's NetworkPolicy (when the operator runs with `--network-policy`).
pub fn network_policy(job: &str) -> String {
    job.to_owned()
}

/// The job ConfigMap holding `job.json`.
pub fn config_map(job: &str) -> String {
    format!("{job}-config")
}

/// The Secret holding the job token.
pub fn token_secret(job: &str) -> String {
    format!("{job}-token")
}

/// The Secret holding the SSH key pair of `backend: mpi` jobs.
pub fn ssh_secret(job: &str) -> String {
    format!("{job}-ssh")
}

/// The hostfile ConfigMap of group `group`.
pub fn hostfile(job: &str, group: u32) -> String {
    format!("{job}-g{group}-hostfile")
}

/// The PodGroup of a gang-scheduled job.
pub fn pod_group(job: &str) -> String {
    job.to_owned()
}

/// The pod of a role: `<job>-ps-<i>`, `<job>-g<g>-<r>` or `<job>-g<g>-launcher`.
pub fn pod(job: &str, role: Role) -> String {
    match role {
        Role::Ps { index } => format!("{job}-ps-{index}"),
        Role::Worker { group, rank } => format!("{job}-g{group}-{rank}"),
        Role::Launcher { group } => format!("{job}-g{group}-launcher"),
    }
}

/// The DNS name of a pod through the headless Service.
pub fn pod_host(job: &str, namespace: &str, role: Role) -> String {
    format!("{}.{}.{namespace}.svc", pod(job, role), service(job))
}

/// Labels every child of job `job` carries.
pub fn child_labels(job: &str, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.to_owned(), APP_NAME.to_owned()),
        (LABEL_INSTANCE.to_owned(), job.to_owned()),
        (LABEL_COMPONENT.to_owned(), component.to_owned()),
        (LABEL_MANAGED_BY.to_owned(), FIELD_MANAGER.to_owned()),
        (LABEL_JOB.to_owned(), job.to_owned()),
    ])
}

/// Labels of a pod of `role`.
pub fn pod_labels(job: &str, role: Role, attempt: u32) -> BTreeMap<String, String> {
    let mut labels = child_labels(job, role.name());
    labels.insert(LABEL_ROLE.to_owned(), role.name().to_owned());
    labels.insert(LABEL_ATTEMPT.to_owned(), attempt.to_string());
    match role {
        Role::Ps { index } => {
            labels.insert(LABEL_PS_INDEX.to_owned(), index.to_string());
        }
        Role::Worker { group, rank } => {
            labels.insert(LABEL_GROUP.to_owned(), group.to_string());
            labels.insert(LABEL_RANK.to_owned(), rank.to_string());
        }
        Role::Launcher { group } => {
            labels.insert(LABEL_GROUP.to_owned(), group.to_string());
        }
    }
    labels
}

/// Label selector of every child of a job (for listing and pruning).
pub fn job_selector(job: &str) -> String {
    format!("{LABEL_JOB}={job},{LABEL_MANAGED_BY}={FIELD_MANAGER}")
}

/// Label selector of a job's worker pods (the scale subresource's `selector`).
pub fn worker_selector(job: &str) -> String {
    format!("{LABEL_JOB}={job},{LABEL_ROLE}=worker")
}

/// Reads the role of a pod back from its labels; `None` for a pod that is not a Tandem pod.
pub fn role_of(labels: &BTreeMap<String, String>) -> Option<Role> {
    let num = |key: &str| labels.get(key).and_then(|v| v.parse::<u32>().ok());
    match labels.get(LABEL_ROLE).map(String::as_str) {
        Some("ps") => Some(Role::Ps { index: num(LABEL_PS_INDEX)? }),
        Some("worker") => Some(Role::Worker { group: num(LABEL_GROUP)?, rank: num(LABEL_RANK)? }),
        Some("launcher") => Some(Role::Launcher { group: num(LABEL_GROUP)? }),
        _ => None,
    }
}

/// The attempt a pod was launched for (0 when unlabelled).
pub fn attempt_of(labels: &BTreeMap<String, String>) -> u32 {
    labels.get(LABEL_ATTEMPT).and_then(|v| v.parse().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_labels_read_back_as_the_same_role() {
        for role in [Role::Ps { index: 3 }, Role::Worker { group: 2, rank: 1 }, Role::Launcher { group: 7 }] {
            let labels = pod_labels("j", role, 4);
            assert_eq!(role_of(&labels), Some(role));
            assert_eq!(attempt_of(&labels), 4);
        }
    }

    #[test]
    fn names_follow_the_documented_patterns() {
        assert_eq!(pod("mnist", Role::Ps { index: 1 }), "mnist-ps-1");
        assert_eq!(pod("mnist", Role::Worker { group: 0, rank: 3 }), "mnist-g0-3");
        assert_eq!(pod("mnist", Role::Launcher { group: 2 }), "mnist-g2-launcher");
        assert_eq!(pod_host("mnist", "ns", Role::Ps { index: 0 }), "mnist-ps-0.mnist.ns.svc");
    }
}
