//! The local runner: `tandem train -f job.yaml` for jobs of more than one process. It starts every
//! parameter-server replica and every worker group as processes on this machine, through the same
//! launch contract the operator uses, merges their progress, and restarts failed ones by the same
//! run policy as the operator.
//!
//! Expected flow: [`run`] writes `job.json` (a [`JobConfig`] with 127.0.0.1 endpoints on free
//! ports) and a random token file into the output folder, then drives the [`state::Supervisor`]:
//! it spawns what the supervisor asks for — `tandem ps` for each replica and `tandem worker` for
//! each rank (`tandem launcher`, which runs `mpirun -np <groupSize> tandem worker`, per group with
//! `backend: mpi`) with [`LaunchEnv::to_vars`] — and feeds it the children's progress lines
//! ([`progress`]), their exits and the passing time, until it says the job is over. Once every
//! group has finished it pulls the PS weights as an observer and evaluates them on the test set.
//!
//! Guarantees: every child runs in its own process group and is killed with it when the runner
//! returns — finished, failed, interrupted (SIGINT/SIGTERM) or by error — and on Linux the kernel
//! kills it should the runner itself be killed, so no process outlives the runner. Every decision
//! (which unit restarts, when, what fails the job) is the supervisor's; this module only does the
//! I/O. Children's stderr goes to `<output>/logs/<role>.<attempt>.log`, named in failure messages.
//!
//! Resume: a restarted group resumes from the PS weights and continues its step count from the
//! PS ([`crate::worker::ps_step::PsStep::start_step`]); an `allreduce` group (no PS) resumes from
//! rank 0's newest intact checkpoint in `<output>/checkpoints/`. With [`Options::resume`]
//! (`--resume`) a whole job that stopped — interrupted, failed, or its runner killed — starts
//! again the same way: every PS from its newest checkpoint in `<output>/ps-<i>/` and every group
//! from the step it had reached there. Without it, a folder that holds an earlier run's
//! checkpoints is refused ([`check_output`]) rather than cleared or mixed into: nothing of the
//! earlier run is lost, and no checkpoint of one run is pruned for, or resumed by, another.
//!
//! A job with `workers.command` runs the user's command as each rank instead of `tandem worker`
//! ([`user`]): the same supervisor, restarts and stall detection, with the group's progress read
//! from the JSON lines its rank 0 appends to `TANDEM_PROGRESS_FILE`, and the final accuracy the
//! groups last reported there (no final evaluation: the runner does not know the user's model).
//!
//! Caveats: free ports are found by binding port 0 and releasing it, so another program could
//! take one in between.

pub mod chaos;
pub mod nodes;
pub mod progress;
pub mod state;
pub mod user;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tandem_api::contract::{self, Endpoint, JobConfig, LaunchEnv, Role};
use tandem_api::{JobPlan, TrainingJobSpec};

use chaos::Chaos;
use nodes::Placement;
use state::{Input, Outcome, ProcId, Supervisor};
use tandem_compute::device::Device;
use tandem_compute::model::engine;
use tandem_compute::train::Trainer;
use tandem_ps::client::{ClientConfig, PsClient};
use tandem_util::proc::{Exit, die_with_parent, free_ports};

/// How long children get between SIGTERM and SIGKILL when the runner stops them.
const GRACE: Duration = Duration::from_secs(15);

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// What the runner is asked to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Job name (metadata.name).
    pub job_name: String,
    /// The validated spec.
    pub spec: TrainingJobSpec,
    /// Output folder: job.json, token, logs, PS checkpoints.
    pub output: PathBuf,
    /// The `tandem` executable to start children from.
    pub exe: PathBuf,
    /// Folder with the built-in data sets.
    pub data_dir: PathBuf,
    /// Extra arguments for `tandem worker` (e.g. `--device cpu`).
    pub worker_args: Vec<String>,
    /// Processes to kill on the way.
    pub chaos: Vec<Chaos>,
    /// Resume from the checkpoints of an earlier run (PS shards, allreduce group); without it a
    /// folder holding them is refused ([`check_output`]).
    pub resume: bool,
    /// The nodes (network namespaces) the processes run on; empty: all on loopback.
    pub placement: Placement,
    /// The folder a user's `workers.command` runs in (the manifest's folder).
    pub workdir: PathBuf,
}

