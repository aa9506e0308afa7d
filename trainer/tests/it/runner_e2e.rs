//! `tandem train -f` on multi-process jobs, end to end: real `tandem ps` and `tandem worker`
//! processes on loopback, started, supervised and stopped by the local runner.
//!
//! Needs the MNIST-5k sample in `data/` (`make data`). The jobs run one at a time: each one already
//! keeps six processes busy.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Lines};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Stdio};

use crate::runner_support::{
    Run, example, manifest, one_job_at_a_time, processes_of, set, train, train_command,
};
use tandem_api::contract::JobConfig;

/// A fresh folder (kept while the returned `TempDir` lives) holding the hybrid example with `edit`
/// applied to its manifest; returns the folder, the job's output folder in it and the manifest.
fn hybrid_job(edit: impl FnOnce(&mut serde_yaml::Value)) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let file = manifest(tmp.path(), "mnist-hybrid.yaml", edit);
    (tmp, out, file)
}

/// Runs [`hybrid_job`] with `extra` arguments to its end; returns the folder, the output folder and
/// the run.
fn run_hybrid(
    edit: impl FnOnce(&mut serde_yaml::Value),
    extra: &[&str],
) -> (tempfile::TempDir, PathBuf, Run) {
    let (tmp, out, file) = hybrid_job(edit);
    let run = train(&file, &out, extra);
    (tmp, out, run)
}

/// Runs the hybrid example with a 1-second restart backoff under `--chaos <chaos>`.
fn run_hybrid_under_chaos(chaos: &str) -> (tempfile::TempDir, PathBuf, Run) {
    run_hybrid(|doc| set(doc, &["spec", "runPolicy", "backoffSeconds"], 1.into()), &["--chaos", chaos])
}

/// A job of the hybrid example set to 100,000 steps, started in the background and read until its
/// workers train (their first progress line).
struct EndlessJob {
    child: Child,
    out: PathBuf,
    /// The rest of its stdout, kept open: the runner goes on writing progress lines.
    _lines: Lines<BufReader<ChildStdout>>,
    _tmp: tempfile::TempDir,
}

fn start_endless_job(stderr: Stdio) -> EndlessJob {
    let (tmp, out, file) = hybrid_job(|doc| set(doc, &["spec", "training", "steps"], 100_000.into()));
    let mut child = train_command(&file, &out).stdout(Stdio::piped()).stderr(stderr).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.any(|l| l.is_ok_and(|l| l.contains("\"progress\""))), "the job never reported progress");
    EndlessJob { child, out, _lines: lines, _tmp: tmp }
}

/// A batch-norm model through the PS: the final evaluation uses the groups' running statistics
/// that shard 0 holds (with fresh ones a ResNet scores about chance, 0.1), so it agrees with what
/// the workers measured at the same step.
///
/// The learning rate decays to zero (cosine): at a constant 0.05 with momentum the weights still
/// move fast at step 200, the running averages trail them, and evaluation-mode accuracy scattered
/// from 0.2 to 0.9 while the training loss was the same in every run — PyTorch's BatchNorm2d does
/// the same on this recipe (0.56 to 0.87 over 8 seeds, 0.92 with batch statistics). Decayed, 25
/// runs scored 0.917 to 0.937, the workers within 0.01 of the PS.
#[test]
fn a_resnet_trained_through_the_ps_is_evaluated_with_its_batch_norm_statistics() {
    let _one = one_job_at_a_time();
    let (_tmp, _out, run) = run_hybrid(
        |doc| {
            set(doc, &["spec", "model"], serde_yaml::from_str("{kind: resnet, depth: 8, width: 4}").unwrap());
            set(doc, &["spec", "training", "steps"], 200.into());
            set(doc, &["spec", "training", "evalEverySteps"], 200.into());
            set(
                doc,
                &["spec", "training", "optimizer", "schedule"],
                serde_yaml::from_str("{kind: cosine}").unwrap(),
            );
        },
        &[],
    );
    assert!(run.success, "stderr:\n{}", run.stderr);
    let done = run.finished();
    let final_accuracy = done["test_accuracy"].as_f64().unwrap();
    let measured: Vec<f64> = run.of("progress").iter().filter_map(|p| p["accuracy"].as_f64()).collect();
    let last = *measured.last().unwrap_or_else(|| panic!("no worker reported an accuracy: {:?}", run.events));
    assert!(final_accuracy >= 0.85, "final accuracy {final_accuracy} (the workers measured {last}): {done}");
    // The PS weights also hold the other group's last pushes, and shard 0 the groups' mean
    // statistics: close to what a worker measured, not equal; fresh statistics would be some 0.8
    // below.
    assert!(
        (final_accuracy - last).abs() <= 0.05,
        "the PS weights score {final_accuracy}, the workers measured {last} at the last step"
    );
}

