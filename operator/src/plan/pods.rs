//! What the plan reads of the job's pods: phase, role, attempt, and how a pod failed; and
//! [`keep_what_is_read`], which strips a pod to those fields before it enters the pod cache.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
    Pod, PodCondition, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use tandem_api::Role;
use tandem_api::policy::{Failure, FailureKind};

use tandem_api::names;

/// A pod's phase (`status.phase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodPhase {
    /// Accepted, not all containers started yet; also a phase missing or unknown to this version.
    Pending,
    /// Bound to a node, containers started.
    Running,
    /// Every container exited with 0.
    Succeeded,
    /// Every container ended, at least one in failure.
    Failed,
    /// The pod's node stopped reporting.
    Unknown,
}

impl PodPhase {
    /// The phase of `pod`.
    pub fn of(pod: &Pod) -> Self {
        match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Running") => PodPhase::Running,
            Some("Succeeded") => PodPhase::Succeeded,
            Some("Failed") => PodPhase::Failed,
            Some("Unknown") => PodPhase::Unknown,
            _ => PodPhase::Pending,
        }
    }
}

/// One existing pod of the job, as the plan sees it.
#[derive(Clone, Debug)]
pub(super) struct ObservedPod<'a> {
    pub pod: &'a Pod,
    pub name: String,
    pub role: Role,
    /// The attempt of its unit it was launched for.
    pub attempt: u32,
    pub phase: PodPhase,
    /// It has a deletion timestamp.
    pub deleting: bool,
}

impl<'a> ObservedPod<'a> {
    /// The job's pods that carry a role, sorted by name; other pods are ignored.
    pub fn all(pods: &'a [Pod]) -> Vec<Self> {
        let mut observed: Vec<Self> = pods
            .iter()
            .filter_map(|pod| {
                let labels = pod.labels();
                Some(ObservedPod {
                    pod,
                    name: pod.name_any(),
                    role: names::role_of(labels)?,
                    attempt: names::attempt_of(labels),
                    phase: PodPhase::of(pod),
                    deleting: pod.metadata.deletion_timestamp.is_some(),
                })
            })
            .collect();
        observed.sort_by(|a, b| a.name.cmp(&b.name));
        observed
    }

    pub fn running(&self) -> bool {
        self.phase == PodPhase::Running && !self.deleting
    }

    pub fn succeeded(&self) -> bool {
        self.phase == PodPhase::Succeeded
    }

    /// Running and its Ready condition is True.
    pub fn ready(&self) -> bool {
        self.running()
            && self
                .pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    }

    /// What keeps a Pending pod from running, as a reason and message copied from its status:
    /// the scheduler's (`PodScheduled=False`, e.g. `Unschedulable: 0/3 nodes are available: …`),
    /// else a container's that cannot start (an image that cannot be pulled, a missing Secret or
    /// ConfigMap, a volume that cannot be mounted). `None` for a pod that is not Pending, or that
    /// is only starting.
    pub fn blocked(&self) -> Option<(String, String)> {
        if self.phase != PodPhase::Pending || self.deleting {
            return None;
        }
        let status = self.pod.status.as_ref()?;
        let unscheduled = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            .map(|c| (c.reason.clone().unwrap_or_else(|| "Unschedulable".to_owned()), c.message.clone()));
        if let Some((reason, message)) = unscheduled {
            let message = message.unwrap_or_else(|| "the scheduler has not placed it".to_owned());
            return Some((reason, format!("pod {}: {message}", self.name)));
        }
        let containers =
            status.init_container_statuses.iter().flatten().chain(status.container_statuses.iter().flatten());
        containers.filter_map(|c| Some((c, c.state.as_ref()?.waiting.as_ref()?))).find_map(|(c, waiting)| {
            let reason = waiting.reason.clone()?;
            if !BLOCKING_WAIT_REASONS.contains(&reason.as_str()) {
                return None;
            }
            let detail = waiting.message.clone().unwrap_or_default();
            Some((reason, format!("pod {} container {}: {detail}", self.name, c.name)))
        })
    }

