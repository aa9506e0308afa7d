//! The launch contract: what every `tandem` process is told about its place in a job.
//!
//! Expected flow: the operator (or the local runner) writes one [`JobConfig`] per job — as
//! `job.json` in the job's ConfigMap, or as a file for local processes — and gives each process a
//! handful of environment variables ([`env`]) naming its [`Role`], the config file, the token file
//! and the address to bind. The process reads them with [`LaunchEnv::from_lookup`] and the file
//! with [`JobConfig::from_json`].
//!
//! Guarantees: the contract is defined only here and used by both sides; serialisation
//! round-trips exactly; a missing or malformed variable is an error naming the variable and the
//! value expected, never a default that silently puts a process in the wrong place.
//!
//! Assumptions: peers of one group never change while that group runs — scaling adds or removes
//! whole groups, and a group whose size changes is relaunched with a new config.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::job::TrainingJobSpec;

pub mod status_auth;
pub mod user;

pub use user::{Hosting, UserFiles, UserProgress, user_env};

/// Names of the environment variables of the contract.
pub mod env {
    /// `ps`, `worker` or `launcher`.
    pub const ROLE: &str = "TANDEM_ROLE";
    /// Parameter-server index (role `ps`).
    pub const PS_INDEX: &str = "TANDEM_PS_INDEX";
    /// Worker group index (roles `worker` and `launcher`).
    pub const GROUP: &str = "TANDEM_GROUP";
    /// Rank inside the group (role `worker`); with `backend: mpi` mpirun's rank wins.
    pub const RANK: &str = "TANDEM_RANK";
    /// Path of the job's [`super::JobConfig`] JSON.
    pub const CONFIG: &str = "TANDEM_CONFIG";
    /// Path of the file holding the job token.
    pub const TOKEN_FILE: &str = "TANDEM_TOKEN_FILE";
    /// Address to bind listening sockets to (the pod IP).
    pub const BIND: &str = "TANDEM_BIND";
    /// Folder for checkpoints, curves and logs.
    pub const OUTPUT: &str = "TANDEM_OUTPUT";
    /// Attempt number of this process's group or PS (0 for the first launch).
    pub const ATTEMPT: &str = "TANDEM_ATTEMPT";
    /// Port of a parameter server's HTTP status endpoint (role `ps`, optional): unset means
    /// [`super::STATUS_PORT`], `0` any free port, `off` no endpoint. Read with
    /// [`super::status_port`].
    pub const STATUS_PORT: &str = "TANDEM_STATUS_PORT";
    /// Seconds a unit waits for every peer of its group to be reachable (DNS and TCP) before it
    /// fails naming the unreachable ones (optional, default [`super::PEER_TIMEOUT_SECONDS`]):
    /// the launcher's gate before `mpirun`, and a `tcp` group's rendezvous. Read with
    /// [`super::peer_timeout`].
    pub const PEER_TIMEOUT: &str = "TANDEM_PEER_TIMEOUT";
    /// Where a failed process writes its last error for the kubelet, which shows it as the
    /// container's termination message (optional, default [`super::TERMINATION_LOG`], written only
    /// when that file exists, as the kubelet makes it).
    pub const TERMINATION_LOG: &str = "TANDEM_TERMINATION_LOG";
    /// Port of a process's Prometheus metrics (optional): unset means none are served (the local
    /// runner's processes share one host), a number that port, `0` any free port. The operator
    /// sets it to [`super::METRICS_PORT`] on every PS and worker pod. Read with
    /// [`super::metrics_port`].
    pub const METRICS_PORT: &str = "TANDEM_METRICS_PORT";
}

/// Default of [`env::PEER_TIMEOUT`]: every peer of a group reachable within this many seconds.
pub const PEER_TIMEOUT_SECONDS: u64 = 120;
/// The kubelet's default `terminationMessagePath`.
pub const TERMINATION_LOG: &str = "/dev/termination-log";