/// What the runner reports while it runs; `--output json` prints each as one line.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Every process was started.
    Started {
        /// Job name.
        job: String,
        /// Processes started.
        processes: usize,
        /// Steps each group runs.
        total_steps: u64,
        /// Output folder.
        output: String,
    },
    /// A group reported progress; the merged view afterwards.
    Progress {
        /// Merged step (the furthest any group reached).
        step: u64,
        /// Group that reported.
        group: u32,
        /// That group's own step in its current attempt.
        group_step: u64,
        /// Mean of the groups' latest training losses.
        loss: Option<f64>,
        /// The reporting group's own training loss in this report.
        group_loss: Option<f64>,
        /// The test accuracy this report measured (the group evaluated at `group_step`); `None`
        /// between evaluations, so that nothing shows an old evaluation as a new measurement.
        accuracy: Option<f64>,
        /// Samples processed so far, all groups and attempts together.
        samples: u64,
        /// Fraction of their step time the groups waited for data at their last reports (their
        /// mean): near 0 the input keeps up, near 1 the job is input-bound.
        data_wait: f64,
        /// Samples skipped as unreadable so far, all groups and attempts together.
        skipped: u64,
    },
    /// Parameter server 0's HTTP status endpoint listens (again after each of its restarts).
    Status {
        /// PS index (0).
        ps: u32,
        /// `host:port` of the endpoint; `GET /status` with a proof of the job token
        /// (`tandem_api::contract::status_auth`).
        addr: String,
    },
    /// No group advanced its step for `runPolicy.stallTimeoutSeconds` while every unit ran;
    /// `stallPolicy` acts next (a [`Event::Restart`] per unit it restarts).
    Stalled {
        /// The job's (merged) step.
        step: u64,
        /// The timeout that passed.
        seconds: u32,
        /// What was seen and the policy.
        message: String,
    },
    /// A step advanced again after a stall that was only reported.
    Unstalled {
        /// The job's (merged) step.
        step: u64,
    },
    /// `--chaos` killed a process.
    Chaos {
        /// The process, e.g. `worker 0/1`.
        target: String,
        /// Merged step when it was signalled.
        step: u64,
        /// `kill` (SIGKILL) or `term` (SIGTERM).
        action: &'static str,
    },
    /// A unit is restarted.
    Restart {
        /// `ps` or `group`.
        role: &'static str,
        /// PS or group index.
        index: u32,
        /// New attempt.
        attempt: u32,
        /// Why.
        message: String,
    },
    /// Training finished; the PS weights were evaluated on the test set (with `workers.command`:
    /// the groups' last reported accuracies, averaged).
    Finished {
        /// Test accuracy of the final model; absent when a user's command reported none.
        #[serde(skip_serializing_if = "Option::is_none")]
        test_accuracy: Option<f64>,
        /// Test loss of the final model (absent without a PS).
        test_loss: Option<f64>,
        /// Steps each group ran.
        steps: u64,
        /// Samples over wall time, all groups together.
        samples_per_second: f64,
        /// Wall time of the whole job.
        wall_seconds: f64,
        /// Restarts counted towards maxRestarts.
        restarts: u32,
    },
}

