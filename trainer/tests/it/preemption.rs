//! Preemption with real `tandem worker` and `tandem ps` processes on loopback: SIGTERM (the
//! kubelet's notice of an eviction, a preemption, a node drain) stops a worker group at a step
//! boundary and a parameter server after its last checkpoint, both with the retryable
//! [`contract::EXIT_PREEMPTED`], and the restarted processes resume at exactly the step they
//! stopped at: no completed step is lost.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::ps_common::{Job, eventually, loopback_endpoints};
use tandem_api::contract::{self, Role};
use tandem_compute::checkpoint::{self, Checkpoint};

const STEPS: u64 = 3000;

fn spec(algorithm: &str, group_size: u32, replicas: u32) -> serde_json::Value {
    serde_json::json!({
        "model": {"kind": "mlp", "hidden": [32]},
        "data": {"source": "synthetic", "batchSize": 16, "syntheticSamples": 1200},
        "training": {
            "algorithm": algorithm,
            "steps": STEPS,
            "evalEverySteps": 0,
            "optimizer": {"kind": "sgd", "learningRate": 0.05, "momentum": 0.9},
            // Only the last step's: a checkpoint that exists mid-run is the preemption's.
            "checkpoint": {"everySteps": 0}
        },
        "parameterServers": {"replicas": replicas},
        "workers": {"groups": 1, "groupSize": group_size, "minGroups": 1, "maxGroups": 1, "backend": "tcp"}
    })
}

/// A running `tandem worker` whose stdout lines are collected as they come.
pub(crate) struct Worker {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    /// The thread that collects stdout: it ends when the pipe closes, with every line read.
    reader: Option<std::thread::JoinHandle<()>>,
    log: PathBuf,
}

impl Worker {
    fn spawn(job: &Job, rank: u32, attempt: u32) -> Self {
        Self::spawn_with(job, rank, attempt, &[])
    }

    /// Rank `rank` of group 0, attempt `attempt`, with the variables `env` added.
    pub(crate) fn spawn_with(job: &Job, rank: u32, attempt: u32, env: &[(&str, &str)]) -> Self {
        Self::spawn_in(job, 0, rank, attempt, env)
    }

