//! What the plan reads of the job's pods: phase, role, attempt, and how a pod failed.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tandem_api::Role;
use tandem_api::policy::{Failure, FailureKind};

use crate::names;

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
