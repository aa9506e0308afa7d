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
        !has_number(&log, "403") && !log.contains("Forbidden"),
        "the API server denied the operator something:\n{log}"
    );
}

/// Whether `text` holds the number `n` on its own (not inside a longer one, such as the
/// timestamp `11:19:18.141403Z`).
fn has_number(text: &str, n: &str) -> bool {
    text.match_indices(n).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + n.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_digit()) && !after.is_some_and(|c| c.is_ascii_digit())
    })
}

#[test]
fn a_status_code_is_found_on_its_own_and_not_inside_a_timestamp() {
    assert!(!has_number("\"timestamp\":\"2026-12-02T11:19:18.141403Z\"", "403"));
    assert!(has_number("ApiError: forbidden (ErrorResponse { code: 403 })", "403"));
    assert!(has_number("403", "403"));
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

/// Scenario 2b: examples/mnist-allreduce.yaml switched to mpi (no PS) trains through the launcher,
/// and its final step and accuracy reach `status.progress` from rank 0 (started by mpirun on the
/// group's first worker pod, where the progress sidecar follows its lines).
#[tokio::test]
async fn mnist_allreduce_over_mpi_trains_through_the_launcher() {
    let mut manifest = example("mnist-allreduce.yaml", "mpiallreduce", 600);
    manifest["spec"]["workers"]["backend"] = "mpi".into();
    let (_cluster, ns) = start("mpiallreduce", manifest).await;
    let status = wait_succeeded(&ns, "mpiallreduce").await;
    assert_mpi_group(&ns, "mpiallreduce", 0, 4).await;
    assert_eq!(status.pointer("/progress/step").and_then(Value::as_u64), Some(600), "{status:#}");
    let accuracy = status.pointer("/progress/accuracy").and_then(Value::as_f64);
    assert!(accuracy.is_some_and(|a| a >= 0.90), "status.progress.accuracy of rank 0: {status:#}");
    ns.cleanup().await.unwrap();
}

/// The `Stalled` condition of job `name`, once its status is `want`.
async fn wait_stalled(ns: &TestNamespace, name: &str, want: &str, deadline: Duration) -> Value {
    let jobs = training_jobs(ns);
    wait_for(&format!("Stalled={want} on {name}"), deadline, || async {
        let tj = jobs.get(name).await.ok()?;
        let conditions = tj.data.pointer("/status/conditions")?.as_array()?.clone();
        conditions.into_iter().find(|c| c["type"] == "Stalled" && c["status"] == want)
    })
    .await
}

/// A job without parameter servers (examples/mnist-allreduce.yaml, tcp) reports its progress
/// through the sidecar of its rank 0: `status.progress` and `kubectl get tj` show its step, and
/// stall detection watches it. A SIGSTOPped rank holds the group in its allreduce: 30 s later the
/// job is `Stalled=True` (`stallPolicy: None`: reported only), and once continued the step
/// advances and `Stalled` turns False.
#[tokio::test]
async fn an_allreduce_jobs_progress_reaches_its_status_and_a_stopped_rank_stalls_it() {
    let mut manifest = example("mnist-allreduce.yaml", "arstall", 200_000);
    manifest["spec"]["workers"]["groupSize"] = 2.into();
    manifest["spec"]["runPolicy"] = json!({"stallTimeoutSeconds": 30, "stallPolicy": "None"});
    let (_cluster, ns) = start("arstall", manifest).await;
    let step = wait_for("status.progress from rank 0's progress lines", JOB_DEADLINE, || async {
        progress_step(&ns, "arstall").await.filter(|&s| s > 0)
    })
    .await;
    let table = kubectl(&["-n", ns.name(), "get", "tj", "arstall"]);
    // Columns are left-aligned under their headers (an empty one, such as STALLED, is blank).
    let (header, row) = (table.lines().next().unwrap_or_default(), table.lines().nth(1).unwrap_or_default());
    let column = header.find(" STEP ").unwrap_or_else(|| panic!("no STEP column:\n{table}")) + 1;
    let shown: u64 = row.get(column..).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0);
    assert!(shown >= step, "kubectl get tj shows step {shown}, status.progress had {step}:\n{table}");

    // Rank 1 stopped: rank 0 waits in the allreduce, and no step advances (its collective timeout,
    // 60 s, is past the stall timeout, so the group is still whole when it is continued).
    let victim = pod(&ns, "arstall-g0-1").await.unwrap();
    let (id, _) = container(&victim, "tandem");
    ctr(&["tasks", "kill", "--signal", "SIGSTOP", &id]);
    let stalled = wait_stalled(&ns, "arstall", "True", Duration::from_secs(120)).await;
    let message = stalled["message"].as_str().unwrap_or_default();
    assert!(message.contains("stallTimeoutSeconds is 30 s") && message.contains("None"), "{stalled:#}");
    let at = progress_step(&ns, "arstall").await.unwrap();
    ctr(&["tasks", "kill", "--signal", "SIGCONT", &id]);
    let progressing = wait_stalled(&ns, "arstall", "False", Duration::from_secs(120)).await;
    assert_eq!(progressing["reason"], "Progressing", "{progressing:#}");
    assert!(progress_step(&ns, "arstall").await.unwrap() > at, "the step advanced past {at}");
    let uid = victim.uid();
    assert_eq!(pod(&ns, "arstall-g0-1").await.unwrap().uid(), uid, "nothing was restarted");
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
    // The target of the undisturbed run (scenario 1: 0.90 after 600 steps), which this one meets
    // after 1000 steps with group 1 resumed from the PS weights (as `tandem train` does after a
    // killed worker: trainer/tests/it/runner_e2e.rs).
    assert_tcp_workers_finished(&ns, "chaos", 0.90).await;
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

/// The `tandem` container's log of `pod` from now until the container ends, collected by a task
/// (the log goes with the pod once it is deleted, so it is followed from before the deletion);
/// `opened` is told once the stream is open.
fn follow_log(
    ns: &TestNamespace,
    pod: &str,
    opened: tokio::sync::oneshot::Sender<()>,
) -> tokio::task::JoinHandle<String> {
    let (api, pod) = (ns.api::<Pod>(), pod.to_owned());
    tokio::spawn(async move {
        use futures::{AsyncBufReadExt, TryStreamExt};
        let params = LogParams { container: Some("tandem".to_owned()), follow: true, ..LogParams::default() };
        let Ok(stream) = api.log_stream(&pod, &params).await else { return String::new() };
        let _ = opened.send(());
        let lines: Vec<String> = stream.lines().try_collect().await.unwrap_or_default();
        lines.join("\n")
    })
}

/// The exit code of `pod`'s `tandem` container as the kubelet last reported it before the pod
/// went, watched from before the deletion; `listed` is told once the watch has its first list.
fn watch_exit_code(
    ns: &TestNamespace,
    pod: &str,
    listed: tokio::sync::oneshot::Sender<()>,
) -> tokio::task::JoinHandle<Option<i32>> {
    let (api, pod) = (ns.api::<Pod>(), pod.to_owned());
    tokio::spawn(async move {
        use futures::StreamExt;
        use kube::runtime::watcher::{self, Event};
        let config = watcher::Config::default().fields(&format!("metadata.name={pod}"));
        let mut events = std::pin::pin!(watcher::watcher(api, config));
        let mut code = None;
        let mut listed = Some(listed);
        while let Some(Ok(event)) = events.next().await {
            if matches!(event, Event::InitDone)
                && let Some(listed) = listed.take()
            {
                let _ = listed.send(());
            }
            match event {
                Event::Apply(p) | Event::InitApply(p) => {
                    let statuses = p.status.and_then(|s| s.container_statuses).unwrap_or_default();
                    let terminated = statuses
                        .iter()
                        .filter(|c| c.name == "tandem")
                        .find_map(|c| c.state.as_ref()?.terminated.as_ref().map(|t| t.exit_code));
                    code = terminated.or(code);
                }
                Event::Delete(_) => return code,
                _ => {}
            }
        }
        code
    })
}

/// The first `key=<number>` of the first line of `log` that contains `message`.
fn logged_number(log: &str, message: &str, key: &str) -> Option<u64> {
    let line = log.lines().find(|l| l.contains(message))?;
    line.split(&format!("{key}=")).nth(1)?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// The folder on this node of the claim `name` (local-path storage: a host path).
async fn claim_dir(ns: &TestNamespace, name: &str) -> std::path::PathBuf {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    let claim = ns.api::<PersistentVolumeClaim>().get(name).await.unwrap();
    let volume =
        claim.spec.and_then(|s| s.volume_name).unwrap_or_else(|| panic!("claim {name} is not bound"));
    let pv = Api::<PersistentVolume>::all(ns.client()).get(&volume).await.unwrap();
    let spec = pv.spec.unwrap_or_default();
    let path = spec.host_path.map(|h| h.path).or_else(|| spec.local.map(|l| l.path));
    path.unwrap_or_else(|| panic!("volume {volume} of claim {name} has no path on the node")).into()
}

/// The job's `status.progress.step`.
async fn progress_step(ns: &TestNamespace, job: &str) -> Option<u64> {
    training_jobs(ns).get(job).await.ok()?.data.pointer("/status/progress/step")?.as_u64()
}

/// Deletes `name` (the kubelet's SIGTERM within the pod's grace period) while following its log
/// and its container's exit code; returns both once the pod is gone.
async fn delete_and_observe(ns: &TestNamespace, name: &str) -> (String, Option<i32>) {
    let ((opened, log_open), (listed, watch_listed)) =
        (tokio::sync::oneshot::channel(), tokio::sync::oneshot::channel());
    let (log, code) = (follow_log(ns, name, opened), watch_exit_code(ns, name, listed));
    // Both have opened their streams before the deletion.
    let open = async { log_open.await.is_ok() && watch_listed.await.is_ok() };
    let open = tokio::time::timeout(Duration::from_secs(60), open).await;
    assert_eq!(open, Ok(true), "the log stream and the watch of {name} did not open within 60 s");
    ns.api::<Pod>().delete(name, &kube::api::DeleteParams::default()).await.unwrap();
    let within = Duration::from_secs(180);
    let code = tokio::time::timeout(within, code).await.expect("the deleted pod went").unwrap();
    let log = tokio::time::timeout(within, log).await.expect("its log ended").unwrap();
    (log, code)
}

/// Issue 20's preemption on the real node: deleting a running worker pod and then the running PS
/// pod of a ps-sync job mid-training (as an eviction, a preemption or a drain would). Each gets
/// SIGTERM from the kubelet, stops after saving its progress (the worker at a step boundary, the PS
/// after a last checkpoint on the job's claim) and exits 143; the operator restarts the unit, which
/// resumes where it stopped — no completed step is lost — and the job succeeds.
#[tokio::test]
async fn deleted_worker_and_ps_pods_checkpoint_on_sigterm_and_their_restarts_lose_no_step() {
    const STEPS: u64 = 3000;
    let cluster = TestCluster::connect().await.unwrap();
    let ns = cluster.namespace("node-preempt").await.unwrap();
    let claim = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "ckpt"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    });
    cluster.apply(ns.name(), &claim).await.unwrap();
    let mut manifest = example("mnist-ps-sync.yaml", "preempt", STEPS);
    let spec = &mut manifest["spec"];
    // No periodic checkpoints: the only PS checkpoint mid-run is the one written on SIGTERM. The
    // claim outlives the PS pod, so its recreated pod finds that checkpoint.
    spec["training"]["checkpoint"] = json!({"everySteps": 0, "claimName": "ckpt"});
    spec["workers"] = json!({"groups": 1, "groupSize": 2, "minGroups": 1, "maxGroups": 1, "backend": "tcp"});
    spec["runPolicy"] = json!({"restartPolicy": "OnFailure", "maxRestarts": 20, "backoffSeconds": 2});
    cluster.apply(ns.name(), &manifest).await.unwrap();

    // The worker: rank 1 is deleted (rank 0 reports progress and checkpoints for the group); the
    // group stops at a step boundary that both ranks agree on.
    wait_training(&ns, "preempt-g0-0").await;
    let before = uids(&ns, "preempt").await;
    let (log, code) = delete_and_observe(&ns, "preempt-g0-1").await;
    assert_eq!(code, Some(143), "the deleted worker's exit code; its log:\n{log}");
    let stopped = log
        .split("stopped at step ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("the deleted worker did not stop at a step boundary on SIGTERM:\n{log}"));
    assert!(stopped < STEPS, "the job ended before the deletion: {log}");
    // The group restarts as a unit; the PS keeps its pod.
    common::assert_only_group_relaunched(&ns, "preempt", 0, &before).await;
    let resumed = wait_for("the restarted group to resume", JOB_DEADLINE, || async {
        logged_number(&log_of(&ns, "preempt-g0-0", false).await, "resuming the group's step count", "step")
    })
    .await;
    assert!(resumed >= stopped, "the group stopped at step {stopped} but its restart resumed at {resumed}");

    // The PS: deleted once the restarted group trains; it writes its last checkpoint and goes.
    let leader = wait_training(&ns, "preempt-g0-0").await.uid();
    let ps_uid = pod(&ns, "preempt-ps-0").await.unwrap().uid();
    let reported = progress_step(&ns, "preempt").await.unwrap_or(0);
    let (log, code) = delete_and_observe(&ns, "preempt-ps-0").await;
    assert_eq!(code, Some(143), "the deleted PS's exit code; its log:\n{log}");
    assert!(log.contains("stopped on SIGTERM after writing its last checkpoint"), "{log}");
    let written = log
        .lines()
        .rev()
        .find_map(|l| logged_number(l, "checkpoint written", "version"))
        .unwrap_or_else(|| panic!("the deleted PS wrote no checkpoint:\n{log}"));
    assert!(written >= reported, "the last checkpoint (version {written}) lacks reported step {reported}");
    assert!(written < STEPS, "the job ended before the deletion: {log}");
    // Its new pod resumes from exactly that checkpoint on the claim.
    let ps_log = wait_for("the recreated PS 0 to resume", JOB_DEADLINE, || async {
        let p = pod(&ns, "preempt-ps-0").await?;
        (p.uid() != ps_uid).then_some(())?;
        let log = log_of(&ns, "preempt-ps-0", false).await;
        log.contains("resumed from checkpoint").then_some(log)
    })
    .await;
    let version = logged_number(&ps_log, "resumed from checkpoint", "version");
    assert_eq!(version, Some(written), "the recreated PS did not resume from the last checkpoint:\n{ps_log}");
    // The group, which lost its PS and was restarted, continues from the PS's version.
    let continued = wait_for("the group to resume after the PS restart", JOB_DEADLINE, || async {
        (pod(&ns, "preempt-g0-0").await?.uid() != leader).then_some(())?;
        logged_number(&log_of(&ns, "preempt-g0-0", false).await, "resuming the group's step count", "step")
    })
    .await;
    assert!(continued >= written, "the group resumed at step {continued}, before the PS's version {written}");

    let status = wait_succeeded(&ns, "preempt").await;
    let last = status.pointer("/progress/step").and_then(Value::as_u64).unwrap_or(0);
    assert!(last >= written, "the job's progress went back to step {last} after the PS's version {written}");
    ns.cleanup().await.unwrap();
}

/// A user's own PyTorch DDP script (examples/pytorch/, its image from `make images`) through the
/// operator: two groups of two ranks, each one torch.distributed world over gloo between pods,
/// checkpoints on the job's claim. `status.progress` comes from the script's progress lines
/// (through the `tandem progress` sidecar of each group's rank 0); a deleted worker pod (SIGTERM:
/// the group checkpoints and exits 143) restarts its group only, which resumes from its own
/// checkpoint; both groups reach the example's accuracy; `kubectl tandem logs` shows the script's
/// output.
#[tokio::test]
async fn a_users_pytorch_script_trains_through_the_operator_and_a_deleted_pod_restarts_its_group() {
    let cluster = TestCluster::connect().await.unwrap();
    let ns = cluster.namespace("node-pytorch").await.unwrap();
    let claim = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "ckpt"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    });
    cluster.apply(ns.name(), &claim).await.unwrap();
    // About 30 steps a second on two cores (more with the node to itself): minutes, long enough
    // to delete a pod mid-run.
    let steps = 6000;
    let mut manifest = example("pytorch/job.yaml", "ddp", steps);
    manifest["spec"]["training"]["checkpoint"]["claimName"] = "ckpt".into();
    manifest["spec"]["workers"]["env"] = json!([{"name": "OMP_NUM_THREADS", "value": "1"}]);
    cluster.apply(ns.name(), &manifest).await.unwrap();
    let jobs = training_jobs(&ns);
    let started = std::time::Instant::now();
    let seen = wait_for("status.progress from the script's progress lines", JOB_DEADLINE, || async {
        let tj = jobs.get("ddp").await.ok()?;
        let step = tj.data.pointer("/status/progress/step")?.as_u64()?;
        (step >= 100).then_some(step)
    })
    .await;
    eprintln!("status.progress.step {seen} after {:?}", started.elapsed());
    // Issue 42, item 2: rank 0's progress sidecar serves the group's progress as metrics, without
    // the token, on the pod's metrics port (the user's script serves none).
    let rank0_ip = pod(&ns, "ddp-g0-0").await.and_then(|p| p.status?.pod_ip).unwrap();
    let (code, page) = http_get(&format!("http://{rank0_ip}:7073/metrics"));
    assert_eq!(code, 200, "the sidecar's metrics: {page}");
    let step = page
        .lines()
        .find_map(|l| l.strip_prefix("tandem_group_step{group=\"0\"} ")?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no tandem_group_step of group 0:\n{page}"));
    assert!(step > 0.0, "{page}");
    // status.progress is the lowest running group's; group 1, whose pod is deleted, may have
    // started later: wait for its own progress file (on the claim's host folder) to pass a
    // periodic checkpoint.
    let dir = claim_dir(&ns, "ckpt").await;
    let progress = dir.join("progress/group-1.0.jsonl");
    wait_for("group 1 past step 100", JOB_DEADLINE, || async {
        let text = std::fs::read_to_string(&progress).ok()?;
        let last: Value = serde_json::from_str(text.lines().last()?).ok()?;
        (last["step"].as_u64()? >= 100).then_some(())
    })
    .await;
    let before = uids(&ns, "ddp").await;
    let (log, code) = delete_and_observe(&ns, "ddp-g1-1").await;
    assert_eq!(code, Some(143), "the deleted rank's exit code; its log:\n{log}");
    common::assert_only_group_relaunched(&ns, "ddp", 1, &before).await;
    let status = wait_for("job ddp to finish", JOB_DEADLINE, || async {
        let status = jobs.get("ddp").await.ok()?.data.get("status").cloned()?;
        matches!(status["phase"].as_str(), Some("Succeeded" | "Failed")).then_some(status)
    })
    .await;
    if status["phase"] != "Succeeded" {
        let mut out = Vec::new();
        let logs = kubectl_tandem::Command::Logs {
            name: "ddp".to_owned(),
            group: None,
            rank: None,
            follow: false,
            tail: Some(40),
        };
        let _ = kubectl_tandem::run(logs, ns.client(), ns.name(), &mut out, &mut std::io::sink()).await;
        panic!("job ddp did not succeed: {status:#}\nits pods' logs:\n{}", String::from_utf8_lossy(&out));
    }
    let resumed = log_of(&ns, "ddp-g1-0", false).await;
    let at = resumed
        .lines()
        .find_map(|l| l.strip_prefix("rank 0: resumed from ")?.rsplit(' ').next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("the relaunched group did not resume from a checkpoint:\n{resumed}"));
    assert!(at >= 50, "group 1 resumed at step {at}");
    for group in 0..2 {
        let (accuracy, log) = script_accuracy(&ns, "ddp", group).await;
        assert!(accuracy >= 0.8, "group {group} finished at accuracy {accuracy}:\n{log}");
        assert!(log.lines().all(|l| l.starts_with(&format!("[ddp-g{group}-0]"))), "{log}");
    }
    assert_eq!(status.pointer("/progress/step").and_then(Value::as_u64), Some(steps), "{status:#}");
    let accuracy = status.pointer("/progress/accuracy").and_then(Value::as_f64);
    assert!(accuracy.is_some_and(|a| a >= 0.8), "status.progress.accuracy from the script: {status:#}");
    ns.cleanup().await.unwrap();
}

