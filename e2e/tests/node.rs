//! End-to-end tests in real containers: the chart's operator (a pod, in-cluster credentials, the
//! chart's RBAC) drives TrainingJobs whose pods run the `tandem-trainer` image under a real kubelet
//! and containerd, on a CNI bridge, with names from CoreDNS and the API server behind kube-proxy.
//! Compiled with the `e2e` feature and run by `make e2e-node` (e2e/node.sh), which starts the node,
//! installs the chart and sets `KUBECONFIG` and `TANDEM_NODE_CONTAINERD` (containerd's socket, to
//! kill a container's process the way a crash would).
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::{JOB_DEADLINE, events, example, pods, role_of, training_jobs, uids, wait_for, wait_succeeded};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{LogParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use tandem_testkit::{TestCluster, TestNamespace};

/// Where the chart is installed (e2e/node.sh).
const OPERATOR_NAMESPACE: &str = "tandem-system";

async fn start(name: &str, manifest: Value) -> (TestCluster, TestNamespace) {
    let cluster = TestCluster::connect().await.unwrap();
    let ns = cluster.namespace(&format!("node-{name}")).await.unwrap();
    cluster.apply(ns.name(), &manifest).await.unwrap();
    (cluster, ns)
}

/// The `tandem` container's log of `pod` (its previous run's with `previous`), as `kubectl logs`.
async fn log_of(ns: &TestNamespace, pod: &str, previous: bool) -> String {
    let api: Api<Pod> = ns.api();
    let params = LogParams { container: Some("tandem".to_owned()), previous, ..LogParams::default() };
    api.logs(pod, &params).await.unwrap_or_default()
}

fn kubectl(args: &[&str]) -> String {
    let out =
        Command::new("kubectl").args(args).output().expect("kubectl is on PATH (e2e/node.sh puts it there)");
    assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `tandem` container's state of `pod`: (containerd id, restart count).
fn container(pod: &Pod, name: &str) -> (String, i32) {
    let status = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref()).into_iter().flatten();
    let c = status
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("{} has no container {name}", pod.name_any()));
    let id = c.container_id.as_deref().unwrap_or_default();
    (id.strip_prefix("containerd://").unwrap_or(id).to_owned(), c.restart_count)
}

fn ctr(args: &[&str]) -> String {
    let socket = std::env::var("TANDEM_NODE_CONTAINERD")
        .expect("TANDEM_NODE_CONTAINERD is not set: run the node tests with `make e2e-node`");
    let out = Command::new("ctr").args(["--address", &socket, "-n", "k8s.io"]).args(args).output().unwrap();
    assert!(out.status.success(), "ctr {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The host pid of a running container's main process.
fn host_pid(container_id: &str) -> u32 {
    ctr(&["tasks", "ls"])
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some(container_id)).then(|| f.next()?.parse().ok()).flatten()
        })
        .unwrap_or_else(|| panic!("container {container_id} has no running task"))
}

/// SIGKILLs the main process of `pod`'s `tandem` container from the host, as a crash would.
fn kill_container(pod: &Pod) {
    let (id, _) = container(pod, "tandem");
    ctr(&["tasks", "kill", "--signal", "SIGKILL", &id]);
}

async fn pod(ns: &TestNamespace, name: &str) -> Option<Pod> {
    ns.api::<Pod>().get_opt(name).await.unwrap()
}

/// Waits until `name` runs and its log shows a progress line; returns the pod.
async fn wait_training(ns: &TestNamespace, name: &str) -> Pod {
    wait_for(&format!("{name} to report training progress"), JOB_DEADLINE, || async {
        let p = pod(ns, name).await?;
        (!events(&log_of(ns, name, false).await, "progress").is_empty()).then_some(p)
    })
    .await
}

/// The `finished` lines of `log`: at least `ranks`, each at accuracy ≥ `min`.
fn assert_finished(what: &str, log: &str, ranks: usize, min: f64) {
    let finished = events(log, "finished");
    assert!(finished.len() >= ranks, "{what}: {} finished lines, want {ranks}; log:\n{log}", finished.len());
    for line in &finished {
        let accuracy = line["accuracy"].as_f64().unwrap();
        assert!(accuracy >= min, "{what} finished at accuracy {accuracy} < {min}: {line}");
    }
}

/// tcp workers print their own `finished` lines; every one must reach `min`.
async fn assert_tcp_workers_finished(ns: &TestNamespace, job: &str, min: f64) {
    let workers: Vec<Pod> = pods(ns, job).await.into_iter().filter(|p| role_of(p) == "worker").collect();
    assert!(!workers.is_empty(), "job {job} has no worker pods");
    for w in workers {
        assert_finished(&w.name_any(), &log_of(ns, &w.name_any(), false).await, 1, min);
    }
}