/// The peer deadline that [`env::PEER_TIMEOUT`] asks for, read through `lookup`.
pub fn peer_timeout(lookup: impl Fn(&str) -> Option<String>) -> Result<std::time::Duration, ContractError> {
    match lookup(env::PEER_TIMEOUT) {
        None => Ok(std::time::Duration::from_secs(PEER_TIMEOUT_SECONDS)),
        Some(value) => match value.trim().parse::<u64>() {
            Ok(secs) if secs > 0 => Ok(std::time::Duration::from_secs(secs)),
            _ => Err(ContractError::Invalid {
                key: env::PEER_TIMEOUT,
                value,
                expected: "a whole number of seconds above 0",
            }),
        },
    }
}

/// Port a parameter server listens on in a pod.
pub const PS_PORT: u16 = 7070;
/// Port a worker's collective endpoint listens on in a pod.
pub const WORKER_PORT: u16 = 7071;
/// Port of a parameter server's HTTP status endpoint in a pod (see [`PsStatus`]).
pub const STATUS_PORT: u16 = 7072;
/// Port of a pod's Prometheus metrics, `GET /metrics` without a token (every PS and worker, and
/// the progress sidecar of a group that runs the user's command); its container port is named
/// [`METRICS_PORT_NAME`], which the chart's PodMonitor and the scrape config in
/// `deploy/prometheus/` select.
pub const METRICS_PORT: u16 = 7073;
/// Name of the [`METRICS_PORT`] container port.
pub const METRICS_PORT_NAME: &str = "metrics";
/// Path of the status endpoint: `GET` with a proof of the job token ([`status_auth`]) answers a
/// [`PsStatus`] as JSON.
pub const STATUS_PATH: &str = "/status";
/// Path of a PS replica 0's group count: `POST /groups?count=<n>`, signed as a `GET` of
/// [`STATUS_PATH`] is ([`status_auth`], method `POST`, the target with its query), tells shard 0
/// the job's group count at once (the operator sends it when `workers.groups` changed), instead
/// of when the kubelet refreshes the mounted job config. Answers 204.
pub const GROUPS_PATH: &str = "/groups";

/// The request target of [`GROUPS_PATH`] for `count` groups.
pub fn groups_target(count: u32) -> String {
    format!("{GROUPS_PATH}?count={count}")
}
/// File name of the job config inside the job ConfigMap.
pub const CONFIG_FILE: &str = "job.json";
/// Key of the token inside the job Secret.
pub const TOKEN_KEY: &str = "token";
/// How a Tandem process failed, as its exit code tells whoever supervises it (the kubelet, the
/// operator, the local runner): the one taxonomy of failed exits, each with its one code. A
/// process classifies an error once, where it is raised (a collective's, a PS client's, a training
/// step's `exit_class`), and exits with [`ExitClass::code`]; the run policy reads the code back
/// ([`crate::policy::FailureKind::exit_class`]) and decides whether to restart. A stalled job is
/// not an exit: its supervisor sees it ([`crate::policy::FailureKind::Stalled`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ExitClass {
    /// Its own fault or the job's configuration (bad input, a diverged model, data it cannot
    /// read): a restart would fail again. Exit 1, which restart policies do not retry.
    Permanent = 1,
    /// Stopped on SIGTERM (eviction, preemption, node drain, spot interruption) after saving its
    /// state: a worker group at a step boundary, with rank 0's checkpoint of that step
    /// (`allreduce`; a PS job's state is on the servers), a PS with its last checkpoint shard. It
    /// is 128 + SIGTERM, the code the kubelet reports for a process that SIGTERM ended, so restart
    /// policies retry it, and the restarted unit resumes at the step it stopped at.
    Preempted = 128 + 15,
    /// Stopped because another process of the job was lost (a peer rank of its group, a parameter
    /// server): at least 128, so that restart policies retry it like the lost process's own
    /// failure, and above 128 + any signal number, so that it reads as no signal. Without it, the
    /// survivors of a killed rank would exit 1 — a permanent failure — and whether the job
    /// restarted or failed would depend on which exit the controller saw first.
    PeerLost = 200,
}

