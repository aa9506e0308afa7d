//! `tandem train` as a user runs it: JSON progress, the finished line, the curve, clear errors.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use crate::trainer_support;

use std::process::Command;

fn tandem() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tandem"));
    c.env("TANDEM_DATA_DIR", trainer_support::data_dir());
    c
}

const JOB: &str = "apiVersion: tandem.dev/v1alpha1
kind: TrainingJob
metadata: {name: digits-cli}
spec:
  model: {kind: mlp, hidden: [32]}
  data: {source: digits, batchSize: 32}
  training:
    algorithm: allreduce
    optimizer: {kind: sgd, learningRate: 0.1, momentum: 0.9}
    epochs: 3
    evalEverySteps: 40
    checkpoint: {everySteps: 50}
  workers: {groups: 1, groupSize: 1, minGroups: 1, maxGroups: 1}
";

#[test]
fn json_output_ends_with_finished_and_writes_the_curve() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.yaml");
    std::fs::write(&job, JOB).unwrap();
    let out_dir = dir.path().join("out");
    let out = tandem()
        .args(["train", "-f"])
        .arg(&job)
        .args(["--output", "json", "--output-dir"])
        .arg(&out_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect();
    let last = lines.last().unwrap();
    assert_eq!(last["event"], "finished");
    for key in ["test_accuracy", "test_loss", "steps", "samples_per_second", "wall_seconds"] {
        assert!(last[key].is_number(), "finished line lacks {key}: {last}");
    }
    assert_eq!(last["steps"], 3 * (1437 / 32));
    assert!(last["test_accuracy"].as_f64().unwrap() > 0.9, "{last}");
    // The runner's events, as for a job of many processes: started, progress with the test
    // accuracy at evaluation steps, the curve, finished.
    assert_eq!(lines[0]["event"], "started", "{}", lines[0]);
    assert_eq!(lines[0]["processes"], 1);
    let evaluated: Vec<u64> = lines
        .iter()
        .filter(|l| l["event"] == "progress" && l["accuracy"].is_number())
        .map(|l| l["step"].as_u64().unwrap())
        .collect();
    assert_eq!(evaluated.first(), Some(&40), "the first evaluation is at evalEverySteps");
    let curve = lines.iter().find(|l| l["event"] == "curve").expect("a curve event");
    let svg = std::fs::read_to_string(curve["path"].as_str().unwrap()).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("polyline"), "{svg}");
    assert!(std::fs::read_to_string(out_dir.join("curve.csv")).unwrap().lines().count() > 3);
    let ckpts = std::fs::read_dir(out_dir.join("checkpoints")).unwrap().count();
    assert!((1..=3).contains(&ckpts), "{ckpts} checkpoints");

    // --resume from the final checkpoint has nothing left to do and reports the same step count.
    let again = tandem()
        .args(["train", "-f"])
        .arg(&job)
        .args(["--output", "json", "--resume", "--output-dir"])
        .arg(&out_dir)
        .output()
        .unwrap();
    assert!(again.status.success(), "stderr: {}", String::from_utf8_lossy(&again.stderr));
    let text = String::from_utf8(again.stdout).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["steps"], 3 * (1437 / 32));
}

#[test]
fn bad_manifests_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.yaml");
    std::fs::write(&job, JOB.replace("epochs: 3", "epochs: 3\n    steps: 10")).unwrap();
    let out = tandem().args(["train", "-f"]).arg(&job).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("exactly one of training.steps and training.epochs"), "{err}");

    std::fs::write(&job, "kind: TrainingJob\nspec: [1]\n").unwrap();
    let out = tandem().args(["train", "-f"]).arg(&job).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a valid TrainingJob"));
}

/// The local runner applies the CRD's own schema: what `kubectl apply` refuses is refused here
/// before anything trains, with the API server's wording.
#[test]
fn manifests_the_api_server_refuses_are_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.yaml");
    let cases = [
        (
            JOB.replace("learningRate: 0.1", "learningrate: 0.1"),
            "unknown field \"spec.training.optimizer.learningrate\"",
        ),
        (
            JOB.replace("epochs: 3", "epochs: 0"),
            "spec.training.epochs in body should be greater than or equal to 1",
        ),
        (JOB.replace("kind: TrainingJob", "kind: Pod"), "this is not a TrainingJob"),
        (
            JOB.replace("hidden: [32]", "hidden: [8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8]"),
            "must have at most 16 items",
        ),
    ];
    for (manifest, expected) in cases {
        std::fs::write(&job, &manifest).unwrap();
        let out_dir = dir.path().join("out");
        let out =
            tandem().args(["train", "-f"]).arg(&job).arg("--output-dir").arg(&out_dir).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{expected}: trained anyway");
        assert!(err.contains(expected), "expected {expected:?} in {err}");
        assert!(!out_dir.exists(), "{expected}: wrote {}", out_dir.display());
    }
}

