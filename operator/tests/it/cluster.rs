//! The operator against a real kube-apiserver (`make cluster-up`): jobs are created as a user
//! would, pod phases and exit codes are set through the API as a kubelet would, and the
//! operator acts only as a ServiceAccount bound by the Helm chart's RBAC (`helm template` of
//! charts/tandem, impersonation), so a missing RBAC rule fails these tests: every request the API
//! server denies the operator is logged by it, and [`Harness::stop`] fails on any such line.

// Test helpers panic on purpose: a failed step is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tandem_api::names;
use tandem_api::{JobConfig, JobPhase, TrainingJob};
use tandem_operator::metrics::Metrics;
use tandem_operator::{Context, JobController, Scope, Settings};
use tandem_testkit::{TestCluster, TestNamespace, parse_manifests};
use tokio::sync::watch;

use crate::support;
use support::{LOG, capture_logs, denied, helm};

/// Generous: two busy cores run the control plane, the operator and the test.
const WAIT: Duration = Duration::from_secs(90);
const SA: &str = "tandem-operator";
const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/tandem");

/// The chart's ServiceAccount (named [`SA`]), ClusterRole, ClusterRoleBinding and leader-election
/// Role and RoleBinding for a release `release` in `namespace`, as `helm install` would create them.
fn chart_rbac(release: &str, namespace: &str, values: &str) -> Vec<serde_json::Value> {
    let out = std::process::Command::new(helm())
        .args(["template", release, CHART, "--namespace", namespace])
        .args(["--set", &format!("serviceAccount.name={SA}{values}")])
        .args(["--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/clusterrole.yaml"])
        .args(["--show-only", "templates/leader-election-role.yaml"])
        .output()
        .expect("helm runs (make cluster-bins; TANDEM_K8S_BIN or PATH)");
    assert!(out.status.success(), "helm template failed: {}", String::from_utf8_lossy(&out.stderr));
    parse_manifests(&String::from_utf8(out.stdout).unwrap(), "helm template charts/tandem").unwrap()
}

struct Harness {
    cluster: TestCluster,
    ns: TestNamespace,
    stop: watch::Sender<bool>,
    operator: tokio::task::JoinHandle<()>,
    /// The chart release whose RBAC the operator acts under: its ClusterRole and binding are named
    /// `<release>-operator`.
    release: String,
    metrics: Metrics,
    ctx: Arc<Context>,
}

impl Harness {
    async fn start(prefix: &str) -> Self {
        Self::start_with(prefix, "", |_| {}).await
    }

    /// [`Harness::start`] with extra chart `values` (`,key=value…`) and a change to the context.
    async fn start_with(prefix: &str, values: &str, configure: impl FnOnce(&mut Context)) -> Self {
        let cluster =
            TestCluster::connect().await.expect("control plane up (make cluster-up, KUBECONFIG set)");
        cluster.install_crds(concat!(env!("CARGO_MANIFEST_DIR"), "/../crds")).await.unwrap();
        let ns = cluster.namespace(prefix).await.unwrap();
        capture_logs();
        // One release per test, named after its namespace, so cluster-scoped names never collide.
        let release = ns.name().to_owned();
        for manifest in chart_rbac(&release, ns.name(), values) {
            cluster.apply(ns.name(), &manifest).await.unwrap();
        }
        let client = cluster.impersonate(ns.name(), SA).unwrap();
        let metrics = Metrics::default();
        let settings =
            Settings { force_delete_after: Duration::from_secs(1), resync: Duration::from_secs(5) };
        let mut ctx = Context::new(client, metrics.clone(), settings, Some("test".to_owned()));
        ctx.prune_every = Duration::from_secs(1);
        configure(&mut ctx);
        let ctx = Arc::new(ctx);
        let (stop, rx) = watch::channel(false);
        let prepared = JobController::new(ctx.clone(), &Scope { namespace: Some(ns.name().to_owned()) });
        let operator = tokio::spawn(prepared.run(async move {
            let mut rx = rx;
            let _ = rx.wait_for(|s| *s).await;
        }));
        Self { cluster, ns, stop, operator, release, metrics, ctx }
    }

    fn admin(&self) -> Client {
        self.cluster.client()
    }

    fn jobs(&self) -> Api<TrainingJob> {
        self.ns.api()
    }

    fn pods(&self) -> Api<Pod> {
        self.ns.api()
    }

    async fn create_job(&self, yaml: &str) -> TrainingJob {
        let job: TrainingJob = serde_yaml::from_str(yaml).unwrap();
        self.jobs().create(&PostParams::default(), &job).await.unwrap()
    }

    async fn job(&self, name: &str) -> TrainingJob {
        self.jobs().get(name).await.unwrap()
    }

    async fn pod_names(&self, job: &str) -> Vec<String> {
        let list = self
            .pods()
            .list(&ListParams::default().labels(&format!("{}={job}", names::LABEL_JOB)))
            .await
            .unwrap();
        let mut names: Vec<String> = list.items.iter().map(|p| p.name_any()).collect();
        names.sort();
        names
    }

    /// Sets a pod's phase as a kubelet would; `exit` adds a terminated `tandem` container.
    async fn set_pod(&self, pod: &str, phase: &str, ready: bool, exit: Option<i32>) {
        let mut status = json!({
            "phase": phase,
            "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}],
        });
        if let Some(code) = exit {
            status["containerStatuses"] = json!([{
                "name": "tandem", "image": "tandem-trainer:0.1", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": code, "reason": if code == 0 {"Completed"} else {"Error"}}},
            }]);
        }
        self.pods()
            .patch_status(pod, &PatchParams::default(), &Patch::Merge(json!({"status": status})))
            .await
            .unwrap();
    }

    async fn run_all(&self, job: &str) {
        for pod in self.pod_names(job).await {
            self.set_pod(&pod, "Running", true, None).await;
        }
    }

