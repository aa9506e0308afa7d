//! The contract for a user's own worker processes (`spec.workers.command`): the environment that
//! makes each worker group one `torch.distributed` world, as torchrun would start it, plus
//! Tandem's own variables; and the progress lines such a process may write.
//!
//! Expected flow: whoever starts a rank of a group — the local runner, the operator's pods —
//! calls [`user_env`] with the job's [`JobConfig`], the rank's [`LaunchEnv`] and where its files
//! live ([`UserFiles`]), and starts the user's command with exactly those variables added. An
//! unchanged PyTorch script then calls `torch.distributed.init_process_group("gloo")` (or
//! `"nccl"`) with the default `env://` and joins its group's world: `RANK` and `WORLD_SIZE` are the
//! rank and size of the group, `MASTER_ADDR:MASTER_PORT` is rank 0 of the group (its endpoint in
//! the job config), where torch's store listens.
//!
//! Guarantees: the variables are a pure function of the plan, so the local runner and the
//! operator give a rank the same ones; every name is in [`USER_VARS`] (the documented list, which
//! `workers.env` may not override); torchrun's names keep torchrun's meaning (`GROUP_RANK` is
//! torchrun's node rank, not Tandem's group: that is `TANDEM_GROUP`).
//!
//! Progress: a process appends [`UserProgress`] lines — one JSON object per line,
//! `{"step":120,"loss":0.41,"accuracy":0.83}` — to the file named by [`env::PROGRESS_FILE`];
//! Tandem reads every complete line, skips the ones that do not parse, and ignores fields it does
//! not know. Rank 0 of a group writes its group's progress (other ranks may write too; their lines
//! count as the group's). The built-in `tandem worker` writes the same lines when the variable is
//! set ([`UserProgress::of_report`]).
//!
//! Exit codes: 0 is done; [`super::EXIT_PREEMPTED`] (143) after SIGTERM means "checkpointed,
//! resume me" and is retried like any code of 128 and above; 1–127 is a permanent failure under
//! the default `restartPolicy`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{ContractError, GroupReport, JobConfig, LaunchEnv, Role};

/// Names of the variables a user process gets beside [`super::env`]'s.
pub mod env {
    /// torchrun: rank in the group's world.
    pub const RANK: &str = "RANK";
    /// torchrun: ranks in the group's world.
    pub const WORLD_SIZE: &str = "WORLD_SIZE";
    /// torchrun: rank among the processes on this host (0 in a pod).
    pub const LOCAL_RANK: &str = "LOCAL_RANK";
    /// torchrun: processes of the world on this host (1 in a pod).
    pub const LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";
    /// torchrun: rank of this host among the world's hosts.
    pub const GROUP_RANK: &str = "GROUP_RANK";
    /// torchrun: hosts of the world.
    pub const GROUP_WORLD_SIZE: &str = "GROUP_WORLD_SIZE";
    /// torchrun: rank among the processes of the same role (every worker has one role).
    pub const ROLE_RANK: &str = "ROLE_RANK";
    /// torchrun: processes of the same role.
    pub const ROLE_WORLD_SIZE: &str = "ROLE_WORLD_SIZE";
    /// torchrun: the role's name, `worker`.
    pub const ROLE_NAME: &str = "ROLE_NAME";
    /// torchrun: host of rank 0 of the group, where torch's store listens.
    pub const MASTER_ADDR: &str = "MASTER_ADDR";
    /// torchrun: port of torch's store on rank 0 of the group.
    pub const MASTER_PORT: &str = "MASTER_PORT";
    /// torchrun: restarts of this group so far (Tandem's attempt).
    pub const RESTART_COUNT: &str = "TORCHELASTIC_RESTART_COUNT";
    /// torchrun: restarts the job may use (`runPolicy.maxRestarts`).
    pub const MAX_RESTARTS: &str = "TORCHELASTIC_MAX_RESTARTS";
    /// torchrun: the world's identity, `<job>-g<group>`.
    pub const RUN_ID: &str = "TORCHELASTIC_RUN_ID";
    /// The job's name.
    pub const JOB: &str = "TANDEM_JOB";
    /// Worker groups of the job now (`spec.workers.groups`).
    pub const GROUPS: &str = "TANDEM_GROUPS";
    /// Parameter-server endpoints, `host:port` by shard index, comma-separated (empty: none).
    pub const PS_ENDPOINTS: &str = "TANDEM_PS_ENDPOINTS";
    /// Folder for this group's checkpoints; it outlives restarts of the group.
    pub const CHECKPOINT_DIR: &str = "TANDEM_CHECKPOINT_DIR";
    /// File the process appends its progress lines to ([`super::UserProgress`]).
    pub const PROGRESS_FILE: &str = "TANDEM_PROGRESS_FILE";
    /// Folder holding Tandem's data sets (`make data`), where the runner knows one.
    pub const DATA_DIR: &str = "TANDEM_DATA_DIR";
    /// `training.steps`, when the job gives its length in steps.
    pub const STEPS: &str = "TANDEM_STEPS";
    /// `training.epochs`, when the job gives its length in epochs.
    pub const EPOCHS: &str = "TANDEM_EPOCHS";
    /// `training.checkpoint.everySteps`: steps between checkpoints.
    pub const CHECKPOINT_EVERY: &str = "TANDEM_CHECKPOINT_EVERY";
    /// `training.evalEverySteps`: steps between evaluations on the test set (0: at the end only).
    pub const EVAL_EVERY: &str = "TANDEM_EVAL_EVERY";
    /// `training.seed`.
    pub const SEED: &str = "TANDEM_SEED";
}