/// The test accuracy that rank 0 of `job`'s group `group` printed ("rank 0: test accuracy A …"),
/// read through `kubectl tandem logs`, with that log.
async fn script_accuracy(ns: &TestNamespace, job: &str, group: u32) -> (f64, String) {
    let mut out = Vec::new();
    let logs = kubectl_tandem::Command::Logs {
        name: job.to_owned(),
        group: Some(group),
        rank: Some(0),
        follow: false,
        tail: None,
    };
    kubectl_tandem::run(logs, ns.client(), ns.name(), &mut out, &mut std::io::sink()).await.unwrap();
    let log = String::from_utf8(out).unwrap();
    let accuracy = log
        .lines()
        .find_map(|l| {
            l.split_once("rank 0: test accuracy ")?.1.split_whitespace().next()?.parse::<f64>().ok()
        })
        .unwrap_or_else(|| panic!("kubectl tandem logs shows no test accuracy of group {group}:\n{log}"));
    (accuracy, log)
}

/// Issue 39: a PyTorch script on tandem.torch (python/examples/fashion_mnist.py and the `tandem`
/// wheel, in the example's image from `make images`) through the operator with MXNET-MPI's hybrid:
/// two PS shards (the trainer image's `tandem ps`) and two groups of two pods running the script.
/// Both groups train one model through the servers to the example's accuracy, and the job's
/// status shows the script's progress.
#[tokio::test]
async fn a_tandem_torch_script_trains_the_hybrid_through_the_operator() {
    let steps = 300;
    let mut manifest = example("../python/examples/job-hybrid.yaml", "torch-hybrid", steps);
    manifest["spec"]["workers"]["image"] = "tandem-pytorch-example:0.1".into();
    manifest["spec"]["workers"]["env"] = json!([{"name": "OMP_NUM_THREADS", "value": "1"}]);
    let (_cluster, ns) = start("torch-hybrid", manifest).await;
    // The operator made the two PS shards beside the script's pods (it removes them once the job
    // succeeds).
    wait_for("the job's two PS pods", JOB_DEADLINE, || async {
        let ps = pods(&ns, "torch-hybrid").await.iter().filter(|p| role_of(p) == "ps").count();
        (ps == 2).then_some(())
    })
    .await;
    let jobs = training_jobs(&ns);
    let seen = wait_for("status.progress from the script's progress lines", JOB_DEADLINE, || async {
        let tj = jobs.get("torch-hybrid").await.ok()?;
        let step = tj.data.pointer("/status/progress/step")?.as_u64()?;
        (step > 0).then_some(step)
    })
    .await;
    eprintln!("status.progress.step {seen}");
    let status = wait_succeeded(&ns, "torch-hybrid").await;
    assert_eq!(status.pointer("/progress/step").and_then(Value::as_u64), Some(steps), "{status:#}");
    // Each group evaluates the weights it pulled last, between the other group's asynchronous
    // pushes: about 0.82 on a quiet node, 0.75 measured beside the suite's other jobs; 0.1 is chance.
    let floor = 0.7;
    let accuracy = status.pointer("/progress/accuracy").and_then(Value::as_f64);
    assert!(accuracy.is_some_and(|a| a >= floor), "status.progress.accuracy from the script: {status:#}");
    for group in 0..2 {
        let (accuracy, log) = script_accuracy(&ns, "torch-hybrid", group).await;
        assert!(accuracy >= floor, "group {group} finished at accuracy {accuracy}:\n{log}");
        assert!(log.contains("after 300 steps (hybrid)"), "{log}");
    }
    ns.cleanup().await.unwrap();
}