    async fn events(&self, job: &str) -> Vec<Event> {
        let events: Api<Event> = self.ns.api();
        let list = events.list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(job))
            .collect()
    }

    /// Stops the operator, removes the test's objects, and fails if the API server denied the
    /// operator any request: the chart's RBAC must grant everything the operator does.
    async fn stop(self) {
        use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
        let admin = self.admin();
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(WAIT, self.operator).await;
        let name = format!("{}-operator", self.release);
        let _ = Api::<ClusterRoleBinding>::all(admin.clone()).delete(&name, &DeleteParams::default()).await;
        let _ = Api::<ClusterRole>::all(admin).delete(&name, &DeleteParams::default()).await;
        let user = format!("system:serviceaccount:{}:{SA}", self.ns.name());
        self.ns.cleanup().await.unwrap();
        let denied = denied(&user);
        assert!(denied.is_empty(), "the chart's RBAC denied the operator:\n{}", denied.join("\n"));
    }
}

/// Polls `check` until it returns `Some`, failing with `what` and the last state after [`WAIT`].
async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(state) if tokio::time::Instant::now() > deadline => {
                panic!("timed out waiting for {what}; last: {state}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

async fn wait_phase(h: &Harness, job: &str, phase: JobPhase) -> TrainingJob {
    wait_for(&format!("{job} phase {phase:?}"), || async {
        let j = h.job(job).await;
        match j.status.as_ref().and_then(|s| s.phase) {
            Some(p) if p == phase => Ok(j),
            _ => Err(format!("{:?}", j.status)),
        }
    })
    .await
}

async fn wait_pods(h: &Harness, job: &str, expected: &[&str]) {
    wait_for(&format!("pods {expected:?}"), || async {
        let names = h.pod_names(job).await;
        if names == expected { Ok(()) } else { Err(format!("{names:?}")) }
    })
    .await
}

/// Waits until pod `pod` exists at launch attempt `attempt`.
async fn wait_attempt(h: &Harness, pod: &str, attempt: &str) {
    wait_for(&format!("{pod} recreated at attempt {attempt}"), || async {
        match h.pods().get_opt(pod).await.unwrap() {
            Some(p) if p.labels().get(names::LABEL_ATTEMPT).map(String::as_str) == Some(attempt) => Ok(()),
            other => Err(format!("{:?}", other.map(|p| p.labels().clone()))),
        }
    })
    .await
}

fn condition(
    job: &TrainingJob,
    type_: &str,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    job.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_).cloned()
}

const HYBRID: &str = r#"
apiVersion: tandem.dev/v1alpha1
kind: TrainingJob
metadata: {name: hybrid}
spec:
  training: {algorithm: hybrid, steps: 100}
  parameterServers: {replicas: 1}
  workers: {groups: 2, groupSize: 2, minGroups: 1, maxGroups: 3}
  runPolicy: {maxRestarts: 2, backoffSeconds: 1}
"#;

#[tokio::test]
async fn children_status_and_group_restart() {
    let h = Harness::start("op-restart").await;
    h.create_job(HYBRID).await;
    let all = ["hybrid-g0-0", "hybrid-g0-1", "hybrid-g1-0", "hybrid-g1-1", "hybrid-ps-0"];
    wait_pods(&h, "hybrid", &all).await;

    // Children: headless Service, the contract ConfigMap, the token Secret, all owned by the job.
    let job = wait_phase(&h, "hybrid", JobPhase::Created).await;
    let uid = job.uid().unwrap();
    let svc: Service = h.ns.api().get("hybrid").await.unwrap();
    assert_eq!(svc.spec.as_ref().unwrap().cluster_ip.as_deref(), Some("None"));
    assert_eq!(svc.owner_references()[0].uid, uid);
    let cm: ConfigMap = h.ns.api().get("hybrid-config").await.unwrap();
    let config = JobConfig::from_json(&cm.data.unwrap()["job.json"]).unwrap();
    assert_eq!(config.groups.len(), 2);
    assert_eq!(config.parameter_servers[0].host, format!("hybrid-ps-0.hybrid.{}.svc", h.ns.name()));
    let secret: Secret = h.ns.api().get("hybrid-token").await.unwrap();
    assert_eq!(secret.data.unwrap()["token"].0.len(), 64);
    let pod = h.pods().get("hybrid-g1-0").await.unwrap();
    assert_eq!(pod.owner_references()[0].uid, uid);
    assert_eq!(pod.metadata.managed_fields.unwrap()[0].manager.as_deref(), Some("tandem-operator"));
    assert_eq!(
        job.status.as_ref().unwrap().selector.as_deref(),
        Some("tandem.dev/job-name=hybrid,tandem.dev/role=worker")
    );

    // Every pod running: Running, with counts and a start time.
    h.run_all("hybrid").await;
    let job = wait_phase(&h, "hybrid", JobPhase::Running).await;
    let status = job.status.unwrap();
    assert_eq!(status.groups, 2);
    assert_eq!(status.workers.unwrap().ready, 4);
    assert!(status.start_time.is_some());
    assert_eq!(status.observed_generation, job.metadata.generation);
    let untouched: Vec<String> = {
        let mut v = Vec::new();
        for name in ["hybrid-ps-0", "hybrid-g0-0", "hybrid-g0-1"] {
            v.push(h.pods().get(name).await.unwrap().uid().unwrap());
        }
        v
    };

    // A worker killed by SIGKILL (137): group 1 alone is restarted, as attempt 1.
    h.set_pod("hybrid-g1-0", "Failed", false, Some(137)).await;
    let job = wait_for("restart recorded", || async {
        let j = h.job("hybrid").await;
        if j.status.as_ref().is_some_and(|s| s.restarts == 1) {
            Ok(j)
        } else {
            Err(format!("{:?}", j.status))
        }
    })
    .await;
    let restarting = condition(&job, "Restarting").unwrap();
    assert_eq!(restarting.reason, "WorkerFailed");
    assert!(
        restarting.message.contains("hybrid-g1-0") && restarting.message.contains("137"),
        "{}",
        restarting.message
    );
    wait_attempt(&h, "hybrid-g1-1", "1").await;
    for (name, uid) in ["hybrid-ps-0", "hybrid-g0-0", "hybrid-g0-1"].iter().zip(&untouched) {
        assert_eq!(&h.pods().get(name).await.unwrap().uid().unwrap(), uid, "{name} must not be restarted");
    }
    wait_pods(&h, "hybrid", &all).await;
    h.set_pod("hybrid-g1-0", "Running", true, None).await;
    h.set_pod("hybrid-g1-1", "Running", true, None).await;
    let job = wait_phase(&h, "hybrid", JobPhase::Running).await;
    assert_eq!(condition(&job, "Restarting").unwrap().status, "False");

    // Events for the transitions, naming the pod and exit code.
    let events = h.events("hybrid").await;
    assert!(
        events.iter().any(|e| e.reason.as_deref() == Some("WorkerFailed")
            && e.note.as_deref().is_some_and(|n| n.contains("hybrid-g1-0") && n.contains("137"))),
        "{events:?}"
    );
    assert!(events.iter().any(|e| e.reason.as_deref() == Some("AllPodsRunning")), "{events:?}");

    // The metrics saw the restart.
    assert!(h.metrics.encode().contains("tandem_operator_restarts_total{role=\"worker\"} 1"));
    h.stop().await;
}

/// Sets the `tandem` container of running pod `pod` as a kubelet shows it: `restarts` in-place
/// restarts, `last_exit` the exit code of the run that ended last, and running now or (`down`)
/// ended with that code and not yet restarted.
async fn set_container(h: &Harness, pod: &str, restarts: i32, last_exit: i32, down: bool) {
    let ended = json!({"terminated": {"exitCode": last_exit, "reason": "Error"}});
    let (state, last) = if down { (ended, json!({})) } else { (json!({"running": {}}), ended) };
    let status = json!({
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": if down {"False"} else {"True"}}],
        "containerStatuses": [{
            "name": "tandem", "image": "tandem-trainer:0.1", "imageID": "", "ready": !down,
            "restartCount": restarts, "state": state, "lastState": last,
        }],
    });
    h.pods()
        .patch_status(pod, &PatchParams::default(), &Patch::Merge(json!({"status": status})))
        .await
        .unwrap();
}

/// Issue 42, item 4: one PS crash is one restart, as with `tandem train`. The PS's container is
/// killed (137) and restarted in place by the kubelet; meanwhile every group's workers lose it and
/// exit with the peer-lost code (200). The groups come back as new attempts, and `status.restarts`
/// counts the PS's restart alone (it used to count 1 + the number of groups).
#[tokio::test]
async fn a_ps_crash_costs_one_restart_however_many_groups_lose_it() {
    let h = Harness::start("op-ps-crash").await;
    h.create_job(HYBRID).await;
    let all = ["hybrid-g0-0", "hybrid-g0-1", "hybrid-g1-0", "hybrid-g1-1", "hybrid-ps-0"];
    wait_pods(&h, "hybrid", &all).await;
    h.run_all("hybrid").await;
    wait_phase(&h, "hybrid", JobPhase::Running).await;

    // As the kubelet reports it: the PS's container ended with 137; a worker of each group exits
    // with 200. (One pod a group: the operator may relaunch group 0 before group 1 is set, and
    // a relaunch replaces the group's other pods.)
    set_container(&h, "hybrid-ps-0", 0, 137, true).await;
    for pod in ["hybrid-g0-0", "hybrid-g1-0"] {
        h.set_pod(pod, "Failed", false, Some(tandem_api::contract::EXIT_PEER_LOST)).await;
    }
    // Then the kubelet starts the PS's container again in the same pod.
    set_container(&h, "hybrid-ps-0", 1, 137, false).await;

    let status = wait_for("both groups relaunched and the PS restart counted", || async {
        let status = h.job("hybrid").await.status.unwrap_or_default();
        let attempt = |unit: &str| status.attempts.iter().find(|a| a.unit == unit).map(|a| a.attempt);
        let ps = status.attempts.iter().find(|a| a.unit == "ps-0").and_then(|a| a.container_restarts);
        if attempt("group-0") == Some(1) && attempt("group-1") == Some(1) && ps == Some(1) {
            Ok(status)
        } else {
            Err(format!("{status:?}"))
        }
    })
    .await;
    assert_eq!(status.restarts, 1, "one PS crash, one restart: {status:?}");
    assert_ne!(status.phase, Some(JobPhase::Failed));
    // The Events follow the status write: the relaunch and the PS's restart are told (the
    // recorder folds two Events of one reason on one job into a series, so one note may stand for
    // both groups).
    wait_for("an Event for the relaunch and for the PS's restart", || async {
        let notes: Vec<String> = h.events("hybrid").await.into_iter().filter_map(|e| e.note).collect();
        let told = |text: &str| notes.iter().any(|n| n.contains(text));
        if told("relaunched because parameter server 0 restarted (not counted")
            && told("pod hybrid-ps-0 exited with code 137")
        {
            Ok(())
        } else {
            Err(format!("{notes:?}"))
        }
    })
    .await;
    wait_attempt(&h, "hybrid-g1-1", "1").await;
    h.stop().await;
}

/// Issue 15, item 13: with `networkPolicy.enabled` (the operator's `--network-policy`), every job
/// gets a NetworkPolicy, owned by it, under which its pods admit only the job's own pods, and the
/// operator's pods on the PS status port; the chart's RBAC grants exactly that. Issue 42, item 2:
/// the scrapers of `networkPolicy.metricsFrom` reach the metrics port, and nothing else.
#[tokio::test]
async fn network_policy_admits_only_the_jobs_pods_the_operator_and_the_scraper_on_the_metrics_port() {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let labels =
        std::collections::BTreeMap::from([("app.kubernetes.io/name".to_owned(), "tandem".to_owned())]);
    let metrics_from = serde_json::from_value(json!([
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]))
    .unwrap();
    let peer = tandem_operator::builder::OperatorPeer {
        namespace: "tandem-system".to_owned(),
        labels,
        metrics_from,
    };
    let h = Harness::start_with("op-netpol", ",networkPolicy.enabled=true", |ctx| {
        ctx.network_policy = Some(peer);
    })
    .await;
    let job = h.create_job(HYBRID).await;
    wait_pods(&h, "hybrid", &["hybrid-g0-0", "hybrid-g0-1", "hybrid-g1-0", "hybrid-g1-1", "hybrid-ps-0"])
        .await;
    let policy: NetworkPolicy = h.ns.api().get("hybrid").await.unwrap();
    assert_eq!(policy.owner_references()[0].uid, job.uid().unwrap());
    let spec = serde_json::to_value(policy.spec.unwrap()).unwrap();
    assert_eq!(
        spec,
        json!({
            "podSelector": {"matchLabels": {"tandem.dev/job-name": "hybrid"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"tandem.dev/job-name": "hybrid"}}}]},
                {
                    "from": [{
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tandem-system"}},
                        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "tandem"}}
                    }],
                    "ports": [{"port": 7072, "protocol": "TCP"}]
                },
                {
                    "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
                    "ports": [{"port": 7073, "protocol": "TCP"}]
                }
            ]
        })
    );
    h.stop().await;
}