/// A job the runner could not run to the end.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The job or options cannot be run.
    #[error("{0}")]
    Config(String),
    /// A process failed beyond what runPolicy allows.
    #[error("job failed: {0}")]
    Failed(String),
    /// SIGINT or SIGTERM.
    #[error("interrupted; every process of the job was stopped")]
    Interrupted,
    /// The final model could not be read or evaluated.
    #[error("evaluating the final model: {0}")]
    Eval(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunnerError {
    let what = what.into();
    move |source| RunnerError::Io { what, source }
}

/// Whether `spec` needs more than one process (any PS, or more than one worker rank), or runs a
/// user's command (always a process of its own).
pub fn needs_runner(spec: &TrainingJobSpec) -> bool {
    spec.parameter_servers.replicas > 0 || spec.workers.ranks() > 1 || spec.workers.command.is_some()
}

/// One child process of the job.
struct Proc {
    role: Role,
    child: Child,
    /// How it ended, once reaped, and when that was seen.
    exit: Option<Exit>,
    exited_at: Option<Instant>,
    /// Set once it ended or was killed: its progress file's reader then stops.
    ended: Arc<AtomicBool>,
    /// Set by its output's reader once it has sent every line (at the end of its stdout, or after
    /// a user rank 0's last read of its progress file).
    drained: Arc<AtomicBool>,
    /// Whether the supervisor was told of its exit.
    reported: bool,
}

/// How long an exit waits for the process's last lines before it is reported without them.
const OUTPUT_GRACE: Duration = Duration::from_secs(2);

impl Drop for Proc {
    fn drop(&mut self) {
        self.ended.store(true, Ordering::SeqCst);
    }
}

impl Proc {
    /// Sends `signal` to the child's process group and, for SIGKILL, to every descendant (a
    /// launcher's mpirun puts each rank in a process group of its own: killed with mpirun alone
    /// they would live on, holding their ports).
    fn signal(&self, signal: i32) {
        if self.exit.is_some() {
            return;
        }
        let pgid = self.child.id() as libc::pid_t;
        let rest = if signal == libc::SIGKILL { tandem_util::proc::descendants(pgid) } else { Vec::new() };
        // SAFETY: kill(2) with a negative pid signals a process group; it touches no memory.
        unsafe { libc::kill(-pgid, signal) };
        for pid in rest {
            // SAFETY: as above, one process.
            unsafe { libc::kill(pid, signal) };
        }
    }
}

/// The job's children by the supervisor's ids, and what carries out its commands; dropping it
/// kills every child, so that no error path leaves orphans.
struct Procs<'a> {
    spawner: Spawner<'a>,
    live: BTreeMap<ProcId, Proc>,
    /// The log of every process ever started, for failure messages.
    logs: BTreeMap<ProcId, PathBuf>,
}

impl Procs<'_> {
    /// Carries out one of the supervisor's commands; the outcome once it says the job is over.
    fn execute(
        &mut self,
        command: state::Command,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<Option<Outcome>, RunnerError> {
        match command {
            state::Command::Spawn { id, role, attempt } => {
                let ended = Arc::new(AtomicBool::new(false));
                let drained = Arc::new(AtomicBool::new(false));
                let (child, log) = self.spawner.spawn(id, role, attempt, &ended, &drained)?;
                let proc = Proc { role, child, exit: None, exited_at: None, ended, drained, reported: false };
                self.live.insert(id, proc);
                self.logs.insert(id, log);
            }
            state::Command::Kill { id } => {
                if let Some(mut p) = self.live.remove(&id) {
                    p.signal(libc::SIGKILL);
                    let _ = p.child.wait();
                }
            }
            state::Command::Chaos { id, signal } => {
                if let Some(p) = self.live.get(&id).filter(|p| p.exit.is_none()) {
                    if matches!(p.role, Role::Launcher { .. }) && signal == libc::SIGKILL {
                        // An mpirun launcher is killed with its ranks.
                        p.signal(signal);
                    } else {
                        // SAFETY: kill(2) touches no memory.
                        unsafe { libc::kill(p.child.id() as libc::pid_t, signal) };
                    }
                }
            }
            state::Command::Emit(event) => on_event(&event),
            state::Command::Finish(outcome) => return Ok(Some(outcome)),
        }
        Ok(None)
    }

    /// The children that ended since the last look and whose output was read to its end (or
    /// that ended [`OUTPUT_GRACE`] ago): a rank's last line, its final accuracy, is never taken
    /// after its exit.
    fn exits(&mut self) -> Result<Vec<Input>, RunnerError> {
        let mut exits = Vec::new();
        for (&id, p) in self.live.iter_mut().filter(|(_, p)| !p.reported) {
            if p.exit.is_none()
                && let Some(status) = p.child.try_wait().map_err(io(format!("waiting for {}", p.role)))?
            {
                p.exit = Some(Exit::from_status(status));
                p.exited_at = Some(Instant::now());
                p.ended.store(true, Ordering::SeqCst);
            }
            let Some(exit) = p.exit else { continue };
            let late = p.exited_at.is_none_or(|at| at.elapsed() >= OUTPUT_GRACE);
            if p.drained.load(Ordering::SeqCst) || late {
                p.reported = true;
                exits.push(Input::Exited { id, exit });
            }
        }
        Ok(exits)
    }

    /// The last lines of the logs of `ids`, one block each.
    fn log_tails(&self, ids: &[ProcId]) -> String {
        ids.iter().filter_map(|id| self.logs.get(id)).map(|log| log_tail(log)).collect::<Vec<_>>().join("\n")
    }

    fn kill_all(&mut self) {
        for p in self.live.values_mut() {
            p.signal(libc::SIGKILL);
            let _ = p.child.wait();
        }
        self.live.clear();
    }

    /// SIGTERM to every child, SIGKILL to those still alive after [`GRACE`].
    fn stop_all(&mut self) {
        for p in self.live.values() {
            p.signal(libc::SIGTERM);
        }
        let deadline = Instant::now() + GRACE;
        while Instant::now() < deadline {
            let alive =
                self.live.values_mut().filter(|p| p.exit.is_none()).any(|p| match p.child.try_wait() {
                    Ok(Some(status)) => {
                        p.exit = Some(Exit::from_status(status));
                        false
                    }
                    _ => true,
                });
            if !alive {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill_all();
    }
}

impl Drop for Procs<'_> {
    fn drop(&mut self) {
        self.kill_all();
    }
}

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(signal, handler) };
    }
}

