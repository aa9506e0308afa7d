//! Kueue admission (`--kueue`): a TrainingJob labelled `kueue.x-k8s.io/queue-name` runs no pod until
//! a real Kueue admits it. The operator writes the job's `Workload` itself — one pod set per role,
//! each with the role's pod template — as Kueue's job framework does for its built-in
//! integrations; Kueue reserves quota for all of it at once, or none. The job then runs with the
//! admission's node selectors and tolerations on every pod; an evicted (preempted) job is stopped
//! (SIGTERM: the trainer checkpoints), its reservation cleared so that Kueue queues it again; a
//! finished job's Workload is marked `Finished` so that its quota is released.
//!
//! The size Kueue admitted is the size that runs: a job scaled while admitted (`kubectl scale`) no
//! longer matches its Workload, which is then replaced — the job stops, checkpointing, and resumes
//! at the new size once Kueue admits that (Kueue's own rule for jobs that change shape).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde::Deserialize;
use tandem_api::{Backend, Role, names};

use crate::builder;
use crate::validate::ValidatedJob;

/// Label naming the LocalQueue a job is submitted to.
pub const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// Label naming the job's WorkloadPriorityClass.
pub const PRIORITY_LABEL: &str = "kueue.x-k8s.io/priority-class";
/// Label of a Workload naming its job's UID.
pub const JOB_UID_LABEL: &str = "kueue.x-k8s.io/job-uid";
/// Kueue's API group.
pub const GROUP: &str = "kueue.x-k8s.io";
/// The Workload API version written (Kueue's storage version).
pub const VERSION: &str = "v1beta2";
/// Field manager with which Kueue writes a Workload's admission; clearing the admission of an
/// evicted Workload is applied with it, as Kueue's job framework does.
pub const ADMISSION_MANAGER: &str = "kueue-admission";

/// A Kueue API of `kind` (`plural`).
fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, kind), plural)
}

/// The Workload API.
pub fn workload_resource() -> ApiResource {
    resource("Workload", "workloads")
}

/// The ResourceFlavor API (cluster-scoped).
pub fn flavor_resource() -> ApiResource {
    resource("ResourceFlavor", "resourceflavors")
}

/// The WorkloadPriorityClass API (cluster-scoped).
pub fn priority_class_resource() -> ApiResource {
    resource("WorkloadPriorityClass", "workloadpriorityclasses")
}

/// The LocalQueue `job` is submitted to, if it is labelled with one.
pub fn queue_name<'a>(job: &ValidatedJob<'a>) -> Option<&'a str> {
    job.job.labels().get(QUEUE_LABEL).map(String::as_str).filter(|q| !q.is_empty())
}

/// The name of `job`'s Workload.
pub fn workload_name(job: &str) -> String {
    format!("trainingjob-{job}")
}

/// A pod set of the Workload: its pod count and the role whose pod is its template (its name is
/// the role's, [`pod_set_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodSet {
    /// Pods of the set.
    pub count: u32,
    /// A role of the set (every pod of a set asks for the same resources).
    pub role: Role,
}

/// The pod sets of `job`: its PS, its workers (every group), and its launchers (MPI).
pub fn pod_sets(job: &ValidatedJob<'_>) -> Vec<PodSet> {
    let spec = job.spec;
    let mut sets = Vec::new();
    if spec.parameter_servers.replicas > 0 {
        sets.push(PodSet { count: spec.parameter_servers.replicas, role: Role::Ps { index: 0 } });
    }
    sets.push(PodSet { count: spec.workers.ranks(), role: Role::Worker { group: 0, rank: 0 } });
    if spec.workers.backend == Backend::Mpi {
        sets.push(PodSet { count: spec.workers.groups, role: Role::Launcher { group: 0 } });
    }
    sets
}

/// The pod set a pod of `role` belongs to.
pub fn pod_set_of(role: Role) -> &'static str {
    match role {
        Role::Ps { .. } => "ps",
        Role::Worker { .. } => "worker",
        Role::Launcher { .. } => "launcher",
    }
}

/// The job's priority as Kueue reads it: a WorkloadPriorityClass (the job's
/// `kueue.x-k8s.io/priority-class` label) or the pods' PriorityClass
/// (`runPolicy.scheduling.priorityClassName`), with its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Priority {
    /// `kueue.x-k8s.io` (WorkloadPriorityClass) or `scheduling.k8s.io` (PriorityClass).
    pub group: &'static str,
    /// Its name.
    pub name: String,
    /// Its value.
    pub value: i32,
}

impl Priority {
    fn kind(&self) -> &'static str {
        if self.group == GROUP { "WorkloadPriorityClass" } else { "PriorityClass" }
    }
}

