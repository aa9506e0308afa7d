//! `tandem launcher`: starts one `backend: mpi` worker group under `mpirun`, configured by the
//! launch contract.
//!
//! Expected flow: the operator runs it in the group's launcher pod once the group's workers (sshd)
//! are ready, with OpenMPI's hostfile and ssh settings in `OMPI_MCA_*` variables; the local runner
//! runs it with no hostfile, so that mpirun starts the ranks on this machine. It checks that
//! `TANDEM_ROLE` says `launcher`, then runs
//! `mpirun -np <groupSize> [--allow-run-as-root] --bind-to none -x TANDEM_… <this tandem> worker …`
//! with `TANDEM_ROLE=worker`: each rank takes its rank from MPI, and every `TANDEM_*` variable is
//! forwarded with `-x` because ranks started over ssh do not inherit the launcher's environment.
//!
//! Before mpirun, the "peers reachable" gate ([`tandem_comm::reach`]): with a hostfile, every
//! host in it must resolve and accept a connection on the workers' sshd port (`-p` of
//! `OMPI_MCA_plm_rsh_args`, else 22; `localhost` and this host, which mpirun starts without
//! ssh, are left out) within `TANDEM_PEER_TIMEOUT` seconds (default 120), or the
//! launcher exits with [`ExitClass::PeerLost`] (retryable) and an error, also written as the
//! pod's termination message, naming each unreachable worker — mpirun never starts against a
//! dead or missing worker.
//!
//! A group that runs the user's command (`workers.command`) runs
//! `mpirun … sh -c <rank script> tandem-rank <command> <args>` instead, with the contract for
//! user processes ([`tandem_api::contract::user`]): rank 0's variables forwarded with `-x`, which
//! [`user::MPI_RANK_SCRIPT`] turns into each rank's own from OpenMPI's numbers, so the user's
//! image needs OpenMPI, sshd and a POSIX `sh`, but no `tandem`.
//!
//! Guarantees: SIGTERM and SIGINT are passed on to mpirun, which passes them on to the ranks; the
//! launcher exits with mpirun's exit code, or 128 + the signal that killed it, so that the
//! operator's restart policy sees what the group did. `--allow-run-as-root` is added only when
//! running as uid 0.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{Context, bail};
use tandem_api::contract::user::{self, Hosting, UserFiles};
use tandem_api::contract::{self, JobConfig, Role, env};
use tandem_api::{ExitClass, LaunchEnv};
use tandem_comm::reach::{self, Target};
use tandem_util::proc::{Exit, die_with_parent};

/// OpenMPI's hostfile variables (ORTE for OpenMPI 4, PRRTE for 5); the operator sets both.
const HOSTFILE_VARS: [&str; 2] = ["OMPI_MCA_orte_default_hostfile", "OMPI_MCA_prte_default_hostfile"];
/// Variables forwarded to the ranks besides the `TANDEM_*` ones, when set.
const FORWARDED: [&str; 2] = ["RUST_LOG", "RUST_BACKTRACE"];

/// Arguments of `tandem launcher`.
#[derive(clap::Args)]
pub struct Args {
    /// The mpirun to run (a name looked up in PATH, or a path).
    #[arg(long, env = "TANDEM_MPIRUN", default_value = "mpirun")]
    pub mpirun: String,
    /// Let mpirun start more ranks than this machine has cores (the local runner sets it).
    #[arg(long)]
    pub oversubscribe: bool,
    /// Tandem's data folder, given to the ranks of a user's command as `TANDEM_DATA_DIR` (the
    /// local runner sets it; on Kubernetes the user's image keeps its own).
    #[arg(long)]
    pub data_dir: Option<std::path::PathBuf>,
    /// Arguments passed on to every `tandem worker` rank, after `--` (e.g. `-- --device cpu`).
    #[arg(last = true)]
    pub worker_args: Vec<String>,
}