/// Every variable a user process is given, in the order [`user_env`] writes them: what
/// `workers.env` may not set.
pub const USER_VARS: &[&str] = &[
    super::env::ROLE,
    super::env::GROUP,
    super::env::RANK,
    super::env::CONFIG,
    super::env::TOKEN_FILE,
    super::env::BIND,
    super::env::OUTPUT,
    super::env::ATTEMPT,
    env::RANK,
    env::WORLD_SIZE,
    env::LOCAL_RANK,
    env::LOCAL_WORLD_SIZE,
    env::GROUP_RANK,
    env::GROUP_WORLD_SIZE,
    env::ROLE_RANK,
    env::ROLE_WORLD_SIZE,
    env::ROLE_NAME,
    env::MASTER_ADDR,
    env::MASTER_PORT,
    env::RESTART_COUNT,
    env::MAX_RESTARTS,
    env::RUN_ID,
    env::JOB,
    env::GROUPS,
    env::PS_ENDPOINTS,
    env::CHECKPOINT_DIR,
    env::PROGRESS_FILE,
    env::DATA_DIR,
    env::STEPS,
    env::EPOCHS,
    env::CHECKPOINT_EVERY,
    env::EVAL_EVERY,
    env::SEED,
];

/// Where a group's ranks run, which decides torchrun's host-local numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hosting {
    /// Every rank of the group on this one host (the local runner): `LOCAL_RANK` is the rank.
    OneHost,
    /// One rank per host (a pod per rank): `LOCAL_RANK` is 0, `GROUP_RANK` the rank.
    HostPerRank,
}

/// The files of one rank, outside the job config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserFiles {
    /// The group's checkpoint folder ([`checkpoint_dir`] locally).
    pub checkpoint_dir: PathBuf,
    /// The file for progress lines ([`progress_file`] locally).
    pub progress_file: PathBuf,
    /// Tandem's data folder, if the runner has one.
    pub data_dir: Option<PathBuf>,
}

/// The checkpoint folder of group `group` under a job's output folder: one per group, since each
/// group is its own world with its own weights.
pub fn checkpoint_dir(output: &Path, group: u32) -> PathBuf {
    output.join("checkpoints").join(format!("group-{group}"))
}

/// The progress file of group `group`'s attempt `attempt` under a job's output folder: a new file
/// per attempt, so a restarted group's lines never mix with its earlier attempt's.
pub fn progress_file(output: &Path, group: u32, attempt: u32) -> PathBuf {
    output.join("progress").join(format!("group-{group}.{attempt}.jsonl"))
}

