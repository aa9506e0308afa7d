//! A worker rank that runs the user's own command (`spec.workers.command`) instead of
//! `tandem worker`: the user's image, command and arguments, and the environment of the launch
//! contract for user processes ([`tandem_api::contract::user`]): torchrun's variables that make
//! each group one `torch.distributed` world, Tandem's own, then the job's `workers.env`.
//!
//! Guarantees: the variables are those the local runner gives the same rank
//! ([`user_env`] with [`Hosting::HostPerRank`]: one rank per pod), except the bind address,
//! which is the pod IP; the group's checkpoint folder and the attempt's progress file lie in the
//! output volume (an emptyDir, or the job's checkpoint claim, which is what lets a restarted group
//! find its checkpoints). No readiness probe: only rank 0 listens, on `MASTER_PORT`.
//!
//! Progress: rank 0 of each group gets a native sidecar (an init container that keeps running)
//! from the job's image, `tandem progress`, which follows the group's progress file in the
//! shared output volume and serves it on the status port, where the operator reads
//! `status.progress` as it does from a PS; the kubelet stops it once the user's container ended.
//! A built-in job without parameter servers (`algorithm: allreduce`) reports the same way: its
//! `tandem worker` rank 0 appends to the file that `TANDEM_PROGRESS_FILE` names.
//! Every other rank first runs `tandem wait-master` as an init container ([`MASTER_WAIT`]).

use k8s_openapi::api::core::v1::{Container, EnvVar};
use tandem_api::contract::user::{self, Hosting, UserFiles, user_env};
use tandem_api::contract::{self, env};
use tandem_api::{LaunchEnv, Role};

use super::job_config;
use super::pod::{Parts, container_port, field_env, mount, plain_env};
use crate::validate::ValidatedJob;
use tandem_api::names;

/// Whether the pods of `role` run the user's image: the workers of a job with `workers.command`
/// (its parameter servers keep running `tandem ps`, its launchers `tandem launcher`, from the
/// job's image).
pub(super) fn uses_user_image(job: &ValidatedJob<'_>, role: Role) -> bool {
    matches!(role, Role::Worker { .. }) && job.spec.workers.command.is_some()
}

/// Whether the pods of `role` start the user's command themselves: the workers of a `backend: tcp`
/// job with `workers.command`. A `backend: mpi` group's workers run sshd from the user's image,
/// and its launcher's mpirun starts the command on them.
pub(super) fn runs_user_command(job: &ValidatedJob<'_>, role: Role) -> bool {
    uses_user_image(job, role) && job.spec.workers.backend == tandem_api::Backend::Tcp
}

/// The image of a user's worker pod: `workers.image`, else the job's.
pub(super) fn image(job: &ValidatedJob<'_>) -> String {
    job.spec.workers.image.clone().unwrap_or_else(|| job.spec.image.clone())
}

/// Replaces `parts` (the role's) with the user's command, arguments and environment, and drops
/// the readiness probe.
pub(super) fn parts(job: &ValidatedJob<'_>, role: Role, attempt: u32, parts: Parts) -> Parts {
    let workers = &job.spec.workers;
    Parts {
        command: workers.command.clone(),
        args: workers.args.clone(),
        env: environment(job, role, attempt),
        ready_port: None,
        ..parts
    }
}

/// Name of the progress sidecar of a group's rank 0.
pub const PROGRESS_SIDECAR: &str = "tandem-progress";

/// The progress sidecar of `role`, if it is rank 0 of a group whose progress the job reports
/// ([`ValidatedJob::progress_from_groups`]): the user's command, or the built-in trainer without
/// parameter servers (whose rank 0 appends to the same file, see [`progress_file_env`]). Beside
/// the user's command it also serves the group's metrics on the metrics port, which the built-in
/// trainer's rank 0 serves itself.
pub(super) fn progress_sidecar(job: &ValidatedJob<'_>, role: Role, attempt: u32) -> Option<Container> {
    if !job.progress_from_groups() || !matches!(role, Role::Worker { rank: 0, .. }) {
        return None;
    }
    let mut env = contract_env(job, role, attempt);
    let mut ports = vec![container_port(super::STATUS_PORT_NAME, contract::STATUS_PORT)];
    if uses_user_image(job, role) {
        env.push(super::pod::metrics_port_env());
        ports.push(container_port(contract::METRICS_PORT_NAME, contract::METRICS_PORT));
    }
    Some(Container {
        name: PROGRESS_SIDECAR.to_owned(),
        image: Some(job.spec.image.clone()),
        command: Some(vec!["tandem".to_owned(), "progress".to_owned()]),
        env: Some(env),
        ports: Some(ports),
        volume_mounts: Some(vec![
            mount("tandem-config", names::CONFIG_DIR, true),
            mount("tandem-token", names::TOKEN_DIR, true),
            mount("tandem-output", names::OUTPUT_DIR, false),
        ]),
        // A native sidecar: started before the user's container, stopped after it.
        restart_policy: Some("Always".to_owned()),
        ..Container::default()
    })
}

