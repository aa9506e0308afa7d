//! The Helm chart against a real kube-apiserver (`make cluster-up`): `helm install` creates every
//! object of the chart, and the operator, acting as the ServiceAccount that install created
//! (impersonation), reconciles an MPI job and takes its Lease without a single denied request.
//! Needs `helm` (`$TANDEM_K8S_BIN`, as `make test-cluster` sets it, or PATH) and `KUBECONFIG`.

#![cfg(feature = "cluster-tests")]
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use tandem_api::names;
use tandem_api::{JobPhase, TrainingJob};
use tandem_operator::leader::{Attempt, LeaderElector};
use tandem_operator::metrics::Metrics;
use tandem_operator::{Context, JobController, Scope, Settings};
use tandem_testkit::{TestCluster, parse_manifests};
use tokio::sync::watch;

use crate::support;
use support::{capture_logs, denied, helm};

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/tandem");
const WAIT: Duration = Duration::from_secs(60);

/// Runs helm with `args`, failing the test with its output when it fails.
fn run_helm(args: &[&str]) -> String {
    run_ok(Command::new(helm()).args(args), &format!("helm {args:?} (make cluster-bins builds it)"))
}

/// The rules of the first ClusterRole in a YAML stream.
fn cluster_role_rules(yaml: &str, origin: &str) -> serde_json::Value {
    parse_manifests(yaml, origin)
        .unwrap()
        .into_iter()
        .find(|m| m["kind"] == "ClusterRole")
        .unwrap_or_else(|| panic!("no ClusterRole in {origin}"))["rules"]
        .clone()
}

#[test]
fn operator_rbac_file_is_the_charts_cluster_role() {
    let rendered = run_helm(&["template", "tandem", CHART, "--show-only", "templates/clusterrole.yaml"]);
    let file =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/rbac/clusterrole.yaml")).unwrap();
    assert_eq!(
        cluster_role_rules(&rendered, "helm template"),
        cluster_role_rules(&file, "operator/rbac/clusterrole.yaml"),
        "operator/rbac/clusterrole.yaml is stale: run `make chart-manifests`"
    );
}

/// `kubectl` of the pinned version, beside helm.
fn kubectl() -> std::path::PathBuf {
    helm().with_file_name("kubectl")
}