/// The Workload of `job` in `queue`: one pod set per role, each with that role's pod as built
/// for the cluster (its requests are what Kueue reserves), owned by the job.
pub fn workload(job: &ValidatedJob<'_>, queue: &str, priority: Option<&Priority>) -> DynamicObject {
    let pod_sets: Vec<serde_json::Value> = pod_sets(job)
        .into_iter()
        .map(|set| {
            let pod = builder::pod(job, set.role, 0);
            let template = PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: pod.metadata.labels.clone(), ..ObjectMeta::default() }),
                spec: pod.spec,
            };
            serde_json::json!({ "name": pod_set_of(set.role), "count": set.count, "template": template })
        })
        .collect();
    let mut spec = serde_json::json!({ "queueName": queue, "podSets": pod_sets, "active": true });
    if let Some(p) = priority {
        spec["priorityClassRef"] = serde_json::json!({ "group": p.group, "kind": p.kind(), "name": p.name });
        spec["priority"] = p.value.into();
    }
    let name = workload_name(job.name);
    let mut labels = names::child_labels(job.name, "workload");
    // Kueue names the job by this in its preemption messages and metrics.
    labels.insert(JOB_UID_LABEL.to_owned(), job.uid.to_owned());
    let mut object = DynamicObject::new(&name, &workload_resource());
    object.metadata = ObjectMeta {
        name: Some(name),
        namespace: Some(job.namespace.to_owned()),
        labels: Some(labels),
        owner_references: Some(vec![job.owner_reference()]),
        ..ObjectMeta::default()
    };
    object.data = serde_json::json!({ "spec": spec });
    object
}

/// Whether `workload` still describes `job`: the same pod sets with the same counts (the size
/// Kueue admitted). A job scaled since does not match.
pub fn matches(workload: &DynamicObject, job: &ValidatedJob<'_>) -> bool {
    let have: Vec<(String, u64)> = workload.data["spec"]["podSets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| (s["name"].as_str().unwrap_or_default().to_owned(), s["count"].as_u64().unwrap_or(0)))
        .collect();
    let want: Vec<(String, u64)> =
        pod_sets(job).into_iter().map(|s| (pod_set_of(s.role).to_owned(), u64::from(s.count))).collect();
    have == want
}

/// A Workload condition as Kueue writes it.
#[derive(Clone, Debug, Default, Deserialize)]
struct WorkloadCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
}

/// The part of a Workload's status the operator reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WorkloadStatus {
    #[serde(default)]
    conditions: Vec<WorkloadCondition>,
    #[serde(default)]
    admission: Option<AdmissionStatus>,
    #[serde(default)]
    admission_checks: Vec<AdmissionCheck>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionStatus {
    #[serde(default)]
    cluster_queue: String,
    #[serde(default)]
    pod_set_assignments: Vec<PodSetAssignment>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct PodSetAssignment {
    name: String,
    #[serde(default)]
    flavors: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionCheck {
    #[serde(default)]
    pod_set_updates: Vec<PodSetUpdate>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodSetUpdate {
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    node_selector: BTreeMap<String, String>,
    #[serde(default)]
    tolerations: Vec<Toleration>,
}

/// What a ResourceFlavor puts on the pods it admits.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Flavor {
    /// `spec.nodeLabels`: node selector terms.
    pub node_labels: BTreeMap<String, String>,
    /// `spec.tolerations`.
    pub tolerations: Vec<Toleration>,
}

impl Flavor {
    /// The flavor of a ResourceFlavor object.
    pub fn of(object: &DynamicObject) -> Flavor {
        let spec = &object.data["spec"];
        Flavor {
            node_labels: serde_json::from_value(spec["nodeLabels"].clone()).unwrap_or_default(),
            tolerations: serde_json::from_value(spec["tolerations"].clone()).unwrap_or_default(),
        }
    }
}

/// What each pod set gets on admission: node selectors and tolerations of its flavours and of the
/// admission checks' updates, and their labels and annotations.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placement {
    /// Per pod set name.
    pub pod_sets: BTreeMap<String, PodSetPlacement>,
}

/// See [`Placement`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodSetPlacement {
    /// Added to the pod's node selector.
    pub node_selector: BTreeMap<String, String>,
    /// Added to the pod's tolerations.
    pub tolerations: Vec<Toleration>,
    /// Added to the pod's labels.
    pub labels: BTreeMap<String, String>,
    /// Added to the pod's annotations.
    pub annotations: BTreeMap<String, String>,
}

/// Where a job's Workload stands.
#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    /// Not admitted (yet): Kueue's reason and message (e.g. the quota it lacks).
    Waiting {
        /// A condition reason.
        reason: String,
        /// Kueue's message, or what the operator knows.
        message: String,
    },
    /// Admitted to `cluster_queue`; run with `placement`.
    Admitted {
        /// The ClusterQueue.
        cluster_queue: String,
        /// What the pods get.
        placement: Placement,
    },
    /// Evicted while admitted (preempted, or its admission check was revoked): stop the pods;
    /// once they are gone the reservation is cleared and Kueue queues the job again.
    Evicted {
        /// Kueue's reason (`Preempted`, …).
        reason: String,
        /// Kueue's message.
        message: String,
    },
}

