//! A user's own code as a job's workers (`workers.command`), through the real `tandem train`
//! binary: the plain PyTorch DDP script of `examples/pytorch/` under the launch contract for user
//! processes, with real PyTorch (Debian's `python3-torch`, run by `/usr/bin/python3`:
//! `scripts/install-deps.sh` installs it) on Fashion-MNIST (`make data`).
//!
//! The example's job is two groups of two ranks, each group one torch.distributed world over
//! gloo. Runs take [`one_job_at_a_time`]: four Python processes already fill this machine.

use std::path::{Path, PathBuf};

use crate::runner_support::{data_dir, example_yaml, one_job_at_a_time, repo, set};
use serde_json::Value;
use serde_yaml::Value as Yaml;

/// The accuracy a real run of the example clearly passes: 200 steps of the MLP reach about 0.83
/// on Fashion-MNIST's test set (measured 0.833 for one group of two ranks).
const ACCURACY: f64 = 0.75;

/// A run of `tandem train --output json` on a manifest beside `train.py`.
struct Run {
    success: bool,
    events: Vec<Value>,
    stderr: String,
}

impl Run {
    fn of(&self, kind: &str) -> Vec<&Value> {
        self.events.iter().filter(|e| e["event"] == kind).collect()
    }

    fn finished(&self) -> &Value {
        let last = self.events.last().unwrap_or_else(|| panic!("no events; stderr:\n{}", self.stderr));
        assert_eq!(last["event"], "finished", "stderr:\n{}", self.stderr);
        last
    }
}

/// A folder holding the example's script and its manifest with `edit` applied.
fn job_dir(name: &str, edit: impl FnOnce(&mut Yaml)) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(repo().join("examples/pytorch/train.py"), dir.path().join("train.py")).unwrap();
    let mut doc = example_yaml("pytorch/job.yaml");
    set(&mut doc, &["metadata", "name"], Yaml::from(name));
    edit(&mut doc);
    let manifest = dir.path().join("job.yaml");
    std::fs::write(&manifest, serde_yaml::to_string(&doc).unwrap()).unwrap();
    (dir, manifest)
}