/// A job larger than the machine is refused from its estimate, naming the fields, instead of
/// aborting in the allocator.
#[test]
fn a_job_too_large_for_the_machine_is_refused_with_the_estimate() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.yaml");
    std::fs::write(&job, JOB.replace("hidden: [32]", "hidden: [65536, 65536, 65536]")).unwrap();
    let out = tandem().args(["train", "-f"]).arg(&job).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("model.hidden [65536, 65536, 65536]") && err.contains("GiB"), "{err}");
}

/// `tandem train -f <job> --output json --output-dir <out>` plus `extra`: its exit, stdout lines
/// and stderr.
fn train_into(
    job: &std::path::Path,
    out: &std::path::Path,
    extra: &[&str],
) -> (bool, Vec<serde_json::Value>, String) {
    let output = tandem()
        .args(["train", "-f"])
        .arg(job)
        .args(["--output", "json", "--output-dir"])
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    let lines = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect();
    (output.status.success(), lines, String::from_utf8_lossy(&output.stderr).into_owned())
}

/// The names and bytes of every file in `dir`.
fn contents(dir: &std::path::Path) -> Vec<(std::ffi::OsString, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (e.file_name(), std::fs::read(e.path()).unwrap()))
        .collect();
    files.sort();
    files
}

#[test]
fn a_rerun_is_refused_without_resume_and_resume_falls_back_past_a_damaged_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.yaml");
    std::fs::write(&job, JOB).unwrap();
    let out = dir.path().join("out");
    let (ok, _, stderr) = train_into(&job, &out, &[]);
    assert!(ok, "{stderr}");
    let ckpts = out.join("checkpoints");
    let steps = 3 * (1437 / 32);
    let before = contents(&ckpts);
    let names: Vec<_> = before.iter().map(|(n, _)| n.to_string_lossy().into_owned()).collect();
    assert_eq!(names, [50, 100, steps].map(|s| format!("ckpt-{s:010}.safetensors")), "{names:?}");

    // Run again into the same folder without --resume: refused, and the first run's checkpoints
    // are left exactly as they were (not pruned for, or mixed with, a second run's).
    let (ok, lines, stderr) = train_into(&job, &out, &[]);
    assert!(!ok, "a second run trained into the first one's folder: {lines:?}");
    for part in ["holds the checkpoints of an earlier run", "--resume", "another folder"] {
        assert!(stderr.contains(part), "{part:?} missing from: {stderr}");
    }
    assert_eq!(contents(&ckpts), before);

    // The newest checkpoint torn (a copy cut short), and the partial file of a writer killed
    // mid-write: --resume continues from the one before, and the partial file goes.
    let newest = ckpts.join(format!("ckpt-{steps:010}.safetensors"));
    let bytes = std::fs::read(&newest).unwrap();
    std::fs::write(&newest, &bytes[..bytes.len() - 100]).unwrap();
    let partial = ckpts.join(".ckpt-0000000150.safetensors.tmp-424242");
    std::fs::write(&partial, &bytes[..1000]).unwrap();
    let (ok, lines, stderr) = train_into(&job, &out, &["--resume"]);
    assert!(ok, "--resume did not fall back to the intact checkpoint: {stderr}");
    assert!(stderr.contains("resumed from") && stderr.contains("at step 100"), "{stderr}");
    assert!(
        stderr.contains("1 newer checkpoint(s) failed their checks"),
        "the damaged file is told: {stderr}"
    );
    let first = lines.iter().find(|l| l["event"] == "progress").unwrap();
    assert!(first["step"].as_u64().unwrap() > 100, "it continued after step 100: {first}");
    assert_eq!(lines.last().unwrap()["steps"], steps);
    assert!(!partial.exists(), "the partial file of the interrupted write is removed");
}