/// Issue 38: a `backend: mpi` group runs the user's script from the user's image (OpenMPI and sshd
/// by the documented recipe): the launcher's mpirun starts it on the worker pods over ssh with the
/// contract's variables, the group trains to accuracy, and its progress reaches the job's status
/// through rank 0's sidecar.
#[tokio::test]
async fn a_users_script_runs_under_the_launchers_mpirun_on_the_users_image() {
    let steps = 300;
    let mut manifest = example("pytorch/job.yaml", "ddp-mpi", steps);
    manifest["spec"]["workers"]["backend"] = "mpi".into();
    manifest["spec"]["workers"]["groups"] = 1.into();
    manifest["spec"]["workers"]["env"] = json!([{"name": "OMP_NUM_THREADS", "value": "1"}]);
    let (_cluster, ns) = start("pytorch-mpi", manifest).await;
    let status = wait_succeeded(&ns, "ddp-mpi").await;
    let log = log_of(&ns, "ddp-mpi-g0-launcher", false).await;
    let accuracy = log
        .lines()
        .find_map(|l| {
            l.split_once("rank 0: test accuracy ")?.1.split_whitespace().next()?.parse::<f64>().ok()
        })
        .unwrap_or_else(|| panic!("the launcher's log shows no test accuracy of rank 0:\n{log}"));
    assert!(accuracy >= 0.75, "accuracy {accuracy}:\n{log}");
    assert_eq!(status.pointer("/progress/step").and_then(Value::as_u64), Some(steps), "{status:#}");
    ns.cleanup().await.unwrap();
}