    /// The kubelet's in-place restarts of its `tandem` container (see [`container_restarts`]).
    pub fn container_restarts(&self) -> Option<(u32, Option<i32>)> {
        container_restarts(self.pod)
    }

    /// Whether its `tandem` container is not running after it ran: ended, or waiting to be
    /// restarted in place (the kubelet reports the run that ended as its last state).
    pub fn container_down(&self) -> bool {
        let statuses = self.pod.status.as_ref().and_then(|s| s.container_statuses.as_ref());
        statuses.into_iter().flatten().filter(|c| c.name == names::CONTAINER).any(|c| {
            let state = c.state.as_ref();
            state.is_some_and(|s| s.terminated.is_some())
                || (state.is_some_and(|s| s.waiting.is_some())
                    && c.last_state.as_ref().is_some_and(|s| s.terminated.is_some()))
        })
    }

    /// How the pod failed, if it did: its phase is Failed (evicted, node lost, an exit code, or a
    /// reason) or Unknown (node lost), or it is being deleted before it ended.
    pub fn failure(&self) -> Option<Failure> {
        let status = self.pod.status.as_ref();
        let reason = status.and_then(|s| s.reason.clone()).unwrap_or_default();
        let disrupted = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "DisruptionTarget" && c.status == "True"))
            .and_then(|c| c.reason.clone());
        let kind = match self.phase {
            PodPhase::Failed => match exit_code(self.pod) {
                _ if reason == "Evicted" || disrupted.as_deref() == Some("EvictionByEvictionAPI") => {
                    FailureKind::Evicted
                }
                _ if reason == "NodeLost" => FailureKind::NodeLost,
                Some(code) => FailureKind::Exit(code),
                None if reason.is_empty() => FailureKind::Other("no exit code".to_owned()),
                None => FailureKind::Other(reason),
            },
            PodPhase::Unknown => FailureKind::NodeLost,
            PodPhase::Succeeded => return None,
            _ if self.deleting => FailureKind::Deleted,
            _ => return None,
        };
        let message = termination_message(self.pod, Run::Current);
        Some(Failure { who: format!("pod {}", self.name), role: self.role, kind, message })
    }

    /// The termination message of the `tandem` container's run that ended last, as in
    /// [`termination_message`] with [`Run::Last`] (a PS container the kubelet restarted).
    pub fn last_termination_message(&self) -> Option<String> {
        termination_message(self.pod, Run::Last)
    }
}

/// Container waiting reasons of the kubelet that mean the container cannot start until someone
/// acts (as opposed to `ContainerCreating`, which passes by itself).
const BLOCKING_WAIT_REASONS: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "CrashLoopBackOff",
];

/// The exit code of the `tandem` container (else of the first container that failed).
pub fn exit_code(pod: &Pod) -> Option<i32> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let code = |name: Option<&str>| {
        statuses
            .iter()
            .filter(|s| name.is_none_or(|n| s.name == n))
            .filter_map(|s| s.state.as_ref()?.terminated.as_ref().map(|t| t.exit_code))
            .find(|code| name.is_some() || *code != 0)
    };
    code(Some(names::CONTAINER)).or_else(|| code(None))
}

/// Which run of a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Run {
    /// The one the container's state describes.
    Current,
    /// The one before the kubelet's last in-place restart (`lastState`).
    Last,
}

/// What the `tandem` container wrote to its termination log (`/dev/termination-log`) when `run`
/// ended, as the kubelet reports it in `state.terminated.message`; `None` when it wrote nothing.
pub fn termination_message(pod: &Pod, run: Run) -> Option<String> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let c = statuses.iter().find(|s| s.name == names::CONTAINER)?;
    let state = match run {
        Run::Current => c.state.as_ref(),
        Run::Last => c.last_state.as_ref(),
    };
    let message = state?.terminated.as_ref()?.message.as_deref()?.trim();
    (!message.is_empty()).then(|| message.to_owned())
}

