//! Helpers for tests that run `tandem train -f` on multi-process jobs through the real binary:
//! paths, manifests derived from the examples, and the JSON event stream of a run.
//!
//! Needs the MNIST-5k sample in `data/` (`make data`).

#![allow(dead_code)] // each test file uses its own subset

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// Jobs run one at a time: each one already keeps every core busy.
pub static ONE_JOB_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Takes [`ONE_JOB_AT_A_TIME`], even after another test panicked while holding it.
pub fn one_job_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// The workspace root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// `data/`, checked to hold MNIST-5k.
pub fn data_dir() -> PathBuf {
    let dir = repo().join("data");
    assert!(
        dir.join("mnist_5k.csv.gz").exists(),
        "{} has no mnist_5k.csv.gz; run `make data` first",
        dir.display()
    );
    dir
}

/// `examples/<name>`.
pub fn example(name: &str) -> PathBuf {
    repo().join("examples").join(name)
}

/// The example's YAML.
pub fn example_yaml(name: &str) -> serde_yaml::Value {
    let text = std::fs::read_to_string(example(name)).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

/// The example manifest with `edit` applied to its YAML, written into `dir`.
pub fn manifest(dir: &Path, example: &str, edit: impl FnOnce(&mut serde_yaml::Value)) -> PathBuf {
    manifest_as(dir, example, example, edit)
}

/// The example manifest with `edit` applied to its YAML, written into `dir` as `name`.
pub fn manifest_as(
    dir: &Path,
    example: &str,
    name: &str,
    edit: impl FnOnce(&mut serde_yaml::Value),
) -> PathBuf {
    let mut doc = example_yaml(example);
    edit(&mut doc);
    let path = dir.join(name);
    std::fs::write(&path, serde_yaml::to_string(&doc).unwrap()).unwrap();
    path
}

/// Sets the value at `path` (keys from the document root).
pub fn set(doc: &mut serde_yaml::Value, path: &[&str], value: serde_yaml::Value) {
    let mut at = doc;
    for key in &path[..path.len() - 1] {
        at = at.get_mut(*key).unwrap_or_else(|| panic!("no {key} in the manifest"));
    }
    at[path[path.len() - 1]] = value;
}

/// A finished `tandem train --output json` run.
pub struct Run {
    /// Whether it exited 0.
    pub success: bool,
    /// Every stdout line, parsed.
    pub events: Vec<serde_json::Value>,
    /// Its stderr.
    pub stderr: String,
    /// Wall time of the run.
    pub wall: std::time::Duration,
}

impl Run {
    /// The last event, checked to be `finished`.
    pub fn finished(&self) -> &serde_json::Value {
        let last = self.events.last().unwrap_or_else(|| panic!("no events; stderr:\n{}", self.stderr));
        assert_eq!(
            last["event"], "finished",
            "the last line is the finished event; stderr:\n{}",
            self.stderr
        );
        last
    }

    /// Events of one kind.
    pub fn of(&self, kind: &str) -> Vec<&serde_json::Value> {
        self.events.iter().filter(|e| e["event"] == kind).collect()
    }
}

/// The command `tandem train --output json --device cpu -f <manifest> --output-dir <out>
/// --data-dir data/`, not started.
pub fn train_command(manifest: &Path, out: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tandem"));
    cmd.args(["train", "--output", "json", "--device", "cpu", "-f"])
        .arg(manifest)
        .arg("--output-dir")
        .arg(out)
        .arg("--data-dir")
        .arg(data_dir());
    cmd
}

/// Runs [`train_command`] plus `extra` to its end.
pub fn train(manifest: &Path, out: &Path, extra: &[&str]) -> Run {
    let started = std::time::Instant::now();
    let output = train_command(manifest, out).args(extra).output().unwrap();
    let wall = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let events = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("stdout line {l:?} is not JSON: {e}")))
        .collect();
    Run {
        success: output.status.success(),
        events,
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        wall,
    }
}

/// Processes still running whose launch contract points at `out` (children of a runner).
pub fn processes_of(out: &Path) -> Vec<String> {
    let needle = format!("TANDEM_OUTPUT={}", out.display());
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
        if environ.split(|b| *b == 0).any(|v| v == needle.as_bytes()) {
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // Zombies of the finished test process are not running.
            if !stat.contains(") Z ") {
                found.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
    }
    found
}