fn random_token() -> Result<String, RunnerError> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(io("reading /dev/urandom for the job token"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn write_private(path: &Path, text: &str) -> Result<(), RunnerError> {
    tandem_util::fs::write_atomic(path, text.as_bytes(), Some(0o600))
        .map_err(io(format!("writing {}", path.display())))
}

/// The checkpoints an earlier run left in `output`: rank 0's in `checkpoints/` and every PS
/// shard's in `ps-<i>/` (of any number of replicas), oldest folder first.
pub fn earlier_checkpoints(output: &Path) -> Result<Vec<PathBuf>, RunnerError> {
    let listing = |dir: &Path| io(format!("reading {}", dir.display()));
    let worker = output.join("checkpoints");
    let mut found: Vec<PathBuf> = tandem_compute::checkpoint::latest(&worker)
        .map_err(|e| RunnerError::Config(e.to_string()))?
        .into_iter()
        .collect();
    // A user's command keeps its checkpoints, in its own format, in one folder per group.
    if let Ok(entries) = std::fs::read_dir(&worker) {
        let mut groups: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.is_dir() && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("group-"))
            })
            .collect();
        groups.sort();
        for dir in groups {
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                .map_err(listing(&dir))?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .collect();
            files.sort();
            found.extend(files);
        }
    }
    let entries = match std::fs::read_dir(output) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(listing(output)(e)),
    };
    let mut ps: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            name.strip_prefix("ps-").is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    ps.sort();
    for dir in ps {
        found.extend(crate::ps::server::checkpoint::files(&dir).map_err(listing(&dir))?);
    }
    Ok(found)
}

/// Refuses a fresh run (`resume` false) into an `output` folder that holds an earlier run's
/// checkpoints: the PS shards and an allreduce group would resume from them, and the new run's
/// checkpoints would be pruned for the older, higher-numbered ones. The user passes `--resume` to
/// continue that run, or gives the new one a folder of its own; nothing is deleted for them.
pub fn check_output(output: &Path, resume: bool) -> Result<(), RunnerError> {
    if resume {
        return Ok(());
    }
    let found = earlier_checkpoints(output)?;
    let Some(first) = found.first() else { return Ok(()) };
    Err(RunnerError::Config(format!(
        "{} holds the checkpoints of an earlier run ({} file(s), such as {}); a new run there would \
         mix with them. Pass --resume to continue that run, or start afresh in another folder \
         (--output-dir), or move {} away first",
        output.display(),
        found.len(),
        first.display(),
        output.display()
    )))
}

/// The job's config with free loopback ports for every PS and rank.
pub fn local_config(job_name: &str, spec: &TrainingJobSpec) -> Result<JobConfig, RunnerError> {
    placed_config(job_name, spec, &Placement::default())
}