impl ExitClass {
    /// The process's exit code.
    pub const fn code(self) -> i32 {
        self as i32
    }

    /// The class of a Tandem process that exited with `code`; `None` for success and for codes
    /// Tandem does not give (a user's command's own, a signal's 128 + n other than SIGTERM's).
    pub fn of_code(code: i32) -> Option<Self> {
        [ExitClass::Permanent, ExitClass::Preempted, ExitClass::PeerLost]
            .into_iter()
            .find(|c| c.code() == code)
    }
}

impl std::fmt::Display for ExitClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self {
            ExitClass::Permanent => "permanent failure",
            ExitClass::Preempted => "preempted, state saved",
            ExitClass::PeerLost => "lost a peer",
        };
        write!(f, "{what} (exit {})", self.code())
    }
}

/// [`ExitClass::PeerLost`]'s code.
pub const EXIT_PEER_LOST: i32 = ExitClass::PeerLost.code();
/// [`ExitClass::Preempted`]'s code, which a user's command also exits with after checkpointing on
/// SIGTERM.
pub const EXIT_PREEMPTED: i32 = ExitClass::Preempted.code();
/// Seconds the operator's pods get between SIGTERM and SIGKILL (`terminationGracePeriodSeconds`,
/// unless the role's pod template sets it): time for a worker group to finish its step and write
/// a checkpoint, and for a PS to write its last one (Kubernetes' own default, 30 s, is short for
/// a large model on a slow volume). A pod that stops sooner is not held back by it.
pub const TERMINATION_GRACE_SECONDS: i64 = 120;

/// The port of the PS status endpoint that [`env::STATUS_PORT`] asks for, read through `lookup`:
/// `Ok(None)` when it says `off`, [`STATUS_PORT`] when it is unset.
pub fn status_port(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<u16>, ContractError> {
    match lookup(env::STATUS_PORT) {
        None => Ok(Some(STATUS_PORT)),
        Some(v) if v.trim() == "off" => Ok(None),
        Some(value) => value.trim().parse().map(Some).map_err(|_| ContractError::Invalid {
            key: env::STATUS_PORT,
            value,
            expected: "a port number (0 for any free port) or `off`",
        }),
    }
}

/// The metrics port that [`env::METRICS_PORT`] asks for, read through `lookup`: `None` when unset
/// or empty (no metrics endpoint).
pub fn metrics_port(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<u16>, ContractError> {
    match lookup(env::METRICS_PORT).filter(|v| !v.trim().is_empty()) {
        None => Ok(None),
        Some(value) => value.trim().parse().map(Some).map_err(|_| ContractError::Invalid {
            key: env::METRICS_PORT,
            value,
            expected: "a port number (0 for any free port), or unset for no metrics endpoint",
        }),
    }
}

/// What a parameter server's status endpoint answers (JSON, camelCase); servers may add fields,
/// readers ignore the ones they do not know.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PsStatus {
    /// Shard index of the answering replica.
    pub shard: u32,
    /// Number of PS replicas.
    pub replicas: u32,
    /// Updates the shard has applied.
    pub version: u64,
    /// Worker groups currently members (waited for and counted).
    pub member_groups: u32,
    /// The job's progress as the groups reported it; `None` before the first report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<crate::job::Progress>,
    /// Shard 0: the group count its next epoch plan splits the data among (the job config's, or
    /// the last one posted to [`GROUPS_PATH`]); `None` from other shards and other endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_groups: Option<u32>,
}

/// What a process does in the job.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Role {
    /// Parameter-server replica holding shard `index`.
    Ps {
        /// Shard index in `0..replicas`.
        index: u32,
    },
    /// Worker `rank` of group `group`.
    Worker {
        /// Group index.
        group: u32,
        /// Rank inside the group.
        rank: u32,
    },
    /// mpirun launcher of group `group` (`backend: mpi`).
    Launcher {
        /// Group index.
        group: u32,
    },
}