/// How a `backend: mpi` group starts each rank of a user's command: `mpirun … sh -c
/// MPI_RANK_SCRIPT tandem-rank <command> <args>…`, with the group's [`user_env`] of rank 0
/// forwarded to every rank (`-x`). The script takes the rank's own numbers from OpenMPI
/// (`OMPI_COMM_WORLD_RANK`, `…_LOCAL_RANK`, `…_LOCAL_SIZE`) — `RANK`, `ROLE_RANK`, `TANDEM_RANK`,
/// `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`, `GROUP_WORLD_SIZE` — so that each rank gets
/// what [`user_env`] gives it under either [`Hosting`] (one rank per pod, or every rank on one
/// host), then runs the command. It needs only a POSIX `sh` in the user's image, and fails with a
/// message when not started by OpenMPI's mpirun.
pub const MPI_RANK_SCRIPT: &str = r#"r="${OMPI_COMM_WORLD_RANK:?tandem-rank: not started by OpenMPI's mpirun (OMPI_COMM_WORLD_RANK is unset)}"
n="${OMPI_COMM_WORLD_LOCAL_SIZE:-1}"
export RANK="$r" ROLE_RANK="$r" TANDEM_RANK="$r" LOCAL_RANK="${OMPI_COMM_WORLD_LOCAL_RANK:-0}" LOCAL_WORLD_SIZE="$n" GROUP_RANK="$((r / n))" GROUP_WORLD_SIZE="$((WORLD_SIZE / n))"
exec "$@""#;

/// The environment of rank `launch.role` of a user's command: torchrun's variables for the
/// group's world, Tandem's launch contract ([`LaunchEnv::to_vars`]) and the variables of
/// [`env`]. Fails when the role is not a worker, or its group or rank is not in `config`.
pub fn user_env(
    config: &JobConfig,
    launch: &LaunchEnv,
    hosting: Hosting,
    files: &UserFiles,
) -> Result<Vec<(&'static str, String)>, ContractError> {
    let Role::Worker { group, rank } = launch.role else {
        return Err(ContractError::Config(format!(
            "a user command runs as a worker rank, not as {}",
            launch.role
        )));
    };
    let topology = config.group(group).ok_or_else(|| {
        ContractError::Config(format!("group {group} is not in the job config of {}", config.job_name))
    })?;
    let size = topology.peers.len() as u32;
    let master = topology.peers.first().filter(|_| rank < size).ok_or_else(|| {
        ContractError::Config(format!("rank {rank} is not in group {group}, which has {size} rank(s)"))
    })?;
    let (local_rank, local_size, host_rank, hosts) = match hosting {
        Hosting::OneHost => (rank, size, 0, 1),
        Hosting::HostPerRank => (0, 1, rank, size),
    };
    let training = &config.spec.training;
    let path = |p: &Path| p.display().to_string();
    let mut vars = launch.to_vars();
    vars.extend([
        (env::RANK, rank.to_string()),
        (env::WORLD_SIZE, size.to_string()),
        (env::LOCAL_RANK, local_rank.to_string()),
        (env::LOCAL_WORLD_SIZE, local_size.to_string()),
        (env::GROUP_RANK, host_rank.to_string()),
        (env::GROUP_WORLD_SIZE, hosts.to_string()),
        (env::ROLE_RANK, rank.to_string()),
        (env::ROLE_WORLD_SIZE, size.to_string()),
        (env::ROLE_NAME, "worker".to_owned()),
        (env::MASTER_ADDR, master.host.clone()),
        (env::MASTER_PORT, master.port.to_string()),
        (env::RESTART_COUNT, launch.attempt.to_string()),
        (env::MAX_RESTARTS, config.spec.run_policy.max_restarts.to_string()),
        (env::RUN_ID, format!("{}-g{group}", config.job_name)),
        (env::JOB, config.job_name.clone()),
        (env::GROUPS, config.spec.workers.groups.to_string()),
        (
            env::PS_ENDPOINTS,
            config.parameter_servers.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
        ),
        (env::CHECKPOINT_DIR, path(&files.checkpoint_dir)),
        (env::PROGRESS_FILE, path(&files.progress_file)),
    ]);
    if let Some(data) = &files.data_dir {
        vars.push((env::DATA_DIR, path(data)));
    }
    if let Some(steps) = training.steps {
        vars.push((env::STEPS, steps.to_string()));
    }
    if let Some(epochs) = training.epochs {
        vars.push((env::EPOCHS, epochs.to_string()));
    }
    vars.extend([
        (env::CHECKPOINT_EVERY, training.checkpoint.every_steps.to_string()),
        (env::EVAL_EVERY, training.eval_every_steps.to_string()),
        (env::SEED, training.seed.to_string()),
    ]);
    Ok(vars)
}

