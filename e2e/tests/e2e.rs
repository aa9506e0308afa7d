//! End-to-end tests: TrainingJobs driven by the operator, their pods run by `tandem-node` as local
//! `tandem` processes. Compiled with the `e2e` feature and run by `make e2e` (e2e/run.sh), which
//! starts the control plane, the operator and the agent, and sets `KUBECONFIG` and
//! `TANDEM_E2E_STATE` (the agent's state folder, where pod logs and pid files are).
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, ResourceExt};
use serde_json::Value;
use tandem_testkit::{TestCluster, TestNamespace};

/// How long a job may take to finish; generous, the machine is small and the tests share it.
const JOB_DEADLINE: Duration = Duration::from_secs(300);

fn state_dir() -> PathBuf {
    std::env::var_os("TANDEM_E2E_STATE")
        .expect("TANDEM_E2E_STATE is not set: run the e2e tests with `make e2e`")
        .into()
}

fn training_jobs(ns: &TestNamespace) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("tandem.dev", "v1alpha1", "TrainingJob"),
        "trainingjobs",
    );
    Api::namespaced_with(ns.client(), ns.name(), &resource)
}

/// `examples/mnist-hybrid.yaml` named `name`, with `steps` training steps.
fn hybrid_manifest(name: &str, steps: u64) -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/mnist-hybrid.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut doc: Value = serde_yaml::from_str(&text).unwrap();
    doc["metadata"]["name"] = name.into();
    doc["spec"]["training"]["steps"] = steps.into();
    doc
}

async fn start_job(name: &str, steps: u64) -> (TestCluster, TestNamespace) {
    let cluster = TestCluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e").await.unwrap();
    cluster.apply(ns.name(), &hybrid_manifest(name, steps)).await.unwrap();
    (cluster, ns)
}

async fn pods(ns: &TestNamespace, job: &str) -> Vec<Pod> {
    let api: Api<Pod> = ns.api();
    api.list(&ListParams::default().labels(&format!("tandem.dev/job-name={job}"))).await.unwrap().items
}

/// Pod name → UID of the job's pods.
async fn uids(ns: &TestNamespace, job: &str) -> BTreeMap<String, String> {
    pods(ns, job).await.into_iter().map(|p| (p.name_any(), p.uid().unwrap())).collect()
}

fn log_of(uid: &str) -> String {
    std::fs::read_to_string(tandem_e2e::container_log(&state_dir(), uid, "tandem")).unwrap_or_default()
}

/// JSON lines of a log whose `event` is `event`.
fn events(log: &str, event: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == event)
        .collect()
}

/// Polls `check` every second until it gives a value, failing with `what` after `deadline`.
async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < end, "timed out after {deadline:?} waiting for {what}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Waits for the job's terminal phase and returns its status; fails if it is not `Succeeded`.
async fn wait_succeeded(ns: &TestNamespace, job: &str) -> Value {
    let jobs = training_jobs(ns);
    let status = wait_for(&format!("job {job} to finish"), JOB_DEADLINE, || async {
        let tj = jobs.get(job).await.ok()?;
        let status = tj.data.get("status").cloned()?;
        matches!(status["phase"].as_str(), Some("Succeeded" | "Failed")).then_some(status)
    })
    .await;
    assert_eq!(status["phase"], "Succeeded", "job {job} did not succeed: {status:#}");
    status
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
    let after = wait_for("group 1 to be relaunched", JOB_DEADLINE, || async {
        let now = uids(&ns, "chaos").await;
        let relaunched = ["chaos-g1-0", "chaos-g1-1"]
            .iter()
            .all(|n| now.get(*n).is_some_and(|uid| before.get(*n) != Some(uid)));
        relaunched.then_some(now)
    })
    .await;
    for (name, uid) in &before {
        if name.starts_with("chaos-g1-") {
            assert_ne!(after.get(name), Some(uid), "{name} of the killed group was not restarted");
        } else {
            assert_eq!(after.get(name), Some(uid), "{name} outside the killed group was restarted");
        }
    }
    wait_succeeded(&ns, "chaos").await;
    assert_workers_finished(&ns, "chaos", 0.0).await;
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