/// The workers' sshd endpoints from the hostfile (rank order, as the operator writes it), none
/// without a hostfile (every rank runs on this machine).
fn ssh_targets(group: u32) -> anyhow::Result<Vec<Target>> {
    let Some(path) = HOSTFILE_VARS.iter().find_map(|v| std::env::var(v).ok().filter(|p| !p.is_empty()))
    else {
        return Ok(Vec::new());
    };
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("cannot read the MPI hostfile {path}"))?;
    let rsh = std::env::var("OMPI_MCA_plm_rsh_args").unwrap_or_default();
    let mut words = rsh.split_whitespace();
    let mut port = 22;
    while let Some(word) = words.next() {
        if word == "-p" {
            let value = words.next().unwrap_or_default();
            port = value.parse().with_context(|| {
                format!("OMPI_MCA_plm_rsh_args has `-p {value}`, which is not a port number")
            })?;
        }
    }
    let hosts = text
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .filter_map(|line| line.split_whitespace().next());
    // mpirun starts the slots of this host itself, without ssh.
    let here = this_host();
    Ok(hosts
        .enumerate()
        .filter(|(_, host)| *host != "localhost" && here.as_deref() != Some(*host))
        .map(|(rank, host)| Target { name: format!("worker {group}/{rank}"), host: host.to_owned(), port })
        .collect())
}

/// The contract for user processes ([`user::user_env`]) of rank 0 of `group`, which
/// [`user::MPI_RANK_SCRIPT`] turns into each rank's, then `workers.env`; without the launcher's
/// bind address (each rank's is its own host's).
fn user_vars(
    job: &JobConfig,
    launch: &LaunchEnv,
    group: u32,
    data_dir: Option<&Path>,
) -> anyhow::Result<Vec<(String, String)>> {
    let rank0 = LaunchEnv { role: Role::Worker { group, rank: 0 }, ..launch.clone() };
    let files = UserFiles {
        checkpoint_dir: user::checkpoint_dir(&launch.output, group),
        progress_file: user::progress_file(&launch.output, group, launch.attempt),
        data_dir: data_dir.map(Path::to_path_buf),
    };
    // With a hostfile each rank has a host of its own; the rank script corrects either way.
    let vars = user::user_env(job, &rank0, Hosting::HostPerRank, &files)?;
    Ok(vars
        .into_iter()
        .filter(|(k, _)| *k != env::BIND)
        .map(|(k, v)| (k.to_owned(), v))
        .chain(job.spec.workers.env.iter().flatten().map(|e| (e.name.clone(), e.value.clone())))
        .collect())
}

/// This machine's host name.
fn this_host() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname(2) writes at most `buf.len()` bytes into the buffer we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8(buf[..end].to_vec()).ok()
}

/// Pid of the running mpirun, for the signal handler (0 while none runs).
static MPIRUN_PID: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward_signal(signal: libc::c_int) {
    let pid = MPIRUN_PID.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe and touches no memory.
        unsafe { libc::kill(pid, signal) };
    }
}

