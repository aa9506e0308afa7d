//! The Workload a queued job submits to Kueue and what the operator reads back from it: pod sets,
//! admission and placement, eviction, and the status written to clear a reservation. The cluster
//! side (a real Kueue admitting, preempting and releasing quota) is in e2e/tests/node.rs.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use serde_json::{Value, json};
use tandem_api::{Role, TrainingJob};
use tandem_operator::builder;
use tandem_operator::kueue::{self, Admission, Flavor, Priority};
use tandem_operator::validate::{ValidatedJob, validate};

fn fixture(name: &str) -> TrainingJob {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let mut job: TrainingJob = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    job.metadata.labels = Some(BTreeMap::from([(kueue::QUEUE_LABEL.to_owned(), "team-a".to_owned())]));
    job
}

fn valid(job: &TrainingJob) -> ValidatedJob<'_> {
    validate(job).unwrap_or_else(|e| panic!("{e}"))
}

fn workload_with(status: Value) -> DynamicObject {
    let mut w = DynamicObject::new("trainingjob-j", &kueue::workload_resource()).within("ns");
    w.metadata.uid = Some("w-1".to_owned());
    w.metadata.resource_version = Some("42".to_owned());
    w.metadata.generation = Some(1);
    w.data = json!({ "spec": {}, "status": status });
    w
}

fn condition(type_: &str, status: &str, reason: &str, at: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": format!("{type_} {reason}"),
           "lastTransitionTime": at})
}

#[test]
fn a_queued_job_submits_one_pod_set_per_role_with_its_pods_requests_and_priority() {
    let job = fixture("hybrid.yaml");
    let job = valid(&job);
    assert_eq!(kueue::queue_name(&job), Some("team-a"));
    let priority = Priority { group: kueue::GROUP, name: "high".to_owned(), value: 1000 };
    let w = kueue::workload(&job, "team-a", Some(&priority));
    assert_eq!(w.metadata.name.as_deref(), Some("trainingjob-mnist-hybrid"));
    let owner = &w.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.controller), ("TrainingJob", Some(true)));
    let spec = &w.data["spec"];
    assert_eq!(spec["queueName"], "team-a");
    let sets: Vec<(&str, u64)> = spec["podSets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap(), s["count"].as_u64().unwrap()))
        .collect();
    assert_eq!(sets, [("ps", 2), ("worker", 4)], "2 PS, 2 groups of 2");
    // Each template is the role's pod as the operator creates it: Kueue reserves its requests.
    let worker = builder::pod(&job, Role::Worker { group: 0, rank: 0 }, 0);
    assert_eq!(spec["podSets"][1]["template"]["spec"], serde_json::to_value(worker.spec.unwrap()).unwrap());
    assert_eq!(
        spec["priorityClassRef"],
        json!({"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "high"})
    );
    assert_eq!(spec["priority"], 1000);
    assert!(kueue::matches(&w, &job));
    let mut scaled = job.job.clone();
    scaled.spec.workers.groups = 3;
    assert!(!kueue::matches(&w, &valid(&scaled)), "a scaled job no longer matches its Workload");
}

#[test]
fn an_mpi_job_submits_its_launchers_too() {
    let job = fixture("mpi.yaml");
    let w = kueue::workload(&valid(&job), "team-a", None);
    let names: Vec<&str> =
        w.data["spec"]["podSets"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["ps", "worker", "launcher"]);
    assert!(w.data["spec"].get("priorityClassRef").is_none());
}

#[test]
fn kueues_reason_is_read_while_waiting_and_the_flavours_placement_once_admitted() {
    let at = "2026-12-07T10:00:00Z";
    let pending = workload_with(
        json!({"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
        "message": "couldn't assign flavors to pod set worker: insufficient quota for cpu", "lastTransitionTime": at}]}),
    );
    match kueue::admission(&pending, &BTreeMap::new()) {
        Admission::Waiting { message, .. } => assert!(message.contains("insufficient quota"), "{message}"),
        other => panic!("{other:?}"),
    }
    let fresh = workload_with(json!({}));
    assert!(matches!(kueue::admission(&fresh, &BTreeMap::new()), Admission::Waiting { .. }));

    let admitted = workload_with(json!({
        "conditions": [condition("QuotaReserved", "True", "QuotaReserved", at), condition("Admitted", "True", "Admitted", at)],
        "admission": {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "ps", "flavors": {"cpu": "on-demand"}, "count": 2},
            {"name": "worker", "flavors": {"cpu": "spot", "memory": "spot"}, "count": 4}]},
        "admissionChecks": [{"name": "prov", "state": "Ready", "lastTransitionTime": at, "message": "",
            "podSetUpdates": [{"name": "worker", "labels": {"pool": "a"}, "nodeSelector": {"zone": "z1"}}]}],
    }));
    assert_eq!(kueue::flavors_used(&admitted), ["on-demand", "spot"]);
    let spot_toleration = Toleration {
        key: Some("spot".to_owned()),
        operator: Some("Exists".to_owned()),
        ..Toleration::default()
    };
    let flavors = BTreeMap::from([
        (
            "on-demand".to_owned(),
            Flavor {
                node_labels: BTreeMap::from([("lifecycle".to_owned(), "on-demand".to_owned())]),
                tolerations: vec![],
            },
        ),
        (
            "spot".to_owned(),
            Flavor {
                node_labels: BTreeMap::from([("lifecycle".to_owned(), "spot".to_owned())]),
                tolerations: vec![spot_toleration.clone()],
            },
        ),
    ]);
    let Admission::Admitted { cluster_queue, placement } = kueue::admission(&admitted, &flavors) else {
        panic!()
    };
    assert_eq!(cluster_queue, "cq");
    let job = fixture("hybrid.yaml");
    let job = valid(&job);
    let mut worker = builder::pod(&job, Role::Worker { group: 1, rank: 0 }, 0);
    kueue::place(&mut worker, Role::Worker { group: 1, rank: 0 }, &placement);
    let spec = worker.spec.as_ref().unwrap();
    let selector = spec.node_selector.as_ref().unwrap();
    assert_eq!((selector["lifecycle"].as_str(), selector["zone"].as_str()), ("spot", "z1"));
    assert_eq!(spec.tolerations.as_deref(), Some(&[spot_toleration][..]));
    assert_eq!(worker.metadata.labels.as_ref().unwrap()["pool"], "a");
    let mut ps = builder::pod(&job, Role::Ps { index: 0 }, 0);
    kueue::place(&mut ps, Role::Ps { index: 0 }, &placement);
    assert_eq!(ps.spec.as_ref().unwrap().node_selector.as_ref().unwrap()["lifecycle"], "on-demand");
    assert_eq!(ps.spec.as_ref().unwrap().tolerations, None);
}