/// Issue 15, item 11: an object that already holds a child's name and is not owned by the job is
/// neither adopted nor taken over; the job fails with a condition that names it, and the object
/// survives the job's deletion unchanged.
#[tokio::test]
async fn a_foreign_object_with_a_childs_name_fails_the_job_and_is_left_alone() {
    let h = Harness::start("op-clash").await;
    let admin_cms: Api<ConfigMap> = Api::namespaced(h.admin(), h.ns.name());
    let admin_secrets: Api<Secret> = Api::namespaced(h.admin(), h.ns.name());
    let foreign_cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "clash-config"}, "data": {"owner": "someone else"}
    }))
    .unwrap();
    admin_cms.create(&PostParams::default(), &foreign_cm).await.unwrap();
    let foreign_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "clash2-token"}, "stringData": {"token": "not-the-jobs"}
    }))
    .unwrap();
    admin_secrets.create(&PostParams::default(), &foreign_secret).await.unwrap();

    for (job, kind, object) in [("clash", "ConfigMap", "clash-config"), ("clash2", "Secret", "clash2-token")]
    {
        h.create_job(&HYBRID.replace("name: hybrid", &format!("name: {job}"))).await;
        let failed = wait_phase(&h, job, JobPhase::Failed).await;
        let condition = condition(&failed, "Failed").unwrap();
        assert_eq!(condition.reason, "NameConflict", "{condition:?}");
        assert!(
            condition.message.contains(&format!("{kind} {}/{object}", h.ns.name()))
                && condition.message.contains("not owned by this TrainingJob"),
            "the condition must name the conflicting object: {}",
            condition.message
        );
        assert!(h.pod_names(job).await.is_empty(), "a job that failed on a name conflict started pods");
        h.jobs().delete(job, &DeleteParams::default()).await.unwrap();
    }
    let cm = admin_cms.get("clash-config").await.unwrap();
    assert_eq!(cm.data.unwrap().get("owner").map(String::as_str), Some("someone else"));
    assert!(cm.metadata.owner_references.unwrap_or_default().is_empty(), "the ConfigMap was adopted");
    let managers: Vec<_> =
        cm.metadata.managed_fields.unwrap_or_default().into_iter().filter_map(|f| f.manager).collect();
    assert!(
        !managers.iter().any(|m| m == names::FIELD_MANAGER),
        "the operator wrote the ConfigMap: {managers:?}"
    );
    let secret = admin_secrets.get("clash2-token").await.unwrap();
    assert_eq!(secret.data.unwrap()["token"].0, b"not-the-jobs");
    assert!(secret.metadata.owner_references.unwrap_or_default().is_empty(), "the Secret was adopted");
    h.stop().await;
}