/// The job's config with every PS and rank at its place: on a node's address, or on a free
/// loopback port.
pub fn placed_config(
    job_name: &str,
    spec: &TrainingJobSpec,
    placement: &Placement,
) -> Result<JobConfig, RunnerError> {
    let ports = match placement.is_local() {
        true => free_ports(nodes::slots(spec) as usize).map_err(io("finding free ports on 127.0.0.1"))?,
        false => Vec::new(),
    };
    Ok(JobConfig::of_spec(job_name, "local", spec, |role| {
        let local = ports.get(nodes::slot(spec, role) as usize).copied().unwrap_or_default();
        placement.endpoint(spec, role, local)
    }))
}

/// Last lines of a child's log, for failure messages.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = &lines[lines.len().saturating_sub(3)..];
    if tail.is_empty() {
        format!("(its log {} is empty)", path.display())
    } else {
        format!("last lines of {}:\n  {}", path.display(), tail.join("\n  "))
    }
}

/// Starts the job's processes through the launch contract.
struct Spawner<'a> {
    opts: &'a Options,
    config: JobConfig,
    config_path: PathBuf,
    token_path: PathBuf,
    logs: PathBuf,
    lines: mpsc::Sender<(ProcId, progress::Line)>,
}

impl Spawner<'_> {
    fn env(&self, role: Role, attempt: u32) -> LaunchEnv {
        LaunchEnv {
            role,
            config: self.config_path.clone(),
            token_file: self.token_path.clone(),
            bind: self.opts.placement.bind(&self.opts.spec, role),
            output: self.opts.output.clone(),
            attempt,
        }
    }

    /// Compute threads of each worker rank: this machine's CPUs shared among the job's ranks (at
    /// least one each).
    fn threads_per_rank(&self) -> usize {
        let ranks = self.opts.spec.workers.ranks() as usize;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cpus / ranks).max(1)
    }

    /// Sends `cmd`'s output to the log `name` (returned), with no input, in a process group of its
    /// own that dies with the runner.
    fn log_to(&self, cmd: &mut Command, name: &str) -> Result<PathBuf, RunnerError> {
        let log = self.logs.join(name);
        let out = std::fs::File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        let err = out.try_clone().map_err(io(format!("opening {}", log.display())))?;
        use std::os::unix::process::CommandExt;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
        die_with_parent(cmd, libc::SIGKILL);
        Ok(log)
    }

    /// Starts rank `role` of a user's command; returns it and its log. Rank 0 starts the reader
    /// of its group's progress file, which stops once `ended` is set, and then sets `drained`.
    fn spawn_user(
        &self,
        id: ProcId,
        role: Role,
        attempt: u32,
        ended: &Arc<AtomicBool>,
        drained: &Arc<AtomicBool>,
    ) -> Result<(Child, PathBuf), RunnerError> {
        let opts = self.opts;
        let Role::Worker { group, rank } = role else {
            return Err(RunnerError::Config(format!("{role} does not run a user's command")));
        };
        let launch = self.env(role, attempt);
        let files = user::files(&opts.output, group, attempt, &opts.data_dir);
        if rank == 0 {
            user::reset_progress(&files.progress_file)?;
        }
        let node = opts.placement.node(&opts.spec, role);
        let threads = self.threads_per_rank();
        let mut cmd = user::command(&opts.spec, &self.config, &launch, &files, &opts.workdir, threads, node)?;
        let log = self.log_to(&mut cmd, &format!("worker-{group}-{rank}.{attempt}.log"))?;
        let program = opts.spec.workers.command.as_ref().and_then(|c| c.first()).cloned().unwrap_or_default();
        let child = cmd.spawn().map_err(io(format!(
            "starting {role}: workers.command {program:?} in {}; is it installed, on PATH and executable?",
            opts.workdir.display()
        )))?;
        if rank == 0 {
            let reader = (ended.clone(), drained.clone());
            user::tail_progress(files.progress_file, group, id, reader, self.lines.clone());
        } else {
            drained.store(true, Ordering::SeqCst);
        }
        Ok((child, log))
    }

    /// Starts the launcher of `backend: mpi` group `group` running a user's command: `tandem
    /// launcher`, whose mpirun starts the ranks here with the contract for user processes, in
    /// the job's working folder; returns it and its log (mpirun's output, the ranks' among it).
    /// It follows the group's progress file as rank 0 of a `tcp` group does.
    fn spawn_user_launcher(
        &self,
        id: ProcId,
        group: u32,
        attempt: u32,
        ended: &Arc<AtomicBool>,
        drained: &Arc<AtomicBool>,
    ) -> Result<(Child, PathBuf), RunnerError> {
        let opts = self.opts;
        let role = Role::Launcher { group };
        let files = user::files(&opts.output, group, attempt, &opts.data_dir);
        user::create_dirs(&files)?;
        user::reset_progress(&files.progress_file)?;
        let mut cmd = Command::new(&opts.exe);
        cmd.args(["launcher", "--oversubscribe", "--data-dir"])
            .arg(&opts.data_dir)
            .current_dir(&opts.workdir)
            .envs(self.env(role, attempt).to_vars());
        user::limit_threads(&mut cmd, self.threads_per_rank());
        let log = self.log_to(&mut cmd, &format!("launcher-{group}.{attempt}.log"))?;
        let child = cmd.spawn().map_err(io(format!("starting {role} ({})", opts.exe.display())))?;
        user::tail_progress(
            files.progress_file,
            group,
            id,
            (ended.clone(), drained.clone()),
            self.lines.clone(),
        );
        Ok((child, log))
    }

    /// Starts process `id` as `role`; returns it and its log. Its stdout lines reach `lines`;
    /// `drained` is set once they all have.
    fn spawn(
        &self,
        id: ProcId,
        role: Role,
        attempt: u32,
        ended: &Arc<AtomicBool>,
        drained: &Arc<AtomicBool>,
    ) -> Result<(Child, PathBuf), RunnerError> {
        let opts = self.opts;
        if opts.spec.workers.command.is_some() {
            match role {
                Role::Worker { .. } => return self.spawn_user(id, role, attempt, ended, drained),
                Role::Launcher { group } => {
                    return self.spawn_user_launcher(id, group, attempt, ended, drained);
                }
                Role::Ps { .. } => {}
            }
        }
        // On a node, the process runs inside its network namespace.
        let node = opts.placement.node(&opts.spec, role);
        let mut cmd = node.map_or_else(|| Command::new(&opts.exe), |node| node.command(&opts.exe));
        match role {
            Role::Ps { .. } => {
                // Every PS takes a free port for its status endpoint.
                cmd.arg("ps").env(contract::env::STATUS_PORT, "0");
            }
            Role::Worker { .. } => {
                cmd.arg("worker").arg("--data-dir").arg(&opts.data_dir).args(&opts.worker_args);
            }
            Role::Launcher { .. } => {
                // The same launch path as on Kubernetes; without a hostfile mpirun starts the
                // ranks here, more of them than this machine may have cores.
                cmd.args(["launcher", "--oversubscribe", "--", "--data-dir"])
                    .arg(&opts.data_dir)
                    .args(&opts.worker_args);
            }
        }
        let name = match role {
            Role::Ps { index } => format!("ps-{index}"),
            Role::Worker { group, rank } => format!("worker-{group}-{rank}"),
            Role::Launcher { group } => format!("launcher-{group}"),
        };
        let log = self.logs.join(format!("{name}.{attempt}.log"));
        let stderr = std::fs::File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        if !matches!(role, Role::Ps { .. }) && std::env::var_os(engine::THREADS_ENV).is_none() {
            // Every rank of a local job shares this machine's CPUs: give each its share, or the
            // ranks' compute pools (each sized to the whole machine) oversubscribe the cores.
            cmd.env(engine::THREADS_ENV, self.threads_per_rank().to_string());
        }
        use std::os::unix::process::CommandExt;
        cmd.envs(self.env(role, attempt).to_vars())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .process_group(0);
        // The kernel kills the child if the runner dies without cleaning up (e.g. SIGKILL).
        die_with_parent(&mut cmd, libc::SIGKILL);
        let mut child = cmd.spawn().map_err(io(format!(
            "starting {role} ({}{}); is it installed and executable?",
            node.map_or_else(String::new, |n| format!("ip netns exec {} ", n.netns)),
            opts.exe.display()
        )))?;
        if let Some(stdout) = child.stdout.take() {
            let tx = self.lines.clone();
            let drained = drained.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    let Some(line) = progress::parse(&line) else { continue };
                    if tx.send((id, line)).is_err() {
                        break;
                    }
                }
                drained.store(true, Ordering::SeqCst);
            });
        } else {
            drained.store(true, Ordering::SeqCst);
        }
        Ok((child, log))
    }
}