impl Role {
    /// The role's name as written in [`env::ROLE`].
    pub fn name(self) -> &'static str {
        match self {
            Role::Ps { .. } => "ps",
            Role::Worker { .. } => "worker",
            Role::Launcher { .. } => "launcher",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Role::Ps { index } => write!(f, "ps {index}"),
            Role::Worker { group, rank } => write!(f, "worker {group}/{rank}"),
            Role::Launcher { group } => write!(f, "launcher {group}"),
        }
    }
}

/// A host and port.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// DNS name or IP address.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl Endpoint {
    /// An endpoint from its parts.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self { host: host.into(), port }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// The members of one worker group, in rank order.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GroupTopology {
    /// Group index.
    pub index: u32,
    /// Collective endpoint of each rank.
    pub peers: Vec<Endpoint>,
}

/// Everything about a job that every process shares: written once per job (and per scale change).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobConfig {
    /// TrainingJob name.
    pub job_name: String,
    /// Namespace (`local` for the local runner).
    pub namespace: String,
    /// The job's spec, defaults applied, without the pod templates (which stay on the pods).
    pub spec: TrainingJobSpec,
    /// Parameter-server endpoints, by shard index.
    pub parameter_servers: Vec<Endpoint>,
    /// Worker groups present, by index.
    pub groups: Vec<GroupTopology>,
}

impl JobConfig {
    /// The config of job `job_name` in `namespace`: every parameter server and every rank of every
    /// group that `spec` has, each at the endpoint `endpoint` gives its role.
    pub fn of_spec(
        job_name: &str,
        namespace: &str,
        spec: &TrainingJobSpec,
        endpoint: impl Fn(Role) -> Endpoint,
    ) -> Self {
        let workers = &spec.workers;
        JobConfig {
            job_name: job_name.to_owned(),
            namespace: namespace.to_owned(),
            spec: without_templates(spec),
            parameter_servers: (0..spec.parameter_servers.replicas)
                .map(|index| endpoint(Role::Ps { index }))
                .collect(),
            groups: (0..workers.groups)
                .map(|group| GroupTopology {
                    index: group,
                    peers: (0..workers.group_size)
                        .map(|rank| endpoint(Role::Worker { group, rank }))
                        .collect(),
                })
                .collect(),
        }
    }

    /// Parses the JSON written by the operator or the local runner.
    pub fn from_json(text: &str) -> Result<Self, ContractError> {
        serde_json::from_str(text).map_err(|e| ContractError::Config(e.to_string()))
    }

    /// Serialises the config as the JSON that [`JobConfig::from_json`] reads.
    pub fn to_json(&self) -> String {
        // Serialising plain data with string keys cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The peers of group `group`, if the group is present.
    pub fn group(&self, group: u32) -> Option<&GroupTopology> {
        self.groups.iter().find(|g| g.index == group)
    }
}

/// The spec as processes read it, without the pod templates: what a user put into a template's
/// env is meant for the pods, not for a ConfigMap that whoever may read ConfigMaps in the
/// namespace reads (a Secret referenced from a template stays a reference in the pod itself).
fn without_templates(spec: &TrainingJobSpec) -> TrainingJobSpec {
    let mut spec = spec.clone();
    spec.parameter_servers.template = None;
    spec.workers.template = None;
    spec
}

/// The per-process part of the contract, carried in environment variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    /// What this process is.
    pub role: Role,
    /// Path of the [`JobConfig`] file.
    pub config: PathBuf,
    /// Path of the job-token file.
    pub token_file: PathBuf,
    /// Address to bind listening sockets to.
    pub bind: String,
    /// Folder for checkpoints and outputs.
    pub output: PathBuf,
    /// Attempt number (restarts so far of this group or PS).
    pub attempt: u32,
}