/// The kubelet's in-place restarts of `pod`'s `tandem` container: its restart count and the exit
/// code of the run that ended last (`None` when the kubelet reports none).
pub fn container_restarts(pod: &Pod) -> Option<(u32, Option<i32>)> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let c = statuses.iter().find(|s| s.name == names::CONTAINER)?;
    let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref()).map(|t| t.exit_code);
    Some((u32::try_from(c.restart_count).unwrap_or(0), last))
}

/// Pod condition types the operator reads: readiness (a launcher waits for its workers), the
/// scheduler's verdict (`Scheduled=False`) and a disruption (eviction).
const CONDITIONS_READ: &[&str] = &["Ready", "PodScheduled", "DisruptionTarget"];

/// Strips `pod` to what the operator reads of it — name, namespace, UID, resource version, Tandem's
/// labels and the managed-by label, the controller's owner reference, the deletion timestamp, the
/// node name, and of the status the phase, reason, pod IP, the conditions in [`CONDITIONS_READ`] and
/// each container's name, restart count, waiting reason and message, and exit codes — so that the
/// pod cache holds a few hundred bytes a pod instead of the whole object (the spec with its
/// containers, env and volumes, annotations, timestamps and images are most of a pod's size).
///
/// Runs on every pod the watch delivers, before the reflector stores it. Everything that reads
/// cached pods (the plan, [`crate::progress::status_address`], the lost-node check) must read only
/// what is kept here; the plan's tests run on trimmed pods to hold that.
pub fn keep_what_is_read(pod: &mut Pod) {
    let Pod { metadata, spec, status } = std::mem::take(pod);
    let is_read = |key: &String| key.starts_with("tandem.dev/") || key == names::LABEL_MANAGED_BY;
    pod.metadata = ObjectMeta {
        name: metadata.name,
        namespace: metadata.namespace,
        uid: metadata.uid,
        resource_version: metadata.resource_version,
        deletion_timestamp: metadata.deletion_timestamp,
        labels: metadata.labels.map(|labels| labels.into_iter().filter(|(k, _)| is_read(k)).collect()),
        // The controller maps a pod's events to its job through this reference.
        owner_references: metadata
            .owner_references
            .map(|refs| refs.into_iter().filter(|r| r.controller == Some(true)).collect()),
        ..ObjectMeta::default()
    };
    pod.spec = spec.map(|s| PodSpec { node_name: s.node_name, ..PodSpec::default() });
    pod.status = status.map(|s| PodStatus {
        phase: s.phase,
        reason: s.reason,
        pod_ip: s.pod_ip,
        conditions: s.conditions.map(|cs| {
            cs.into_iter()
                .filter(|c| CONDITIONS_READ.contains(&c.type_.as_str()))
                .map(|c| PodCondition {
                    type_: c.type_,
                    status: c.status,
                    reason: c.reason,
                    message: c.message,
                    ..PodCondition::default()
                })
                .collect()
        }),
        container_statuses: s.container_statuses.map(keep_containers),
        init_container_statuses: s.init_container_statuses.map(keep_containers),
        ..PodStatus::default()
    });
}

fn keep_containers(statuses: Vec<ContainerStatus>) -> Vec<ContainerStatus> {
    let state = |s: ContainerState| ContainerState {
        running: s.running.map(|_| ContainerStateRunning::default()),
        // The message is what the process wrote to its termination log: the plan quotes it.
        terminated: s.terminated.map(|t| ContainerStateTerminated {
            exit_code: t.exit_code,
            reason: t.reason,
            message: t.message,
            ..ContainerStateTerminated::default()
        }),
        waiting: s.waiting.map(|w| ContainerStateWaiting { reason: w.reason, message: w.message }),
    };
    statuses
        .into_iter()
        .map(|c| ContainerStatus {
            name: c.name,
            restart_count: c.restart_count,
            state: c.state.map(state),
            last_state: c.last_state.map(state),
            ..ContainerStatus::default()
        })
        .collect()
}