/// Checks that every chaos target exists in the job.
pub fn check_chaos(spec: &TrainingJobSpec, chaos: &[Chaos]) -> Result<(), RunnerError> {
    match chaos.iter().find(|c| !c.target.in_spec(spec)) {
        None => Ok(()),
        Some(c) => Err(RunnerError::Config(format!(
            "--chaos {c}: the job has {} parameter server(s) and {} group(s) of {} rank(s); name one of them",
            spec.parameter_servers.replicas, spec.workers.groups, spec.workers.group_size
        ))),
    }
}

/// Runs the job to the end; `on_event` sees every [`Event`], the last one `Finished`.
pub fn run(opts: &Options, on_event: &mut dyn FnMut(&Event)) -> Result<(), RunnerError> {
    check_chaos(&opts.spec, &opts.chaos)?;
    opts.placement.check(&opts.spec)?;
    check_output(&opts.output, opts.resume)?;
    user::check(&opts.spec, opts.placement.is_local())?;
    install_signal_handlers();
    INTERRUPTED.store(false, Ordering::SeqCst);
    let started = Instant::now();
    // A user's command trains a model the runner does not know: no final evaluation.
    let mut eval = match opts.spec.workers.command {
        None => Some(final_model(opts)?),
        Some(_) => None,
    };
    let total_steps = match &eval {
        Some(eval) => eval.total_steps(),
        None => opts.spec.training.steps.unwrap_or(0),
    };
    let files = JobFiles::write(opts)?;
    let (lines, rx) = mpsc::channel();
    let spawner = Spawner {
        opts,
        config: files.config.clone(),
        config_path: files.config_path.clone(),
        token_path: files.token_path.clone(),
        logs: files.logs.clone(),
        lines,
    };
    let mut procs = Procs { spawner, live: BTreeMap::new(), logs: BTreeMap::new() };
    let mut sup = Supervisor::new(opts.spec.clone(), opts.chaos.clone());
    let first = sup.start();
    let processes = first.len();
    for command in first {
        procs.execute(command, on_event)?;
    }
    on_event(&Event::Started {
        job: opts.job_name.clone(),
        processes,
        total_steps,
        output: opts.output.display().to_string(),
    });
    match supervise(&mut sup, &mut procs, &rx, on_event)? {
        Outcome::Interrupted => {
            procs.stop_all();
            Err(RunnerError::Interrupted)
        }
        Outcome::Failed { message, logs } => {
            let tails = procs.log_tails(&logs);
            procs.stop_all();
            Err(RunnerError::Failed(format!("{message}\n{tails}")))
        }
        Outcome::Trained { steps, accuracy, samples, restarts } => {
            let (test_accuracy, test_loss) = match eval.as_mut() {
                Some(eval) => {
                    let (accuracy, loss) = evaluate(&files, eval, accuracy)?;
                    (Some(accuracy), loss)
                }
                None => (accuracy, None),
            };
            procs.stop_all();
            let wall_seconds = started.elapsed().as_secs_f64();
            on_event(&Event::Finished {
                test_accuracy,
                test_loss,
                steps: if steps > 0 { steps } else { total_steps },
                samples_per_second: samples as f64 / wall_seconds.max(1e-9),
                wall_seconds,
                restarts,
            });
            Ok(())
        }
    }
}