/// Checks that Debian's PyTorch is there, with a message that says how to get it.
fn require_torch() {
    let ok = std::process::Command::new("/usr/bin/python3")
        .args(["-c", "import torch, numpy"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "/usr/bin/python3 cannot import torch: run scripts/install-deps.sh (Debian's python3-torch)");
    assert!(
        data_dir().join("fashion-mnist/train-images-idx3-ubyte.gz").exists(),
        "data/fashion-mnist is missing: run `make data`"
    );
}

fn train(manifest: &Path, out: &Path, extra: &[&str]) -> Run {
    require_torch();
    // `python3` in the example's command is Debian's, which sees python3-torch.
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["train", "--output", "json", "-f"])
        .arg(manifest)
        .arg("--output-dir")
        .arg(out)
        .arg("--data-dir")
        .arg(data_dir())
        .args(extra)
        .env("PATH", path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    Run {
        success: output.status.success(),
        events: stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("stdout line {l:?} is not JSON: {e}")))
            .collect(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn log(out: &Path, group: u32, rank: u32, attempt: u32) -> String {
    let path = out.join(format!("logs/worker-{group}-{rank}.{attempt}.log"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The step of the checkpoint the script says it resumed from in `log`, and that checkpoint's path.
fn resumed(log: &str) -> Option<(u64, String)> {
    let line = log.lines().find(|l| l.contains("resumed from "))?;
    let (path, step) = line.split_once("resumed from ")?.1.rsplit_once(" at step ")?;
    Some((step.trim().parse().ok()?, path.to_owned()))
}

#[test]
fn a_ddp_script_trains_two_groups_to_accuracy_with_progress_and_a_curve() {
    let _one = one_job_at_a_time();
    let (dir, manifest) = job_dir("ddp-train", |_| {});
    let out = dir.path().join("out");
    let run = train(&manifest, &out, &[]);
    assert!(run.success, "stderr:\n{}", run.stderr);
    let done = run.finished();
    let accuracy = done["test_accuracy"].as_f64().unwrap();
    assert!(accuracy >= ACCURACY, "the groups' reported test accuracy {accuracy} < {ACCURACY}: {done}");
    assert_eq!(done["steps"], 200, "{done}");
    assert_eq!(done["restarts"], 0, "{done}");
    // Progress from each group's file reached the runner's output, up to the last step.
    let progress = run.of("progress");
    for group in 0..2 {
        let steps: Vec<u64> = progress
            .iter()
            .filter(|e| e["group"] == group)
            .map(|e| e["group_step"].as_u64().unwrap())
            .collect();
        assert!(steps.len() >= 10 && steps.windows(2).all(|w| w[0] < w[1]), "group {group}: {steps:?}");
        assert_eq!(steps.last(), Some(&200), "group {group}");
    }
    assert!(progress.iter().any(|e| e["accuracy"].as_f64().is_some()), "evaluations reached the output");
    // ... and its curve.
    let curve = std::fs::read_to_string(out.join("curve.csv")).unwrap();
    assert!(curve.lines().count() >= 10, "{curve}");
    assert!(out.join("curve.svg").exists());
    // Each group is its own world with its own checkpoints, in the folder the contract names.
    for group in 0..2 {
        let folder = out.join(format!("checkpoints/group-{group}"));
        assert!(folder.join("step-00000200.pt").exists(), "{}", folder.display());
        assert!(log(&out, group, 0, 0).contains("test accuracy"), "rank 0 of group {group} evaluated");
    }
}

#[test]
fn a_killed_rank_restarts_only_its_group_which_resumes_from_its_checkpoint() {
    let _one = one_job_at_a_time();
    let (dir, manifest) = job_dir("ddp-kill", |_| {});
    let out = dir.path().join("out");
    let run = train(&manifest, &out, &["--chaos", "kill:worker:1:1@150"]);
    assert!(run.success, "stderr:\n{}", run.stderr);
    let restarts = run.of("restart");
    assert_eq!(restarts.len(), 1, "one restart: {restarts:?}");
    assert_eq!((&restarts[0]["role"], &restarts[0]["index"]), (&"group".into(), &1.into()), "{restarts:?}");
    assert_eq!(restarts[0]["attempt"], 1);
    // Group 0 ran once; group 1's second attempt resumed from its own newest checkpoint.
    assert!(!out.join("logs/worker-0-0.1.log").exists(), "group 0 was not restarted");
    let (step, path) = resumed(&log(&out, 1, 0, 1)).expect("group 1 resumed from a checkpoint");
    assert!(step > 0 && step % 50 == 0 && step <= 150, "resumed at step {step}");
    assert!(path.starts_with(&out.join("checkpoints/group-1").display().to_string()), "{path}");
    assert_eq!(resumed(&log(&out, 1, 1, 1)).map(|r| r.0), Some(step), "both ranks resumed at one step");
    // The restarted group's progress goes on from there, and the job trains to accuracy.
    let group1: Vec<u64> = run
        .of("progress")
        .iter()
        .filter(|e| e["group"] == 1)
        .map(|e| e["group_step"].as_u64().unwrap())
        .collect();
    assert_eq!(group1.last(), Some(&200), "{group1:?}");
    assert!(run.finished()["test_accuracy"].as_f64().unwrap() >= ACCURACY, "{}", run.finished());
    assert_eq!(run.finished()["restarts"], 1);
}

#[test]
fn a_sigtermed_group_checkpoints_exits_retryable_and_resumes_there() {
    let _one = one_job_at_a_time();
    let (dir, manifest) = job_dir("ddp-term", |doc| {
        set(doc, &["spec", "workers", "groups"], Yaml::from(1));
    });
    let out = dir.path().join("out");
    let run = train(&manifest, &out, &["--chaos", "term:worker:0:1@60"]);
    assert!(run.success, "stderr:\n{}", run.stderr);
    let first = log(&out, 0, 0, 0);
    let line = first
        .lines()
        .find(|l| l.contains("SIGTERM: checkpointed step "))
        .unwrap_or_else(|| panic!("{first}"));
    let saved: u64 =
        line.split("checkpointed step ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(saved >= 60, "{line}");
    for rank in 0..2 {
        assert!(
            log(&out, 0, rank, 0).contains("with exit code 143"),
            "rank {rank} stopped with the retryable code"
        );
    }
    let restarts = run.of("restart");
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    let message = restarts[0]["message"].as_str().unwrap();
    assert!(message.contains("exited with code 143"), "{message}");
    // The new attempt starts at exactly the step the SIGTERM checkpoint saved.
    assert_eq!(resumed(&log(&out, 0, 0, 1)).map(|r| r.0), Some(saved));
    assert!(run.finished()["test_accuracy"].as_f64().unwrap() >= ACCURACY, "{}", run.finished());
}

#[test]
fn a_command_that_fails_at_start_fails_the_job_naming_the_rank_and_code() {
    let _one = one_job_at_a_time();
    let (dir, manifest) = job_dir("ddp-fails", |doc| {
        let command: Yaml =
            serde_yaml::from_str(r#"[sh, -c, "echo cannot open my data >&2; exit 1"]"#).unwrap();
        set(doc, &["spec", "workers", "command"], command);
    });
    let out = dir.path().join("out");
    let run = train(&manifest, &out, &[]);
    assert!(!run.success, "the job fails");
    assert!(run.of("restart").is_empty(), "exit code 1 is permanent: no restart: {:?}", run.of("restart"));
    assert!(
        run.stderr.contains("exited with code 1") && run.stderr.contains("worker 0/"),
        "names the rank and the code:\n{}",
        run.stderr
    );
    assert!(run.stderr.contains("cannot open my data"), "shows the rank's log:\n{}", run.stderr);
}

#[test]
fn fields_of_the_built_in_trainer_are_refused_beside_a_command_naming_them() {
    let (dir, manifest) = job_dir("ddp-refused", |doc| {
        let model: Yaml = serde_yaml::from_str("{kind: cnn}").unwrap();
        set(doc, &["spec", "model"], model);
        set(doc, &["spec", "workers", "fusionBytes"], Yaml::from(1024));
    });
    let out = dir.path().join("out");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["train", "-f"])
        .arg(&manifest)
        .arg("--output-dir")
        .arg(&out)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    for says in [
        "workers.command runs your own training code, which builds its own model: remove spec.model",
        "workers.fusionBytes sizes the built-in trainer's fused gradient buffers",
    ] {
        assert!(stderr.contains(says), "{says:?} in:\n{stderr}");
    }
    assert!(!out.exists(), "nothing ran");
}

/// `backend: mpi` (issue 38): the group's launcher runs `mpirun <the script>` on this machine,
/// each rank gets the contract's variables through the rank script (one torch.distributed world
/// per group), the group trains to accuracy with progress from its file; a killed rank fails
/// the launcher's mpirun, and the relaunched group resumes from its own checkpoint.
#[test]
fn an_mpi_group_runs_the_script_under_mpirun_and_a_killed_rank_restarts_it_from_its_checkpoint() {
    let _one = one_job_at_a_time();
    let (dir, manifest) = job_dir("ddp-mpi", |doc| {
        set(doc, &["spec", "workers", "backend"], Yaml::from("mpi"));
        set(doc, &["spec", "workers", "groups"], Yaml::from(1));
        // Long enough that the kill at step 150 comes well before the end.
        set(doc, &["spec", "training", "steps"], Yaml::from(STEPS));
    });
    const STEPS: u64 = 600;
    let out = dir.path().join("out");
    let run = train(&manifest, &out, &["--chaos", "kill:worker:0:1@150"]);
    let launcher = |attempt: u32| {
        let path = out.join(format!("logs/launcher-0.{attempt}.log"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| format!("{}: {e}", path.display()))
    };
    assert!(
        run.success,
        "stderr:\n{}\nfirst launcher:\n{}\nsecond:\n{}",
        run.stderr,
        launcher(0),
        launcher(1)
    );
    let restarts = run.of("restart");
    assert_eq!(restarts.len(), 1, "one restart: {restarts:?}\n{}", launcher(0));
    assert_eq!(restarts[0]["attempt"], 1, "{restarts:?}");
    // Both ranks of the relaunched group resumed at one step, from the group's own folder.
    let second = launcher(1);
    let resumes: Vec<(u64, String)> =
        second.lines().filter(|l| l.contains("resumed from ")).filter_map(resumed).collect();
    assert_eq!(resumes.len(), 2, "two ranks resumed:\n{second}");
    let (step, path) = &resumes[0];
    assert!(*step > 0 && step % 50 == 0 && *step < STEPS, "resumed at step {step}");
    assert_eq!(resumes[1].0, *step);
    assert!(path.starts_with(&out.join("checkpoints/group-0").display().to_string()), "{path}");
    let steps: Vec<u64> = run.of("progress").iter().filter_map(|e| e["group_step"].as_u64()).collect();
    assert_eq!(steps.last(), Some(&STEPS), "{steps:?}");
    let done = run.finished();
    let accuracy = done["test_accuracy"].as_f64().unwrap();
    assert!(accuracy >= ACCURACY, "test accuracy {accuracy} < {ACCURACY}: {done}");
    assert!(out.join("checkpoints/group-0/step-00000600.pt").exists());
}