/// A user's command that fails at start fails the job at once, naming the pod and the exit code
/// (no restart loop); a user's image that cannot be pulled leaves the job `Scheduled=False` with
/// the kubelet's reason.
#[tokio::test]
async fn a_users_failing_command_and_missing_image_are_named_in_the_jobs_status() {
    let cluster = TestCluster::connect().await.unwrap();
    let ns = cluster.namespace("node-user-bad").await.unwrap();
    let mut failing = example("pytorch/job.yaml", "exits", 100);
    failing["spec"]["workers"]["groups"] = 1.into();
    failing["spec"]["workers"]["command"] =
        json!(["python3", "-c", "import sys; print('cannot read my config', file=sys.stderr); sys.exit(1)"]);
    cluster.apply(ns.name(), &failing).await.unwrap();
    let mut missing = example("pytorch/job.yaml", "noimage", 100);
    missing["spec"]["workers"]["groups"] = 1.into();
    missing["spec"]["workers"]["image"] = "tandem-no-such-image:0.1".into();
    cluster.apply(ns.name(), &missing).await.unwrap();
    let jobs = training_jobs(&ns);

    let status = wait_for("job exits to end", JOB_DEADLINE, || async {
        let status = jobs.get("exits").await.ok()?.data.get("status").cloned()?;
        matches!(status["phase"].as_str(), Some("Succeeded" | "Failed")).then_some(status)
    })
    .await;
    assert_eq!(status["phase"], "Failed", "{status:#}");
    let failed = status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Failed").unwrap();
    let message = failed["message"].as_str().unwrap();
    assert!(message.contains("pod exits-g0-") && message.contains("exited with code 1"), "{status:#}");
    assert_eq!(status["restarts"].as_u64().unwrap_or(0), 0, "a permanent failure restarted: {status:#}");

    let scheduled =
        wait_for("job noimage's Scheduled=False with the kubelet's reason", JOB_DEADLINE, || async {
            let status = jobs.get("noimage").await.ok()?.data.get("status").cloned()?;
            let conditions = status["conditions"].as_array()?.clone();
            conditions.into_iter().find(|c| {
                c["type"] == "Scheduled"
                    && c["status"] == "False"
                    && matches!(c["reason"].as_str(), Some("ErrImagePull" | "ImagePullBackOff"))
            })
        })
        .await;
    assert!(
        scheduled["message"].as_str().is_some_and(|m| m.contains("tandem-no-such-image")),
        "{scheduled:#}"
    );
    // The job still runs: delete it, and its pods, before the namespace, so that the operator is
    // not left recreating pods in a namespace being terminated.
    jobs.delete("noimage", &kube::api::DeleteParams::default()).await.unwrap();
    wait_for("job noimage and its pods to go", JOB_DEADLINE, || async {
        (jobs.get_opt("noimage").await.ok()?.is_none() && pods(&ns, "noimage").await.is_empty()).then_some(())
    })
    .await;
    ns.cleanup().await.unwrap();
}

/// A MinIO server on the node's address, which pods reach; stopped when dropped.
struct NodeMinio {
    child: std::process::Child,
    drive: std::path::PathBuf,
    endpoint: String,
}

impl NodeMinio {
    const USER: &str = "tandem-e2e";
    const SECRET: &str = "tandem-e2e-secret";

