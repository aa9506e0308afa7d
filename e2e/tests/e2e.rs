//! End-to-end tests: TrainingJobs driven by the operator, their pods run by `tandem-node` as local
//! `tandem` processes. Compiled with the `e2e` feature and run by `make e2e` (e2e/run.sh), which
//! starts the control plane, the operator and the agent, and sets `KUBECONFIG` and
//! `TANDEM_E2E_STATE` (the agent's state folder, where pod logs and pid files are).
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::PathBuf;

use common::{JOB_DEADLINE, events, pods, uids, wait_for, wait_succeeded};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::Value;
use tandem_testkit::{TestCluster, TestNamespace};

fn state_dir() -> PathBuf {
    std::env::var_os("TANDEM_E2E_STATE")
        .expect("TANDEM_E2E_STATE is not set: run the e2e tests with `make e2e`")
        .into()
}

async fn start_job(name: &str, steps: u64) -> (TestCluster, TestNamespace) {
    let cluster = TestCluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e").await.unwrap();
    cluster.apply(ns.name(), &common::example("mnist-hybrid.yaml", name, steps)).await.unwrap();
    (cluster, ns)
}

fn log_of(uid: &str) -> String {
    std::fs::read_to_string(tandem_e2e::container_log(&state_dir(), uid, "tandem")).unwrap_or_default()
}

/// The worker pods' final `finished` lines: each present, each at accuracy ≥ `min`.
async fn assert_workers_finished(ns: &TestNamespace, job: &str, min: f64) {
    let workers: Vec<Pod> = pods(ns, job)
        .await
        .into_iter()
        .filter(|p| p.labels().get("tandem.dev/role").is_some_and(|r| r == "worker"))
        .collect();
    assert!(!workers.is_empty(), "job {job} has no worker pods");
    for pod in workers {
        let log = log_of(&pod.uid().unwrap());
        let finished = events(&log, "finished");
        let last =
            finished.last().unwrap_or_else(|| panic!("{} has no finished line; log:\n{log}", pod.name_any()));
        let accuracy = last["accuracy"].as_f64().unwrap();
        assert!(accuracy >= min, "{} finished at accuracy {accuracy} < {min}: {last}", pod.name_any());
    }
}

/// Waits until `pod` of `job` runs and its log shows a progress line; returns its UID.
async fn wait_training(ns: &TestNamespace, job: &str, pod: &str) -> String {
    wait_for(&format!("{pod} to report training progress"), JOB_DEADLINE, || async {
        let p = pods(ns, job).await.into_iter().find(|p| p.name_any() == pod)?;
        let uid = p.uid()?;
        (!events(&log_of(&uid), "progress").is_empty()).then_some(uid)
    })
    .await
}

#[tokio::test]
async fn mnist_hybrid_trains_to_accuracy_through_the_operator() {
    let (_cluster, ns) = start_job("hybrid", 600).await;
    let status = wait_succeeded(&ns, "hybrid").await;
    assert_workers_finished(&ns, "hybrid", 0.90).await;
    // Each worker ran as its own process at its own address (finished PS pods are cleaned up).
    let ips: std::collections::BTreeSet<String> = pods(&ns, "hybrid")
        .await
        .iter()
        .filter(|p| p.labels().get("tandem.dev/role").is_some_and(|r| r == "worker"))
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    assert_eq!(ips.len(), 4, "2 groups of 2 with distinct pod IPs: {ips:?}");
    if let Some(accuracy) = status.pointer("/progress/accuracy").and_then(Value::as_f64) {
        assert!(accuracy >= 0.90, "status.progress.accuracy {accuracy} < 0.90: {status:#}");
    }
    ns.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_killed_worker_restarts_its_group_only_and_the_job_succeeds() {
    let (_cluster, ns) = start_job("chaos", 1500).await;
    let victim_uid = wait_training(&ns, "chaos", "chaos-g1-0").await;
    let before = uids(&ns, "chaos").await;
    let pid: i32 = std::fs::read_to_string(tandem_e2e::pid_file(&state_dir(), &victim_uid))
        .expect("the agent writes the pid of a running pod")
        .trim()
        .parse()
        .unwrap();
    let killed = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
    assert!(killed.success(), "kill -KILL {pid} failed");

    // Once the killed group runs again, compare (finished PS pods are cleaned up at the end).
    common::assert_only_group_relaunched(&ns, "chaos", 1, &before).await;
    wait_succeeded(&ns, "chaos").await;
    // The target of the undisturbed run (0.90 after 600 steps, above), which this one meets after
    // 1500 steps with group 1 resumed from the PS weights (as `tandem train` does after a killed
    // worker: trainer/tests/it/runner_e2e.rs).
    assert_workers_finished(&ns, "chaos", 0.90).await;
    ns.cleanup().await.unwrap();
}

#[tokio::test]
async fn scaling_up_adds_a_group_that_joins_and_trains() {
    let (_cluster, ns) = start_job("elastic", 1500).await;
    wait_training(&ns, "elastic", "elastic-g0-0").await;
    let scaled = std::process::Command::new("kubectl")
        .args(["-n", ns.name(), "scale", "tj/elastic", "--replicas=3"])
        .status()
        .expect("kubectl is on PATH (make e2e puts it there)");
    assert!(scaled.success(), "kubectl scale failed");
    // The new group's pods run and its rank 0 trains.
    wait_training(&ns, "elastic", "elastic-g2-0").await;
    assert!(uids(&ns, "elastic").await.contains_key("elastic-g2-1"));
    wait_succeeded(&ns, "elastic").await;
    let g2 = pods(&ns, "elastic").await.into_iter().find(|p| p.name_any() == "elastic-g2-0").unwrap();
    let finished = events(&log_of(&g2.uid().unwrap()), "finished");
    assert!(!finished.is_empty(), "the added group did not finish its training");
    ns.cleanup().await.unwrap();
}