/// The operator runs as the chart made it: ready with no restarts, as uid 65532, on a read-only
/// root filesystem, with the chart's ServiceAccount, and the API server denied it nothing.
#[tokio::test]
async fn the_operator_runs_in_cluster_as_the_chart_made_it() {
    let cluster = TestCluster::connect().await.unwrap();
    let api: Api<Pod> = Api::namespaced(cluster.client(), OPERATOR_NAMESPACE);
    let list =
        api.list(&kube::api::ListParams::default().labels("app.kubernetes.io/name=tandem")).await.unwrap();
    let op = list.items.first().expect("the chart's operator pod");
    let spec = op.spec.as_ref().unwrap();
    assert_eq!(spec.service_account_name.as_deref(), Some("tandem-operator"));
    let ready = op
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    assert!(ready, "the operator pod is not Ready (its probes fail): {:?}", op.status);
    let (id, restarts) = container(op, "operator");
    assert_eq!(restarts, 0, "the operator restarted");
    let pid = host_pid(&id);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert_eq!(uid.split_whitespace().nth(1), Some("65532"), "{uid}");
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mounts.lines().find(|l| l.split_whitespace().nth(4) == Some("/")).unwrap();
    assert!(
        root.split_whitespace().nth(5).unwrap().split(',').any(|o| o == "ro"),
        "root filesystem not read-only: {root}"
    );
    let log = api.logs(&op.name_any(), &LogParams::default()).await.unwrap();
    assert!(
        !log.contains("403") && !log.contains("Forbidden"),
        "the API server denied the operator something:\n{log}"
    );
}

/// Scenarios 1 and 6: examples/mnist-hybrid.yaml (tcp) trains to 0.90 with status.progress from
/// the PS over the pod network, and `kubectl logs` of a worker shows its progress lines.
#[tokio::test]
async fn mnist_hybrid_trains_with_progress_from_the_ps_and_kubectl_logs() {
    let (_cluster, ns) = start("hybrid", example("mnist-hybrid.yaml", "hybrid", 600)).await;
    wait_training(&ns, "hybrid-g0-0").await;
    let logs = kubectl(&["-n", ns.name(), "logs", "hybrid-g0-0", "-c", "tandem"]);
    assert!(!events(&logs, "progress").is_empty(), "kubectl logs shows no progress lines:\n{logs}");
    let status = wait_succeeded(&ns, "hybrid").await;
    assert_tcp_workers_finished(&ns, "hybrid", 0.90).await;
    let ips: std::collections::BTreeSet<String> = pods(&ns, "hybrid")
        .await
        .iter()
        .filter(|p| role_of(p) == "worker")
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    assert_eq!(ips.len(), 4, "2 groups of 2 with distinct pod IPs: {ips:?}");
    let accuracy = status.pointer("/progress/accuracy").and_then(Value::as_f64);
    assert!(accuracy.is_some_and(|a| a >= 0.90), "status.progress from the PS: {status:#}");
    assert!(status.pointer("/progress/step").and_then(Value::as_u64).is_some_and(|s| s > 0), "{status:#}");
    ns.cleanup().await.unwrap();
}

/// The launcher of `group`: its ranks' `finished` lines reach 0.90, and the workers' sshd and the
/// ranks ran as the image's non-root user.
async fn assert_mpi_group(ns: &TestNamespace, job: &str, group: u32, ranks: usize) {
    let log = log_of(ns, &format!("{job}-g{group}-launcher"), false).await;
    assert_finished(&format!("{job} group {group}"), &log, ranks, 0.90);
}

/// Scenario 2a: a hybrid job with mpi groups trains through the launchers' mpirun and the
/// workers' sshd (host keys checked against the job's CA), as uid 1000.
#[tokio::test]
async fn mpi_hybrid_trains_through_launcher_and_sshd_as_non_root() {
    let mut manifest = example("mnist-hybrid.yaml", "mpihybrid", 600);
    manifest["spec"]["workers"]["backend"] = "mpi".into();
    let (_cluster, ns) = start("mpihybrid", manifest).await;
    // While the group runs: sshd and the ranks are uid 1000 in the worker pods.
    let worker = wait_for("mpihybrid-g0-1 to run ranks", JOB_DEADLINE, || async {
        let out = Command::new("kubectl")
            .args([
                "-n",
                ns.name(),
                "exec",
                "mpihybrid-g0-1",
                "-c",
                "tandem",
                "--",
                "ps",
                "-eo",
                "uid=,args=",
            ])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.contains("tandem worker").then_some(text)
    })
    .await;
    for line in worker.lines().filter(|l| l.contains("sshd") || l.contains("tandem worker")) {
        assert_eq!(line.split_whitespace().next(), Some("1000"), "not the image's user: {line}\n{worker}");
    }
    wait_succeeded(&ns, "mpihybrid").await;
    for group in 0..2 {
        assert_mpi_group(&ns, "mpihybrid", group, 2).await;
    }
    ns.cleanup().await.unwrap();
}