    fn start(bucket: &str) -> NodeMinio {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/minio/bin-path.sh");
        let out = Command::new(script).output().unwrap();
        let bin = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        assert!(std::path::Path::new(&bin).exists(), "{bin} is missing: `make minio-bin`");
        // One folder per test (bucket): tests run at once, and each removes its own when done.
        let root = std::env::temp_dir().join(format!("tandem-e2e-minio-{}-{bucket}", std::process::id()));
        let drive = root.join("drive");
        std::fs::create_dir_all(drive.join(bucket)).unwrap();
        // The node's bridge address (scripts/node/node-env.sh), on a port of its own.
        let port = std::net::TcpListener::bind("10.89.0.1:0").unwrap().local_addr().unwrap().port();
        let address = format!("10.89.0.1:{port}");
        let log = std::fs::File::create(root.join("minio.log")).unwrap();
        let child = Command::new(bin)
            .arg("server")
            .arg(&drive)
            .args(["--address", &address, "--console-address", "127.0.0.1:0", "--certs-dir"])
            .arg(root.join("certs"))
            .env("MINIO_ROOT_USER", Self::USER)
            .env("MINIO_ROOT_PASSWORD", Self::SECRET)
            .env("MINIO_BROWSER", "off")
            .env("HOME", &root)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(&address).is_err() {
            assert!(std::time::Instant::now() < deadline, "minio did not listen on {address} within 60 s");
            std::thread::sleep(Duration::from_millis(200));
        }
        NodeMinio { child, drive, endpoint: format!("http://{address}") }
    }

    /// Object names under `prefix` of `bucket` (MinIO keeps an object as a folder of its key).
    fn objects(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.drive.join(bucket).join(prefix))
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    }

    /// Points `job`'s checkpoints at `s3://<bucket>/runs` on this MinIO, its workers holding the
    /// credentials in their template's env.
    fn checkpoint_here(&self, job: &mut Value, bucket: &str) {
        job["spec"]["training"]["checkpoint"] = json!({"everySteps": 100, "url": format!("s3://{bucket}/runs"), "s3": {"endpoint": self.endpoint}});
        job["spec"]["workers"]["template"] = json!({"spec": {"containers": [{"name": "tandem", "env": [
            {"name": "AWS_ACCESS_KEY_ID", "value": NodeMinio::USER},
            {"name": "AWS_SECRET_ACCESS_KEY", "value": NodeMinio::SECRET},
        ]}]}});
    }

    /// The steps of the checkpoints job `job` keeps in `bucket` (see [`NodeMinio::checkpoint_here`]).
    fn checkpoint_steps(&self, bucket: &str, job: &str) -> Vec<u64> {
        self.objects(bucket, &format!("runs/{job}/checkpoints"))
            .iter()
            .filter_map(|n| n.strip_prefix("ckpt-")?.strip_suffix(".safetensors")?.parse().ok())
            .collect()
    }
}

impl Drop for NodeMinio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(root) = self.drive.parent() {
            let _ = std::fs::remove_dir_all(root);
        }
    }
}

/// Checkpoints in object storage (`training.checkpoint.url`, a real MinIO that the pods reach on
/// the node's address, credentials from the pod template's env): a TrainingJob deleted mid-run —
/// its pods and their emptyDirs gone — and re-created resumes at the step it had saved.
#[tokio::test]
async fn a_deleted_and_recreated_job_resumes_from_its_checkpoints_in_a_bucket() {
    let bucket = "tandem-checkpoints";
    let minio = NodeMinio::start(bucket);
    let mut manifest = example("mnist-allreduce.yaml", "s3ckpt", 200_000);
    manifest["spec"]["workers"]["groupSize"] = 2.into();
    minio.checkpoint_here(&mut manifest, bucket);
    let (cluster, ns) = start("s3ckpt", manifest.clone()).await;
    wait_for("a checkpoint in the bucket", JOB_DEADLINE, || async {
        let kept = minio.objects(bucket, "runs/s3ckpt/checkpoints");
        (!kept.is_empty()).then_some(kept)
    })
    .await;
    let jobs = training_jobs(&ns);
    jobs.delete("s3ckpt", &Default::default()).await.unwrap();
    wait_for("the job's pods to be gone", JOB_DEADLINE, || async {
        pods(&ns, "s3ckpt").await.is_empty().then_some(())
    })
    .await;
    let saved = minio.checkpoint_steps(bucket, "s3ckpt");
    let newest = saved.iter().copied().max().unwrap_or_else(|| panic!("no checkpoint in the bucket"));
    assert!(saved.len() <= 3, "the bucket keeps what the folder keeps: {saved:?}");

    cluster.apply(ns.name(), &manifest).await.unwrap();
    let log = wait_for("rank 0 to resume", JOB_DEADLINE, || async {
        let log = log_of(&ns, "s3ckpt-g0-0", false).await;
        log.contains("resumed from checkpoint").then_some(log)
    })
    .await;
    let step = logged_number(&log, "resumed from checkpoint", "step").unwrap_or(0);
    assert!(step >= newest, "resumed at step {step}, but the bucket held step {newest}:\n{log}");
    ns.cleanup().await.unwrap();
}

/// The `groups=` of each "epoch plan fixed" line of `log` after the first line holding `marker`.
fn epochs_planned_after(log: &str, marker: &str) -> Vec<u64> {
    log.lines()
        .skip_while(|l| !l.contains(marker))
        .filter(|l| l.contains("epoch plan fixed"))
        .filter_map(|l| l.split("groups=").nth(1)?.split_whitespace().next()?.parse().ok())
        .collect()
}

/// Scaling down reaches PS 0 at once: the operator posts the new group count to its status
/// endpoint, instead of leaving it to the mounted job config, which this node's real kubelet
/// refreshes up to a minute later. Every epoch planned after that splits the data among the
/// groups that remain, so no share goes to the group that left.
#[tokio::test]
async fn scaling_down_reaches_ps_0_at_once_and_later_epochs_split_among_the_groups_left() {
    let mut manifest = example("mnist-hybrid.yaml", "shrink", 1);
    let training = manifest["spec"]["training"].as_object_mut().unwrap();
    training.remove("steps");
    training.insert("epochs".to_owned(), 40.into());
    manifest["spec"]["workers"]["groups"] = 3.into();
    let (_cluster, ns) = start("shrink", manifest).await;
    wait_training(&ns, "shrink-g2-0").await;
    kubectl(&["-n", ns.name(), "scale", "tj/shrink", "--replicas=2"]);
    let marker = "group count set by the operator";
    let log = wait_for("PS 0 to hear the new group count and plan two more epochs", JOB_DEADLINE, || async {
        let log = log_of(&ns, "shrink-ps-0", false).await;
        (epochs_planned_after(&log, marker).len() >= 2).then_some(log)
    })
    .await;
    let told = log.lines().find(|l| l.contains(marker)).unwrap();
    assert!(told.contains("groups=2"), "{told}");
    let planned = epochs_planned_after(&log, marker);
    assert!(planned.iter().all(|&g| g == 2), "epochs planned after the scale-down: {planned:?}\n{log}");
    ns.cleanup().await.unwrap();
}

/// Prometheus (upstream's, built from its Go module: `$TANDEM_PROMETHEUS`, `make prometheus-bin`;
/// Debian's package lacks the Kubernetes discovery), on this host, configured with the scrape job
/// users add to theirs
/// (`deploy/prometheus/scrape-trainingjobs.yaml`), discovering pods through the API server of
/// `KUBECONFIG` and scraping them every second on the CNI bridge.
struct NodePrometheus {
    child: std::process::Child,
    root: std::path::PathBuf,
    api: String,
}