/// One progress line of a user process (JSON, one object per line, in [`env::PROGRESS_FILE`]):
/// `step` is required, the rest optional; unknown fields are ignored.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub struct UserProgress {
    /// Optimizer steps the group completed in this run (counting from its resumed step).
    pub step: u64,
    /// Training loss (e.g. the mean since the previous line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// Test accuracy in [0, 1], on the lines that evaluated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// Samples the group processed in this attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    /// Epoch of the group's data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
}

impl UserProgress {
    /// The line of a built-in worker's `report`: `tandem worker`'s rank 0 appends it to
    /// [`env::PROGRESS_FILE`] when that is set (on Kubernetes, a job without parameter servers,
    /// whose groups report their progress as a user's command does).
    pub fn of_report(report: &GroupReport) -> Self {
        Self {
            step: report.step,
            loss: report.loss,
            accuracy: report.accuracy,
            samples: Some(report.samples),
            epoch: Some(report.epoch),
        }
    }

    /// The JSON line of `self` (no newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads one line; `None` for a line that is not a progress object (or has a non-finite or
    /// out-of-range number).
    pub fn parse(line: &str) -> Option<Self> {
        let line = line.trim();
        if !line.starts_with('{') {
            return None;
        }
        let p: Self = serde_json::from_str(line).ok()?;
        let finite = |v: Option<f64>| v.is_none_or(f64::is_finite);
        let in_unit = p.accuracy.is_none_or(|a| (0.0..=1.0).contains(&a));
        (finite(p.loss) && finite(p.accuracy) && in_unit).then_some(p)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::contract::Endpoint;
    use crate::job::TrainingJob;

    fn config(groups: u32, size: u32, ps: u32) -> JobConfig {
        let algorithm = if ps > 0 { "hybrid" } else { "allreduce" };
        let yaml = format!(
            "apiVersion: tandem.dev/v1alpha1\nkind: TrainingJob\nmetadata: {{name: fmnist}}\nspec:\n  training: \
             {{algorithm: {algorithm}, steps: 300, checkpoint: {{everySteps: 50}}}}\n  parameterServers: {{replicas: {ps}}}\n  \
             workers: {{groups: {groups}, groupSize: {size}}}\n"
        );
        let job: TrainingJob = crate::manifest::parse(&yaml).unwrap();
        JobConfig::of_spec("fmnist", "team", &job.spec, |role| match role {
            Role::Ps { index } => Endpoint::new(format!("fmnist-ps-{index}.fmnist"), 7070),
            Role::Worker { group, rank } => Endpoint::new(format!("fmnist-g{group}-{rank}.fmnist"), 7071),
            Role::Launcher { group } => Endpoint::new(format!("fmnist-g{group}-launcher"), 22),
        })
    }

    fn launch(group: u32, rank: u32, attempt: u32) -> LaunchEnv {
        LaunchEnv {
            role: Role::Worker { group, rank },
            config: "/etc/tandem/job.json".into(),
            token_file: "/var/run/tandem/token".into(),
            bind: "0.0.0.0".into(),
            output: "/out".into(),
            attempt,
        }
    }

    fn files(group: u32, attempt: u32) -> UserFiles {
        UserFiles {
            checkpoint_dir: checkpoint_dir(Path::new("/out"), group),
            progress_file: progress_file(Path::new("/out"), group, attempt),
            data_dir: Some("/data".into()),
        }
    }

    fn vars(
        config: &JobConfig,
        launch: &LaunchEnv,
        hosting: Hosting,
        files: &UserFiles,
    ) -> BTreeMap<&'static str, String> {
        user_env(config, launch, hosting, files).unwrap().into_iter().collect()
    }

