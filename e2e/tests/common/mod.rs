//! Helpers both end-to-end suites share: TrainingJobs from the examples, pods by job, JSON log
//! events, polling with a deadline, the terminal phase.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, ResourceExt};
use serde_json::Value;
use tandem_testkit::TestNamespace;

/// How long a job may take to finish; generous, the machine is small and the tests share it.
pub const JOB_DEADLINE: Duration = Duration::from_secs(600);

pub fn training_jobs(ns: &TestNamespace) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("tandem.dev", "v1alpha1", "TrainingJob"),
        "trainingjobs",
    );
    Api::namespaced_with(ns.client(), ns.name(), &resource)
}

/// `examples/<example>` named `name`, with `steps` training steps.
pub fn example(example: &str, name: &str, steps: u64) -> Value {
    let path = format!("{}/../examples/{example}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut doc: Value = serde_yaml::from_str(&text).unwrap();
    doc["metadata"]["name"] = name.into();
    doc["spec"]["training"]["steps"] = steps.into();
    doc
}

pub async fn pods(ns: &TestNamespace, job: &str) -> Vec<Pod> {
    let api: Api<Pod> = ns.api();
    api.list(&ListParams::default().labels(&format!("tandem.dev/job-name={job}"))).await.unwrap().items
}

pub fn role_of(pod: &Pod) -> &str {
    pod.labels().get("tandem.dev/role").map_or("", String::as_str)
}

/// JSON lines of a log whose `event` is `event`.
pub fn events(log: &str, event: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == event)
        .collect()
}

/// Polls `check` every second until it gives a value, failing with `what` after `deadline`.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
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
pub async fn wait_succeeded(ns: &TestNamespace, job: &str) -> Value {
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

/// Pod name → UID of the job's pods.
pub async fn uids(ns: &TestNamespace, job: &str) -> BTreeMap<String, String> {
    pods(ns, job).await.into_iter().map(|p| (p.name_any(), p.uid().unwrap())).collect()
}

/// Waits until every pod of `job`'s group `group` that was in `before` (name → UID) runs under a
/// new UID, then asserts that no pod outside the group was replaced.
pub async fn assert_only_group_relaunched(
    ns: &TestNamespace,
    job: &str,
    group: u32,
    before: &BTreeMap<String, String>,
) {
    let prefix = format!("{job}-g{group}-");
    let members: Vec<&String> = before.keys().filter(|n| n.starts_with(&prefix)).collect();
    assert!(!members.is_empty(), "group {group} of {job} had no pods: {before:?}");
    let after = wait_for(&format!("group {group} to be relaunched"), JOB_DEADLINE, || async {
        let now = uids(ns, job).await;
        members.iter().all(|n| now.get(*n).is_some_and(|uid| before.get(*n) != Some(uid))).then_some(now)
    })
    .await;
    for (name, uid) in before {
        if !name.starts_with(&prefix) {
            assert_eq!(after.get(name), Some(uid), "{name} outside the killed group was restarted");
        }
    }
}