    /// Rank `rank` of group `group`, attempt `attempt`, with the variables `env` added.
    pub(crate) fn spawn_in(job: &Job, group: u32, rank: u32, attempt: u32, env: &[(&str, &str)]) -> Self {
        let launch = job.launch(Role::Worker { group, rank }, attempt);
        let log = job.dir.path().join(format!("worker-{group}-{rank}.{attempt}.log"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(["worker", "--device", "cpu"])
            .envs(launch.to_vars())
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (stdout, sink) = (child.stdout.take().unwrap(), lines.clone());
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Self { child, lines, reader: Some(reader), log }
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The steps of the progress lines printed so far.
    fn progress_steps(&self) -> Vec<u64> {
        let lines = self.lines.lock().unwrap();
        lines
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["event"] == "progress")
            .filter_map(|v| v["progress"]["step"].as_u64())
            .collect()
    }

    pub(crate) fn finished(&self) -> serde_json::Value {
        let lines = self.lines.lock().unwrap();
        let last = lines.last().unwrap_or_else(|| panic!("no output; log:\n{}", self.log_text()));
        let v: serde_json::Value = serde_json::from_str(last).unwrap();
        assert_eq!(v["event"], "finished", "{v}");
        v
    }

    pub(crate) fn wait_for_progress(&self) {
        eventually("a progress line", || !self.progress_steps().is_empty());
    }

    pub(crate) fn sigterm(&self) {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }

    pub(crate) fn wait(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Only the child held the pipe's write end: the reader ends with the last line.
                if let Some(reader) = self.reader.take() {
                    reader.join().unwrap();
                }
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the worker did not exit within {within:?}:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The step in a preempted worker's "stopped at step K of N" message.
pub(crate) fn stopped_at(log: &str) -> u64 {
    let (_, rest) = log.split_once("stopped at step ").unwrap_or_else(|| panic!("no stop message:\n{log}"));
    rest.split(' ').next().unwrap().parse().unwrap()
}

/// The newest PS checkpoint of shard 0: its version.
fn ps_checkpoint_version(dir: &Path) -> u64 {
    let files = tandem::ps::server::checkpoint::files(dir).unwrap();
    let newest = files.last().unwrap_or_else(|| panic!("no PS checkpoint in {}", dir.display()));
    let stored = tandem::ps::server::checkpoint::decode(&std::fs::read(newest).unwrap()).unwrap();
    stored.snapshot.version
}

#[test]
fn a_sigtermed_rank_stops_its_group_at_a_checkpointed_step_and_the_restart_resumes_there() {
    let _one = crate::runner_support::one_job_at_a_time();
    let job = Job::with_spec(spec("allreduce", 2, 0));
    job.write_topology(&[], &[loopback_endpoints(2)]);
    let mut ranks = [Worker::spawn(&job, 0, 0), Worker::spawn(&job, 1, 0)];
    ranks[0].wait_for_progress();
    // Rank 1 gets the notice (its pod is the one evicted); rank 0 checkpoints for the group.
    ranks[1].sigterm();
    for (r, w) in ranks.iter_mut().enumerate() {
        let status = w.wait(Duration::from_secs(60));
        assert_eq!(status.code(), Some(contract::EXIT_PREEMPTED), "rank {r}: {status:?}\n{}", w.log_text());
    }
    let log = ranks[0].log_text();
    let step = stopped_at(&log);
    assert!(step < STEPS, "the run was stopped before its end: {log}");
    // The checkpoint is of the last completed step: past rank 0's last report, at most the next
    // report's step (a stop agreed at a report step comes before that step's report).
    let last_report = *ranks[0].progress_steps().last().unwrap();
    assert!(last_report <= step && step <= last_report + 10, "reported {last_report}, stopped at {step}");
    let newest = checkpoint::latest(&job.output().join("checkpoints")).unwrap().expect("a checkpoint");
    assert_eq!(newest, checkpoint::step_path(&job.output().join("checkpoints"), step));
    assert_eq!(Checkpoint::read(&newest).unwrap().meta.step, step);
    assert!(ranks[1].log_text().contains(&format!("stopped at step {step} ")), "{}", ranks[1].log_text());

    // The restarted group resumes at exactly that step and runs to the end.
    let mut again = [Worker::spawn(&job, 0, 1), Worker::spawn(&job, 1, 1)];
    for (r, w) in again.iter_mut().enumerate() {
        let status = w.wait(Duration::from_secs(300));
        assert!(status.success(), "rank {r} of the restarted group: {status:?}\n{}", w.log_text());
        let done = w.finished();
        assert_eq!(
            (done["start_step"].as_u64(), done["steps"].as_u64()),
            (Some(step), Some(STEPS)),
            "{done}"
        );
    }
    assert!(again[0].log_text().contains("resumed from checkpoint"), "{}", again[0].log_text());
}

#[test]
fn a_sigtermed_ps_job_worker_and_ps_exit_retryable_and_their_restarts_lose_no_step() {
    let _one = crate::runner_support::one_job_at_a_time();
    let job = Job::with_spec(spec("ps-sync", 1, 1));
    let mut ps = job.spawn_ps(0, 0);
    job.write_topology(std::slice::from_ref(&ps), &[loopback_endpoints(1)]);

    // The worker: SIGTERM stops it at a step boundary; the PS holds that step's weights.
    let mut worker = Worker::spawn(&job, 0, 0);
    worker.wait_for_progress();
    worker.sigterm();
    let status = worker.wait(Duration::from_secs(60));
    assert_eq!(status.code(), Some(contract::EXIT_PREEMPTED), "{status:?}\n{}", worker.log_text());
    let step = stopped_at(&worker.log_text());
    let last_report = *worker.progress_steps().last().unwrap();
    assert!(last_report <= step && step <= last_report + 10, "reported {last_report}, stopped at {step}");

    // Its next attempt continues from the PS at exactly that step.
    let mut worker = Worker::spawn(&job, 0, 1);
    eventually("the restarted worker to report", || worker.progress_steps().iter().any(|&s| s > step));
    let first = worker.progress_steps()[0];
    assert_eq!(first, (step / 10 + 1) * 10, "the first report after resuming at {step}");
    let log = worker.log_text();
    assert!(
        log.contains("resuming the group's step count") && log.contains(&format!("step={step}")),
        "{log}"
    );

    // The PS: SIGTERM writes its last checkpoint, then the retryable code.
    let status = ps.terminate();
    assert_eq!(status.code(), Some(contract::EXIT_PREEMPTED), "{status:?}\n{}", ps.log_text());
    let version = ps_checkpoint_version(&job.output().join("ps-0"));
    let reported = *worker.progress_steps().last().unwrap();
    assert!(version >= reported, "the checkpoint (version {version}) holds every reported step ({reported})");
    // The worker lost its PS: a retryable exit too.
    let status = worker.wait(Duration::from_secs(60));
    assert!(status.code().is_some_and(|c| c >= 128), "{status:?}\n{}", worker.log_text());

    // The restarted PS resumes from that checkpoint, and the group's next attempt at its step.
    let ps = job.spawn_ps(0, ps.port());
    eventually("the PS to resume", || ps.log_text().contains("resumed from checkpoint"));
    assert!(ps.log_text().contains(&format!("version={version}")), "{}", ps.log_text());
    let mut worker = Worker::spawn(&job, 0, 2);
    let status = worker.wait(Duration::from_secs(300));
    assert!(status.success(), "{status:?}\n{}", worker.log_text());
    let done = worker.finished();
    assert_eq!((done["start_step"].as_u64(), done["steps"].as_u64()), (Some(version), Some(STEPS)), "{done}");
}
