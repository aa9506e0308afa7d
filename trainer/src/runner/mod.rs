//! The local runner: `tandem train -f job.yaml` for jobs of more than one process. It starts every
//! parameter-server replica and every worker group as processes on this machine, through the same
//! launch contract the operator uses, merges their progress, and restarts failed ones as the
//! operator would.
//!
//! Expected flow: [`run`] writes `job.json` (a [`JobConfig`] with 127.0.0.1 endpoints on free
//! ports) and a random token file into the output folder, spawns `tandem ps` for each replica and
//! `tandem worker` for each rank (`tandem launcher`, which runs `mpirun -np <groupSize> tandem
//! worker`, per group with `backend: mpi`) with [`LaunchEnv::to_vars`], reads the workers' progress lines
//! ([`progress`]), applies the job's runPolicy through [`policy::Supervisor`], and once every
//! group has finished pulls the PS weights as an observer and evaluates them on the test set.
//!
//! Guarantees: every child runs in its own process group and is killed with it when the runner
//! returns — finished, failed, interrupted (SIGINT/SIGTERM) or by error — and on Linux the kernel
//! kills it should the runner itself be killed, so no process outlives the runner. A failed worker restarts its group only; a failed PS restarts from its checkpoint.
//! Children's stderr goes to `<output>/logs/<role>.<attempt>.log`, named in failure messages.
//!
//! Caveats: `tandem worker` does not reconnect to a restarted PS, so a PS restart also relaunches
//! every unfinished group (a new attempt each, not counted towards `maxRestarts`). A restarted
//! group resumes from the PS weights and continues its step count from the PS
//! ([`crate::worker::ps_step::PsStep::start_step`]); an `allreduce` group (no PS) resumes from rank 0's
//! newest checkpoint in `<output>/checkpoints/`, which a run without `--resume` clears first. Free
//! ports are found by binding port 0 and releasing it, so another program could take one in
//! between.

pub mod chaos;
pub mod policy;
pub mod progress;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tandem_api::contract::{self, Endpoint, GroupTopology, JobConfig, LaunchEnv, Role};
use tandem_api::{Backend, TrainingJobSpec};

use crate::compute::device::Device;
use crate::compute::train::Trainer;
use crate::ps::client::{ClientConfig, PsClient};
use chaos::Chaos;
use policy::{Decision, Exit, Failure, Supervisor, Unit};
use progress::{Line, Merged};