#[test]
fn mnist_hybrid_trains_to_the_target_through_the_launch_contract() {
    let _one = one_job_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let run = train(&example("mnist-hybrid.yaml"), &out, &[]);
    assert!(run.success, "stderr:\n{}", run.stderr);
    let done = run.finished();
    assert!(done["test_accuracy"].as_f64().unwrap() >= 0.90, "{done}");
    assert!(done["test_loss"].as_f64().unwrap().is_finite(), "{done}");
    assert_eq!(done["steps"], 600);
    assert_eq!(done["restarts"], 0);
    assert!(done["samples_per_second"].as_f64().unwrap() > 0.0, "{done}");
    assert_eq!(run.of("started")[0]["processes"], 6, "2 PS and 2 groups of 2 ranks");
    assert!(!run.of("progress").is_empty(), "progress is merged from the workers");

    // The same contract the operator writes: job.json with loopback endpoints, a private token.
    let config = JobConfig::from_json(&std::fs::read_to_string(out.join("job.json")).unwrap()).unwrap();
    assert_eq!(config.parameter_servers.len(), 2);
    assert_eq!(config.groups.len(), 2);
    assert!(
        config.groups.iter().all(|g| g.peers.len() == 2 && g.peers.iter().all(|p| p.host == "127.0.0.1"))
    );
    use std::os::unix::fs::PermissionsExt;
    let token = std::fs::metadata(out.join("token")).unwrap();
    assert_eq!(token.permissions().mode() & 0o077, 0, "only the owner reads the token");
    assert!(token.len() >= 32);
    for log in ["ps-0.0.log", "ps-1.0.log", "worker-0-0.0.log", "worker-1-1.0.log"] {
        assert!(out.join("logs").join(log).exists(), "{log}");
    }
    // The 4 ranks share this machine's CPUs instead of each sizing its pool to all of them.
    let share = (std::thread::available_parallelism().unwrap().get() / 4).max(1);
    for log in ["worker-0-0.0.log", "worker-0-1.0.log", "worker-1-0.0.log", "worker-1-1.0.log"] {
        let text = std::fs::read_to_string(out.join("logs").join(log)).unwrap();
        assert!(
            text.contains(&format!("threads={share}")),
            "{log} should compute on {share} threads:\n{text}"
        );
    }
    assert!(processes_of(&out).is_empty(), "every child stopped with the job");
}

#[test]
fn a_killed_worker_restarts_only_its_group_and_the_job_meets_the_target() {
    let _one = one_job_at_a_time();
    let (_tmp, out, run) = run_hybrid_under_chaos("kill:worker:1:1@200");
    assert!(run.success, "stderr:\n{}", run.stderr);
    let chaos = run.of("chaos");
    assert_eq!(chaos.len(), 1);
    assert_eq!(chaos[0]["target"], "worker 1/1");
    let restarts = run.of("restart");
    assert_eq!(restarts.len(), 1, "only group 1 restarts: {restarts:?}");
    assert_eq!((restarts[0]["role"].as_str(), restarts[0]["index"].as_u64()), (Some("group"), Some(1)));
    assert_eq!(restarts[0]["attempt"], 1);
    let done = run.finished();
    assert_eq!(done["restarts"], 1);
    assert!(done["test_accuracy"].as_f64().unwrap() >= 0.90, "{done}");
    assert_eq!(done["steps"], 600, "{done}");
    // The restarted group resumed its step count from the PS instead of starting again at 0,
    // and ended at the job's step count.
    let after = run.events.iter().position(|e| e["event"] == "restart").unwrap();
    let group1: Vec<u64> = run.events[after..]
        .iter()
        .filter(|e| e["event"] == "progress" && e["group"] == 1)
        .map(|e| e["group_step"].as_u64().unwrap())
        .collect();
    assert!(group1.first().is_some_and(|&s| s > 150), "group 1 resumed near step 200: {group1:?}");
    assert_eq!(group1.last(), Some(&600), "group 1 ended at the job's step count: {group1:?}");
    let logs = out.join("logs");
    assert!(logs.join("worker-1-0.1.log").exists() && logs.join("worker-1-1.1.log").exists());
    assert!(!logs.join("worker-0-0.1.log").exists(), "group 0 kept its first attempt");
    assert!(!logs.join("ps-0.1.log").exists() && !logs.join("ps-1.1.log").exists(), "the PS kept running");
}