/// `TANDEM_PROGRESS_FILE` for the built-in trainer's worker or launcher pod of `role`, if the
/// job's progress comes from its groups: the group's file of `attempt`, which rank 0 of
/// `tandem worker` appends to and the sidecar of [`progress_sidecar`] follows (a launcher's
/// mpirun forwards it to its ranks, rank 0 running on the group's first worker pod, as the
/// hostfile orders them).
pub(super) fn progress_file_env(job: &ValidatedJob<'_>, role: Role, attempt: u32) -> Option<EnvVar> {
    let (Role::Worker { group, .. } | Role::Launcher { group }) = role else { return None };
    if !job.progress_from_groups() || uses_user_image(job, role) {
        return None;
    }
    let file = user::progress_file(std::path::Path::new(names::OUTPUT_DIR), group, attempt);
    Some(plain_env(user::env::PROGRESS_FILE, &file.display().to_string()))
}

/// Name of the init container that holds every rank but 0 until rank 0 accepts connections.
pub const MASTER_WAIT: &str = "tandem-wait-master";

/// The init container of `role`, if it is a rank other than 0 of a group running the user's
/// command: `tandem wait-master` from the job's image, which waits until `MASTER_ADDR:MASTER_PORT`
/// resolves and accepts connections. While a group's rank 0 is replaced, its name can still
/// resolve to the old pod's address for a moment, and PyTorch's store client gives up at once on
/// the "No route to host" that address gives (it retries only refused connections and names
/// that do not resolve).
pub(super) fn master_wait(job: &ValidatedJob<'_>, role: Role, attempt: u32) -> Option<Container> {
    if !runs_user_command(job, role) || matches!(role, Role::Worker { rank: 0, .. }) {
        return None;
    }
    Some(Container {
        name: MASTER_WAIT.to_owned(),
        image: Some(job.spec.image.clone()),
        command: Some(vec!["tandem".to_owned(), "wait-master".to_owned()]),
        env: Some(contract_env(job, role, attempt)),
        ..Container::default()
    })
}

/// The contract's variables for rank `role` at `attempt`, then `workers.env`.
fn environment(job: &ValidatedJob<'_>, role: Role, attempt: u32) -> Vec<EnvVar> {
    let mut out = contract_env(job, role, attempt);
    out.extend(job.spec.workers.env.iter().flatten().map(|e| plain_env(&e.name, &e.value)));
    out
}

fn is_rank0(role: Role) -> bool {
    matches!(role, Role::Worker { rank: 0, .. })
}

/// The contract's variables for rank `role` at `attempt`; rank 0's `MASTER_ADDR` is its pod IP.
fn contract_env(job: &ValidatedJob<'_>, role: Role, attempt: u32) -> Vec<EnvVar> {
    let output = std::path::Path::new(names::OUTPUT_DIR);
    let launch = LaunchEnv {
        role,
        config: format!("{}/{}", names::CONFIG_DIR, contract::CONFIG_FILE).into(),
        token_file: format!("{}/{}", names::TOKEN_DIR, contract::TOKEN_KEY).into(),
        bind: String::new(),
        output: output.into(),
        attempt,
    };
    let group = match role {
        Role::Worker { group, .. } => group,
        Role::Ps { .. } | Role::Launcher { .. } => 0,
    };
    let files = UserFiles {
        checkpoint_dir: user::checkpoint_dir(output, group),
        progress_file: user::progress_file(output, group, attempt),
        data_dir: None,
    };
    // Pods are built only for the roles of the spec, which the job config holds: the fallback (the
    // contract's own variables) is never taken.
    let vars = user_env(&job_config(job), &launch, Hosting::HostPerRank, &files)
        .unwrap_or_else(|_| launch.to_vars());
    vars.into_iter()
        .map(|(name, value)| {
            // Rank 0 hosts the group's store and reaches it at its own address, not through its
            // name, which may still resolve to the pod it replaced.
            let own_address = name == env::BIND || (name == user::env::MASTER_ADDR && is_rank0(role));
            if own_address { field_env(name, "status.podIP") } else { plain_env(name, &value) }
        })
        .collect()
}