/// How long the other processes of a failing unit get to end on their own before the unit's
/// failure is judged (so that a killed rank, not its peers' broken connections, is the cause).
const SETTLE: Duration = Duration::from_secs(3);
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
    /// Keep the checkpoints of an earlier run (PS shards, allreduce group) and resume from them.
    pub resume: bool,
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
        /// Latest test accuracy reported.
        accuracy: Option<f64>,
        /// Samples processed so far, all groups and attempts together.
        samples: u64,
    },
    /// Parameter server 0's HTTP status endpoint listens (again after each of its restarts).
    Status {
        /// PS index (0).
        ps: u32,
        /// `host:port` of the endpoint; `GET /status` with the job token as bearer.
        addr: String,
    },
    /// `--chaos` killed a process.
    Chaos {
        /// The process, e.g. `worker 0/1`.
        target: String,
        /// Merged step when it was killed.
        step: u64,
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
    /// Training finished; the PS weights were evaluated on the test set.
    Finished {
        /// Test accuracy of the final model.
        test_accuracy: f64,
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

/// Whether `spec` needs more than one process (any PS, or more than one worker rank).
pub fn needs_runner(spec: &TrainingJobSpec) -> bool {
    spec.parameter_servers.replicas > 0 || spec.workers.groups * spec.workers.group_size > 1
}

/// One child process of the job.
struct Proc {
    id: u64,
    role: Role,
    attempt: u32,
    child: Child,
    log: PathBuf,
    exit: Option<Exit>,
}

impl Proc {
    fn unit(&self) -> Unit {
        Unit::of(self.role)
    }
    /// Sends `signal` to the child's process group (mpirun and its ranks together).
    fn signal(&self, signal: i32) {
        if self.exit.is_some() {
            return;
        }
        let pgid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) with a negative pid signals a process group; it touches no memory.
        unsafe { libc::kill(-pgid, signal) };
    }
}

/// Every live child; dropping it kills them all, so that no error path leaves orphans.
struct Procs {
    list: Vec<Proc>,
    next_id: u64,
}

impl Procs {
    fn kill_where(&mut self, keep: impl Fn(&Proc) -> bool) {
        for p in self.list.iter_mut().filter(|p| !keep(p)) {
            p.signal(libc::SIGKILL);
            let _ = p.child.wait();
        }
        self.list.retain(|p| keep(p));
    }

    /// SIGTERM to every child, SIGKILL to those still alive after [`GRACE`].
    fn stop_all(&mut self) {
        for p in &self.list {
            p.signal(libc::SIGTERM);
        }
        let deadline = Instant::now() + GRACE;
        while Instant::now() < deadline {
            let alive = self.list.iter_mut().filter(|p| p.exit.is_none()).any(|p| match p.child.try_wait() {
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
        self.kill_where(|_| false);
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.kill_where(|_| false);
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

/// `n` free loopback ports, all held at once so that they differ.
fn free_ports(n: usize) -> Result<Vec<u16>, RunnerError> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io("finding free ports on 127.0.0.1"))?;
    listeners.iter().map(|l| l.local_addr().map(|a| a.port()).map_err(io("reading a bound port"))).collect()
}

fn random_token() -> Result<String, RunnerError> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(io("reading /dev/urandom for the job token"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn write_private(path: &Path, text: &str) -> Result<(), RunnerError> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io(format!("writing {}", tmp.display())))?;
    f.write_all(text.as_bytes()).map_err(io(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(io(format!("renaming {} to {}", tmp.display(), path.display())))
}

/// The job's config with free loopback ports for every PS and rank.
pub fn local_config(job_name: &str, spec: &TrainingJobSpec) -> Result<JobConfig, RunnerError> {
    let ps = spec.parameter_servers.replicas as usize;
    let (groups, size) = (spec.workers.groups as usize, spec.workers.group_size as usize);
    let ports = free_ports(ps + groups * size)?;
    let endpoint = |i: usize| Endpoint::new("127.0.0.1", ports[i]);
    Ok(JobConfig {
        job_name: job_name.to_owned(),
        namespace: "local".to_owned(),
        spec: spec.clone(),
        parameter_servers: (0..ps).map(endpoint).collect(),
        groups: (0..groups)
            .map(|g| GroupTopology {
                index: g as u32,
                peers: (0..size).map(|r| endpoint(ps + g * size + r)).collect(),
            })
            .collect(),
    })
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

struct Launcher<'a> {
    opts: &'a Options,
    config_path: PathBuf,
    token_path: PathBuf,
    logs: PathBuf,
    lines: mpsc::Sender<(u64, String)>,
}

impl Launcher<'_> {
    fn env(&self, role: Role, attempt: u32) -> LaunchEnv {
        LaunchEnv {
            role,
            config: self.config_path.clone(),
            token_file: self.token_path.clone(),
            bind: "127.0.0.1".to_owned(),
            output: self.opts.output.clone(),
            attempt,
        }
    }

    fn spawn(&self, procs: &mut Procs, role: Role, attempt: u32) -> Result<(), RunnerError> {
        let opts = self.opts;
        let mut cmd = match role {
            Role::Ps { .. } => {
                let mut cmd = Command::new(&opts.exe);
                // Every PS binds 127.0.0.1: each takes a free port for its status endpoint.
                cmd.arg("ps").env(contract::env::STATUS_PORT, "0");
                cmd
            }
            Role::Worker { .. } => {
                let mut cmd = Command::new(&opts.exe);
                cmd.arg("worker").arg("--data-dir").arg(&opts.data_dir).args(&opts.worker_args);
                cmd
            }
            Role::Launcher { .. } => {
                // The same launch path as on Kubernetes; without a hostfile mpirun starts the
                // ranks here, more of them than this machine may have cores.
                let mut cmd = Command::new(&opts.exe);
                cmd.args(["launcher", "--oversubscribe", "--", "--data-dir"])
                    .arg(&opts.data_dir)
                    .args(&opts.worker_args);
                cmd
            }
        };
        let name = match role {
            Role::Ps { index } => format!("ps-{index}"),
            Role::Worker { group, rank } => format!("worker-{group}-{rank}"),
            Role::Launcher { group } => format!("launcher-{group}"),
        };
        let log = self.logs.join(format!("{name}.{attempt}.log"));
        let stderr = std::fs::File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        use std::os::unix::process::CommandExt;
        cmd.envs(self.env(role, attempt).to_vars())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .process_group(0);
        // The kernel kills the child if the runner dies without cleaning up (e.g. SIGKILL).
        die_with_parent(&mut cmd, libc::SIGKILL);
        let mut child = cmd.spawn().map_err(io(format!(
            "starting {role} ({}); is it installed and executable?",
            cmd.get_program().to_string_lossy()
        )))?;
        let id = procs.next_id;
        procs.next_id += 1;
        if let Some(stdout) = child.stdout.take() {
            let tx = self.lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send((id, line)).is_err() {
                        break;
                    }
                }
            });
        }
        procs.list.push(Proc { id, role, attempt, child, log, exit: None });
        Ok(())
    }

    fn spawn_unit(&self, procs: &mut Procs, unit: Unit, attempt: u32) -> Result<(), RunnerError> {
        match unit {
            Unit::Ps(index) => self.spawn(procs, Role::Ps { index }, attempt),
            Unit::Group(group) if self.opts.spec.workers.backend == Backend::Mpi => {
                self.spawn(procs, Role::Launcher { group }, attempt)
            }
            Unit::Group(group) => {
                for rank in 0..self.opts.spec.workers.group_size {
                    self.spawn(procs, Role::Worker { group, rank }, attempt)?;
                }
                Ok(())
            }
        }
    }
}

/// Checks that every chaos target exists in the job.
pub fn check_chaos(spec: &TrainingJobSpec, chaos: &[Chaos]) -> Result<(), RunnerError> {
    for c in chaos {
        let ok = match c.target {
            Role::Ps { index } => index < spec.parameter_servers.replicas,
            Role::Worker { group, rank } => group < spec.workers.groups && rank < spec.workers.group_size,
            Role::Launcher { group } => group < spec.workers.groups,
        };
        if !ok {
            return Err(RunnerError::Config(format!(
                "--chaos {c}: the job has {} parameter server(s) and {} group(s) of {} rank(s); \
                 name one of them",
                spec.parameter_servers.replicas, spec.workers.groups, spec.workers.group_size
            )));
        }
    }
    Ok(())
}

#[derive(Default)]
struct UnitState {
    failing: Option<(Instant, Vec<Failure>)>,
    start_at: Option<Instant>,
    done: bool,
}

/// Makes the kernel send `signal` to the process `cmd` starts when the process that started it
/// dies (Linux `PR_SET_PDEATHSIG`; nothing elsewhere), so no child outlives a killed parent.
pub fn die_with_parent(cmd: &mut Command, signal: libc::c_int) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe and allocates nothing, as pre_exec requires.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, signal) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (cmd, signal);
}