impl LaunchEnv {
    /// Reads the contract through `lookup` (for a process: `|k| std::env::var(k).ok()`).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ContractError> {
        let get = |key: &'static str| lookup(key).ok_or(ContractError::Missing(key));
        let number = |key: &'static str| -> Result<u32, ContractError> {
            let value = get(key)?;
            value.trim().parse().map_err(|_| ContractError::Invalid {
                key,
                value,
                expected: "a non-negative integer",
            })
        };
        let role_name = get(env::ROLE)?;
        let role = match role_name.as_str() {
            "ps" => Role::Ps { index: number(env::PS_INDEX)? },
            "worker" => Role::Worker { group: number(env::GROUP)?, rank: number(env::RANK)? },
            "launcher" => Role::Launcher { group: number(env::GROUP)? },
            _ => {
                return Err(ContractError::Invalid {
                    key: env::ROLE,
                    value: role_name,
                    expected: "one of ps, worker, launcher",
                });
            }
        };
        Ok(Self {
            role,
            config: get(env::CONFIG)?.into(),
            token_file: get(env::TOKEN_FILE)?.into(),
            bind: lookup(env::BIND).unwrap_or_else(|| "0.0.0.0".to_owned()),
            output: lookup(env::OUTPUT).unwrap_or_else(|| "/tmp/tandem".to_owned()).into(),
            attempt: match lookup(env::ATTEMPT) {
                Some(_) => number(env::ATTEMPT)?,
                None => 0,
            },
        })
    }

    /// The environment variables that [`LaunchEnv::from_lookup`] reads back as `self`.
    pub fn to_vars(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![(env::ROLE, self.role.name().to_owned())];
        match self.role {
            Role::Ps { index } => vars.push((env::PS_INDEX, index.to_string())),
            Role::Worker { group, rank } => {
                vars.push((env::GROUP, group.to_string()));
                vars.push((env::RANK, rank.to_string()));
            }
            Role::Launcher { group } => vars.push((env::GROUP, group.to_string())),
        }
        vars.extend([
            (env::CONFIG, self.config.display().to_string()),
            (env::TOKEN_FILE, self.token_file.display().to_string()),
            (env::BIND, self.bind.clone()),
            (env::OUTPUT, self.output.display().to_string()),
            (env::ATTEMPT, self.attempt.to_string()),
        ]);
        vars
    }
}

/// A launch contract that cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ContractError {
    /// A required variable is unset.
    #[error(
        "environment variable {0} is not set; tandem processes are started by the operator or `tandem train`, which set it"
    )]
    Missing(&'static str),
    /// A variable holds a value of the wrong form.
    #[error("environment variable {key}={value:?} is invalid: expected {expected}")]
    Invalid {
        /// Variable name.
        key: &'static str,
        /// Value found.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// The job config file does not parse.
    #[error("job config is not valid: {0}")]
    Config(String),
}

/// One line of `tandem worker`'s stdout protocol, which the local runner reads: a JSON object
/// tagged by `event`, one per line. The worker writes it and the runner reads it through this
/// type, so the two cannot drift apart; a reader skips lines that are not protocol (logs) and
/// fields it does not know.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum WorkerLine {
    /// Rank 0 of `group` reports the group's progress.
    Progress {
        /// Group index.
        group: u32,
        /// Where the group stands.
        progress: GroupReport,
    },
    /// A rank finished all its steps.
    Finished {
        /// Group index.
        group: u32,
        /// Rank inside the group.
        rank: u32,
        /// The step it ended at (the job's step count).
        steps: u64,
        /// The step it started from (above 0 after a resume).
        #[serde(default)]
        start_step: u64,
        /// Its final test accuracy.
        #[serde(default)]
        accuracy: Option<f64>,
    },
}