impl NodePrometheus {
    fn start() -> NodePrometheus {
        let root = std::env::temp_dir().join(format!("tandem-e2e-prometheus-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/prometheus/scrape-trainingjobs.yaml");
        let mut jobs: Value = serde_yaml::from_str(&std::fs::read_to_string(shipped).unwrap()).unwrap();
        // Outside the cluster the discovery needs the API server's address and credentials.
        let kubeconfig = std::env::var("KUBECONFIG").expect("KUBECONFIG (e2e/node.sh sets it)");
        jobs[0]["kubernetes_sd_configs"][0]["kubeconfig_file"] = kubeconfig.into();
        let config = json!({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": jobs,
        });
        let config_file = root.join("prometheus.yml");
        std::fs::write(&config_file, serde_yaml::to_string(&config).unwrap()).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = std::fs::File::create(root.join("prometheus.log")).unwrap();
        let bin = std::env::var("TANDEM_PROMETHEUS").unwrap_or_else(|_| "prometheus".to_owned());
        let child = Command::new(&bin)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!("--storage.tsdb.path={}", root.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{bin}: {e} (`make prometheus-bin` builds it)"));
        let api = format!("http://127.0.0.1:{port}/api/v1");
        NodePrometheus { child, root, api }
    }

    /// The result vector of the instant query `promql`, or why there is none.
    fn query(&self, promql: &str) -> Result<Vec<Value>, String> {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "5", "--get", "--data-urlencode"])
            .arg(format!("query={promql}"))
            .arg(format!("{}/query", self.api))
            .output()
            .unwrap();
        let body: Value = serde_json::from_slice(&out.stdout)
            .map_err(|_| format!("no answer: {}", String::from_utf8_lossy(&out.stderr)))?;
        if body["status"] != "success" {
            return Err(format!("refused: {body}"));
        }
        Ok(body["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for NodePrometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// `url` fetched with curl: the HTTP status code and the body.
fn http_get(url: &str) -> (u16, String) {
    let out =
        Command::new("curl").args(["-sS", "--max-time", "5", "-w", "\n%{http_code}", url]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// Issue 42, item 2: a stock Prometheus, given the shipped scrape job, finds every PS and worker
/// of a running job and scrapes their metrics without the job token (which still guards the
/// status endpoint), labelled by job, role and group; and every panel of the chart's Grafana
/// dashboard finds data for it.
#[tokio::test]
async fn a_stock_prometheus_scrapes_every_role_and_every_dashboard_panel_finds_data() {
    let prometheus = NodePrometheus::start();
    let (_cluster, ns) = start("metrics", example("mnist-hybrid.yaml", "metrics", 200_000)).await;
    wait_training(&ns, "metrics-g0-0").await;
    let ps_ip =
        wait_for("PS 0's pod IP", JOB_DEADLINE, || async { pod(&ns, "metrics-ps-0").await?.status?.pod_ip })
            .await;
    let (code, page) = http_get(&format!("http://{ps_ip}:7073/metrics"));
    assert_eq!(code, 200, "PS 0's metrics without a token: {page}");
    assert!(page.contains("tandem_ps_version{shard=\"0\"}"), "{page}");
    let (code, refused) = http_get(&format!("http://{ps_ip}:7072/status"));
    assert_eq!(code, 401, "the status endpoint still wants the token's proof: {refused}");

    let selector = format!("namespace=\"{}\", trainingjob=\"metrics\"", ns.name());
    let count = |promql: String| {
        let p = &prometheus;
        async move { p.query(&promql).ok().map(|r| r.len()).unwrap_or(0) }
    };
    // Targets appear one by one as discovery and the first scrapes go: wait for all of them.
    let scraped = |what: &str, promql: String, want: usize, deadline: u64| {
        let what = what.to_owned();
        let p = &prometheus;
        async move {
            let end = tokio::time::Instant::now() + Duration::from_secs(deadline);
            loop {
                let n = count(promql.clone()).await;
                if n >= want {
                    return n;
                }
                if tokio::time::Instant::now() > end {
                    let (_, targets) = http_get(&format!("{}/targets", p.api));
                    panic!(
                        "timed out waiting for {what} ({promql}: {n} series); targets: {targets}\nlog:\n{}",
                        p.log()
                    );
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let workers = scraped(
        "Prometheus to scrape the 4 worker ranks",
        format!("tandem_step{{{selector}, role=\"worker\"}} > 0"),
        4,
        120,
    )
    .await;
    assert_eq!(workers, 4, "2 groups of 2 ranks, each its own target");
    let shards = scraped(
        "Prometheus to scrape the 2 PS shards",
        format!("tandem_ps_version{{{selector}, role=\"ps\"}}"),
        2,
        60,
    )
    .await;
    assert_eq!(shards, 2);

    // The dashboard's queries, with its variables set to this job and a rate window of a few
    // scrapes. A panel shows data when one of its queries does (loss and accuracy come from PS 0
    // in a PS job, from the progress sidecars in a job that runs the user's command).
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/tandem/dashboards/trainingjobs.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 10, "{file} has {} panels", panels.len());
    for panel in panels {
        let title = panel["title"].as_str().unwrap();
        let exprs: Vec<String> = panel["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                t["expr"]
                    .as_str()
                    .unwrap()
                    .replace("$namespace", ns.name())
                    .replace("$trainingjob", "metrics")
                    .replace("$__rate_interval", "15s")
            })
            .collect();
        let found =
            wait_for(&format!("data in panel {title:?}: {exprs:?}"), Duration::from_secs(60), || async {
                let answers: Vec<_> = exprs.iter().map(|e| prometheus.query(e)).collect();
                let errors: Vec<&String> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
                if !errors.is_empty() {
                    return Some(Err(format!("{errors:?}")));
                }
                answers.iter().any(|a| a.as_ref().is_ok_and(|r| !r.is_empty())).then_some(Ok(()))
            })
            .await;
        if let Err(errors) = found {
            panic!("panel {title:?} has a query Prometheus refuses: {errors:?}\n{}", prometheus.log());
        }
    }
    ns.cleanup().await.unwrap();
}

/// The job's scheduler-plugins PodGroup (`scheduling.x-k8s.io/v1alpha1`, the real CRD).
async fn pod_group(ns: &TestNamespace, job: &str) -> Option<kube::api::DynamicObject> {
    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("scheduling.x-k8s.io", "v1alpha1", "PodGroup"),
        "podgroups",
    );
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(ns.client(), ns.name(), &resource);
    api.get_opt(job).await.unwrap()
}

/// Issue 41, gang scheduling by a real scheduler: scheduler-plugins' kube-scheduler with the
/// coscheduling plugin (node-up.sh runs it as `scheduler-plugins-scheduler`) places no pod of a
/// gang that cannot fit as a whole (one worker asks for more CPU than the node has): every pod stays
/// Pending and the job's `Scheduled=False` carries the scheduler's reason. A gang that fits is
/// placed by that scheduler and trains; `minMember` counts the PS and `minGroups` groups.
#[tokio::test]
async fn a_gang_too_big_for_the_node_places_no_pod_and_says_why_and_one_that_fits_trains() {
    let gang = json!({"gang": true, "podGroupFlavor": "scheduler-plugins"});
    let mut big = example("mnist-hybrid.yaml", "gang-big", 200);
    big["spec"]["runPolicy"]["scheduling"] = gang.clone();
    big["spec"]["workers"]["resources"] = json!({"requests": {"cpu": "64"}});
    let (cluster, ns) = start("gang", big).await;
    let pg = wait_for("the PodGroup", JOB_DEADLINE, || pod_group(&ns, "gang-big")).await;
    assert_eq!(pg.data["spec"]["minMember"], 4, "2 PS + minGroups 1 x groupSize 2: {:?}", pg.data);
    let jobs = training_jobs(&ns);
    let scheduled = wait_for("Scheduled=False with the scheduler's reason", JOB_DEADLINE, || async {
        let tj = jobs.get("gang-big").await.ok()?;
        let conditions = tj.data.pointer("/status/conditions")?.as_array()?.clone();
        conditions.into_iter().find(|c| c["type"] == "Scheduled" && c["status"] == "False")
    })
    .await;
    let message = scheduled["message"].as_str().unwrap_or_default();
    assert!(message.contains("Insufficient cpu"), "the reason is not the scheduler's: {scheduled}");
    // Past the coscheduling permit timeout (10 s): still nothing placed, nothing running.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let all = pods(&ns, "gang-big").await;
    assert!(all.len() >= 6, "the job's pods exist: {}", all.len());
    for p in &all {
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.scheduler_name.as_deref(), Some("scheduler-plugins-scheduler"));
        assert!(spec.node_name.is_none(), "{} was placed although its gang cannot fit", p.name_any());
    }
    jobs.delete("gang-big", &Default::default()).await.unwrap();

    let mut fits = example("mnist-hybrid.yaml", "gang-fits", 200);
    fits["spec"]["runPolicy"]["scheduling"] = gang;
    cluster.apply(ns.name(), &fits).await.unwrap();
    wait_succeeded(&ns, "gang-fits").await;
    let pg = pod_group(&ns, "gang-fits").await;
    assert!(pg.is_none(), "a finished job's PodGroup is removed: {pg:?}");
    ns.cleanup().await.unwrap();
}

/// A Kueue API of the node's Kueue (`kueue.x-k8s.io/v1beta2`).
fn kueue_api(
    cluster: &TestCluster,
    ns: Option<&str>,
    kind: &str,
    plural: &str,
) -> Api<kube::api::DynamicObject> {
    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", kind),
        plural,
    );
    match ns {
        Some(ns) => Api::namespaced_with(cluster.client(), ns, &resource),
        None => Api::all_with(cluster.client(), &resource),
    }
}

/// Creates (server-side apply) a Kueue object from `manifest` (cluster-scoped unless `ns`).
async fn kueue_apply(cluster: &TestCluster, ns: Option<&str>, manifest: Value) {
    let kind = manifest["kind"].as_str().unwrap().to_owned();
    let plural = format!("{}s", kind.to_lowercase()).replace("classs", "classes");
    let name = manifest["metadata"]["name"].as_str().unwrap().to_owned();
    let api = kueue_api(cluster, ns, &kind, &plural);
    api.patch(&name, &PatchParams::apply("tandem-e2e").force(), &Patch::Apply(&manifest)).await.unwrap();
}

/// A ClusterQueue with `cpu` of quota in a flavour of the same name, `e2e-<namespace>` (whose
/// node label and toleration every admitted pod must carry), and LocalQueue `queue` in `ns`
/// pointing at it; returns that name.
async fn kueue_queue(cluster: &TestCluster, ns: &TestNamespace, cpu: &str, preempt: bool) -> String {
    let name = format!("e2e-{}", ns.name());
    let name = name.as_str();
    kueue_apply(cluster, None, json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": name},
        "spec": {"nodeLabels": {"kubernetes.io/hostname": "tandem-node"},
                 "tolerations": [{"key": "tandem.dev/queue", "operator": "Equal", "value": name, "effect": "NoSchedule"}]},
    }))
    .await;
    let preemption = if preempt { "LowerPriority" } else { "Never" };
    kueue_apply(cluster, None, json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
        "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": preemption},
                 "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": name, "resources": [
                     {"name": "cpu", "nominalQuota": cpu}, {"name": "memory", "nominalQuota": "8Gi"}]}]}]},
    }))
    .await;
    kueue_apply(
        cluster,
        Some(ns.name()),
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "queue"},
            "spec": {"clusterQueue": name},
        }),
    )
    .await;
    name.to_owned()
}