/// Runs `cmd`, failing the test with its output when it fails; returns its stdout.
fn run_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The chart's PodMonitor and ServiceMonitor are valid, field by field, against the real CRDs of
/// prometheus-operator (a pinned release, installed on the test API server): a server-side dry
/// run with strict field validation accepts them.
#[test]
fn the_charts_monitors_are_valid_against_prometheus_operators_crds() {
    let crds = run_ok(
        &mut Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/prometheus/crds.sh")),
        "fetching prometheus-operator's CRDs",
    );
    let crds = std::path::Path::new(crds.trim());
    let mut apply = Command::new(kubectl());
    apply.args(["apply", "--server-side", "--force-conflicts"]);
    for kind in ["podmonitors", "servicemonitors"] {
        apply.arg("-f").arg(crds.join(format!("monitoring.coreos.com_{kind}.yaml")));
    }
    run_ok(&mut apply, "installing the PodMonitor and ServiceMonitor CRDs");
    run_ok(
        Command::new(kubectl()).args([
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/podmonitors.monitoring.coreos.com",
            "crd/servicemonitors.monitoring.coreos.com",
        ]),
        "waiting for the CRDs",
    );
    let monitors = run_helm(&[
        "template",
        "tandem",
        CHART,
        "--namespace",
        "default",
        "--set",
        "metrics.podMonitor.enabled=true,metrics.serviceMonitor.enabled=true",
        "--show-only",
        "templates/podmonitor.yaml",
        "--show-only",
        "templates/servicemonitor.yaml",
    ]);
    let kinds: Vec<String> = parse_manifests(&monitors, "helm template")
        .unwrap()
        .iter()
        .map(|m| m["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds, ["PodMonitor", "ServiceMonitor"]);
    let file = std::env::temp_dir().join(format!("tandem-monitors-{}.yaml", std::process::id()));
    std::fs::write(&file, &monitors).unwrap();
    let checked = Command::new(kubectl())
        .args(["apply", "--dry-run=server", "--validate=strict", "-n", "default", "-f"])
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(
        checked.status.success(),
        "the API server refuses the chart's monitors:\n{}{}\n{monitors}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// Issue 42, item 2: the chart's PodMonitor labels the jobs' series as the scrape config shipped
/// for a plain Prometheus does (the one the real node's test runs), its dashboard ConfigMap holds
/// the dashboard file, and `networkPolicy.metricsFrom` reaches the operator, which puts it in
/// each job's NetworkPolicy.
#[test]
fn the_chart_scrapes_the_jobs_as_the_shipped_scrape_config_and_ships_the_dashboard() {
    let rendered = run_helm(&[
        "template",
        "tandem",
        CHART,
        "--set",
        "metrics.podMonitor.enabled=true,metrics.dashboard.enabled=true,networkPolicy.enabled=true",
        "--set-json",
        r#"networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"team":"monitoring"}}}]"#,
    ]);
    let manifests = parse_manifests(&rendered, "helm template").unwrap();
    let find =
        |kind: &str| manifests.iter().find(|m| m["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"));

    let endpoint = &find("PodMonitor")["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["port"], tandem_api::contract::METRICS_PORT_NAME);
    let pairs = |rules: &serde_json::Value, from: &str, to: &str| -> Vec<(String, String)> {
        rules
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r.get(to).is_some())
            .map(|r| (r[from][0].as_str().unwrap().to_owned(), r[to].as_str().unwrap().to_owned()))
            .filter(|(source, _)| source.starts_with("__meta_kubernetes_pod_label_"))
            .collect()
    };
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/prometheus/scrape-trainingjobs.yaml"
    ))
    .unwrap();
    let shipped: serde_json::Value = serde_yaml::from_str(&shipped).unwrap();
    let plain = pairs(&shipped[0]["relabel_configs"], "source_labels", "target_label");
    let monitor = pairs(&endpoint["relabelings"], "sourceLabels", "targetLabel");
    assert_eq!(monitor, plain, "the PodMonitor and the plain scrape config label series alike");
    assert_eq!(plain.len(), 5, "trainingjob, role, group, rank, ps_index: {plain:?}");

    let dashboard = find("ConfigMap");
    let held: serde_json::Value =
        serde_json::from_str(dashboard["data"]["trainingjobs.json"].as_str().unwrap()).unwrap();
    let file: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../charts/tandem/dashboards/trainingjobs.json"
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(held, file);
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");

    let args = find("Deployment")["spec"]["template"]["spec"]["containers"][0]["args"].clone();
    let metrics_from = args
        .as_array()
        .unwrap()
        .iter()
        .find_map(|a| a.as_str()?.strip_prefix("--metrics-from="))
        .unwrap_or_else(|| panic!("no --metrics-from in {args}"));
    let peers: Vec<k8s_openapi::api::networking::v1::NetworkPolicyPeer> =
        serde_json::from_str(metrics_from).unwrap();
    assert_eq!(peers.len(), 1, "{metrics_from}");
}

async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(state) if tokio::time::Instant::now() > deadline => {
                panic!("timed out waiting for {what}; last: {state}; denied: {:?}", denied("forbidden"))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

const MPI_JOB: &str = r#"
apiVersion: tandem.dev/v1alpha1
kind: TrainingJob
metadata: {name: mpi}
spec:
  training: {algorithm: hybrid, steps: 100}
  parameterServers: {replicas: 1}
  workers: {groups: 1, groupSize: 2, backend: mpi}
"#;

#[tokio::test]
async fn helm_install_and_the_operator_as_its_service_account() {
    capture_logs();
    let cluster = TestCluster::connect().await.expect("control plane up (make cluster-up, KUBECONFIG set)");
    // The CRD may already be there from other tests; helm then skips the chart's crds/.
    cluster.install_crds(concat!(env!("CARGO_MANIFEST_DIR"), "/../crds")).await.unwrap();
    let release_ns = cluster.namespace("chart").await.unwrap();
    let jobs_ns = cluster.namespace("chart-jobs").await.unwrap();
    // Named after its namespace: the ClusterRole and its binding never collide between runs.
    let release = release_ns.name().to_owned();
    let ns = release_ns.name();
    run_helm(&[
        "install",
        &release,
        CHART,
        "--namespace",
        ns,
        "--set",
        "replicaCount=2,podDisruptionBudget.enabled=true,networkPolicy.enabled=true",
    ]);
    let status = run_helm(&["status", &release, "--namespace", ns]);
    assert!(status.contains("STATUS: deployed"), "{status}");

    // Every object of the chart exists, and the Deployment is what the chart promises.
    let admin = cluster.client();
    let full = format!("{release}-operator");
    let deployment: Deployment = Api::namespaced(admin.clone(), ns).get(&full).await.unwrap();
    let spec = deployment.spec.unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some(full.as_str()));
    assert_eq!(pod.security_context.unwrap().run_as_non_root, Some(true));
    let container = &pod.containers[0];
    let security = container.security_context.clone().unwrap();
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.capabilities.unwrap().drop, Some(vec!["ALL".to_owned()]));
    let path = |probe: &Option<k8s_openapi::api::core::v1::Probe>| {
        probe.as_ref().unwrap().http_get.as_ref().unwrap().path.clone().unwrap()
    };
    assert_eq!(path(&container.liveness_probe), "/healthz");
    assert_eq!(path(&container.readiness_probe), "/readyz");
    assert!(container.resources.as_ref().unwrap().limits.as_ref().unwrap().contains_key("memory"));
    Api::<ServiceAccount>::namespaced(admin.clone(), ns).get(&full).await.unwrap();
    Api::<ClusterRole>::all(admin.clone()).get(&full).await.unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone()).get(&full).await.unwrap();
    let election = format!("{full}-leader-election");
    Api::<Role>::namespaced(admin.clone(), ns).get(&election).await.unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), ns).get(&election).await.unwrap();
    let service: Service = Api::namespaced(admin.clone(), ns).get(&format!("{full}-metrics")).await.unwrap();
    assert_eq!(service.spec.unwrap().ports.unwrap()[0].port, 8080);
    Api::<PodDisruptionBudget>::namespaced(admin.clone(), ns).get(&full).await.unwrap();
    let policy: k8s_openapi::api::networking::v1::NetworkPolicy =
        Api::namespaced(admin.clone(), ns).get(&full).await.unwrap();
    let ingress = policy.spec.unwrap().ingress.unwrap();
    assert_eq!(ingress.len(), 1, "the operator's pods admit one port: {ingress:?}");
    assert_eq!(ingress[0].ports.as_ref().unwrap()[0].port, Some(IntOrString::Int(8080)));
    assert!(
        container.args.as_ref().unwrap().iter().any(|a| a == "--network-policy"),
        "networkPolicy.enabled must turn on the jobs' NetworkPolicies: {:?}",
        container.args
    );

    // The operator as the installed ServiceAccount: a job in another namespace (the ClusterRole is
    // bound cluster-wide) reconciled to its pods, Secrets and hostfile ConfigMap.
    let as_operator: Client = cluster.impersonate(ns, &full).unwrap();
    let ctx = Arc::new(Context::new(
        as_operator.clone(),
        Metrics::default(),
        Settings { force_delete_after: Duration::from_secs(1), resync: Duration::from_secs(5) },
        Some("chart-test".to_owned()),
    ));
    let (stop, rx) = watch::channel(false);
    let prepared = JobController::new(ctx, &Scope { namespace: Some(jobs_ns.name().to_owned()) });
    let operator = tokio::spawn(prepared.run(async move {
        let mut rx = rx;
        let _ = rx.wait_for(|s| *s).await;
    }));
    let jobs: Api<TrainingJob> = jobs_ns.api();
    let job: TrainingJob = serde_yaml::from_str(MPI_JOB).unwrap();
    jobs.create(&PostParams::default(), &job).await.unwrap();
    let pods: Api<Pod> = jobs_ns.api();
    wait_for("the job's pods", || async {
        let list = pods.list(&ListParams::default().labels(&format!("{}=mpi", names::LABEL_JOB))).await;
        let mut found: Vec<String> =
            list.map_err(|e| e.to_string())?.items.iter().map(|p| p.name_any()).collect();
        found.sort();
        if found == ["mpi-g0-0", "mpi-g0-1", "mpi-ps-0"] { Ok(()) } else { Err(format!("{found:?}")) }
    })
    .await;
    wait_for("phase Created", || async {
        let phase = jobs.get("mpi").await.map_err(|e| e.to_string())?.status.and_then(|s| s.phase);
        if phase == Some(JobPhase::Created) { Ok(()) } else { Err(format!("{phase:?}")) }
    })
    .await;
    jobs_ns.api::<Secret>().get("mpi-ssh").await.unwrap();
    let config_maps = jobs_ns.api::<ConfigMap>().list(&ListParams::default()).await.unwrap();
    assert!(config_maps.items.len() >= 2, "job config and hostfile: {:?}", config_maps.items);

    // Leader election in the release namespace through the chart's Role.
    let elector =
        LeaderElector::new(as_operator, ns, "tandem-operator", "chart-test", Duration::from_secs(30));
    assert_eq!(elector.try_acquire().await.unwrap(), Attempt::Leader);
    elector.release().await.unwrap();
    Api::<Lease>::namespaced(admin.clone(), ns).get("tandem-operator").await.unwrap();

    let _ = stop.send(true);
    let _ = tokio::time::timeout(WAIT, operator).await;
    let user = format!("system:serviceaccount:{ns}:{full}");
    let denied = denied(&user);
    assert!(denied.is_empty(), "the chart's RBAC denied the operator:\n{}", denied.join("\n"));

    // helm uninstall removes the cluster-scoped RBAC too.
    run_helm(&["uninstall", &release, "--namespace", ns, "--wait"]);
    assert!(Api::<ClusterRole>::all(admin.clone()).get_opt(&full).await.unwrap().is_none());
    assert!(Api::<ClusterRoleBinding>::all(admin).get_opt(&full).await.unwrap().is_none());
    jobs_ns.cleanup().await.unwrap();
    release_ns.cleanup().await.unwrap();
}