#[test]
fn an_mpi_backend_job_runs_each_group_under_mpirun_and_completes() {
    let _one = one_job_at_a_time();
    let (_tmp, out, run) = run_hybrid(
        |doc| {
            set(doc, &["spec", "workers", "backend"], "mpi".into());
            set(doc, &["spec", "training", "steps"], 120.into());
            set(doc, &["spec", "training", "evalEverySteps"], 60.into());
        },
        &[],
    );
    assert!(run.success, "stderr:\n{}", run.stderr);
    let done = run.finished();
    assert_eq!(done["steps"], 120, "{done}");
    assert_eq!(done["restarts"], 0, "{done}");
    assert!(done["test_accuracy"].as_f64().unwrap() >= 0.5, "it learned: {done}");
    assert_eq!(run.of("started")[0]["processes"], 4, "2 PS and one launcher per group");
    let status = run.of("status");
    assert!(
        status.len() == 1
            && status[0]["ps"] == 0
            && status[0]["addr"].as_str().unwrap().starts_with("127.0.0.1:"),
        "PS 0's status endpoint is shown once: {status:?}"
    );
    let ps1 = std::fs::read_to_string(out.join("logs/ps-1.0.log")).unwrap();
    assert!(!ps1.contains("cannot serve the status endpoint"), "each PS has its own status port:\n{ps1}");
    let samples: Vec<u64> = run.of("progress").iter().map(|e| e["samples"].as_u64().unwrap()).collect();
    assert!(samples.windows(2).all(|w| w[0] <= w[1]) && samples[samples.len() - 1] > 0, "{samples:?}");
    for group in [0, 1] {
        let last = run.of("progress").into_iter().rfind(|e| e["group"] == group).cloned();
        assert_eq!(
            last.map(|e| e["group_step"].clone()),
            Some(120.into()),
            "group {group} trained to the end"
        );
    }
    assert!(processes_of(&out).is_empty(), "every child stopped with the job");
}

#[test]
fn a_killed_ps_resumes_from_its_checkpoint_and_the_job_completes() {
    let _one = one_job_at_a_time();
    let (_tmp, out, run) = run_hybrid_under_chaos("kill:ps:0@200");
    assert!(run.success, "stderr:\n{}", run.stderr);
    let restarts = run.of("restart");
    let ps: Vec<_> = restarts.iter().filter(|r| r["role"] == "ps").collect();
    assert_eq!(ps.len(), 1, "{restarts:?}");
    assert_eq!((ps[0]["index"].as_u64(), ps[0]["attempt"].as_u64()), (Some(0), Some(1)));
    let done = run.finished();
    let logs: String = ["worker-0-0.1.log", "ps-0.1.log", "ps-1.0.log"]
        .iter()
        .map(|f| format!("== {f}\n{}", std::fs::read_to_string(out.join("logs").join(f)).unwrap_or_default()))
        .collect();
    assert_eq!(done["restarts"], 1, "the groups relaunched with the PS do not count: {restarts:?}\n{logs}");
    assert!(done["test_accuracy"].as_f64().unwrap() >= 0.90, "{done}");
    let log = std::fs::read_to_string(out.join("logs/ps-0.1.log")).unwrap();
    assert!(log.contains("resumed from checkpoint"), "PS 0 resumed from its checkpoint:\n{log}");
    assert!(!out.join("logs/ps-1.1.log").exists(), "PS 1 kept running");
}

#[test]
fn past_max_restarts_the_job_fails_naming_the_process_and_leaves_no_process() {
    let _one = one_job_at_a_time();
    let (_tmp, out, run) = run_hybrid(
        |doc| set(doc, &["spec", "runPolicy", "maxRestarts"], 0.into()),
        &["--chaos", "kill:worker:0:1@100"],
    );
    assert!(!run.success, "the job must fail");
    assert!(run.of("finished").is_empty());
    assert!(run.stderr.contains("worker 0/1 was killed by signal 9"), "{}", run.stderr);
    assert!(run.stderr.contains("all 0 restarts of runPolicy.maxRestarts"), "{}", run.stderr);
    assert!(processes_of(&out).is_empty(), "a failed job stops every child");
}