#[tokio::test]
async fn permanent_failure_fails_the_job_and_cleans_running_pods() {
    let h = Harness::start("op-fail").await;
    h.create_job(HYBRID).await;
    wait_pods(&h, "hybrid", &["hybrid-g0-0", "hybrid-g0-1", "hybrid-g1-0", "hybrid-g1-1", "hybrid-ps-0"])
        .await;
    h.run_all("hybrid").await;
    wait_phase(&h, "hybrid", JobPhase::Running).await;
    h.set_pod("hybrid-g0-1", "Failed", false, Some(3)).await;
    let job = wait_phase(&h, "hybrid", JobPhase::Failed).await;
    let failed = condition(&job, "Failed").unwrap();
    assert_eq!(failed.reason, "WorkerFailed");
    assert!(failed.message.contains("pod hybrid-g0-1 exited with code 3"), "{}", failed.message);
    assert!(job.status.unwrap().completion_time.is_some());
    // cleanPodPolicy Running: the failed pod stays for its logs, the running ones go.
    wait_pods(&h, "hybrid", &["hybrid-g0-1"]).await;
    h.stop().await;
}

#[tokio::test]
async fn scale_subresource_adds_and_removes_whole_groups() {
    let h = Harness::start("op-scale").await;
    h.create_job(HYBRID).await;
    wait_pods(&h, "hybrid", &["hybrid-g0-0", "hybrid-g0-1", "hybrid-g1-0", "hybrid-g1-1", "hybrid-ps-0"])
        .await;
    h.run_all("hybrid").await;
    wait_phase(&h, "hybrid", JobPhase::Running).await;

    // kubectl scale tj/hybrid --replicas=3
    let scale = |n: u32| json!({"spec": {"replicas": n}});
    h.jobs().patch_scale("hybrid", &PatchParams::default(), &Patch::Merge(scale(3))).await.unwrap();
    wait_pods(
        &h,
        "hybrid",
        &[
            "hybrid-g0-0",
            "hybrid-g0-1",
            "hybrid-g1-0",
            "hybrid-g1-1",
            "hybrid-g2-0",
            "hybrid-g2-1",
            "hybrid-ps-0",
        ],
    )
    .await;
    let job = wait_phase(&h, "hybrid", JobPhase::Scaling).await;
    assert_eq!(condition(&job, "Scaling").unwrap().status, "True");
    let cm: ConfigMap = h.ns.api().get("hybrid-config").await.unwrap();
    assert_eq!(JobConfig::from_json(&cm.data.unwrap()["job.json"]).unwrap().groups.len(), 3);
    h.set_pod("hybrid-g2-0", "Running", true, None).await;
    h.set_pod("hybrid-g2-1", "Running", true, None).await;
    let job = wait_phase(&h, "hybrid", JobPhase::Running).await;
    assert_eq!(job.status.unwrap().groups, 3);
    let read = h.jobs().get_scale("hybrid").await.unwrap();
    assert_eq!(read.status.unwrap().replicas, 3);

    // Out of range: the API server refuses with the CEL message.
    let err =
        h.jobs().patch_scale("hybrid", &PatchParams::default(), &Patch::Merge(scale(4))).await.unwrap_err();
    assert!(err.to_string().contains("maxGroups"), "{err}");

    h.jobs().patch_scale("hybrid", &PatchParams::default(), &Patch::Merge(scale(1))).await.unwrap();
    wait_pods(&h, "hybrid", &["hybrid-g0-0", "hybrid-g0-1", "hybrid-ps-0"]).await;
    // The job was Running before the scale-down too: wait for the status that counts one group,
    // not for the phase alone, which the operator may not have rewritten yet when the pods go.
    wait_for("hybrid Running with 1 group", || async {
        let status = h.job("hybrid").await.status.unwrap_or_default();
        if status.phase == Some(JobPhase::Running) && status.groups == 1 {
            Ok(())
        } else {
            Err(format!("{status:?}"))
        }
    })
    .await;
    h.stop().await;
}