#[test]
fn an_evicted_workloads_cleared_reservation_keeps_kueues_fields_and_requeues_it() {
    let admitted_at = "2026-12-07T10:00:00Z";
    let evicted = workload_with(json!({
        "conditions": [
            condition("QuotaReserved", "True", "QuotaReserved", admitted_at),
            condition("Admitted", "True", "Admitted", admitted_at),
            condition("Evicted", "True", "Preempted", "2026-12-07T10:00:30Z"),
            condition("Preempted", "True", "InClusterQueue", "2026-12-07T10:00:30Z"),
            condition("PodsReady", "True", "PodsReady", admitted_at),
        ],
        "admission": {"clusterQueue": "cq", "podSetAssignments": []},
        "accumulatedPastExecutionTimeSeconds": 7,
        "schedulingStats": {"evictions": [{"reason": "Preempted", "underlyingCause": "", "count": 1}]},
    }));
    assert!(
        matches!(kueue::admission(&evicted, &BTreeMap::new()), Admission::Evicted { ref reason, .. } if reason == "Preempted")
    );
    let now: Timestamp = "2026-12-07T10:01:00Z".parse().unwrap();
    let body = kueue::cleared_reservation(&evicted, now);
    assert_eq!(body["metadata"]["resourceVersion"], "42", "a stale read must conflict");
    let status = &body["status"];
    assert!(status.get("admission").is_none(), "the admission is left out, so removed");
    assert_eq!(status["accumulatedPastExecutionTimeSeconds"], 67, "7 s before and 60 s admitted");
    assert_eq!(status["schedulingStats"]["evictions"][0]["count"], 1);
    let by_type = |t: &str| status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == t).cloned();
    assert_eq!(by_type("QuotaReserved").unwrap()["status"], "False");
    assert_eq!(by_type("Admitted").unwrap()["reason"], "NoReservation");
    let requeued = by_type("Requeued").unwrap();
    assert_eq!((requeued["status"].as_str(), requeued["reason"].as_str()), (Some("True"), Some("Preempted")));
    assert_eq!(by_type("Evicted").unwrap()["lastTransitionTime"], "2026-12-07T10:00:30Z", "kept as it was");
    assert!(by_type("Preempted").is_some());
    assert!(
        by_type("PodsReady").is_none(),
        "a condition Kueue's admission manager does not own is not claimed"
    );
    // The status then reads as waiting again.
    let mut cleared = evicted.clone();
    cleared.data["status"] = status.clone();
    assert!(matches!(kueue::admission(&cleared, &BTreeMap::new()), Admission::Waiting { .. }));
}