/// Feeds the supervisor every line, exit and tick, carrying out its commands, until the job is
/// over.
fn supervise(
    sup: &mut Supervisor,
    procs: &mut Procs<'_>,
    lines: &mpsc::Receiver<(ProcId, progress::Line)>,
    on_event: &mut dyn FnMut(&Event),
) -> Result<Outcome, RunnerError> {
    loop {
        let mut inputs = Vec::new();
        if INTERRUPTED.load(Ordering::SeqCst) {
            inputs.push(Input::Interrupted);
        }
        if let Ok(first) = lines.recv_timeout(Duration::from_millis(100)) {
            let batch = std::iter::once(first).chain(lines.try_iter());
            inputs.extend(batch.map(|(id, line)| Input::Line { id, line }));
        }
        let exits = procs.exits()?;
        // A process's output was read to its end before its exit is reported: lines still queued
        // come first.
        inputs.extend(lines.try_iter().map(|(id, line)| Input::Line { id, line }));
        inputs.extend(exits);
        inputs.push(Input::Tick);
        for input in inputs {
            for command in sup.handle(input, Instant::now()) {
                if let Some(outcome) = procs.execute(command, on_event)? {
                    return Ok(outcome);
                }
            }
        }
    }
}

/// The model for the final evaluation; loading the data now fails early when it is missing.
fn final_model(opts: &Options) -> Result<Trainer, RunnerError> {
    let spec = &opts.spec;
    let data =
        tandem_input::open_job(spec, &opts.data_dir).map_err(|e| RunnerError::Config(e.to_string()))?;
    let plan =
        JobPlan::resolve(spec, data.train.samples()).map_err(|e| RunnerError::Config(e.to_string()))?;
    Trainer::new(spec, &plan, data, &Device::Cpu, 0).map_err(|e| RunnerError::Config(e.to_string()))
}