/// Runs `tandem launcher`; returns only on an error before mpirun ran, else exits with its code.
pub fn run(args: Args) -> anyhow::Result<()> {
    super::init_logging();

    let super::Contract { env: launch, job, .. } = super::load_contract()?;
    let Role::Launcher { group } = launch.role else {
        bail!(
            "`tandem launcher` starts an MPI worker group, but TANDEM_ROLE says this process is {}",
            launch.role
        );
    };
    if job.spec.workers.backend != tandem_api::Backend::Mpi {
        bail!(
            "`tandem launcher` is for jobs with workers.backend: mpi, but job {} uses {:?}; its workers \
             start with `tandem worker` directly",
            job.job_name,
            job.spec.workers.backend
        );
    }
    let size = job.group(group).map_or(job.spec.workers.group_size, |g| g.peers.len() as u32);
    if size == 0 {
        bail!("group {group} has no ranks in the job config {}", launch.config.display());
    }
    for var in HOSTFILE_VARS {
        if let Ok(path) = std::env::var(var)
            && !path.is_empty()
            && !Path::new(&path).is_file()
        {
            bail!(
                "the MPI hostfile {path} ({var}) does not exist; the operator mounts the group's hostfile \
                 ConfigMap there — check that the ConfigMap exists and is mounted, or unset {var} to run \
                 every rank on this machine"
            );
        }
    }
    let targets = ssh_targets(group)?;
    if !targets.is_empty() {
        let timeout = contract::peer_timeout(|k| std::env::var(k).ok())?;
        tracing::info!(
            group,
            workers = targets.len(),
            timeout_s = timeout.as_secs(),
            "waiting for every worker's sshd"
        );
        if let Err(e) = reach::await_reachable(&targets, timeout) {
            let message = format!("group {group} cannot start mpirun: {e}");
            return super::finish(Err(super::Failure::new(ExitClass::PeerLost, anyhow::anyhow!(message))));
        }
    }
    let exe = std::env::current_exe().context("cannot find the path of this tandem executable")?;

    // What every rank runs, with the variables it gets (forwarded with `-x`: ranks started over
    // ssh do not inherit the launcher's environment).
    let mut vars: Vec<(String, String)> = Vec::new();
    let mut names: Vec<String> =
        FORWARDED.iter().filter(|k| std::env::var_os(k).is_some()).map(|k| (*k).to_owned()).collect();
    let program: Vec<std::ffi::OsString> = match &job.spec.workers.command {
        // The user's command, with the contract for user processes: rank 0's variables, which
        // the rank script turns into each rank's own.
        Some(command) => {
            vars = user_vars(&job, &launch, group, args.data_dir.as_deref())?;
            ["sh", "-c", user::MPI_RANK_SCRIPT, "tandem-rank"]
                .into_iter()
                .map(String::from)
                .chain(command.iter().cloned())
                .chain(job.spec.workers.args.iter().flatten().cloned())
                .map(Into::into)
                .collect()
        }
        // The ranks are the group's workers; MPI gives each its rank.
        None => {
            vars.extend([
                (env::ROLE.to_owned(), "worker".to_owned()),
                (env::GROUP.to_owned(), group.to_string()),
                (env::RANK.to_owned(), "0".to_owned()),
            ]);
            names.extend(
                std::env::vars_os()
                    .filter_map(|(k, _)| k.into_string().ok())
                    .filter(|k| k.starts_with("TANDEM_") && *k != env::BIND && *k != "TANDEM_MPIRUN"),
            );
            [exe.into_os_string(), "worker".into()]
                .into_iter()
                .chain(args.worker_args.iter().map(Into::into))
                .collect()
        }
    };
    names.extend(vars.iter().map(|(k, _)| k.clone()));
    names.sort();
    names.dedup();

    let mut cmd = Command::new(&args.mpirun);
    cmd.arg("-np").arg(size.to_string());
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    if unsafe { libc::geteuid() } == 0 {
        cmd.arg("--allow-run-as-root");
    }
    if args.oversubscribe {
        cmd.arg("--oversubscribe");
    }
    cmd.args(["--bind-to", "none"]);
    for name in &names {
        cmd.arg("-x").arg(name);
    }
    cmd.args(program).envs(vars);

    // mpirun is stopped should the launcher die without passing a signal on.
    die_with_parent(&mut cmd, libc::SIGTERM);
    tracing::info!(group, ranks = size, "starting {:?}", cmd);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "`{}` was not found; the launcher needs OpenMPI's mpirun in PATH (the trainer image has it) \
             or its path in --mpirun / TANDEM_MPIRUN",
            args.mpirun
        ),
        Err(e) => return Err(e).with_context(|| format!("cannot start `{}`", args.mpirun)),
    };
    MPIRUN_PID.store(child.id() as i32, Ordering::SeqCst);
    let handler = forward_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only reads an atomic and calls kill(2), both async-signal-safe.
        unsafe { libc::signal(signal, handler) };
    }
    let status = child.wait().context("waiting for mpirun")?;
    MPIRUN_PID.store(0, Ordering::SeqCst);
    let code = Exit::from_status(status).shell_code();
    if code != 0 {
        tracing::error!(group, code, "mpirun of group {group} ended with exit code {code}");
    }
    std::process::exit(code)
}