/// Deletes the cluster-scoped Kueue objects of [`kueue_queue`] (the namespace's go with it).
async fn kueue_drop(cluster: &TestCluster, name: &str) {
    for (kind, plural) in [("ClusterQueue", "clusterqueues"), ("ResourceFlavor", "resourceflavors")] {
        let _ = kueue_api(cluster, None, kind, plural).delete(name, &Default::default()).await;
    }
}

/// `job` labelled for the LocalQueue `queue`, each pod asking for `cpu`.
fn queued(mut job: Value, cpu: &str) -> Value {
    job["metadata"]["labels"] = json!({"kueue.x-k8s.io/queue-name": "queue"});
    let resources = json!({"requests": {"cpu": cpu, "memory": "64Mi"}});
    job["spec"]["workers"]["resources"] = resources.clone();
    if job["spec"]["parameterServers"].is_object() {
        job["spec"]["parameterServers"]["resources"] = resources;
    }
    job
}

/// The job's condition `type_`, once its status has it with `status`.
async fn condition_of(ns: &TestNamespace, job: &str, type_: &str, status: &str) -> Option<Value> {
    let tj = training_jobs(ns).get(job).await.ok()?;
    let conditions = tj.data.pointer("/status/conditions")?.as_array()?.clone();
    conditions.into_iter().find(|c| c["type"] == type_ && c["status"] == status)
}

/// The ClusterQueue's `status.reservingWorkloads`.
async fn reserving(cluster: &TestCluster, name: &str) -> Option<u64> {
    let cq = kueue_api(cluster, None, "ClusterQueue", "clusterqueues").get(name).await.ok()?;
    Some(cq.data.pointer("/status/reservingWorkloads").and_then(Value::as_u64).unwrap_or(0))
}