/// What the runner writes into the output folder before it starts a process.
struct JobFiles {
    config: JobConfig,
    config_path: PathBuf,
    token: String,
    token_path: PathBuf,
    logs: PathBuf,
}

impl JobFiles {
    /// Creates the log folder, writes `job.json` and a fresh token.
    fn write(opts: &Options) -> Result<Self, RunnerError> {
        let spec = &opts.spec;
        let logs = opts.output.join("logs");
        std::fs::create_dir_all(&logs).map_err(io(format!("creating {}", logs.display())))?;
        let config = placed_config(&opts.job_name, spec, &opts.placement)?;
        let config_path = opts.output.join(contract::CONFIG_FILE);
        write_private(&config_path, &config.to_json())?;
        let token = random_token()?;
        let token_path = opts.output.join("token");
        write_private(&token_path, &token)?;
        Ok(Self { config, config_path, token, token_path, logs })
    }
}

/// Test accuracy and loss of the trained model: the PS weights, with the groups' mean of the
/// model's non-trainable state (batch norm's running statistics) that shard 0 holds, evaluated on
/// the test set; without a PS, the accuracy rank 0 `reported`.
fn evaluate(
    files: &JobFiles,
    eval: &mut Trainer,
    reported: Option<f64>,
) -> Result<(f64, Option<f64>), RunnerError> {
    let config = &files.config;
    if config.parameter_servers.is_empty() {
        let accuracy =
            reported.ok_or_else(|| RunnerError::Eval("no worker reported a final test accuracy".into()))?;
        return Ok((accuracy, None));
    }
    let servers: Vec<String> = config.parameter_servers.iter().map(Endpoint::to_string).collect();
    let total = eval.params().len();
    let mut client_config = ClientConfig::observer(servers, files.token.clone());
    client_config.total_len = total as u64;
    let mut client = PsClient::connect(client_config).map_err(|e| RunnerError::Eval(e.to_string()))?;
    let mut weights = vec![0f32; total];
    client.pull(0, &mut weights).map_err(|e| RunnerError::Eval(e.to_string()))?;
    // Without the groups' statistics a batch-norm model would be evaluated with fresh ones (mean
    // 0, variance 1), and score about chance.
    let wanted = eval.state().len();
    let state = if wanted == 0 {
        None
    } else {
        Some(client.get_state().map_err(|e| RunnerError::Eval(e.to_string()))?)
    };
    drop(client);
    eval.set_params(&weights).map_err(|e| RunnerError::Eval(e.to_string()))?;
    if let Some(state) = state {
        if state.len() != wanted {
            return Err(RunnerError::Eval(format!(
                "parameter server 0 holds {} values of model state where the model has {wanted} (its \
                 batch-norm running statistics); the groups put them after every step, so a trained job \
                 always has them: this is a bug, please report it",
                state.len()
            )));
        }
        eval.set_state(&state).map_err(|e| RunnerError::Eval(e.to_string()))?;
    }
    let result = eval.evaluate().map_err(|e| RunnerError::Eval(e.to_string()))?;
    Ok((result.accuracy, Some(result.loss)))
}