/// A group's progress in a [`WorkerLine::Progress`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub struct GroupReport {
    /// Steps the group completed.
    pub step: u64,
    /// Mean training loss since the previous report.
    #[serde(default)]
    pub loss: Option<f64>,
    /// Test accuracy, at evaluation steps.
    #[serde(default)]
    pub accuracy: Option<f64>,
    /// Samples the group processed in this attempt.
    #[serde(default)]
    pub samples: u64,
    /// Epoch of the group's data stream.
    #[serde(default)]
    pub epoch: u64,
    /// Fraction of the step time since the previous report that the group's ranks waited for
    /// their next batch (0: the data was always ready; near 1: the job is input-bound).
    #[serde(default)]
    pub data_wait: f64,
    /// Samples the group's ranks skipped so far in this attempt because they could not be read
    /// (each named in a warning in its rank's log).
    #[serde(default)]
    pub skipped: u64,
}

impl WorkerLine {
    /// The line, without its newline.
    pub fn to_line(&self) -> String {
        // Numbers and strings only: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads one line; `None` for a line that is not protocol.
    pub fn parse(line: &str) -> Option<Self> {
        let line = line.trim();
        if !line.starts_with('{') {
            return None;
        }
        serde_json::from_str(line).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_lines_round_trip_and_other_output_is_not_protocol() {
        let lines = [
            WorkerLine::Progress {
                group: 1,
                progress: GroupReport {
                    step: 200,
                    loss: Some(0.25),
                    accuracy: None,
                    samples: 12_800,
                    epoch: 3,
                    data_wait: 0.25,
                    skipped: 2,
                },
            },
            WorkerLine::Finished { group: 0, rank: 1, steps: 600, start_step: 40, accuracy: Some(0.94) },
        ];
        for line in &lines {
            assert_eq!(WorkerLine::parse(&line.to_line()).as_ref(), Some(line));
        }
        assert!(lines[1].to_line().starts_with(r#"{"event":"finished","group":0"#), "{}", lines[1].to_line());
        assert_eq!(WorkerLine::parse("listening on 127.0.0.1:7070"), None);
        assert_eq!(WorkerLine::parse(r#"{"event":"progress","group":1}"#), None);
        assert_eq!(WorkerLine::parse(r#"{"event":"party"}"#), None);
        let later = r#"{"event":"finished","group":2,"rank":0,"steps":5,"note":"a later field"}"#;
        assert!(WorkerLine::parse(later).is_some(), "unknown fields are ignored");
    }

    #[test]
    fn status_port_defaults_reads_and_refuses() {
        let with = |v: Option<&str>| status_port(|_| v.map(str::to_owned));
        assert_eq!(with(None), Ok(Some(STATUS_PORT)));
        assert_eq!(with(Some("0")), Ok(Some(0)));
        assert_eq!(with(Some(" 9000 ")), Ok(Some(9000)));
        assert_eq!(with(Some("off")), Ok(None));
        assert!(matches!(with(Some("70000")), Err(ContractError::Invalid { key: env::STATUS_PORT, .. })));
    }

    #[test]
    fn metrics_port_is_off_unless_set_and_refuses_what_is_not_a_port() {
        let with = |v: Option<&str>| metrics_port(|_| v.map(str::to_owned));
        assert_eq!(with(None), Ok(None));
        assert_eq!(with(Some(" ")), Ok(None));
        assert_eq!(with(Some("7073")), Ok(Some(METRICS_PORT)));
        assert_eq!(with(Some("0")), Ok(Some(0)));
        let refused = with(Some("metrics")).unwrap_err();
        assert!(matches!(refused, ContractError::Invalid { key: env::METRICS_PORT, .. }));
        assert!(refused.to_string().contains("TANDEM_METRICS_PORT"), "{refused}");
    }
}