    #[test]
    fn each_group_is_one_torch_world_around_its_rank_0() {
        let config = config(2, 4, 1);
        let v = vars(&config, &launch(1, 2, 3), Hosting::HostPerRank, &files(1, 3));
        let expected = [
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "1"),
            ("GROUP_RANK", "2"),
            ("GROUP_WORLD_SIZE", "4"),
            ("ROLE_RANK", "2"),
            ("ROLE_WORLD_SIZE", "4"),
            ("ROLE_NAME", "worker"),
            ("MASTER_ADDR", "fmnist-g1-0.fmnist"),
            ("MASTER_PORT", "7071"),
            ("TORCHELASTIC_RESTART_COUNT", "3"),
            ("TORCHELASTIC_MAX_RESTARTS", "5"),
            ("TORCHELASTIC_RUN_ID", "fmnist-g1"),
            ("TANDEM_JOB", "fmnist"),
            ("TANDEM_GROUP", "1"),
            ("TANDEM_GROUPS", "2"),
            ("TANDEM_RANK", "2"),
            ("TANDEM_ATTEMPT", "3"),
            ("TANDEM_PS_ENDPOINTS", "fmnist-ps-0.fmnist:7070"),
            ("TANDEM_TOKEN_FILE", "/var/run/tandem/token"),
            ("TANDEM_CHECKPOINT_DIR", "/out/checkpoints/group-1"),
            ("TANDEM_PROGRESS_FILE", "/out/progress/group-1.3.jsonl"),
            ("TANDEM_DATA_DIR", "/data"),
            ("TANDEM_STEPS", "300"),
            ("TANDEM_CHECKPOINT_EVERY", "50"),
            ("TANDEM_EVAL_EVERY", "100"),
            ("TANDEM_SEED", "42"),
        ];
        for (key, value) in expected {
            assert_eq!(v.get(key).map(String::as_str), Some(value), "{key}");
        }
        assert!(!v.contains_key("TANDEM_EPOCHS"), "the job gives steps, not epochs");
        let mut names: Vec<&str> = v.keys().copied().collect();
        names.sort_unstable();
        let mut documented: Vec<&str> = USER_VARS.iter().copied().filter(|n| *n != env::EPOCHS).collect();
        documented.sort_unstable();
        assert_eq!(names, documented, "every variable is in USER_VARS and USER_VARS lists every variable");
        // The other group is another world, around its own rank 0.
        let other = vars(&config, &launch(0, 0, 0), Hosting::HostPerRank, &files(0, 0));
        assert_eq!(other["MASTER_ADDR"], "fmnist-g0-0.fmnist");
        assert_eq!(other["TANDEM_CHECKPOINT_DIR"], "/out/checkpoints/group-0");
        assert_eq!(other["TORCHELASTIC_RUN_ID"], "fmnist-g0");
    }

    #[test]
    fn on_one_host_the_local_numbers_are_the_group_ranks() {
        let config = config(1, 3, 0);
        let v = vars(&config, &launch(0, 2, 0), Hosting::OneHost, &files(0, 0));
        assert_eq!((v["LOCAL_RANK"].as_str(), v["LOCAL_WORLD_SIZE"].as_str()), ("2", "3"));
        assert_eq!((v["GROUP_RANK"].as_str(), v["GROUP_WORLD_SIZE"].as_str()), ("0", "1"));
        assert_eq!(v["TANDEM_PS_ENDPOINTS"], "", "no parameter server");
    }

    #[test]
    fn the_contract_read_back_is_the_launch_env() {
        let config = config(1, 2, 0);
        let launch = launch(0, 1, 2);
        let v = vars(&config, &launch, Hosting::OneHost, &files(0, 2));
        assert_eq!(LaunchEnv::from_lookup(|k| v.get(k).cloned()), Ok(launch));
    }

    #[test]
    fn a_role_or_rank_outside_the_job_is_an_error() {
        let config = config(2, 2, 1);
        let mut ps = launch(0, 0, 0);
        ps.role = Role::Ps { index: 0 };
        for (launch, says) in [(ps, "not as ps 0"), (launch(5, 0, 0), "group 5"), (launch(1, 2, 0), "rank 2")]
        {
            let err = user_env(&config, &launch, Hosting::OneHost, &files(0, 0)).unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
        }
    }

    #[test]
    fn the_user_command_rules_name_every_field_and_variable() {
        use crate::job::{USER_DATA_RULE, USER_ENV_RULE, USER_MODEL_RULE};
        let crd = serde_json::to_value(crate::crd::as_written()).unwrap();
        let spec =
            &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        for (object, rule, stored) in [("model", USER_MODEL_RULE, "kind"), ("data", USER_DATA_RULE, "source")]
        {
            let fields = spec[object]["properties"].as_object().unwrap();
            assert!(fields.len() > 5, "{object} has fields");
            for name in fields.keys().filter(|k| *k != stored) {
                let test = format!("has(self.{object}.{name})");
                assert!(rule.contains(&test), "the rule refusing spec.{object} with a command misses {test}");
            }
        }
        for var in USER_VARS.iter().filter(|v| !v.starts_with("TANDEM_")) {
            assert!(USER_ENV_RULE.contains(&format!("'{var}'")), "workers.env may set {var}");
        }
    }

    #[test]
    fn progress_lines_parse_and_anything_else_is_skipped() {
        let full = UserProgress::parse(r#"{"step":120,"loss":0.41,"accuracy":0.83,"samples":7680,"lr":0.1}"#);
        assert_eq!(
            full,
            Some(UserProgress {
                step: 120,
                loss: Some(0.41),
                accuracy: Some(0.83),
                samples: Some(7680),
                epoch: None
            })
        );
        assert_eq!(UserProgress::parse(r#"{"step":3}"#).map(|p| p.loss), Some(None));
        for bad in [
            "",
            "step 3",
            r#"{"loss":0.4}"#,
            r#"{"step":-1}"#,
            r#"{"step":1,"accuracy":1.5}"#,
            r#"{"step":1"#,
        ] {
            assert_eq!(UserProgress::parse(bad), None, "{bad}");
        }
        let line = serde_json::to_string(&full.unwrap()).unwrap();
        assert_eq!(UserProgress::parse(&line), full);
    }

    /// The rank script, run by `sh` as OpenMPI would start it, gives each rank what `user_env`
    /// gives that rank, from rank 0's variables and OpenMPI's numbers alone.
    #[test]
    fn the_mpi_rank_script_gives_each_rank_its_own_numbers() {
        let config = config(1, 3, 0);
        for (hosting, local_size) in [(Hosting::HostPerRank, 1), (Hosting::OneHost, 3)] {
            let rank0 = user_env(&config, &launch(0, 0, 0), hosting, &files(0, 0)).unwrap();
            for rank in 0..3u32 {
                let local_rank = if local_size == 1 { 0 } else { rank };
                let out = std::process::Command::new("sh")
                    .arg("-c")
                    .arg(MPI_RANK_SCRIPT)
                    .args(["tandem-rank", "env"])
                    .env_clear()
                    .envs(rank0.iter().map(|(k, v)| (*k, v.as_str())))
                    .env("OMPI_COMM_WORLD_RANK", rank.to_string())
                    .env("OMPI_COMM_WORLD_LOCAL_RANK", local_rank.to_string())
                    .env("OMPI_COMM_WORLD_LOCAL_SIZE", local_size.to_string())
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
                let got: BTreeMap<String, String> = String::from_utf8(out.stdout)
                    .unwrap()
                    .lines()
                    .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
                    .collect();
                let want = vars(&config, &launch(0, rank, 0), hosting, &files(0, 0));
                for (key, value) in &want {
                    assert_eq!(got.get(*key), Some(value), "{key} of rank {rank} ({hosting:?})");
                }
            }
        }
        let bare = std::process::Command::new("sh")
            .args(["-c", MPI_RANK_SCRIPT, "tandem-rank", "true"])
            .env_remove("OMPI_COMM_WORLD_RANK")
            .output()
            .unwrap();
        assert!(!bare.status.success());
        assert!(String::from_utf8_lossy(&bare.stderr).contains("not started by OpenMPI's mpirun"));
    }
}