#[tokio::test]
async fn suspend_resume_success_and_ttl() {
    let h = Harness::start("op-suspend").await;
    let yaml = HYBRID.replace("backoffSeconds: 1}", "backoffSeconds: 1, ttlSecondsAfterFinished: 2}");
    h.create_job(&yaml).await;
    let all = ["hybrid-g0-0", "hybrid-g0-1", "hybrid-g1-0", "hybrid-g1-1", "hybrid-ps-0"];
    wait_pods(&h, "hybrid", &all).await;

    let suspend = |s: bool| Patch::Merge(json!({"spec": {"runPolicy": {"suspend": s}}}));
    h.jobs().patch("hybrid", &PatchParams::default(), &suspend(true)).await.unwrap();
    let job = wait_phase(&h, "hybrid", JobPhase::Suspended).await;
    assert_eq!(condition(&job, "Suspended").unwrap().status, "True");
    wait_pods(&h, "hybrid", &[]).await;
    assert!(h.ns.api::<ConfigMap>().get_opt("hybrid-config").await.unwrap().is_some(), "job objects kept");

    h.jobs().patch("hybrid", &PatchParams::default(), &suspend(false)).await.unwrap();
    wait_pods(&h, "hybrid", &all).await;
    let job = wait_for("resumed", || async {
        let j = h.job("hybrid").await;
        match condition(&j, "Suspended") {
            Some(c) if c.status == "False" && c.reason == "Resumed" => Ok(j),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_ne!(job.status.unwrap().phase, Some(JobPhase::Suspended));

    // Every worker exits 0: the job succeeds, the PS (still running) is cleaned up.
    h.run_all("hybrid").await;
    wait_phase(&h, "hybrid", JobPhase::Running).await;
    for pod in ["hybrid-g0-0", "hybrid-g0-1", "hybrid-g1-0", "hybrid-g1-1"] {
        h.set_pod(pod, "Succeeded", false, Some(0)).await;
    }
    let job = wait_phase(&h, "hybrid", JobPhase::Succeeded).await;
    assert_eq!(condition(&job, "Succeeded").unwrap().reason, "TrainingSucceeded");
    let uid = job.uid().unwrap();
    assert!(h.ctx.remembered_jobs().contains(&uid), "the operator remembers the job's token Secret");
    // ttlSecondsAfterFinished: 2 deletes the TrainingJob itself.
    wait_for("job deleted by its TTL", || async {
        match h.jobs().get_opt("hybrid").await.unwrap() {
            None => Ok(()),
            Some(j) => Err(format!("{:?}", j.status.map(|s| s.phase))),
        }
    })
    .await;
    // What the operator remembered of it goes too (pruned every second here).
    wait_for("the operator to forget the deleted job", || async {
        let remembered = h.ctx.remembered_jobs();
        if remembered.contains(&uid) { Err(format!("{remembered:?}")) } else { Ok(()) }
    })
    .await;
    h.stop().await;
}

#[tokio::test]
async fn mpi_launcher_starts_only_after_its_workers_are_ready() {
    let h = Harness::start("op-mpi").await;
    h.create_job(
        r#"
apiVersion: tandem.dev/v1alpha1
kind: TrainingJob
metadata: {name: mpi}
spec:
  training: {algorithm: hybrid, steps: 100}
  parameterServers: {replicas: 1}
  workers: {groups: 2, groupSize: 2, minGroups: 1, maxGroups: 2, backend: mpi}
"#,
    )
    .await;
    wait_pods(&h, "mpi", &["mpi-g0-0", "mpi-g0-1", "mpi-g1-0", "mpi-g1-1", "mpi-ps-0"]).await;
    let ssh: Secret = h.ns.api().get("mpi-ssh").await.unwrap();
    assert_eq!(ssh.type_.as_deref(), Some("kubernetes.io/ssh-auth"));
    let private = ssh.data.as_ref().unwrap()["ssh-privatekey"].0.clone();
    let hostfile: ConfigMap = h.ns.api().get("mpi-g1-hostfile").await.unwrap();
    assert_eq!(
        hostfile.data.unwrap()["hostfile"],
        format!("mpi-g1-0.mpi.{0}.svc slots=1\nmpi-g1-1.mpi.{0}.svc slots=1\n", h.ns.name())
    );
    // Group 0 ready, group 1 running but not ready: only group 0's launcher.
    h.set_pod("mpi-g0-0", "Running", true, None).await;
    h.set_pod("mpi-g0-1", "Running", true, None).await;
    h.set_pod("mpi-g1-0", "Running", true, None).await;
    h.set_pod("mpi-g1-1", "Running", false, None).await;
    wait_pods(&h, "mpi", &["mpi-g0-0", "mpi-g0-1", "mpi-g0-launcher", "mpi-g1-0", "mpi-g1-1", "mpi-ps-0"])
        .await;
    h.set_pod("mpi-g1-1", "Running", true, None).await;
    wait_pods(
        &h,
        "mpi",
        &["mpi-g0-0", "mpi-g0-1", "mpi-g0-launcher", "mpi-g1-0", "mpi-g1-1", "mpi-g1-launcher", "mpi-ps-0"],
    )
    .await;
    // The key is generated once: later reconciles leave it alone.
    let again: Secret = h.ns.api().get("mpi-ssh").await.unwrap();
    assert_eq!(again.data.unwrap()["ssh-privatekey"].0, private);
    // Launchers decide their group.
    h.set_pod("mpi-g0-launcher", "Succeeded", false, Some(0)).await;
    h.set_pod("mpi-g1-launcher", "Succeeded", false, Some(0)).await;
    wait_phase(&h, "mpi", JobPhase::Succeeded).await;
    h.stop().await;
}

#[tokio::test]
async fn pod_stuck_terminating_on_a_lost_node_is_force_deleted() {
    let h = Harness::start("op-lost").await;
    h.create_job(&HYBRID.replace("groups: 2,", "groups: 1,")).await;
    wait_pods(&h, "hybrid", &["hybrid-g0-0", "hybrid-g0-1", "hybrid-ps-0"]).await;
    // A node without a kubelet, reporting NotReady.
    let node_name = format!("lost-{}", h.ns.name());
    let nodes: Api<Node> = Api::all(h.admin());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": node_name}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let not_ready =
        json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletDown"}]}});
    nodes.patch_status(&node_name, &PatchParams::default(), &Patch::Merge(not_ready)).await.unwrap();
    // Bind a worker to it, as the scheduler would, and let it run.
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "hybrid-g0-0"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node_name},
    });
    h.admin()
        .request::<serde_json::Value>(http_request(
            &format!("/api/v1/namespaces/{}/pods/hybrid-g0-0/binding", h.ns.name()),
            &binding,
        ))
        .await
        .unwrap();
    h.run_all("hybrid").await;
    wait_phase(&h, "hybrid", JobPhase::Running).await;
    // The node is gone for good; something deletes the pod, which no kubelet will ever confirm.
    h.pods()
        .delete("hybrid-g0-0", &DeleteParams { grace_period_seconds: Some(1), ..DeleteParams::default() })
        .await
        .unwrap();
    // The operator restarts the group and force-deletes the stuck pod, so a new attempt appears.
    wait_for("group 0 recreated after the stuck pod was force-deleted", || async {
        match h.pods().get_opt("hybrid-g0-0").await.unwrap() {
            Some(p) if p.labels().get(names::LABEL_ATTEMPT).map(String::as_str) == Some("1") => Ok(()),
            other => Err(format!("{:?}", other.map(|p| (p.labels().clone(), p.metadata.deletion_timestamp)))),
        }
    })
    .await;
    let job = h.job("hybrid").await;
    assert!(condition(&job, "Restarting").unwrap().message.contains("hybrid-g0-0 was deleted"));
    let _ = nodes.delete(&node_name, &DeleteParams::default()).await;
    h.stop().await;
}

