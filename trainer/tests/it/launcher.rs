//! `tandem launcher` as the operator runs it in a launcher pod: the launch contract in `TANDEM_*`
//! variables and the group's hostfile in OpenMPI's `OMPI_MCA_*_default_hostfile`; it runs the
//! group's `tandem worker` ranks under mpirun and exits with mpirun's exit code.
//!
//! Needs the MNIST-5k sample in `data/` (`make data`) and OpenMPI's `mpirun`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use crate::runner_support::{data_dir, example_yaml, one_job_at_a_time, set};
use tandem_api::TrainingJob;

const STEPS: u64 = 20;

/// Writes an allreduce job of one `backend: mpi` group of 4 ranks (config, token, and a hostfile
/// of 4 local slots) into `dir`; returns the `tandem launcher` command with its contract.
fn launcher(dir: &Path, role: &str) -> Command {
    let mut doc = example_yaml("mnist-allreduce.yaml");
    set(&mut doc, &["spec", "workers", "backend"], "mpi".into());
    set(&mut doc, &["spec", "training", "steps"], STEPS.into());
    let job: TrainingJob = serde_yaml::from_value(doc).unwrap();
    job.spec.validate().unwrap();
    let config = tandem::runner::local_config("launcher-test", &job.spec).unwrap();
    std::fs::write(dir.join("job.json"), config.to_json()).unwrap();
    std::fs::write(dir.join("token"), "launcher-test-token").unwrap();
    let hostfile = dir.join("hostfile");
    std::fs::write(&hostfile, "localhost slots=4\n").unwrap();

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tandem"));
    cmd.args(["launcher", "--", "--device", "cpu"])
        .env("TANDEM_ROLE", role)
        .env("TANDEM_GROUP", "0")
        .env("TANDEM_CONFIG", dir.join("job.json"))
        .env("TANDEM_TOKEN_FILE", dir.join("token"))
        .env("TANDEM_BIND", "127.0.0.1")
        .env("TANDEM_OUTPUT", dir.join("out"))
        .env("TANDEM_DATA_DIR", data_dir())
        .env("OMPI_MCA_orte_default_hostfile", &hostfile)
        .env("OMPI_MCA_prte_default_hostfile", &hostfile);
    cmd
}

fn finished_ranks(output: &Output) -> Vec<u64> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut ranks: Vec<u64> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l.trim()).ok())
        .filter(|e| e["event"] == "finished")
        .inspect(|e| assert_eq!(e["steps"], STEPS, "{e}"))
        .filter_map(|e| e["rank"].as_u64())
        .collect();
    ranks.sort_unstable();
    ranks
}

#[test]
fn the_launcher_runs_the_group_on_the_hostfile_slots_to_completion() {
    let _one = one_job_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let output = launcher(tmp.path(), "launcher").output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{:?}\nstderr:\n{stderr}", output.status);
    assert_eq!(finished_ranks(&output), [0, 1, 2, 3], "each rank took its rank from MPI\nstderr:\n{stderr}");
}

#[test]
fn the_launcher_exits_with_the_code_of_a_failed_rank() {
    let _one = one_job_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    // Every rank fails: the data folder does not exist.
    let output =
        launcher(tmp.path(), "launcher").env("TANDEM_DATA_DIR", tmp.path().join("no-data")).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "a rank's exit code 1 is the launcher's\nstderr:\n{stderr}");
    assert!(finished_ranks(&output).is_empty());
}

#[test]
fn the_launcher_refuses_another_role_and_a_missing_hostfile() {
    let tmp = tempfile::tempdir().unwrap();
    let output = launcher(tmp.path(), "worker").env("TANDEM_RANK", "0").output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("TANDEM_ROLE says this process is worker 0/0"),
        "{stderr}"
    );

    let missing = tmp.path().join("no-hostfile");
    let output =
        launcher(tmp.path(), "launcher").env("OMPI_MCA_orte_default_hostfile", &missing).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains(&format!("hostfile {} ", missing.display())),
        "{stderr}"
    );
}
