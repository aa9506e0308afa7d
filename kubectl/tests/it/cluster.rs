use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tandem_api::TrainingJob;
use tandem_testkit::{TestCluster, TestNamespace, parse_manifests};

const EXAMPLE: &str = include_str!("../../../examples/mnist-hybrid.yaml");
const JOB: &str = "mnist-hybrid";
/// The node the running pods are bound to; it does not exist, so no kubelet serves their logs.
const NODE: &str = "kt-node-without-kubelet";

/// What a run of the plugin printed and whether it succeeded.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

async fn plugin(ns: &str, args: &[&str]) -> Run {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-tandem"))
        .args(args)
        .args(["-n", ns])
        .output()
        .await
        .unwrap();
    let run = Run {
        ok: out.status.success(),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    };
    eprintln!("$ kubectl tandem {} -n {ns}\n{}{}", args.join(" "), run.stdout, run.stderr);
    run
}

async fn start(prefix: &str) -> (TestCluster, TestNamespace) {
    let cluster = TestCluster::connect().await.expect("control plane up (make cluster-up, KUBECONFIG set)");
    cluster.install_crds(concat!(env!("CARGO_MANIFEST_DIR"), "/../crds")).await.unwrap();
    let ns = cluster.namespace(prefix).await.unwrap();
    (cluster, ns)
}

async fn create_example(cluster: &TestCluster, ns: &TestNamespace) {
    let manifest = parse_manifests(EXAMPLE, "examples/mnist-hybrid.yaml").unwrap().remove(0);
    cluster.create(ns.name(), &manifest).await.unwrap();
}

fn ago(seconds: i64) -> Timestamp {
    Timestamp::now().checked_sub(SignedDuration::from_secs(seconds)).unwrap()
}

fn time(seconds_ago: i64) -> Value {
    serde_json::to_value(Time(ago(seconds_ago))).unwrap()
}

/// A pod as the operator names and labels it, bound to `node` (a name: no such node or kubelet
/// exists) or unscheduled.
async fn create_pod(ns: &TestNamespace, name: &str, labels: &[(&str, &str)], node: Option<&str>) {
    let mut all = json!({
        "app.kubernetes.io/name": "tandem",
        "app.kubernetes.io/managed-by": "tandem-operator",
        "tandem.dev/job-name": JOB,
    });
    for (k, v) in labels {
        all[*k] = json!(v);
    }
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": all},
        "spec": {"containers": [{"name": "tandem", "image": "tandem-trainer:0.1"}], "nodeName": node},
    }))
    .unwrap();
    ns.api::<Pod>().create(&PostParams::default(), &pod).await.unwrap();
}

/// Sets a pod's status as a kubelet would: `state` is its container's state.
async fn set_pod(ns: &TestNamespace, name: &str, phase: &str, state: Value) {
    let status = json!({"status": {
        "phase": phase,
        "containerStatuses": [{"name": "tandem", "image": "tandem-trainer:0.1", "imageID": "", "ready": phase == "Running",
                               "restartCount": 0, "state": state}],
    }});
    ns.api::<Pod>().patch_status(name, &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
}

/// The example job's pods: PS 0 and group 0's ranks run, group 1's rank 0 waits for its image.
async fn pods_of_the_example(ns: &TestNamespace) {
    let ps = [("tandem.dev/role", "ps"), ("tandem.dev/ps-index", "0")];
    create_pod(ns, "mnist-hybrid-ps-0", &ps, Some(NODE)).await;
    for (group, rank, node) in [("0", "0", Some(NODE)), ("0", "1", Some(NODE)), ("1", "0", None)] {
        let labels = [("tandem.dev/role", "worker"), ("tandem.dev/group", group), ("tandem.dev/rank", rank)];
        create_pod(ns, &format!("{JOB}-g{group}-{rank}"), &labels, node).await;
    }
    let running = json!({"running": {"startedAt": time(60)}});
    for pod in ["mnist-hybrid-ps-0", "mnist-hybrid-g0-0", "mnist-hybrid-g0-1"] {
        set_pod(ns, pod, "Running", running.clone()).await;
    }
    let pulling = json!({"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"tandem-trainer:0.1\""}});
    set_pod(ns, "mnist-hybrid-g1-0", "Pending", pulling).await;
}