fn http_request(path: &str, body: &serde_json::Value) -> http::Request<Vec<u8>> {
    http::Request::post(path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .unwrap()
}

#[tokio::test]
async fn jobs_managed_by_another_controller_are_left_alone() {
    let h = Harness::start("op-managed").await;
    h.create_job(&HYBRID.replace("runPolicy: {", "runPolicy: {managedBy: kueue.x-k8s.io/multikueue, ")).await;
    h.create_job(&HYBRID.replace("name: hybrid", "name: ours")).await;
    // Once the operator handled the second job, it has seen the first too.
    wait_phase(&h, "ours", JobPhase::Created).await;
    assert!(h.pod_names("hybrid").await.is_empty());
    assert!(h.job("hybrid").await.status.is_none());
    h.stop().await;
}

#[tokio::test]
async fn the_operator_role_grants_no_more_than_it_needs() {
    let h = Harness::start("op-rbac").await;
    let client = h.cluster.impersonate(h.ns.name(), SA).unwrap();
    // Secrets can be read by name (the job token), never listed.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), h.ns.name());
    let err = secrets.list(&ListParams::default()).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 403), "{err}");
    // Pods are never patched: the operator deletes and recreates them.
    let pods: Api<Pod> = Api::namespaced(client.clone(), h.ns.name());
    let err = pods.patch("x", &PatchParams::default(), &Patch::Merge(json!({}))).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 403), "{err}");
    // Job specs are never written.
    let jobs: Api<TrainingJob> = Api::namespaced(client, h.ns.name());
    let err = jobs.patch("x", &PatchParams::default(), &Patch::Merge(json!({}))).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 403), "{err}");
    h.stop().await;
}