#[test]
fn sigint_stops_every_child() {
    let _one = one_job_at_a_time();
    // Once the workers train, press Ctrl-C.
    let mut job = start_endless_job(Stdio::piped());
    assert!(!processes_of(&job.out).is_empty());
    // SAFETY: kill(2) with our own child's pid.
    unsafe { libc::kill(job.child.id() as i32, libc::SIGINT) };
    let status = job.child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut job.child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(processes_of(&job.out).is_empty(), "no child outlives the runner");
}

#[test]
fn a_killed_runner_takes_its_children_with_it() {
    let _one = one_job_at_a_time();
    let mut job = start_endless_job(Stdio::null());
    job.child.kill().unwrap();
    job.child.wait().unwrap();
    // The kernel delivers the children's parent-death signal as the runner dies; wait for them to go.
    let mut left = processes_of(&job.out);
    for _ in 0..600 {
        if left.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        left = processes_of(&job.out);
    }
    assert!(left.is_empty(), "children outlived a SIGKILLed runner: {left:?}");
}

/// The PS checkpoint files in `out` by name, with their bytes.
fn ps_checkpoints(out: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    for shard in ["ps-0", "ps-1"] {
        for entry in std::fs::read_dir(out.join(shard)).unwrap() {
            let entry = entry.unwrap();
            files.push((
                format!("{shard}/{}", entry.file_name().to_string_lossy()),
                std::fs::read(entry.path()).unwrap(),
            ));
        }
    }
    files.sort();
    files
}

#[test]
fn after_the_runner_is_killed_resume_continues_the_step_counts_and_a_fresh_run_is_refused() {
    let _one = one_job_at_a_time();
    let (_tmp, out, file) = hybrid_job(|doc| {
        set(doc, &["spec", "training", "steps"], 300.into());
        set(doc, &["spec", "training", "checkpoint", "everySteps"], 40.into());
    });
    // Train until the merged step passes 150, then SIGKILL the runner (no chance to clean up).
    let mut child = train_command(&file, &out).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    // The runner's stdout stays open until it is killed, so that it sees no broken pipe first.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let passed = lines.by_ref().map_while(Result::ok).any(|l| {
        let e: serde_json::Value = serde_json::from_str(&l).unwrap_or_default();
        e["event"] == "progress" && e["step"].as_u64().is_some_and(|s| s >= 150)
    });
    assert!(passed, "the job never reached step 150");
    child.kill().unwrap();
    child.wait().unwrap();
    drop(lines);
    for _ in 0..600 {
        if processes_of(&out).is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(processes_of(&out).is_empty(), "children outlived the killed runner");
    let saved = ps_checkpoints(&out);
    assert!(!saved.is_empty(), "the shards checkpointed before the kill");

    // A run without --resume into the same folder is refused and touches no checkpoint.
    let fresh = train(&file, &out, &[]);
    assert!(!fresh.success, "a fresh run trained over the killed run's checkpoints");
    assert!(
        fresh.stderr.contains("holds the checkpoints of an earlier run") && fresh.stderr.contains("--resume"),
        "{}",
        fresh.stderr
    );
    assert_eq!(ps_checkpoints(&out), saved, "the earlier run's checkpoints are left as they were");

    // --resume: every group continues from the step the shards' checkpoints hold, not from 0.
    let resumed = train(&file, &out, &["--resume"]);
    assert!(resumed.success, "stderr:\n{}", resumed.stderr);
    assert_eq!(resumed.finished()["steps"], 300, "{}", resumed.finished());
    for group in [0, 1] {
        let steps: Vec<u64> = resumed
            .of("progress")
            .iter()
            .filter(|e| e["group"] == group)
            .map(|e| e["group_step"].as_u64().unwrap())
            .collect();
        assert!(steps.first().is_some_and(|&s| s > 100), "group {group} resumed near step 150: {steps:?}");
        assert_eq!(steps.last(), Some(&300), "group {group} ended at the job's step count: {steps:?}");
    }
    assert!(
        resumed.finished()["test_accuracy"].as_f64().unwrap() >= 0.8,
        "the resumed model kept what it learned: {}",
        resumed.finished()
    );
}