/// Scenario 2b: examples/mnist-allreduce.yaml switched to mpi (no PS) trains through the launcher.
#[tokio::test]
async fn mnist_allreduce_over_mpi_trains_through_the_launcher() {
    let mut manifest = example("mnist-allreduce.yaml", "mpiallreduce", 600);
    manifest["spec"]["workers"]["backend"] = "mpi".into();
    let (_cluster, ns) = start("mpiallreduce", manifest).await;
    wait_succeeded(&ns, "mpiallreduce").await;
    assert_mpi_group(&ns, "mpiallreduce", 0, 4).await;
    ns.cleanup().await.unwrap();
}

/// Scenario 3: killing a worker container's process restarts only its group; the job succeeds.
#[tokio::test]
async fn a_killed_worker_restarts_its_group_only_and_the_job_succeeds() {
    let (_cluster, ns) = start("chaos", example("mnist-hybrid.yaml", "chaos", 1000)).await;
    let victim = wait_training(&ns, "chaos-g1-0").await;
    let before = uids(&ns, "chaos").await;
    kill_container(&victim);
    common::assert_only_group_relaunched(&ns, "chaos", 1, &before).await;
    wait_succeeded(&ns, "chaos").await;
    assert_tcp_workers_finished(&ns, "chaos", 0.0).await;
    ns.cleanup().await.unwrap();
}

/// Scenario 4: killing a PS container's process (default settings: no volume in the manifest)
/// restarts it in its pod, where its checkpoint folder survives: it resumes from a checkpoint
/// past step 0, and the job still succeeds.
#[tokio::test]
async fn a_killed_ps_resumes_from_its_checkpoint_and_the_job_succeeds() {
    let (_cluster, ns) = start("psfault", example("mnist-hybrid.yaml", "psfault", 1000)).await;
    let jobs = training_jobs(&ns);
    // Once the PS has written a checkpoint (everySteps: 100): the group's step is past 100.
    wait_for("a checkpoint of PS 0", JOB_DEADLINE, || async {
        let tj = jobs.get("psfault").await.ok()?;
        let step = tj.data.pointer("/status/progress/step")?.as_u64()?;
        (step > 150).then_some(())
    })
    .await;
    let victim = pod(&ns, "psfault-ps-0").await.unwrap();
    let uid = victim.uid().unwrap();
    kill_container(&victim);
    let restarted = wait_for("PS 0 to run again", JOB_DEADLINE, || async {
        let p = pod(&ns, "psfault-ps-0").await?;
        let (_, restarts) = container(&p, "tandem");
        let running = p
            .status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .iter()
            .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
        (restarts >= 1 && running).then_some(p)
    })
    .await;
    assert_eq!(restarted.uid().unwrap(), uid, "the PS pod was recreated, so its emptyDir checkpoint is gone");
    let log = wait_for("PS 0 to resume", Duration::from_secs(60), || async {
        let log = log_of(&ns, "psfault-ps-0", false).await;
        log.contains("resumed from checkpoint").then_some(log)
    })
    .await;
    let line = log.lines().find(|l| l.contains("resumed from checkpoint")).unwrap();
    let version: u64 = line
        .split("version=")
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(version > 0, "PS 0 resumed from an empty checkpoint: {line}");
    wait_succeeded(&ns, "psfault").await;
    // Its events said what happened: restarted in place, resuming from the checkpoint folder.
    let events = kubectl(&[
        "-n",
        ns.name(),
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=psfault",
        "-o",
        "json",
    ]);
    assert!(events.contains("in place"), "no event tells of the in-place restart: {events}");
    ns.cleanup().await.unwrap();
}

/// Scenario 5: `kubectl scale tj/NAME --replicas=3` mid-run adds a group that joins and trains;
/// suspending deletes the pods, resuming brings them back and the job succeeds.
#[tokio::test]
async fn scaling_up_adds_a_group_and_suspend_resume_work() {
    let (_cluster, ns) = start("elastic", example("mnist-hybrid.yaml", "elastic", 1200)).await;
    wait_training(&ns, "elastic-g0-0").await;
    kubectl(&["-n", ns.name(), "scale", "tj/elastic", "--replicas=3"]);
    wait_training(&ns, "elastic-g2-0").await;
    assert!(pod(&ns, "elastic-g2-1").await.is_some());

    let jobs = training_jobs(&ns);
    let patch = |suspend: bool| json!({"spec": {"runPolicy": {"suspend": suspend}}});
    jobs.patch("elastic", &PatchParams::default(), &Patch::Merge(patch(true))).await.unwrap();
    wait_for("the suspended job's pods to go", JOB_DEADLINE, || async {
        let phase = jobs.get("elastic").await.ok()?.data.pointer("/status/phase")?.as_str()?.to_owned();
        (phase == "Suspended" && pods(&ns, "elastic").await.is_empty()).then_some(())
    })
    .await;
    jobs.patch("elastic", &PatchParams::default(), &Patch::Merge(patch(false))).await.unwrap();
    wait_training(&ns, "elastic-g2-0").await;
    wait_succeeded(&ns, "elastic").await;
    let finished = events(&log_of(&ns, "elastic-g2-0", false).await, "finished");
    assert!(!finished.is_empty(), "the added group did not finish its training");
    ns.cleanup().await.unwrap();
}
