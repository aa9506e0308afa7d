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
//! Guarantees: SIGTERM and SIGINT are passed on to mpirun, which passes them on to the ranks; the
//! launcher exits with mpirun's exit code, or 128 + the signal that killed it, so that the
//! operator's restart policy sees what the group did. `--allow-run-as-root` is added only when
//! running as uid 0.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{Context, bail};
use tandem::util::proc::{Exit, die_with_parent};
use tandem_api::contract::{Role, env};

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
    /// Arguments passed on to every `tandem worker` rank, after `--` (e.g. `-- --device cpu`).
    #[arg(last = true)]
    pub worker_args: Vec<String>,
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
    let exe = std::env::current_exe().context("cannot find the path of this tandem executable")?;

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
    // The ranks are the group's workers; MPI gives each its rank.
    cmd.env(env::ROLE, "worker").env(env::GROUP, group.to_string()).env(env::RANK, "0");
    let mut names: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("TANDEM_") && *k != env::BIND && *k != "TANDEM_MPIRUN")
        .chain(FORWARDED.iter().filter(|k| std::env::var_os(k).is_some()).map(|k| (*k).to_owned()))
        .chain([env::ROLE, env::GROUP, env::RANK].map(str::to_owned))
        .collect();
    names.sort();
    names.dedup();
    for name in &names {
        cmd.arg("-x").arg(name);
    }
    cmd.arg(&exe).arg("worker").args(&args.worker_args);

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