/// The part of `workload`'s status the operator reads (empty before Kueue wrote any).
fn status_of(workload: &DynamicObject) -> WorkloadStatus {
    serde_json::from_value(workload.data["status"].clone()).unwrap_or_default()
}

/// Appends each of `more` to `tolerations` that is not there yet.
fn add_tolerations(tolerations: &mut Vec<Toleration>, more: &[Toleration]) {
    for t in more {
        if !tolerations.contains(t) {
            tolerations.push(t.clone());
        }
    }
}

fn condition<'s>(status: &'s WorkloadStatus, type_: &str) -> Option<&'s WorkloadCondition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

fn is_true(status: &WorkloadStatus, type_: &str) -> bool {
    condition(status, type_).is_some_and(|c| c.status == "True")
}

/// Names of the ResourceFlavors an admitted Workload uses.
pub fn flavors_used(workload: &DynamicObject) -> Vec<String> {
    let status = status_of(workload);
    let mut names: Vec<String> = status
        .admission
        .iter()
        .flat_map(|a| a.pod_set_assignments.iter())
        .flat_map(|p| p.flavors.values().cloned())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Reads `workload`'s status; `flavors` gives the ResourceFlavors by name (see [`flavors_used`]).
pub fn admission(workload: &DynamicObject, flavors: &BTreeMap<String, Flavor>) -> Admission {
    let status = status_of(workload);
    if let Some(evicted) = condition(&status, "Evicted").filter(|c| c.status == "True")
        && status.admission.is_some()
    {
        return Admission::Evicted { reason: evicted.reason.clone(), message: evicted.message.clone() };
    }
    let admitted = is_true(&status, "QuotaReserved") && is_true(&status, "Admitted");
    let Some(admission) = status.admission.as_ref().filter(|_| admitted) else {
        let pending = condition(&status, "QuotaReserved").filter(|c| c.status == "False");
        let (reason, message) = match pending {
            Some(c) if !c.message.is_empty() => (c.reason.clone(), c.message.clone()),
            _ if status.admission.is_some() => {
                ("AdmissionChecks".to_owned(), "quota reserved; waiting for the admission checks".to_owned())
            }
            _ => ("Queued".to_owned(), "waiting for Kueue to reserve quota".to_owned()),
        };
        return Admission::Waiting { reason, message };
    };
    let mut placement = Placement::default();
    for assignment in &admission.pod_set_assignments {
        let entry = placement.pod_sets.entry(assignment.name.clone()).or_default();
        let mut used: Vec<&String> = assignment.flavors.values().collect();
        used.sort();
        used.dedup();
        for flavor in used.into_iter().filter_map(|name| flavors.get(name)) {
            entry.node_selector.extend(flavor.node_labels.clone());
            add_tolerations(&mut entry.tolerations, &flavor.tolerations);
        }
    }
    for update in status.admission_checks.iter().flat_map(|c| c.pod_set_updates.iter()) {
        let entry = placement.pod_sets.entry(update.name.clone()).or_default();
        entry.node_selector.extend(update.node_selector.clone());
        entry.labels.extend(update.labels.clone());
        entry.annotations.extend(update.annotations.clone());
        add_tolerations(&mut entry.tolerations, &update.tolerations);
    }
    Admission::Admitted { cluster_queue: admission.cluster_queue.clone(), placement }
}

/// Whether Kueue marked `workload` finished.
pub fn finished(workload: &DynamicObject) -> bool {
    let status = status_of(workload);
    is_true(&status, "Finished")
}

/// Puts `placement` of `role`'s pod set on `pod`: node selector entries and labels added (the
/// admission's win over the template's for the same key), tolerations appended.
pub fn place(pod: &mut Pod, role: Role, placement: &Placement) {
    let Some(set) = placement.pod_sets.get(pod_set_of(role)) else { return };
    if !set.labels.is_empty() {
        pod.metadata.labels.get_or_insert_with(BTreeMap::new).extend(set.labels.clone());
    }
    if !set.annotations.is_empty() {
        pod.metadata.annotations.get_or_insert_with(BTreeMap::new).extend(set.annotations.clone());
    }
    let Some(spec) = pod.spec.as_mut() else { return };
    if !set.node_selector.is_empty() {
        spec.node_selector.get_or_insert_with(BTreeMap::new).extend(set.node_selector.clone());
    }
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    add_tolerations(tolerations, &set.tolerations);
    if tolerations.is_empty() {
        spec.tolerations = None;
    }
}

/// Conditions of a Workload's status that Kueue's admission manager owns: an apply with
/// [`ADMISSION_MANAGER`] that leaves one out removes it.
const ADMISSION_CONDITIONS: &[&str] = &[
    "QuotaReserved",
    "BlockedOnPreemptionGates",
    "Evicted",
    "Admitted",
    "Preempted",
    "Requeued",
    "DeactivationTarget",
    "Finished",
];

/// Status fields the admission manager owns besides its conditions, kept as they are.
const ADMISSION_FIELDS: &[&str] = &[
    "requeueState",
    "schedulingStats",
    "clusterName",
    "nominatedClusterNames",
    "unhealthyNodes",
    "preemptionGates",
    "admissionChecks",
];

/// Sets condition `type_` in `conditions` (its transition time moves only when its status does).
fn upsert(
    conditions: &mut Vec<serde_json::Value>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: &str,
    generation: Option<i64>,
) {
    let status = if status { "True" } else { "False" };
    let mut condition = serde_json::json!({
        "type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": now,
    });
    if let Some(generation) = generation {
        condition["observedGeneration"] = generation.into();
    }
    match conditions.iter_mut().find(|c| c["type"] == type_) {
        Some(old) => {
            if old["status"] == status {
                condition["lastTransitionTime"] = old["lastTransitionTime"].clone();
            }
            *old = condition;
        }
        None => conditions.push(condition),
    }
}

/// The status applied (field manager [`ADMISSION_MANAGER`], forced, at the read
/// `resourceVersion`) to an evicted Workload whose pods are gone, as Kueue's job framework writes
/// it: no `admission` (left out, so removed), `QuotaReserved=False`, `Admitted=False`, `Requeued`
/// (True after a preemption or lost nodes: Kueue then queues it again), the admitted time added
/// to `accumulatedPastExecutionTimeSeconds`, and every other field that manager owns as it was.
pub fn cleared_reservation(workload: &DynamicObject, now: Timestamp) -> serde_json::Value {
    let status = &workload.data["status"];
    let old: Vec<serde_json::Value> = status["conditions"].as_array().cloned().unwrap_or_default();
    let find = |type_: &str| old.iter().find(|c| c["type"] == type_);
    let (reason, message) = find("Evicted")
        .map(|c| (c["reason"].as_str().unwrap_or("Evicted"), c["message"].as_str().unwrap_or_default()))
        .unwrap_or(("Evicted", ""));
    let admitted_for = find("Admitted")
        .filter(|c| c["status"] == "True")
        .and_then(|c| c["lastTransitionTime"].as_str()?.parse::<Timestamp>().ok())
        .map_or(0, |since| now.duration_since(since).as_secs().max(0));
    let accumulated = status["accumulatedPastExecutionTimeSeconds"].as_i64().unwrap_or(0) + admitted_for;
    let generation = workload.metadata.generation;
    let at = now.to_string();
    let mut conditions: Vec<serde_json::Value> = old
        .iter()
        .filter(|c| c["type"].as_str().is_some_and(|t| ADMISSION_CONDITIONS.contains(&t)))
        .cloned()
        .collect();
    upsert(&mut conditions, "QuotaReserved", false, "Pending", message, &at, generation);
    upsert(
        &mut conditions,
        "Admitted",
        false,
        "NoReservation",
        "The workload has no reservation",
        &at,
        generation,
    );
    let requeue = matches!(reason, "Preempted" | "NodeFailures");
    upsert(&mut conditions, "Requeued", requeue, reason, message, &at, generation);
    let mut body = serde_json::json!({
        "conditions": conditions,
        "accumulatedPastExecutionTimeSeconds": accumulated,
    });
    for field in ADMISSION_FIELDS {
        if let Some(value) = status.get(*field).filter(|v| !v.is_null()) {
            body[*field] = value.clone();
        }
    }
    serde_json::json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "Workload",
        "metadata": {
            "name": workload.name_any(),
            "namespace": workload.namespace(),
            "uid": workload.metadata.uid,
            "resourceVersion": workload.metadata.resource_version,
        },
        "status": body,
    })
}

/// The status applied (field manager [`names::FIELD_MANAGER`]) to the Workload of a finished job:
/// `Finished=True`, so that Kueue releases its quota.
pub fn finished_status(
    workload: &DynamicObject,
    succeeded: bool,
    message: &str,
    now: &str,
) -> serde_json::Value {
    let reason = if succeeded { "Succeeded" } else { "Failed" };
    serde_json::json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "Workload",
        "metadata": { "name": workload.name_any(), "namespace": workload.namespace() },
        "status": {
            "conditions": [
                { "type": "Finished", "status": "True", "reason": reason, "message": message,
                  "lastTransitionTime": now },
            ],
        },
    })
}