#[tokio::test]
async fn one_replica_leads_and_a_standby_takes_over_on_release() {
    use tandem_operator::leader::{Attempt, LeaderElector};
    // The chart's leader-election Role in the release namespace grants the Lease.
    let h = Harness::start("op-lease").await;
    let client = h.cluster.impersonate(h.ns.name(), SA).unwrap();
    let lease = Duration::from_secs(30);
    let a = LeaderElector::new(client.clone(), h.ns.name(), "tandem-operator", "replica-a", lease);
    let b = LeaderElector::new(client, h.ns.name(), "tandem-operator", "replica-b", lease);
    assert_eq!(a.try_acquire().await.unwrap(), Attempt::Leader);
    assert_eq!(b.try_acquire().await.unwrap(), Attempt::Standby("replica-a".to_owned()));
    assert_eq!(a.try_acquire().await.unwrap(), Attempt::Leader, "the leader renews");
    a.release().await.unwrap();
    assert_eq!(b.try_acquire().await.unwrap(), Attempt::Leader, "a released Lease is taken at once");
    assert_eq!(a.try_acquire().await.unwrap(), Attempt::Standby("replica-b".to_owned()));
    h.stop().await;
}

// ---- Progress from the trainer: a real `tandem ps` serves it, the operator writes it. ----

