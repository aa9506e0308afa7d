//! What runs now, and the phase and conditions that follow from it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tandem_api::{Backend, JobPhase, Role, RoleStatus, TrainingJobSpec, TrainingJobStatus};

use super::pods::{ObservedPod, PodPhase};
use super::{Draft, attempt_in, condition, condition_is};

/// The pods of the current attempt of each unit in the spec that stay (not being deleted).
pub(super) struct Current<'p, 'a>(Vec<&'p ObservedPod<'a>>);

impl<'p, 'a> Current<'p, 'a> {
    pub fn of(draft: &Draft<'_>, pods: &'p [ObservedPod<'a>]) -> Self {
        Self(
            pods.iter()
                .filter(|p| {
                    p.role.in_spec(draft.job.spec)
                        && p.attempt >= attempt_in(&draft.status, p.role)
                        && !draft.plan.delete.contains(&p.name)
                })
                .collect(),
        )
    }

    /// The current pod of `role`.
    pub fn get(&self, role: Role) -> Option<&ObservedPod<'a>> {
        self.0.iter().copied().find(|p| p.role == role)
    }

    /// Pod counts per role, and the groups whose every rank has a pod.
    /// The counts with the pods of `created` (roles about to be created) counted as existing.
    pub fn count(&self, status: &mut TrainingJobStatus, spec: &TrainingJobSpec, created: &[(Role, u32)]) {
        status.parameter_servers = Some(self.role_counts(created, |r| matches!(r, Role::Ps { .. })));
        status.workers = Some(self.role_counts(created, |r| matches!(r, Role::Worker { .. })));
        let (groups, size) = (spec.workers.groups, spec.workers.group_size);
        let there = |role: Role| {
            created.iter().any(|&(r, _)| r == role) || self.get(role).is_some_and(|p| !p.deleting)
        };
        status.groups = (0..groups)
            .filter(|&group| (0..size).all(|rank| there(Role::Worker { group, rank })))
            .count() as u32;
    }

    fn role_counts(&self, created: &[(Role, u32)], pick: impl Fn(Role) -> bool) -> RoleStatus {
        let mut counts = RoleStatus::default();
        counts.total += created.iter().filter(|&&(r, _)| pick(r)).count() as u32;
        for p in self.0.iter().filter(|p| pick(p.role)) {
            counts.total += 1;
            counts.ready += u32::from(p.ready());
            counts.active += u32::from(p.running());
            counts.succeeded += u32::from(p.succeeded());
            counts.failed += u32::from(p.phase == PodPhase::Failed);
        }
        counts
    }

    /// Whether group `group` finished training: its launcher (mpi) or every rank (tcp) succeeded.
    fn group_done(&self, spec: &TrainingJobSpec, group: u32) -> bool {
        if spec.workers.backend == Backend::Mpi {
            self.get(Role::Launcher { group }).is_some_and(ObservedPod::succeeded)
        } else {
            (0..spec.workers.group_size)
                .all(|rank| self.get(Role::Worker { group, rank }).is_some_and(ObservedPod::succeeded))
        }
    }

    /// Whether every group in the spec finished training.
    pub fn every_group_done(&self, spec: &TrainingJobSpec) -> bool {
        (0..spec.workers.groups).all(|group| self.group_done(spec, group))
    }

    /// Whether every pod in the spec runs (workers and launchers may also have succeeded).
    fn all_running(&self, spec: &TrainingJobSpec) -> bool {
        let mpi = spec.workers.backend == Backend::Mpi;
        let up = |role: Role| self.get(role).is_some_and(|p| p.running() || p.succeeded());
        (0..spec.parameter_servers.replicas)
            .all(|index| self.get(Role::Ps { index }).is_some_and(ObservedPod::running))
            && (0..spec.workers.groups).all(|group| {
                (0..spec.workers.group_size).all(|rank| up(Role::Worker { group, rank }))
                    && (!mpi || up(Role::Launcher { group }))
            })
    }
}

/// The phase: Restarting while a unit restarts or waits out its back-off (and until everything
/// runs again), Scaling while groups come or go after the job first ran, Running when every pod
/// runs, else Created. Sets the Restarting, Scaling and Running conditions and the start time.
pub(super) fn set(draft: &mut Draft<'_>, pods: &[ObservedPod<'_>], current: &Current<'_, '_>, waiting: bool) {
    let spec = draft.job.spec;
    let groups = spec.workers.groups;
    let all_running = current.all_running(spec);
    let restarting = waiting
        || !draft.plan.restarted.is_empty()
        || (condition_is(&draft.old, condition::RESTARTING, "True").is_some() && !all_running);
    let leaving = pods.iter().any(|p| !p.role.in_spec(spec));
    let scaling = !restarting && draft.old.start_time.is_some() && (leaving || !all_running);
    let (phase, reason, message) = if restarting {
        let c = draft.status.conditions.iter().find(|c| c.type_ == condition::RESTARTING);
        let reason = c.map_or("Restarting".to_owned(), |c| c.reason.clone());
        let message = c.map_or(String::new(), |c| c.message.clone());
        (JobPhase::Restarting, reason, message)
    } else if scaling {
        (JobPhase::Scaling, "GroupsChanged".to_owned(), format!("scaling to {groups} worker groups"))
    } else if all_running {
        (
            JobPhase::Running,
            "AllPodsRunning".to_owned(),
            format!("all pods of {groups} worker groups are running"),
        )
    } else {
        (JobPhase::Created, "PodsStarting".to_owned(), "waiting for pods to run".to_owned())
    };
    draft.set(condition::RESTARTING, restarting, &reason, &message);
    draft.set(condition::SCALING, scaling, &reason, &message);
    draft.set(condition::RUNNING, all_running && !restarting && !scaling, &reason, &message);
    scheduled(draft, current);
    if phase == JobPhase::Running && draft.status.start_time.is_none() {
        draft.status.start_time = Some(Time(draft.now));
    }
    draft.status.phase = Some(phase);
    if draft.plan.restarted.is_empty() {
        draft.transition(&reason, &message, false);
    }
}

/// Sets `Scheduled`: False while a current pod is Pending for a reason someone must act on (the
/// first such pod's reason and message, copied from its status, see [`ObservedPod::blocked`]),
/// True once every pod of the spec exists and none is blocked.
fn scheduled(draft: &mut Draft<'_>, current: &Current<'_, '_>) {
    if let Some((reason, message)) = current.0.iter().find_map(|p| p.blocked()) {
        // Set even when it never was True: the user must see why nothing runs.
        let (now, generation) = (draft.now, draft.job.generation());
        let conditions = &mut draft.status.conditions;
        if !conditions.iter().any(|c| c.type_ == condition::SCHEDULED) {
            super::set_condition(conditions, condition::SCHEDULED, true, &reason, &message, now, generation);
        }
        draft.set(condition::SCHEDULED, false, &reason, &message);
    } else if current.0.iter().all(|p| p.phase != PodPhase::Pending) && current.all_running(draft.job.spec) {
        draft.set(condition::SCHEDULED, true, "AllPodsScheduled", "every pod is bound to a node and started");
    }
}