/// Issue 41, Kueue admission on the real node: two jobs and quota for one. The second waits as a
/// whole — suspended, no pod, Kueue's reason in its status — and runs once the first succeeds and
/// its Workload's quota is released; every admitted pod carries the flavour's node selector and
/// toleration; the second one's quota is released when it fails.
#[tokio::test]
async fn kueue_admits_a_second_job_when_the_first_releases_its_quota_after_success_and_failure() {
    let cluster = TestCluster::connect().await.unwrap();
    let ns = cluster.namespace("node-kueue").await.unwrap();
    let queue = kueue_queue(&cluster, &ns, "1", false).await;
    // 2 PS + 2 groups of 2 at 100m: 600m; two such jobs do not fit in 1 CPU.
    cluster.apply(ns.name(), &queued(example("mnist-hybrid.yaml", "first", 300), "100m")).await.unwrap();
    let ps = wait_for("the first job's pods", JOB_DEADLINE, || pod(&ns, "first-ps-0")).await;
    let spec = ps.spec.as_ref().unwrap();
    assert_eq!(spec.node_selector.as_ref().unwrap()["kubernetes.io/hostname"], "tandem-node", "{spec:?}");
    let tolerations = spec.tolerations.as_ref().unwrap();
    assert!(tolerations.iter().any(|t| t.key.as_deref() == Some("tandem.dev/queue")), "{tolerations:?}");

    // 6 groups of one rank at 100m: 600m. (Ranks of one group would wait for the failed rank 0
    // until the pod's grace period ends.)
    let mut second = queued(example("pytorch/job.yaml", "second", 100), "100m");
    second["spec"]["workers"]["groups"] = 6.into();
    second["spec"]["workers"]["groupSize"] = 1.into();
    second["spec"]["workers"]["command"] =
        json!(["python3", "-c", "import sys; print('cannot read my config', file=sys.stderr); sys.exit(1)"]);
    cluster.apply(ns.name(), &second).await.unwrap();
    let waiting = wait_for("the second job to wait for quota", JOB_DEADLINE, || async {
        let c = condition_of(&ns, "second", "Suspended", "True").await?;
        c["message"].as_str()?.contains("quota for cpu").then_some(c)
    })
    .await;
    assert_eq!(waiting["reason"], "QueuedByKueue", "{waiting}");
    let jobs = training_jobs(&ns);
    for _ in 0..10 {
        assert!(pods(&ns, "second").await.is_empty(), "a queued job has pods");
        let first = jobs.get("first").await.unwrap();
        if first.data.pointer("/status/phase").and_then(Value::as_str) == Some("Succeeded") {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    wait_succeeded(&ns, "first").await;
    let admitted = wait_for("the second job to be admitted", JOB_DEADLINE, || async {
        condition_of(&ns, "second", "Suspended", "False").await
    })
    .await;
    assert_eq!(admitted["reason"], "Admitted", "{admitted}");
    let status = wait_for("the second job to fail", JOB_DEADLINE, || async {
        let status = jobs.get("second").await.ok()?.data.get("status").cloned()?;
        matches!(status["phase"].as_str(), Some("Succeeded" | "Failed")).then_some(status)
    })
    .await;
    assert_eq!(status["phase"], "Failed", "{status:#}");
    wait_for("the ClusterQueue to hold no reservation", JOB_DEADLINE, || async {
        (reserving(&cluster, &queue).await? == 0).then_some(())
    })
    .await;
    let workloads = kueue_api(&cluster, Some(ns.name()), "Workload", "workloads");
    for job in ["first", "second"] {
        let w = workloads.get(&format!("trainingjob-{job}")).await.unwrap();
        let conditions = w.data.pointer("/status/conditions").cloned().unwrap_or_default();
        let finished = conditions
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Finished" && c["status"] == "True");
        assert!(finished, "workload of {job} not Finished: {conditions}");
    }
    ns.cleanup().await.unwrap();
    kueue_drop(&cluster, &queue).await;
}

/// Issue 41, Kueue preemption on the real node: a higher-priority job (WorkloadPriorityClass)
/// preempts a running one — its pods get SIGTERM and checkpoint to the bucket, it waits
/// suspended with Kueue's reason — and once the preemptor finishes the preempted job is admitted
/// again and resumes from that checkpoint.
#[tokio::test]
async fn a_higher_priority_job_preempts_a_running_one_which_resumes_from_its_checkpoint() {
    let cluster = TestCluster::connect().await.unwrap();
    let ns = cluster.namespace("node-kueue-preempt").await.unwrap();
    let queue = kueue_queue(&cluster, &ns, "1", true).await;
    for (name, value) in [("e2e-low", 100), ("e2e-high", 1000)] {
        kueue_apply(
            &cluster,
            None,
            json!({
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
                "metadata": {"name": name}, "value": value,
            }),
        )
        .await;
    }
    let bucket = "tandem-kueue";
    let minio = NodeMinio::start(bucket);
    let mut low = queued(example("mnist-allreduce.yaml", "low", 200_000), "300m");
    low["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "e2e-low".into();
    low["spec"]["workers"]["groupSize"] = 2.into();
    minio.checkpoint_here(&mut low, bucket);
    cluster.apply(ns.name(), &low).await.unwrap();
    wait_for("a checkpoint of the low job", JOB_DEADLINE, || async {
        let kept = minio.objects(bucket, "runs/low/checkpoints");
        (!kept.is_empty()).then_some(kept)
    })
    .await;

    let mut high = queued(example("mnist-allreduce.yaml", "high", 200), "300m");
    high["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "e2e-high".into();
    high["spec"]["workers"]["groupSize"] = 2.into();
    cluster.apply(ns.name(), &high).await.unwrap();
    let evicted = wait_for("the low job to be preempted", JOB_DEADLINE, || async {
        condition_of(&ns, "low", "Suspended", "True").await.filter(|c| c["reason"] == "EvictedByKueue")
    })
    .await;
    assert!(evicted["message"].as_str().unwrap().contains("Preempted"), "{evicted}");
    wait_for("the low job's pods to go", JOB_DEADLINE, || async {
        pods(&ns, "low").await.is_empty().then_some(())
    })
    .await;
    let newest = minio.checkpoint_steps(bucket, "low").into_iter().max().unwrap();
    wait_succeeded(&ns, "high").await;

    let log = wait_for("the low job to resume", JOB_DEADLINE, || async {
        let log = log_of(&ns, "low-g0-0", false).await;
        log.contains("resumed from checkpoint").then_some(log)
    })
    .await;
    let step = logged_number(&log, "resumed from checkpoint", "step").unwrap_or(0);
    assert!(
        step >= newest,
        "resumed at step {step}, but the bucket held step {newest} when it was preempted:\n{log}"
    );
    ns.cleanup().await.unwrap();
    kueue_drop(&cluster, &queue).await;
}

/// Issue 41, an elastic job under Kueue: scaling an admitted job changes its admitted quota. Its
/// Workload is replaced by one of the new size, and the job runs at that size once Kueue admits it.
#[tokio::test]
async fn scaling_a_job_under_kueue_resubmits_it_at_the_new_size() {
    let cluster = TestCluster::connect().await.unwrap();
    let ns = cluster.namespace("node-kueue-scale").await.unwrap();
    let queue = kueue_queue(&cluster, &ns, "1", false).await;
    // 2 PS + 2 groups of 2 at 100m (600m); 4 groups are 1 CPU, still within the quota.
    cluster.apply(ns.name(), &queued(example("mnist-hybrid.yaml", "grow", 100_000), "100m")).await.unwrap();
    wait_training(&ns, "grow-g1-0").await;
    kubectl(&["-n", ns.name(), "scale", "tj/grow", "--replicas=4"]);
    let workloads = kueue_api(&cluster, Some(ns.name()), "Workload", "workloads");
    let workers = |w: &kube::api::DynamicObject| {
        let sets = w.data.pointer("/spec/podSets").and_then(Value::as_array).cloned().unwrap_or_default();
        sets.iter().find(|s| s["name"] == "worker").and_then(|s| s["count"].as_u64())
    };
    wait_for("the Workload of 4 groups", JOB_DEADLINE, || async {
        let w = workloads.get_opt("trainingjob-grow").await.ok()??;
        (workers(&w) == Some(8)).then_some(())
    })
    .await;
    wait_training(&ns, "grow-g3-0").await;
    let admitted = condition_of(&ns, "grow", "Suspended", "False").await.unwrap();
    assert_eq!(admitted["reason"], "Admitted", "{admitted}");
    ns.cleanup().await.unwrap();
    kueue_drop(&cluster, &queue).await;
}