/// The `tandem` binary: `$TANDEM_BIN`, else `tandem` next to this test's target folder
/// (`cargo build -p tandem-trainer --bin tandem` with the same target dir; `make test-cluster` does).
fn tandem_bin() -> std::path::PathBuf {
    if let Some(bin) = std::env::var_os("TANDEM_BIN") {
        return bin.into();
    }
    let exe = std::env::current_exe().unwrap();
    // <target>/debug/deps/cluster-<hash> → <target>/debug/tandem
    let bin = exe.parent().and_then(|deps| deps.parent()).unwrap().join("tandem");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p tandem-trainer --bin tandem` (same CARGO_TARGET_DIR) or set TANDEM_BIN",
        bin.display()
    );
    bin
}

/// A child process killed when dropped.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// This test's own loopback address, so its PS status port (7072) collides with nothing else.
const PROGRESS_IP: &str = "127.0.0.57";

const PROGRESS: &str = r#"
apiVersion: tandem.dev/v1alpha1
kind: TrainingJob
metadata: {name: prog}
spec:
  model: {kind: mlp, hidden: [16]}
  data: {source: synthetic, batchSize: 32, syntheticSamples: 512}
  training:
    algorithm: ps-async
    steps: 20
    evalEverySteps: 10
    optimizer: {kind: sgd, learningRate: 0.05}
  parameterServers: {replicas: 1}
  workers: {groups: 1, groupSize: 1, minGroups: 1, maxGroups: 1}
"#;

#[tokio::test]
async fn progress_is_read_from_the_ps_status_endpoint() {
    use std::io::BufRead;
    use tandem_api::contract::{self, Endpoint, GroupTopology, LaunchEnv, Role};

    let h = Harness::start("op-progress").await;
    h.create_job(PROGRESS).await;
    wait_pods(&h, "prog", &["prog-g0-0", "prog-ps-0"]).await;

    // The PS runs on this machine with what the operator gave its pod: the job's ConfigMap and
    // token Secret.
    let dir = std::env::temp_dir().join(format!("tandem-{}", h.ns.name()));
    std::fs::create_dir_all(&dir).unwrap();
    let cm: ConfigMap = h.ns.api().get("prog-config").await.unwrap();
    let job_json = cm.data.unwrap()[contract::CONFIG_FILE].clone();
    std::fs::write(dir.join("job.json"), &job_json).unwrap();
    let secret: Secret = h.ns.api().get("prog-token").await.unwrap();
    std::fs::write(dir.join("token"), &secret.data.unwrap()[contract::TOKEN_KEY].0).unwrap();
    let launch = |role: Role, config: &str| LaunchEnv {
        role,
        config: dir.join(config),
        token_file: dir.join("token"),
        bind: PROGRESS_IP.to_owned(),
        output: dir.join("out"),
        attempt: 0,
    };
    let mut ps = Running(
        std::process::Command::new(tandem_bin())
            .args(["ps", "--port", "0"])
            .envs(launch(Role::Ps { index: 0 }, "job.json").to_vars())
            .env_remove(contract::env::STATUS_PORT)
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(dir.join("ps.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let mut lines = std::io::BufReader::new(ps.0.stdout.take().unwrap()).lines();
    let listening = lines.next().unwrap().unwrap();
    let ps_addr = listening.strip_prefix("listening on ").expect(&listening).to_owned();
    let status_line = lines.next().unwrap().unwrap();
    assert_eq!(
        status_line,
        format!("status on {PROGRESS_IP}:{}", contract::STATUS_PORT),
        "{}",
        std::fs::read_to_string(dir.join("ps.log")).unwrap_or_default()
    );
    std::thread::spawn(move || lines.for_each(drop));

    // The kubelet's part: PS 0 runs at the test's address, the worker pod runs too.
    h.pods()
        .patch_status(
            "prog-ps-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
                "podIP": PROGRESS_IP,
                "podIPs": [{"ip": PROGRESS_IP}],
            }})),
        )
        .await
        .unwrap();
    h.set_pod("prog-g0-0", "Running", true, None).await;
    wait_phase(&h, "prog", JobPhase::Running).await;

    // A real worker trains through the PS and reports; its config points at the local addresses.
    let mut config = JobConfig::from_json(&job_json).unwrap();
    let (host, port) = ps_addr.rsplit_once(':').unwrap();
    config.parameter_servers = vec![Endpoint::new(host, port.parse().unwrap())];
    let peer = std::net::TcpListener::bind((PROGRESS_IP, 0)).unwrap().local_addr().unwrap().port();
    config.groups = vec![GroupTopology { index: 0, peers: vec![Endpoint::new(PROGRESS_IP, peer)] }];
    std::fs::write(dir.join("worker.json"), config.to_json()).unwrap();
    let worker = std::process::Command::new(tandem_bin())
        .args(["worker", "--device", "cpu"])
        .envs(launch(Role::Worker { group: 0, rank: 0 }, "worker.json").to_vars())
        .stderr(std::fs::File::create(dir.join("worker.log")).unwrap())
        .output()
        .unwrap();
    assert!(
        worker.status.success(),
        "worker failed: {}\n{}",
        String::from_utf8_lossy(&worker.stdout),
        std::fs::read_to_string(dir.join("worker.log")).unwrap_or_default()
    );

    // The operator reads PS 0's endpoint with the token and writes status.progress.
    let progress = wait_for("status.progress at step 20", || async {
        let j = h.job("prog").await;
        match j.status.as_ref().and_then(|s| s.progress.clone()) {
            Some(p) if p.step == 20 => Ok(p),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // The accuracy is the one the worker measured at step 20 (its last evaluation, evalEverySteps
    // 10), written as measured: it prints as the worker's f32 does (`0.944`, not the f32's exact
    // value `0.944000005722046`), so `kubectl get tj` shows what a person reads.
    let accuracy = progress.accuracy.expect("the worker reported an accuracy");
    let measured = String::from_utf8_lossy(&worker.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "progress" && v["progress"]["step"] == 20)
        .find_map(|v| v["progress"]["accuracy"].as_f64())
        .expect("the worker's progress line at step 20 carries its evaluation");
    assert!((accuracy - measured).abs() < 1e-6, "status {accuracy}, the worker measured {measured}");
    assert_eq!(accuracy.to_string(), (accuracy as f32).to_string(), "{progress:?}");
    // 410 training samples in batches of 32: 12 steps an epoch, so step 20 is in the second.
    assert_eq!(progress.epoch, 1, "{progress:?}");
    assert!(progress.loss.is_some(), "{progress:?}");
    // …and a point of the curve `kubectl tandem plot` draws.
    let history = h.job("prog").await.status.unwrap().history;
    let last = history.last().expect("status.history has the step read");
    assert_eq!((last.step, last.loss), (20, progress.loss), "{history:?}");

    // A PS that cannot be reached leaves the last progress in place.
    let failures = || {
        LOG.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .lines()
            .filter(|l| l.contains("job=prog") && l.contains("cannot read progress"))
            .count()
    };
    let before = failures();
    drop(ps);
    wait_for("a failed progress read after the PS stopped", || async {
        if failures() > before { Ok(()) } else { Err(format!("{} failed reads", failures())) }
    })
    .await;
    let kept = h.job("prog").await.status.and_then(|s| s.progress);
    assert_eq!(kept, Some(progress));
    let _ = std::fs::remove_dir_all(&dir);
    h.stop().await;
}

#[tokio::test]
async fn pending_pods_show_scheduled_false_with_the_schedulers_reason_and_a_stall_restarts_the_groups() {
    let h = Harness::start("op-sched-stall").await;
    h.create_job(
        r#"
apiVersion: tandem.dev/v1alpha1
kind: TrainingJob
metadata: {name: stall}
spec:
  training: {algorithm: hybrid, steps: 100}
  parameterServers: {replicas: 1}
  workers: {groups: 1, groupSize: 1}
  runPolicy: {maxRestarts: 3, backoffSeconds: 1, stallTimeoutSeconds: 30, stallPolicy: RestartGroup}
"#,
    )
    .await;
    wait_pods(&h, "stall", &["stall-g0-0", "stall-ps-0"]).await;
    // The scheduler's verdict on one pod, as kube-scheduler writes it.
    let message = "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available.";
    h.pods()
        .patch_status(
            "stall-g0-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
            ]}})),
        )
        .await
        .unwrap();
    h.set_pod("stall-ps-0", "Running", true, None).await;
    let job = wait_for("Scheduled=False", || async {
        let j = h.job("stall").await;
        match condition(&j, "Scheduled") {
            Some(c) if c.status == "False" => Ok(j),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let c = condition(&job, "Scheduled").unwrap();
    assert_eq!(c.reason, "Unschedulable");
    assert!(c.message.contains(message) && c.message.contains("stall-g0-0"), "{}", c.message);
    assert_ne!(job.status.as_ref().and_then(|s| s.phase), Some(JobPhase::Running));
    assert!(condition(&job, "Running").is_none_or(|c| c.status == "False"));

    // Scheduled and running: no step is ever reported, so 30 s after it ran the job is stalled.
    h.set_pod("stall-g0-0", "Running", true, None).await;
    let running = wait_phase(&h, "stall", JobPhase::Running).await;
    assert_eq!(condition(&running, "Scheduled").unwrap().status, "True");
    let stalled = wait_for("Stalled=True", || async {
        let j = h.job("stall").await;
        match condition(&j, "Stalled") {
            Some(c) if c.status == "True" => Ok(j),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let c = condition(&stalled, "Stalled").unwrap();
    assert_eq!(c.reason, "ProgressStalled");
    assert!(
        c.message.contains("no step was reported") && c.message.contains("RestartGroup"),
        "{}",
        c.message
    );
    let status = stalled.status.unwrap();
    assert_eq!(status.restarts, 1);
    assert!(status.attempts.iter().any(|a| a.unit == "group-0" && a.attempt == 1), "{:?}", status.attempts);
    let events = wait_for("the stall Events", || async {
        let events = h.events("stall").await;
        let reasons: Vec<String> = events.iter().map(|e| e.reason.clone().unwrap_or_default()).collect();
        if reasons.iter().any(|r| r == "ProgressStalled") && reasons.iter().any(|r| r == "StallRestart") {
            Ok(reasons)
        } else {
            Err(format!("{reasons:?}"))
        }
    })
    .await;
    assert!(!events.is_empty());
    // The group's pod is recreated as attempt 1; the PS keeps its pod.
    wait_for("group 0 relaunched as attempt 1", || async {
        let pod = h.pods().get_opt("stall-g0-0").await.unwrap();
        let attempt = pod.as_ref().and_then(|p| p.labels().get(names::LABEL_ATTEMPT).cloned());
        if attempt.as_deref() == Some("1") { Ok(()) } else { Err(format!("{attempt:?}")) }
    })
    .await;
    h.stop().await;
}