/// Deletes the example's pods at once: without a kubelet, the bound ones would wait for it forever,
/// and so would the namespace's removal.
async fn release_pods(ns: &TestNamespace) {
    let now = kube::api::DeleteParams { grace_period_seconds: Some(0), ..kube::api::DeleteParams::default() };
    ns.api::<Pod>().delete_collection(&now, &kube::api::ListParams::default()).await.unwrap();
}

/// The status the operator would have written after a stall restart, with a curve of 30 points.
async fn running_status(ns: &TestNamespace) {
    let history: Vec<Value> = (0..30)
        .map(|i| {
            let step = i * 20;
            json!({"step": step, "loss": 2.3 * (-(step as f64) / 150.0).exp(), "accuracy": (30 + 2 * i) as f64 / 100.0})
        })
        .collect();
    let condition = |type_: &str, status: &str, reason: &str, message: &str, ago: i64| json!({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": time(ago)});
    let status = json!({"status": {
        "phase": "Running",
        "restarts": 1,
        "conditions": [
            condition("Running", "True", "AllPodsRunning", "every pod of every unit is running", 300),
            condition("Stalled", "True", "ProgressStalled", "status.progress.step has stayed at 580 since then", 30),
        ],
        "progress": {"step": 580, "epoch": 7, "loss": 0.0488, "accuracy": 0.88, "samplesPerSecond": 1234.5},
        "stepTime": time(90),
        "attempts": [{"unit": "group-1", "attempt": 1, "lastRestartTime": time(20)}],
        "history": history,
    }});
    let jobs: Api<TrainingJob> = ns.api();
    jobs.patch_status(JOB, &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
}

/// Events about the job as the operator publishes them (events.k8s.io/v1, `regarding` the job).
async fn events_of_the_example(ns: &TestNamespace) {
    let job: TrainingJob = ns.api().get(JOB).await.unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> = ns.api();
    for (i, (kind, reason, note, seconds_ago)) in [
        ("Normal", "JobCreated", "created the job's Service, ConfigMap and pods", 400),
        ("Warning", "ProgressStalled", "status.progress.step has stayed at 580", 30),
        ("Warning", "StallRestart", "restarting every worker group (runPolicy.stallPolicy RestartGroup)", 20),
    ]
    .into_iter()
    .enumerate()
    {
        let event = serde_json::from_value(json!({
            "metadata": {"name": format!("{JOB}.{i}")},
            "eventTime": serde_json::to_value(MicroTime(ago(seconds_ago))).unwrap(),
            "reportingController": "tandem-operator",
            "reportingInstance": "test",
            "action": "Reconcile",
            "type": kind,
            "reason": reason,
            "note": note,
            "regarding": {"apiVersion": "tandem.dev/v1alpha1", "kind": "TrainingJob", "name": JOB,
                          "namespace": ns.name(), "uid": job.uid().unwrap()},
        }))
        .unwrap();
        events.create(&PostParams::default(), &event).await.unwrap();
    }
}

#[tokio::test]
async fn a_job_that_is_not_there_is_named_with_the_jobs_that_are() {
    let (cluster, ns) = start("kt-missing").await;
    for command in ["status", "logs", "plot"] {
        let run = plugin(ns.name(), &[command, "nope"]).await;
        assert!(!run.ok);
        assert!(
            run.stderr.contains(&format!("TrainingJob \"nope\" not found in namespace \"{}\"", ns.name()))
                && run.stderr.contains("there are no TrainingJobs in it"),
            "{command}: {}",
            run.stderr
        );
    }
    create_example(&cluster, &ns).await;
    let run = plugin(ns.name(), &["status", "mnist"]).await;
    assert!(!run.ok);
    assert!(
        run.stderr.contains("the TrainingJobs there are: mnist-hybrid")
            && run.stderr.contains(&format!("kubectl get tj -n {}", ns.name())),
        "{}",
        run.stderr
    );
    ns.cleanup().await.unwrap();
}

#[tokio::test]
async fn status_shows_phase_conditions_progress_restarts_pods_and_the_latest_events() {
    let (cluster, ns) = start("kt-status").await;
    create_example(&cluster, &ns).await;
    // Before the operator wrote anything.
    let run = plugin(ns.name(), &["status", JOB]).await;
    assert!(run.ok, "{}", run.stderr);
    assert!(run.stdout.contains(&format!("TrainingJob {}/{JOB}: (none yet)", ns.name())), "{}", run.stdout);
    assert!(run.stdout.contains("progress: none reported yet"), "{}", run.stdout);

    pods_of_the_example(&ns).await;
    let written = std::time::Instant::now();
    running_status(&ns).await;
    events_of_the_example(&ns).await;
    let run = plugin(ns.name(), &["status", JOB]).await;
    assert!(run.ok, "{}", run.stderr);
    let out = &run.stdout;
    for expected in [
        &format!("TrainingJob {}/{JOB}: Running", ns.name()) as &str,
        "hybrid, 2 group(s) of 2 rank(s) (tcp), 2 parameter server(s)",
        "progress: step 580, epoch 7, loss 0.0488, accuracy 0.8800, 1234.5 samples/s (this step since ",
        "restarts: 1 of at most 5",
        "group-1: attempt 1, last ",
        "every pod of every unit is running",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in\n{out}");
    }
    // The ages: the status's times (90 s and 20 s before it was written) plus the seconds since.
    let since = written.elapsed().as_secs() as i64 + 1;
    let seconds_after = |marker: &str| -> i64 {
        let (_, rest) = out.split_once(marker).unwrap_or_else(|| panic!("no {marker:?} in\n{out}"));
        let (n, _) = rest
            .split_once("s ago")
            .unwrap_or_else(|| panic!("no age in seconds after {marker:?} in\n{out}"));
        n.parse().unwrap_or_else(|_| panic!("{n:?} after {marker:?} is not a number of seconds in\n{out}"))
    };
    let step_age = seconds_after("(this step since ");
    assert!((90..=90 + since).contains(&step_age), "this step since {step_age}s, {since}s after 90 s ago");
    let restart_age = seconds_after("group-1: attempt 1, last ");
    assert!(
        (20..=20 + since).contains(&restart_age),
        "last restart {restart_age}s ago, {since}s after 20 s ago"
    );
    let row =
        |words: &[&str]| out.lines().find(|l| words.iter().all(|w| l.split_whitespace().any(|x| x == *w)));
    assert!(row(&["Stalled", "True", "ProgressStalled"]).is_some(), "{out}");
    // Pods in the order a person reads them, with what their container says.
    let pods: Vec<&str> = out.lines().filter(|l| l.trim_start().starts_with("mnist-hybrid-")).collect();
    assert_eq!(pods.len(), 4, "{out}");
    assert!(pods[0].contains("mnist-hybrid-ps-0") && pods[0].contains("ps-0") && pods[0].contains("Running"));
    assert!(pods[1].contains("mnist-hybrid-g0-0") && pods[2].contains("mnist-hybrid-g0-1"));
    assert!(pods[3].contains("Pending (ImagePullBackOff: Back-off pulling image"), "{}", pods[3]);
    // The job's Events, oldest first.
    let created = out.find("JobCreated").expect("the oldest event is shown");
    let stalled = out.find(row(&["Warning", "ProgressStalled"]).expect("warnings show their type")).unwrap();
    let restart = out.find("StallRestart").expect("the newest event is shown");
    assert!(created < stalled && stalled < restart, "{out}");

    let run = plugin(ns.name(), &["status", JOB, "--events", "2"]).await;
    assert!(!run.stdout.contains("JobCreated") && run.stdout.contains("StallRestart"), "{}", run.stdout);
    release_pods(&ns).await;
    ns.cleanup().await.unwrap();
}

#[tokio::test]
async fn plot_draws_the_status_history_on_the_terminal_and_as_svg_or_csv() {
    let (cluster, ns) = start("kt-plot").await;
    create_example(&cluster, &ns).await;
    let dir = std::env::temp_dir().join(format!("kubectl-tandem-{}", ns.name()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("curve.svg");
    let svg_arg = svg.to_str().unwrap();

    let run = plugin(ns.name(), &["plot", JOB, "-o", svg_arg]).await;
    assert!(!run.ok);
    assert!(
        run.stderr.contains("has no training curve in its status: nothing was reported yet"),
        "{}",
        run.stderr
    );
    assert!(!svg.exists(), "nothing is written without a curve");

    running_status(&ns).await;
    let run = plugin(ns.name(), &["plot", JOB, "-o", svg_arg, "--width", "60", "--height", "10"]).await;
    assert!(run.ok, "{}", run.stderr);
    assert!(run.stderr.contains(&format!("wrote {svg_arg}")), "{}", run.stderr);
    let chart: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(chart[0], format!("{}/{JOB}: 30 points", ns.name()));
    assert_eq!(chart[1], "loss");
    // The loss falls from 2.3 at step 0 (top left) towards 0 at step 580 (bottom right).
    assert!(chart[2].starts_with("    2.415 |*"), "{}", run.stdout);
    assert!(chart[11].starts_with("    0.000 |") && chart[11].ends_with('*'), "{}", run.stdout);
    assert!(chart[13].ends_with("580  step"), "{}", run.stdout);
    assert!(run.stdout.contains("accuracy\n    1.000 |"), "{}", run.stdout);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.contains(&format!("{}/{JOB}", ns.name())), "{text}");
    assert_eq!(text.matches("<polyline").count(), 2, "the loss and the accuracy: {text}");

    let csv = dir.join("curve.csv");
    let run = plugin(ns.name(), &["plot", JOB, "-o", csv.to_str().unwrap(), "--no-chart"]).await;
    assert!(run.ok && run.stdout.is_empty(), "{}{}", run.stdout, run.stderr);
    let text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(text.lines().filter(|l| l.starts_with("train,")).count(), 30, "{text}");
    assert!(text.contains("test,580,,0.88"), "{text}");

    let run = plugin(ns.name(), &["plot", JOB, "-o", dir.join("curve.png").to_str().unwrap()]).await;
    assert!(!run.ok && run.stderr.contains("must end in .svg or .csv"), "{}", run.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
    ns.cleanup().await.unwrap();
}

#[tokio::test]
async fn logs_picks_pods_by_the_operators_labels_and_says_why_there_are_none() {
    let (cluster, ns) = start("kt-logs").await;
    create_example(&cluster, &ns).await;
    let run = plugin(ns.name(), &["logs", JOB]).await;
    assert!(!run.ok);
    assert!(
        run.stderr.contains(&format!("TrainingJob \"{JOB}\" has no pods (phase: none yet)")),
        "{}",
        run.stderr
    );

    pods_of_the_example(&ns).await;
    // A pod of another job, with a name that looks like one of this job's, is never picked.
    create_pod(&ns, "mnist-hybrid-g1-1", &[("tandem.dev/role", "worker"), ("tandem.dev/group", "1")], None)
        .await;
    let other = json!({"metadata": {"labels": {"tandem.dev/job-name": "another"}}});
    ns.api::<Pod>().patch("mnist-hybrid-g1-1", &PatchParams::default(), &Patch::Merge(other)).await.unwrap();

    let run = plugin(ns.name(), &["logs", JOB, "--group", "7"]).await;
    assert!(!run.ok);
    assert!(
        run.stderr.contains(&format!(
            "TrainingJob \"{JOB}\" has no pod in group 7; its pods are: mnist-hybrid-ps-0, mnist-hybrid-g0-0, \
             mnist-hybrid-g0-1, mnist-hybrid-g1-0"
        )),
        "{}",
        run.stderr
    );
    let run = plugin(ns.name(), &["logs", JOB, "-g", "1"]).await;
    assert!(!run.ok);
    assert!(
        run.stderr
            .contains("no pod in group 1 of TrainingJob \"mnist-hybrid\" has started its container yet")
            && run.stderr.contains("mnist-hybrid-g1-0 Pending (ImagePullBackOff"),
        "{}",
        run.stderr
    );
    // Rank 0 of every group: g1-0 has not started (a note), g0-0 has, and its log is asked for —
    // which this control plane cannot serve: the pod's node has no kubelet (nor a Node object).
    let run = plugin(ns.name(), &["logs", JOB, "--rank", "0"]).await;
    assert!(!run.ok);
    assert!(run.stderr.contains("skipped mnist-hybrid-g1-0 Pending (ImagePullBackOff"), "{}", run.stderr);
    assert!(run.stderr.contains("cannot read the logs of pod mnist-hybrid-g0-0"), "{}", run.stderr);
    assert!(run.stderr.contains(NODE), "the API server's answer names the node: {}", run.stderr);
    assert!(!run.stderr.contains("mnist-hybrid-ps-0") && !run.stderr.contains("g0-1"), "{}", run.stderr);
    release_pods(&ns).await;
    ns.cleanup().await.unwrap();
}