/// Runs the job to the end; `on_event` sees every [`Event`], the last one `Finished`.
pub fn run(opts: &Options, on_event: &mut dyn FnMut(&Event)) -> Result<(), RunnerError> {
    let spec = &opts.spec;
    check_chaos(spec, &opts.chaos)?;
    install_signal_handlers();
    INTERRUPTED.store(false, Ordering::SeqCst);
    let started = Instant::now();

    // The model for the final evaluation; loading the data now fails early when it is missing.
    let data = crate::compute::data::load(&spec.data, &opts.data_dir, spec.training.seed)
        .map_err(|e| RunnerError::Config(e.to_string()))?;
    let world = (spec.workers.groups * spec.workers.group_size).max(1) as usize;
    let mut eval =
        Trainer::new(spec, data, &Device::Cpu, 0, world).map_err(|e| RunnerError::Config(e.to_string()))?;

    let logs = opts.output.join("logs");
    std::fs::create_dir_all(&logs).map_err(io(format!("creating {}", logs.display())))?;
    if !opts.resume {
        // A fresh run: the PS shards and an allreduce group would resume from these.
        let old = (0..spec.parameter_servers.replicas)
            .map(|index| format!("ps-{index}"))
            .chain(std::iter::once("checkpoints".to_owned()));
        for name in old {
            let dir = opts.output.join(name);
            if dir.exists() {
                std::fs::remove_dir_all(&dir)
                    .map_err(io(format!("removing the old checkpoints in {}", dir.display())))?;
            }
        }
    }
    let config = local_config(&opts.job_name, spec)?;
    let config_path = opts.output.join(contract::CONFIG_FILE);
    write_private(&config_path, &config.to_json())?;
    let token = random_token()?;
    let token_path = opts.output.join("token");
    write_private(&token_path, &token)?;

    let (tx, rx) = mpsc::channel();
    let launcher = Launcher { opts, config_path, token_path, logs, lines: tx };
    let mut procs = Procs { list: Vec::new(), next_id: 0 };
    let mut sup = Supervisor::new(spec.run_policy.clone());
    let mut units: BTreeMap<Unit, UnitState> = BTreeMap::new();
    for index in 0..spec.parameter_servers.replicas {
        units.insert(Unit::Ps(index), UnitState::default());
        launcher.spawn_unit(&mut procs, Unit::Ps(index), 0)?;
    }
    for group in 0..spec.workers.groups {
        units.insert(Unit::Group(group), UnitState::default());
        launcher.spawn_unit(&mut procs, Unit::Group(group), 0)?;
    }
    on_event(&Event::Started {
        job: opts.job_name.clone(),
        processes: procs.list.len(),
        total_steps: eval.total_steps(),
        output: opts.output.display().to_string(),
    });

    let mut merged = Merged::default();
    let mut fired: BTreeSet<usize> = BTreeSet::new();
    let mut steps = 0u64;
    let mut final_accuracy: Option<f64> = None;
    loop {
        if INTERRUPTED.load(Ordering::SeqCst) {
            procs.stop_all();
            return Err(RunnerError::Interrupted);
        }
        // Progress lines.
        let mut batch = Vec::new();
        if let Ok(msg) = rx.recv_timeout(Duration::from_millis(100)) {
            batch.push(msg);
            batch.extend(rx.try_iter());
        }
        for (id, text) in batch {
            // Lines of processes that were already replaced are stale.
            let Some(p) = procs.list.iter().find(|p| p.id == id) else { continue };
            let current = sup.attempt(p.unit()) == p.attempt;
            match progress::parse(&text) {
                Some(Line::Progress { group, step, loss, accuracy, samples }) if current => {
                    let at = merged.record(group, step, loss, accuracy, samples);
                    on_event(&Event::Progress {
                        step: at,
                        group,
                        group_step: step,
                        loss: merged.loss(),
                        accuracy: merged.accuracy(),
                        samples: merged.samples(),
                    });
                }
                Some(Line::Status { addr }) if current && p.role == (Role::Ps { index: 0 }) => {
                    on_event(&Event::Status { ps: 0, addr });
                }
                Some(Line::Finished { steps: s, accuracy, rank, .. }) if current => {
                    steps = steps.max(s);
                    if rank == 0 && accuracy.is_some() {
                        final_accuracy = accuracy;
                    }
                }
                _ => {}
            }
        }
        // Chaos.
        for (i, c) in opts.chaos.iter().enumerate() {
            if fired.contains(&i) || merged.step() < c.step {
                continue;
            }
            let target = match (c.target, spec.workers.backend) {
                (Role::Worker { group, .. }, Backend::Mpi) => Role::Launcher { group },
                (t, _) => t,
            };
            if let Some(p) = procs.list.iter().find(|p| p.role == target && p.exit.is_none()) {
                let pid = p.child.id() as libc::pid_t;
                // SAFETY: kill(2) touches no memory. An mpirun launcher is killed with its ranks.
                unsafe {
                    libc::kill(
                        if matches!(target, Role::Launcher { .. }) { -pid } else { pid },
                        libc::SIGKILL,
                    )
                };
                fired.insert(i);
                on_event(&Event::Chaos { target: c.target.to_string(), step: merged.step() });
            }
        }
        // Exits.
        let now = Instant::now();
        for p in procs.list.iter_mut().filter(|p| p.exit.is_none()) {
            let status = p.child.try_wait().map_err(io(format!("waiting for {}", p.role)))?;
            let Some(status) = status else { continue };
            let exit = Exit::from_status(status);
            p.exit = Some(exit);
            let unit = Unit::of(p.role);
            if exit.success() && matches!(unit, Unit::Ps(_)) {
                return Err(RunnerError::Failed(format!(
                    "{} stopped (exit code 0) while training ran; was it stopped from outside? {}",
                    p.role,
                    log_tail(&p.log)
                )));
            }
            if !exit.success() {
                let state = units.entry(unit).or_default();
                let (_, failures) = state.failing.get_or_insert_with(|| (now, Vec::new()));
                failures.push(Failure { role: p.role, exit });
            }
        }
        // Groups whose every process finished cleanly are done.
        for (unit, state) in units.iter_mut() {
            if let Unit::Group(_) = unit
                && !state.done
                && state.failing.is_none()
                && state.start_at.is_none()
            {
                let mine: Vec<&Proc> = procs.list.iter().filter(|p| p.unit() == *unit).collect();
                if !mine.is_empty() && mine.iter().all(|p| p.exit.is_some_and(Exit::success)) {
                    state.done = true;
                }
            }
        }
        // Failed units: judge once their processes ended or settled.
        let failing: Vec<Unit> = units.iter().filter(|(_, s)| s.failing.is_some()).map(|(u, _)| *u).collect();
        for unit in failing {
            let since = units.get(&unit).and_then(|s| s.failing.as_ref()).map_or(now, |f| f.0);
            let all_ended = procs.list.iter().filter(|p| p.unit() == unit).all(|p| p.exit.is_some());
            if !all_ended && now.duration_since(since) < SETTLE {
                continue;
            }
            // A group relaunched for a PS restart earlier in this pass has nothing left to judge.
            let Some((_, failures)) = units.get_mut(&unit).and_then(|s| s.failing.take()) else { continue };
            let logs: Vec<String> = failures
                .iter()
                .filter_map(|f| procs.list.iter().find(|p| p.role == f.role))
                .map(|p| log_tail(&p.log))
                .collect();
            procs.kill_where(|p| p.unit() != unit);
            match sup.on_failure(unit, &failures) {
                Decision::Fail(message) => {
                    procs.stop_all();
                    return Err(RunnerError::Failed(format!("{message}\n{}", logs.join("\n"))));
                }
                Decision::Restart { unit, attempt, backoff, message } => {
                    let (role, index) = match unit {
                        Unit::Ps(i) => ("ps", i),
                        Unit::Group(g) => ("group", g),
                    };
                    on_event(&Event::Restart { role, index, attempt, message });
                    let at = now + backoff;
                    if let Some(s) = units.get_mut(&unit) {
                        s.start_at = Some(at);
                    }
                    if let Unit::Group(g) = unit {
                        merged.restart(g);
                    }
                    if let Unit::Ps(ps) = unit {
                        // The workers lose this PS; relaunch every unfinished group with it.
                        let groups: Vec<Unit> = units
                            .iter()
                            .filter(|(u, s)| matches!(u, Unit::Group(_)) && !s.done)
                            .map(|(u, _)| *u)
                            .collect();
                        for g in groups {
                            procs.kill_where(|p| p.unit() != g);
                            let attempt = sup.relaunch(g);
                            if let Some(s) = units.get_mut(&g) {
                                s.failing = None;
                                s.start_at = Some(at);
                            }
                            if let Unit::Group(index) = g {
                                merged.restart(index);
                                on_event(&Event::Restart {
                                    role: "group",
                                    index,
                                    attempt,
                                    message: format!(
                                        "group {index} relaunched because parameter server {ps} restarted"
                                    ),
                                });
                            }
                        }
                    }
                }
            }
        }
        // Units whose back-off ended start again.
        for (unit, state) in units.iter_mut() {
            if state.start_at.is_some_and(|at| at <= Instant::now()) {
                state.start_at = None;
                launcher.spawn_unit(&mut procs, *unit, sup.attempt(*unit))?;
            }
        }
        if units.iter().filter(|(u, _)| matches!(u, Unit::Group(_))).all(|(_, s)| s.done) {
            break;
        }
    }

    // Every group finished: read the final model from the PS and evaluate it.
    let (test_accuracy, test_loss) = if config.parameter_servers.is_empty() {
        let accuracy = final_accuracy
            .ok_or_else(|| RunnerError::Eval("no worker reported a final test accuracy".into()))?;
        (accuracy, None)
    } else {
        let servers: Vec<String> = config.parameter_servers.iter().map(Endpoint::to_string).collect();
        let total = eval.params().len();
        let mut client_config = ClientConfig::observer(servers, token);
        client_config.total_len = total as u64;
        let mut client = PsClient::connect(client_config).map_err(|e| RunnerError::Eval(e.to_string()))?;
        let mut weights = vec![0f32; total];
        client.pull(0, &mut weights).map_err(|e| RunnerError::Eval(e.to_string()))?;
        drop(client);
        eval.set_params(&weights).map_err(|e| RunnerError::Eval(e.to_string()))?;
        let result = eval.evaluate().map_err(|e| RunnerError::Eval(e.to_string()))?;
        (result.accuracy, Some(result.loss))
    };
    procs.stop_all();
    let wall_seconds = started.elapsed().as_secs_f64();
    on_event(&Event::Finished {
        test_accuracy,
        test_loss,
        steps: if steps > 0 { steps } else { eval.total_steps() },
        samples_per_second: merged.samples() as f64 / wall_seconds.max(1e-9),
        wall_seconds,
        restarts: sup.restarts(),
    });
    Ok(())
}
