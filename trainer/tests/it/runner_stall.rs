//! The local runner's stall check with real processes: `tandem train -f` on one group — of a
//! ps-sync job with a real parameter server (one rank), or of an allreduce job (two ranks), which
//! has none —
//! whose worker is SIGSTOPped mid-run, so that no step advances. The runner declares the stall
//! after `runPolicy.stallTimeoutSeconds` (30 s, the least the CRD allows) and acts by
//! `stallPolicy`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::runner_support::{manifest, one_job_at_a_time, processes_of, set, train_command};

/// Generous: the stall takes 30 s, and the machine is shared.
const WAIT: Duration = Duration::from_secs(240);

/// `example` with one group of `size` ranks, 3000 steps and the stall check acting by `policy`.
fn stalling_job(dir: &Path, example: &str, size: u32, policy: &str) -> std::path::PathBuf {
    manifest(dir, example, |doc| {
        set(doc, &["spec", "workers", "groups"], 1.into());
        set(doc, &["spec", "workers", "groupSize"], size.into());
        set(doc, &["spec", "training", "steps"], 3000.into());
        set(doc, &["spec", "training", "checkpoint"], serde_yaml::from_str("{everySteps: 50}").unwrap());
        set(
            doc,
            &["spec", "runPolicy"],
            serde_yaml::from_str(&format!(
                "{{stallTimeoutSeconds: 30, stallPolicy: {policy}, maxRestarts: 2, backoffSeconds: 1}}"
            ))
            .unwrap(),
        );
    })
}

/// The pid of the job's worker 0/0 of attempt `attempt` (a child of the runner under `out`).
fn worker_pid(out: &Path, attempt: u32) -> i32 {
    let wanted = [b"TANDEM_ROLE=worker".to_vec(), format!("TANDEM_ATTEMPT={attempt}").into_bytes()];
    for pid in processes_of(out) {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
        if wanted.iter().all(|w| vars.contains(&w.as_slice())) {
            return pid.parse().unwrap();
        }
    }
    panic!("no worker of attempt {attempt} runs under {}", out.display())
}

/// A running `tandem train --output json`, its events read as they come.
struct Training {
    child: std::process::Child,
    events: mpsc::Receiver<serde_json::Value>,
    seen: Vec<serde_json::Value>,
    started: Instant,
    out: std::path::PathBuf,
}

impl Training {
    fn start(manifest: &Path, out: &Path) -> Self {
        let mut child = train_command(manifest, out)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(out.with_extension("stderr")).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, events) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let event =
                    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?} is not JSON: {e}"));
                if tx.send(event).is_err() {
                    break;
                }
            }
        });
        Self { child, events, seen: Vec::new(), started: Instant::now(), out: out.to_owned() }
    }

    /// Reads events until one matches `wanted`, and returns it.
    fn until(&mut self, what: &str, wanted: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        loop {
            let left = WAIT.saturating_sub(self.started.elapsed());
            match self.events.recv_timeout(left) {
                Ok(event) => {
                    self.seen.push(event.clone());
                    if wanted(&event) {
                        return event;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("no {what} within {WAIT:?}; events: {:#?}\n{}", self.seen, self.logs())
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("the run ended before {what}; events: {:#?}\n{}", self.seen, self.logs())
                }
            }
        }
    }

    /// The end of every process log of the run, for failure messages.
    fn logs(&self) -> String {
        let mut logs: Vec<_> = std::fs::read_dir(self.out.join("logs"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect();
        logs.sort();
        logs.insert(0, self.out.with_extension("stderr"));
        logs.iter()
            .map(|log| {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                format!("--- {}:\n{}", log.display(), lines[lines.len().saturating_sub(15)..].join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn kind(&self, kind: &str) -> Vec<&serde_json::Value> {
        self.seen.iter().filter(|e| e["event"] == kind).collect()
    }

    fn wait(mut self) -> (bool, Vec<serde_json::Value>) {
        while let Ok(event) = self.events.recv_timeout(WAIT) {
            self.seen.push(event);
        }
        (self.child.wait().unwrap().success(), self.seen)
    }
}

fn signal(pid: i32, signal: i32) {
    // SAFETY: kill(2) touches no memory.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "signal {signal} to {pid}");
}

#[test]
fn a_stopped_worker_is_reported_stalled_and_restart_group_restarts_it_and_the_job_finishes() {
    let _one = one_job_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut run = Training::start(&stalling_job(dir.path(), "mnist-ps-sync.yaml", 1, "RestartGroup"), &out);
    run.until("a progress past step 20", |e| e["event"] == "progress" && e["step"].as_u64() >= Some(20));
    let stopped_at = Instant::now();
    signal(worker_pid(&out, 0), libc::SIGSTOP);

    let stalled = run.until("the stall", |e| e["event"] == "stalled");
    assert!(stopped_at.elapsed() >= Duration::from_secs(29), "declared after the timeout, not before");
    assert_eq!(stalled["seconds"], 30);
    let message = stalled["message"].as_str().unwrap();
    assert!(message.contains("for 30 s") && message.contains("RestartGroup"), "{message}");
    let restart = run.until("the group's restart", |e| e["event"] == "restart");
    assert_eq!(
        (restart["role"].as_str(), restart["index"].as_u64(), restart["attempt"].as_u64()),
        (Some("group"), Some(0), Some(1))
    );
    assert!(restart["message"].as_str().unwrap().contains("the job stalled"), "{restart}");
    // The restarted group continues from the parameter server's step and the job ends.
    let (success, events) = run.wait();
    let finished = events.last().unwrap();
    assert!(success && finished["event"] == "finished", "{events:#?}");
    assert_eq!(finished["restarts"], 1, "one stall is one restart");
    assert!(finished["test_accuracy"].as_f64().unwrap() > 0.8, "{finished}");
    assert!(processes_of(&out).is_empty(), "the stopped worker was killed, not left behind");
}

#[test]
fn a_stopped_allreduce_worker_with_stall_policy_none_is_only_reported_and_the_job_goes_on_when_it_continues()
{
    let _one = one_job_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // No parameter server: the stall clock runs on the group's own progress lines. Two ranks (one
    // would train inside the runner's own process); the stopped one holds the other in its
    // allreduce for less than the collective timeout (60 s).
    let mut run = Training::start(&stalling_job(dir.path(), "mnist-allreduce.yaml", 2, "None"), &out);
    run.until("a progress past step 20", |e| e["event"] == "progress" && e["step"].as_u64() >= Some(20));
    let pid = worker_pid(&out, 0);
    signal(pid, libc::SIGSTOP);
    let stalled = run.until("the stall", |e| e["event"] == "stalled");
    let step = stalled["step"].as_u64().unwrap();
    // Reported only: the stopped process itself goes on when continued. Had anything been
    // restarted, a restart event would come before the stall's end, and the step would advance
    // in a worker of attempt 1, not in the stopped one.
    signal(pid, libc::SIGCONT);
    let unstalled = run.until("the stall's end", |e| e["event"] == "unstalled");
    assert!(unstalled["step"].as_u64().unwrap() > step, "{unstalled}");
    assert!(run.kind("restart").is_empty(), "nothing restarted while it stood still: {:#?}", run.seen);
    assert_eq!(worker_pid(&out, 0), pid, "the stopped worker itself continued");
    let (success, events) = run.wait();
    let finished = events.last().unwrap();
    assert!(success && finished["event"] == "finished", "{events:#?}");
    assert_eq!(finished["restarts"], 0);
    assert_eq!(events.iter().filter(|e| e["event"] == "stalled").count(), 1, "declared once");
}
