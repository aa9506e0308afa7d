//! The reconcile decisions — restart, scale, suspend, deadline, TTL, clean-up — on real
//! builder output, without an API server.

// Test helpers panic on purpose: a failed step is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use tandem_api::names;
use tandem_api::policy::{self, Failure, FailureKind, Relaunch, Unit, Verdict};
use tandem_api::{CleanPodPolicy, JobPhase, RestartPolicy, Role, TrainingJob};
use tandem_operator::builder;
use tandem_operator::kueue::{Admission, Placement};
use tandem_operator::plan::{Observed, Plan, Settings, decide, keep_what_is_read};
use tandem_operator::validate::{ValidatedJob, validate};

fn fixture(name: &str) -> TrainingJob {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `job` validated, as the controller hands it to the plan and the builders.
fn valid(job: &TrainingJob) -> ValidatedJob<'_> {
    validate(job).unwrap_or_else(|e| panic!("{e}"))
}

fn t0() -> Timestamp {
    "2026-01-01T00:10:00Z".parse().unwrap()
}

fn at(seconds: i64) -> Timestamp {
    t0().checked_add(SignedDuration::from_secs(seconds)).unwrap()
}

fn pod(job: &TrainingJob, role: Role, attempt: u32, phase: &str, ready: bool) -> Pod {
    let mut pod = builder::pod(&valid(job), role, attempt);
    pod.status = Some(PodStatus {
        phase: Some(phase.to_owned()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".to_owned(),
            status: if ready { "True" } else { "False" }.to_owned(),
            ..PodCondition::default()
        }]),
        ..PodStatus::default()
    });
    pod
}

fn exited(mut pod: Pod, code: i32) -> Pod {
    let status = pod.status.get_or_insert_with(PodStatus::default);
    status.phase = Some(if code == 0 { "Succeeded" } else { "Failed" }.to_owned());
    status.container_statuses = Some(vec![ContainerStatus {
        name: names::CONTAINER.to_owned(),
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        }),
        ..ContainerStatus::default()
    }]);
    pod
}

/// Every pod of the spec, all running and ready, at attempt 0.
fn all_running(job: &TrainingJob) -> Vec<Pod> {
    let mut pods = Vec::new();
    for index in 0..job.spec.parameter_servers.replicas {
        pods.push(pod(job, Role::Ps { index }, 0, "Running", true));
    }
    for group in 0..job.spec.workers.groups {
        for rank in 0..job.spec.workers.group_size {
            pods.push(pod(job, Role::Worker { group, rank }, 0, "Running", true));
        }
        if job.spec.workers.backend == tandem_api::Backend::Mpi {
            pods.push(pod(job, Role::Launcher { group }, 0, "Running", true));
        }
    }
    pods
}

/// `pods` as the controller's pod cache holds them: stripped to what the plan reads. Every
/// decision below is taken on such pods, so the plan cannot come to read a field the cache drops.
fn cached(pods: &[Pod]) -> Vec<Pod> {
    pods.iter()
        .cloned()
        .map(|mut pod| {
            keep_what_is_read(&mut pod);
            pod
        })
        .collect()
}

fn run(job: &TrainingJob, pods: &[Pod], now: Timestamp) -> Plan {
    decide(
        &valid(job),
        &Observed { pods: &cached(pods), lost_nodes: &BTreeSet::new(), now, progress: None, queue: None },
        &Settings::default(),
    )
}

/// Applies a plan to the job and the pod list, like the controller and API server would.
fn apply(job: &mut TrainingJob, pods: &mut Vec<Pod>, plan: &Plan) {
    job.status = Some(plan.status.clone());
    pods.retain(|p| !plan.delete.contains(&p.name_any()) && !plan.force_delete.contains(&p.name_any()));
    for &(role, attempt) in &plan.create {
        pods.push(pod(job, role, attempt, "Pending", false));
    }
}

fn names_of(roles: &[(Role, u32)]) -> Vec<String> {
    roles.iter().map(|(r, _)| names::pod("mnist-hybrid", *r)).collect()
}

fn condition<'a>(
    plan: &'a Plan,
    type_: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    plan.status.conditions.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("no {type_} condition"))
}

#[test]
fn a_new_job_creates_every_pod_in_a_fixed_order() {
    let job = fixture("hybrid.yaml");
    let plan = run(&job, &[], t0());
    assert_eq!(
        names_of(&plan.create),
        [
            "mnist-hybrid-ps-0",
            "mnist-hybrid-ps-1",
            "mnist-hybrid-g0-0",
            "mnist-hybrid-g0-1",
            "mnist-hybrid-g1-0",
            "mnist-hybrid-g1-1"
        ]
    );
    assert_eq!(plan.status.phase, Some(JobPhase::Created));
    assert_eq!(plan.status.observed_generation, Some(3));
    assert_eq!(
        plan.status.selector.as_deref(),
        Some("tandem.dev/job-name=mnist-hybrid,tandem.dev/role=worker")
    );
    assert!(plan.ensure_children);
    assert_eq!(plan.events.len(), 1, "one event for the transition to Created");
}

/// The controller creates a new job's pods before it writes the status, so the status counts
/// them; their arrival in the cache, still Pending, then changes nothing and writes nothing.
#[test]
fn the_status_counts_the_pods_it_creates_and_their_arrival_writes_nothing() {
    for fixture_name in ["hybrid.yaml", "mpi.yaml"] {
        let mut job = fixture(fixture_name);
        let mut pods = Vec::new();
        let plan = run(&job, &pods, t0());
        let spec = &job.spec;
        let total = |counts: &Option<tandem_api::RoleStatus>| counts.as_ref().map_or(0, |c| c.total);
        assert_eq!(
            total(&plan.status.workers),
            spec.workers.groups * spec.workers.group_size,
            "{fixture_name}"
        );
        assert_eq!(total(&plan.status.parameter_servers), spec.parameter_servers.replicas, "{fixture_name}");
        assert_eq!(plan.status.groups, spec.workers.groups, "{fixture_name}");
        let workers = plan.status.workers.clone().unwrap();
        assert_eq!((workers.ready, workers.active), (0, 0), "{fixture_name}: none runs yet");
        apply(&mut job, &mut pods, &plan);
        let again = run(&job, &pods, at(1));
        assert!(again.create.is_empty(), "{fixture_name}: {:?}", again.create);
        assert_eq!(again.status, plan.status, "{fixture_name}: the pods' arrival changed the status");
    }
}

#[test]
fn running_pods_make_a_running_job_with_counts_and_start_time() {
    let mut job = fixture("hybrid.yaml");
    let mut pods = Vec::new();
    let plan = run(&job, &pods, t0());
    apply(&mut job, &mut pods, &plan);
    let pods = all_running(&job);
    let plan = run(&job, &pods, at(5));
    assert_eq!(plan.status.phase, Some(JobPhase::Running));
    assert_eq!(plan.status.start_time, Some(Time(at(5))));
    assert_eq!(plan.status.groups, 2);
    let workers = plan.status.workers.clone().unwrap();
    assert_eq!((workers.total, workers.ready, workers.active), (4, 4, 4));
    assert_eq!(plan.status.parameter_servers.clone().unwrap().active, 2);
    assert!(plan.create.is_empty() && plan.delete.is_empty());
    assert_eq!(condition(&plan, "Running").status, "True");
    // Nothing changes on the next look: no event, same status.
    job.status = Some(plan.status.clone());
    let again = run(&job, &pods, at(9));
    assert!(again.events.is_empty());
    assert_eq!(again.status, plan.status);
}

#[test]
fn a_signal_killed_worker_restarts_its_group_only_after_the_backoff() {
    let mut job = fixture("hybrid.yaml");
    job.status = Some(run(&job, &all_running(&job), t0()).status);
    let mut pods = all_running(&job);
    pods[3] = exited(pods[3].clone(), 137); // mnist-hybrid-g0-1
    let plan = run(&job, &pods, at(10));
    assert_eq!(plan.status.phase, Some(JobPhase::Restarting));
    assert_eq!(plan.status.restarts, 1);
    let mut deleted = plan.delete.clone();
    deleted.sort();
    assert_eq!(
        deleted,
        ["mnist-hybrid-g0-0", "mnist-hybrid-g0-1"],
        "group 0 only; group 1 and the PS keep running"
    );
    let c = condition(&plan, "Restarting");
    assert_eq!(c.reason, "WorkerFailed");
    assert!(c.message.contains("mnist-hybrid-g0-1") && c.message.contains("137"), "{}", c.message);
    assert_eq!(plan.events.len(), 1);
    assert!(plan.events[0].warning && plan.events[0].message.contains("exited with code 137"));
    assert_eq!(plan.restarted, vec![Role::Worker { group: 0, rank: 1 }]);
    assert_eq!(plan.status.attempts[0].unit, "group-0");
    assert_eq!(plan.status.attempts[0].attempt, 1);

    apply(&mut job, &mut pods, &plan);
    // During the 10 s back-off the group stays away and the job is Restarting.
    let waiting = run(&job, &pods, at(15));
    assert!(waiting.create.is_empty(), "{:?}", waiting.create);
    assert_eq!(waiting.status.phase, Some(JobPhase::Restarting));
    assert!(waiting.requeue_after <= Duration::from_secs(5));
    assert_eq!(waiting.status.groups, 1);
    // Afterwards the group returns at attempt 1.
    let back = run(&job, &pods, at(21));
    assert_eq!(
        back.create,
        vec![(Role::Worker { group: 0, rank: 0 }, 1), (Role::Worker { group: 0, rank: 1 }, 1)]
    );
    let recreated = builder::pod(&valid(&job), Role::Worker { group: 0, rank: 0 }, 1);
    let env = &recreated.spec.unwrap().containers[0].env.clone().unwrap();
    assert!(env.iter().any(|e| e.name == "TANDEM_ATTEMPT" && e.value.as_deref() == Some("1")));
    apply(&mut job, &mut pods, &back);
    // Once the group runs again the job is Running, the Restarting condition False.
    let pods = all_running(&job)
        .into_iter()
        .map(|p| {
            let role = names::role_of(p.labels()).unwrap();
            let attempt = if matches!(role, Role::Worker { group: 0, .. }) { 1 } else { 0 };
            pod(&job, role, attempt, "Running", true)
        })
        .collect::<Vec<_>>();
    let healed = run(&job, &pods, at(30));
    assert_eq!(healed.status.phase, Some(JobPhase::Running));
    assert_eq!(condition(&healed, "Restarting").status, "False");
    assert_eq!(healed.status.restarts, 1);
}

/// `pod` ended with `code` after `tandem` wrote `message` to its termination log.
fn said(pod: Pod, code: i32, message: &str) -> Pod {
    let mut pod = exited(pod, code);
    let statuses = pod.status.as_mut().unwrap().container_statuses.as_mut().unwrap();
    statuses[0].state.as_mut().unwrap().terminated.as_mut().unwrap().message = Some(format!("{message}\n"));
    pod
}

#[test]
fn the_termination_message_of_a_failed_pod_is_in_the_event_and_the_condition() {
    let unreachable = "peers unreachable after 120 s: worker 0/0 at mnist-hybrid-g0-0.mnist-hybrid.ns.svc:2222 \
                       (DNS: failed to lookup address information)";
    let mut job = fixture("hybrid.yaml");
    job.status = Some(run(&job, &all_running(&job), t0()).status);
    let mut pods = all_running(&job);
    pods[3] = said(pods[3].clone(), 200, unreachable); // mnist-hybrid-g0-1, retryable
    let plan = run(&job, &pods, at(10));
    let restarting = condition(&plan, "Restarting");
    let expected =
        format!("pod mnist-hybrid-g0-1 exited with code 200 (its termination message: {unreachable})");
    assert!(restarting.message.contains(&expected), "{}", restarting.message);
    assert!(plan.events.iter().any(|e| e.warning && e.message.contains(&expected)), "{:?}", plan.events);

    // A permanent failure: the job's Failed condition says what the process said.
    let mut pods = all_running(&job);
    pods[4] = said(pods[4].clone(), 1, "invalid job.json: spec.model.kind: unknown variant `mlpx`");
    let plan = run(&job, &pods, at(10));
    let failed = condition(&plan, "Failed");
    assert!(
        failed
            .message
            .contains("exited with code 1 (its termination message: invalid job.json: spec.model.kind"),
        "{}",
        failed.message
    );
    // A long message is cut, so the Event stays within the API server's 1 KiB note.
    let mut pods = all_running(&job);
    pods[3] = said(pods[3].clone(), 200, &"x".repeat(5000));
    let plan = run(&job, &pods, at(10));
    let event = plan.events.iter().find(|e| e.warning).unwrap();
    assert!(event.message.contains(&format!("{}…)", "x".repeat(policy::MESSAGE_CHARS))), "{}", event.message);
    assert!(event.message.len() < 1024, "{} bytes", event.message.len());
}

#[test]
fn the_same_failed_pod_is_acted_on_once() {
    let mut job = fixture("hybrid.yaml");
    let mut pods = all_running(&job);
    pods[2] = exited(pods[2].clone(), 143);
    let plan = run(&job, &pods, t0());
    // The controller writes the status, but the failed pod is still listed (deletion not seen yet).
    job.status = Some(plan.status.clone());
    let again = run(&job, &pods, at(1));
    assert_eq!(again.status.restarts, 1, "no second restart for the same failure");
    assert!(again.delete.contains(&"mnist-hybrid-g0-0".to_owned()), "the stale pod is still deleted");
}

#[test]
fn a_permanent_exit_code_fails_the_job_naming_pod_and_code() {
    let job = fixture("hybrid.yaml");
    let mut pods = all_running(&job);
    pods[4] = exited(pods[4].clone(), 1); // mnist-hybrid-g1-0
    let plan = run(&job, &pods, t0());
    assert_eq!(plan.status.phase, Some(JobPhase::Failed));
    assert_eq!(plan.status.completion_time, Some(Time(t0())));
    let failed = condition(&plan, "Failed");
    assert_eq!(failed.reason, "WorkerFailed");
    assert!(failed.message.contains("pod mnist-hybrid-g1-0 exited with code 1"), "{}", failed.message);
    assert!(failed.message.contains("permanent"), "{}", failed.message);
    // cleanPodPolicy Running: running pods go, the failed one stays for its logs.
    assert!(!plan.delete.contains(&"mnist-hybrid-g1-0".to_owned()));
    assert_eq!(plan.delete.len(), 5);
    assert!(plan.create.is_empty());
    assert!(!plan.ensure_children);
}

#[test]
fn a_killed_rank_outweighs_its_peers_exit_seen_in_the_same_look() {
    // Rank 1 was killed (137); rank 0 lost its peer and exited 1, and both failures are seen at once.
    // The group restarts, as the local runner decides: the peer's exit is collateral. It did not
    // matter which pod's name sorts first.
    let mut job = fixture("hybrid.yaml");
    job.status = Some(run(&job, &all_running(&job), t0()).status);
    let mut pods = all_running(&job);
    pods[2] = exited(pods[2].clone(), 1); // mnist-hybrid-g0-0
    pods[3] = exited(pods[3].clone(), 137); // mnist-hybrid-g0-1
    let plan = run(&job, &pods, at(10));
    assert_eq!(plan.status.phase, Some(JobPhase::Restarting));
    assert_eq!(plan.status.restarts, 1, "one restart for the group, not one per pod");
    let c = condition(&plan, "Restarting");
    assert!(c.message.contains("pod mnist-hybrid-g0-1 exited with code 137"), "{}", c.message);
    assert_eq!(plan.restarted, vec![Role::Worker { group: 0, rank: 1 }]);
}

#[test]
fn exit_code_policy_retries_listed_codes_and_never_retries_nothing() {
    let mut job = fixture("hybrid.yaml");
    job.spec.run_policy.restart_policy = RestartPolicy::ExitCode;
    job.spec.run_policy.retryable_exit_codes = vec![42];
    let mut pods = all_running(&job);
    pods[0] = exited(pods[0].clone(), 42); // mnist-hybrid-ps-0
    let plan = run(&job, &pods, t0());
    assert_eq!(plan.status.phase, Some(JobPhase::Restarting));
    assert_eq!(plan.delete, vec!["mnist-hybrid-ps-0".to_owned()], "a failed PS restarts alone");
    assert!(condition(&plan, "Restarting").message.contains("parameter server 0"));

    job.spec.run_policy.restart_policy = RestartPolicy::Never;
    let mut pods = all_running(&job);
    pods[2] = exited(pods[2].clone(), 137);
    let plan = run(&job, &pods, t0());
    assert_eq!(plan.status.phase, Some(JobPhase::Failed));
    assert!(condition(&plan, "Failed").message.contains("restartPolicy is Never"));
}

#[test]
fn evictions_restart_and_max_restarts_ends_the_job() {
    let mut job = fixture("hybrid.yaml");
    let mut status = run(&job, &all_running(&job), t0()).status;
    status.restarts = 3; // maxRestarts in the fixture
    job.status = Some(status);
    let mut pods = all_running(&job);
    let evicted = pods[5].status.as_mut().unwrap();
    evicted.phase = Some("Failed".to_owned());
    evicted.reason = Some("Evicted".to_owned());
    let plan = run(&job, &pods, t0());
    assert_eq!(plan.status.phase, Some(JobPhase::Failed));
    let failed = condition(&plan, "Failed");
    assert_eq!(failed.reason, "MaxRestartsExceeded");
    assert!(failed.message.contains("mnist-hybrid-g1-1 was evicted"), "{}", failed.message);
}

#[test]
fn scaling_adds_and_removes_exactly_one_groups_pods() {
    let mut job = fixture("hybrid.yaml");
    job.status = Some(run(&job, &all_running(&job), t0()).status);
    let pods = all_running(&job);
    job.spec.workers.groups = 3;
    let up = run(&job, &pods, at(1));
    assert_eq!(
        up.create,
        vec![(Role::Worker { group: 2, rank: 0 }, 0), (Role::Worker { group: 2, rank: 1 }, 0)]
    );
    assert!(up.delete.is_empty());
    assert_eq!(up.status.phase, Some(JobPhase::Scaling));
    assert_eq!(condition(&up, "Scaling").status, "True");

    job.spec.workers.groups = 1;
    let down = run(&job, &pods, at(2));
    let mut deleted = down.delete.clone();
    deleted.sort();
    assert_eq!(deleted, ["mnist-hybrid-g1-0", "mnist-hybrid-g1-1"]);
    assert!(down.create.is_empty());
    assert_eq!(down.status.phase, Some(JobPhase::Scaling));
    assert_eq!(down.status.groups, 1);
}

#[test]
fn suspend_deletes_pods_and_resume_recreates_them() {
    let mut job = fixture("hybrid.yaml");
    job.status = Some(run(&job, &all_running(&job), t0()).status);
    let mut pods = all_running(&job);
    job.spec.run_policy.suspend = true;
    let plan = run(&job, &pods, at(1));
    assert_eq!(plan.delete.len(), 6);
    assert_eq!(plan.status.phase, Some(JobPhase::Suspended));
    assert_eq!(plan.status.start_time, None);
    assert_eq!(condition(&plan, "Suspended").status, "True");
    assert!(!plan.want_pod_group);
    apply(&mut job, &mut pods, &plan);
    job.spec.run_policy.suspend = false;
    let resumed = run(&job, &pods, at(2));
    assert_eq!(resumed.create.len(), 6);
    assert_eq!(condition(&resumed, "Suspended").reason, "Resumed");
    assert_eq!(condition(&resumed, "Suspended").status, "False");
}

fn run_queued(job: &TrainingJob, pods: &[Pod], now: Timestamp, queue: &Admission) -> Plan {
    let observed = Observed {
        pods: &cached(pods),
        lost_nodes: &BTreeSet::new(),
        now,
        progress: None,
        queue: Some(queue),
    };
    decide(&valid(job), &observed, &Settings::default())
}

#[test]
fn a_job_waiting_for_kueue_has_no_pod_and_says_why_then_runs_once_admitted() {
    let mut job = fixture("hybrid.yaml");
    job.spec.run_policy.scheduling.gang = true;
    let waiting = Admission::Waiting {
        reason: "Pending".to_owned(),
        message: "couldn't assign flavors to pod set worker: insufficient quota for cpu".to_owned(),
    };
    let plan = run_queued(&job, &[], t0(), &waiting);
    assert!(plan.create.is_empty(), "a queued job creates pods: {:?}", plan.create);
    assert!(!plan.want_pod_group, "a queued job's PodGroup would reserve nothing");
    assert_eq!(plan.status.phase, Some(JobPhase::Suspended));
    let held = condition(&plan, "Suspended");
    assert_eq!((held.status.as_str(), held.reason.as_str()), ("True", "QueuedByKueue"));
    assert!(held.message.contains("insufficient quota for cpu"), "{}", held.message);
    job.status = Some(plan.status);
    let admitted = Admission::Admitted { cluster_queue: "cq".to_owned(), placement: Placement::default() };
    let plan = run_queued(&job, &[], at(5), &admitted);
    assert_eq!(plan.create.len(), 6);
    assert!(plan.want_pod_group);
    let resumed = condition(&plan, "Suspended");
    assert_eq!((resumed.status.as_str(), resumed.reason.as_str()), ("False", "Admitted"));
    assert!(resumed.message.contains("ClusterQueue cq"), "{}", resumed.message);
}

#[test]
fn a_job_evicted_by_kueue_stops_its_pods_and_keeps_its_status() {
    let mut job = fixture("hybrid.yaml");
    let pods = all_running(&job);
    job.status = Some(run(&job, &pods, t0()).status);
    let evicted = Admission::Evicted {
        reason: "Preempted".to_owned(),
        message: "Preempted to accommodate a workload due to prioritization in the ClusterQueue".to_owned(),
    };
    let plan = run_queued(&job, &pods, at(1), &evicted);
    assert_eq!(plan.delete.len(), 6, "every pod gets SIGTERM");
    assert!(plan.create.is_empty());
    assert_eq!(plan.status.phase, Some(JobPhase::Suspended));
    let held = condition(&plan, "Suspended");
    assert_eq!(held.reason, "EvictedByKueue");
    assert!(held.message.contains("Preempted to accommodate"), "{}", held.message);
    assert_eq!(plan.events.len(), 1, "the eviction is an Event: {:?}", plan.events);
}

#[test]
fn finished_workers_succeed_the_job_and_ttl_deletes_it_later() {
    let mut job = fixture("hybrid.yaml");
    job.spec.run_policy.ttl_seconds_after_finished = Some(60);
    job.status = Some(run(&job, &all_running(&job), t0()).status);
    let mut pods: Vec<Pod> = all_running(&job)
        .into_iter()
        .map(|p| if p.name_any().contains("-g") { exited(p, 0) } else { p })
        .collect();
    let plan = run(&job, &pods, at(100));
    assert_eq!(plan.status.phase, Some(JobPhase::Succeeded));
    assert_eq!(condition(&plan, "Succeeded").reason, "TrainingSucceeded");
    assert_eq!(plan.delete, vec!["mnist-hybrid-ps-0".to_owned(), "mnist-hybrid-ps-1".to_owned()]);
    assert!(!plan.delete_job);
    assert!(plan.requeue_after <= Duration::from_secs(60));
    apply(&mut job, &mut pods, &plan);
    assert!(!run(&job, &pods, at(150)).delete_job);
    assert!(run(&job, &pods, at(161)).delete_job);
}

#[test]
fn clean_pod_policy_all_and_none() {
    let mut job = fixture("hybrid.yaml");
    let mut pods = all_running(&job);
    pods[2] = exited(pods[2].clone(), 2);
    job.spec.run_policy.clean_pod_policy = CleanPodPolicy::All;
    assert_eq!(run(&job, &pods, t0()).delete.len(), 6);
    job.spec.run_policy.clean_pod_policy = CleanPodPolicy::None;
    assert!(run(&job, &pods, t0()).delete.is_empty());
}

#[test]
fn active_deadline_fails_a_running_job() {
    let mut job = fixture("hybrid.yaml");
    job.status = Some(run(&job, &all_running(&job), t0()).status);
    job.spec.run_policy.active_deadline_seconds = Some(100);
    let pods = all_running(&job);
    let before = run(&job, &pods, at(50));
    assert_eq!(before.status.phase, Some(JobPhase::Running));
    assert!(before.requeue_after <= Duration::from_secs(50));
    let after = run(&job, &pods, at(101));
    assert_eq!(after.status.phase, Some(JobPhase::Failed));
    assert_eq!(condition(&after, "Failed").reason, "DeadlineExceeded");
    // A job that never ran counts from its creation (ten minutes before t0 in the fixture).
    job.status = None;
    let never = run(&job, &[], t0());
    assert_eq!(never.status.phase, Some(JobPhase::Failed));
}

#[test]
fn mpi_launcher_waits_for_ready_workers_and_decides_the_group() {
    let job = fixture("mpi.yaml");
    let mut pods: Vec<Pod> =
        all_running(&job).into_iter().filter(|p| !p.name_any().ends_with("launcher")).collect();
    // Group 1's last worker is running but not ready yet (sshd not listening).
    let last = pods.iter_mut().find(|p| p.name_any() == "bert-g1-2").unwrap();
    *last = pod(&job, Role::Worker { group: 1, rank: 2 }, 0, "Running", false);
    let plan = run(&job, &pods, t0());
    assert_eq!(plan.create, vec![(Role::Launcher { group: 0 }, 0)], "only group 0's launcher");
    assert!(plan.want_pod_group);
    // A launcher that succeeded finishes its group; sshd workers never exit.
    let mut pods = all_running(&job);
    for p in pods.iter_mut().filter(|p| p.name_any().ends_with("launcher")) {
        *p = exited(p.clone(), 0);
    }
    assert_eq!(run(&job, &pods, t0()).status.phase, Some(JobPhase::Succeeded));
    // A launcher killed by a signal restarts its group, launcher included.
    let mut pods = all_running(&job);
    let idx = pods.iter().position(|p| p.name_any() == "bert-g1-launcher").unwrap();
    pods[idx] = exited(pods[idx].clone(), 255);
    let plan = run(&job, &pods, t0());
    let mut deleted = plan.delete.clone();
    deleted.sort();
    assert_eq!(deleted, ["bert-g1-0", "bert-g1-1", "bert-g1-2", "bert-g1-launcher"]);
    assert_eq!(condition(&plan, "Restarting").reason, "LauncherFailed");
}

#[test]
fn pods_stuck_terminating_on_a_lost_node_are_force_deleted_after_the_grace() {
    let mut job = fixture("hybrid.yaml");
    job.status = Some(run(&job, &all_running(&job), t0()).status);
    let mut pods = all_running(&job);
    pods[2].spec.as_mut().unwrap().node_name = Some("node-a".to_owned());
    pods[2].metadata.deletion_timestamp = Some(Time(at(30)));
    let lost = BTreeSet::from(["node-a".to_owned()]);
    let settings = Settings { force_delete_after: Duration::from_secs(60), ..Settings::default() };
    let early = decide(
        &valid(&job),
        &Observed { pods: &cached(&pods), lost_nodes: &lost, now: at(60), progress: None, queue: None },
        &settings,
    );
    assert!(early.force_delete.is_empty());
    // The deleted pod is a disruption: its group restarts (the other rank goes now).
    assert_eq!(early.status.phase, Some(JobPhase::Restarting));
    assert!(condition(&early, "Restarting").message.contains("was deleted"));
    assert_eq!(early.delete, vec!["mnist-hybrid-g0-1".to_owned()]);
    job.status = Some(early.status.clone());
    let late = decide(
        &valid(&job),
        &Observed { pods: &cached(&pods), lost_nodes: &lost, now: at(91), progress: None, queue: None },
        &settings,
    );
    assert_eq!(late.force_delete, vec!["mnist-hybrid-g0-0".to_owned()]);
    assert_eq!(late.status.restarts, 1);
    // A node that is fine gets no force deletion.
    let fine = decide(
        &valid(&job),
        &Observed {
            pods: &cached(&pods),
            lost_nodes: &BTreeSet::new(),
            now: at(500),
            progress: None,
            queue: None,
        },
        &settings,
    );
    assert!(fine.force_delete.is_empty());
}

/// `pod`, still running, after the kubelet restarted its `tandem` container `count` times, the
/// last run having exited with `code`.
fn restarted_in_place(mut pod: Pod, count: i32, code: i32) -> Pod {
    let status = pod.status.get_or_insert_with(PodStatus::default);
    status.container_statuses = Some(vec![ContainerStatus {
        name: names::CONTAINER.to_owned(),
        restart_count: count,
        state: Some(ContainerState { running: Some(Default::default()), ..ContainerState::default() }),
        last_state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        }),
        ..ContainerStatus::default()
    }]);
    pod
}

fn ps0_index(pods: &[Pod]) -> usize {
    pods.iter().position(|p| p.name_any() == "mnist-hybrid-ps-0").unwrap()
}

#[test]
fn a_ps_restarted_in_place_keeps_its_pod_and_is_counted_once() {
    let mut job = fixture("hybrid.yaml");
    let mut pods = all_running(&job);
    let i = ps0_index(&pods);
    pods[i] = restarted_in_place(pods[i].clone(), 1, 137);
    let plan = run(&job, &pods, t0());
    assert!(plan.delete.is_empty() && plan.create.is_empty(), "the PS pod stays: {plan:?}");
    assert_eq!(plan.status.restarts, 1);
    assert_eq!(plan.status.phase, Some(JobPhase::Restarting));
    let record = plan.status.attempts.iter().find(|a| a.unit == "ps-0").unwrap();
    assert_eq!((record.attempt, record.container_restarts), (0, Some(1)));
    // The event is the run policy's verdict on the container's last exit, counted in place.
    let cause = Failure {
        who: "pod mnist-hybrid-ps-0".to_owned(),
        role: Role::Ps { index: 0 },
        kind: FailureKind::Exit(137),
        message: None,
    };
    let Verdict::Restart { message, .. } = policy::judge_in_place(&job.spec, &cause, 0, 1, 0) else {
        panic!("137 is retryable")
    };
    let event = plan.events.iter().find(|e| e.warning).unwrap();
    assert_eq!(event.message, message);
    assert_eq!(condition(&plan, "Restarting").message, message);
    assert_eq!(plan.restarted, vec![Role::Ps { index: 0 }]);
    // The next reconcile sees the same restart count: nothing more is counted.
    apply(&mut job, &mut pods, &plan);
    let again = run(&job, &pods, at(5));
    assert_eq!(again.status.restarts, 1);
    assert!(again.restarted.is_empty() && again.events.iter().all(|e| !e.warning), "{:?}", again.events);
    // A second crash of the same container counts once more.
    pods[i] = restarted_in_place(pods[i].clone(), 2, 137);
    let third = run(&job, &pods, at(10));
    assert_eq!(third.status.restarts, 2);
}

/// Issue 42, item 4: the groups that lose a crashed PS exit with the peer-lost code; whether the
/// operator sees them before or after the kubelet restarted the PS, the job counts one restart
/// (the PS's), as `tandem train` does, and each group comes back as a new attempt.
#[test]
fn a_ps_crash_and_the_groups_that_lost_it_cost_one_restart() {
    let peer_lost = tandem_api::contract::EXIT_PEER_LOST;
    for kubelet_first in [false, true] {
        let mut job = fixture("hybrid.yaml");
        let mut pods = all_running(&job);
        job.status = Some(run(&job, &pods, t0()).status);
        let i = ps0_index(&pods);
        if kubelet_first {
            pods[i] = restarted_in_place(pods[i].clone(), 1, 137);
        } else {
            // The container ended and is not yet restarted: the kubelet shows its exit as current.
            let mut down = exited(pods[i].clone(), 137);
            down.status.as_mut().unwrap().phase = Some("Running".to_owned());
            pods[i] = down;
        }
        for name in ["mnist-hybrid-g0-1", "mnist-hybrid-g1-0"] {
            let w = pods.iter().position(|p| p.name_any() == name).unwrap();
            pods[w] = exited(pods[w].clone(), peer_lost);
        }
        let plan = run(&job, &pods, at(10));
        let attempts: Vec<(String, u32)> =
            plan.status.attempts.iter().map(|a| (a.unit.clone(), a.attempt)).collect();
        assert!(attempts.contains(&("group-0".to_owned(), 1)), "{attempts:?}");
        assert!(attempts.contains(&("group-1".to_owned(), 1)), "{attempts:?}");
        let relaunched =
            plan.events.iter().filter(|e| e.message.contains("relaunched because parameter server 0"));
        assert_eq!(relaunched.count(), 2, "{:?}", plan.events);
        apply(&mut job, &mut pods, &plan);
        if !kubelet_first {
            pods[i] = restarted_in_place(pods[i].clone(), 1, 137);
        }
        let later = run(&job, &pods, at(20));
        assert_eq!(later.status.restarts, 1, "kubelet first: {kubelet_first}; {:?}", later.events);
    }
    // Without a PS restart, a group's peer-lost exit is a failure of its own, and counts.
    let mut job = fixture("hybrid.yaml");
    let mut pods = all_running(&job);
    job.status = Some(run(&job, &pods, t0()).status);
    let w = pods.iter().position(|p| p.name_any() == "mnist-hybrid-g0-1").unwrap();
    pods[w] = exited(pods[w].clone(), peer_lost);
    assert_eq!(run(&job, &pods, at(10)).status.restarts, 1);
}

#[test]
fn a_ps_restarted_in_place_after_a_permanent_exit_fails_the_job() {
    let job = fixture("hybrid.yaml");
    let mut pods = all_running(&job);
    let i = ps0_index(&pods);
    pods[i] = restarted_in_place(pods[i].clone(), 1, 1);
    let plan = run(&job, &pods, t0());
    assert_eq!(plan.status.phase, Some(JobPhase::Failed));
    let failed = condition(&plan, "Failed");
    assert_eq!(failed.reason, "ParameterServerFailed");
    assert!(failed.message.contains("code 1") && failed.message.contains("permanent"), "{}", failed.message);
}

#[test]
fn in_place_restarts_count_towards_max_restarts() {
    let job = fixture("hybrid.yaml");
    let mut pods = all_running(&job);
    let i = ps0_index(&pods);
    let over = i32::try_from(job.spec.run_policy.max_restarts).unwrap() + 1;
    pods[i] = restarted_in_place(pods[i].clone(), over, 137);
    let plan = run(&job, &pods, t0());
    assert_eq!(plan.status.phase, Some(JobPhase::Failed));
    assert_eq!(condition(&plan, "Failed").reason, "MaxRestartsExceeded");
}

#[test]
fn a_lost_ps_pod_is_recreated_and_its_event_claims_no_resume() {
    let job = fixture("hybrid.yaml");
    let mut pods = all_running(&job);
    let i = ps0_index(&pods);
    let status = pods[i].status.as_mut().unwrap();
    status.phase = Some("Failed".to_owned());
    status.reason = Some("Evicted".to_owned());
    let plan = run(&job, &pods, t0());
    assert!(plan.delete.contains(&"mnist-hybrid-ps-0".to_owned()), "{plan:?}");
    // A new pod: the policy's NewPod verdict, which says it starts from its initial weights.
    let cause = Failure {
        who: "pod mnist-hybrid-ps-0".to_owned(),
        role: Role::Ps { index: 0 },
        kind: FailureKind::Evicted,
        message: None,
    };
    let Verdict::Restart { message, .. } =
        policy::judge(&job.spec, Relaunch::NewPod, Unit::Ps(0), &cause, 0, 0)
    else {
        panic!("an eviction is retryable")
    };
    let event = plan.events.iter().find(|e| e.warning).unwrap();
    assert_eq!(event.message, message);
    assert!(event.message.contains("initial weights") && !event.message.contains("resumes"), "{event:?}");
    // With a claim, the checkpoints survive the pod: the event says it resumes from them.
    let mut claimed = job.clone();
    claimed.spec.training.checkpoint.claim_name = Some("ckpt".to_owned());
    let plan = run(&claimed, &pods, t0());
    let event = plan.events.iter().find(|e| e.warning).unwrap();
    assert!(event.message.contains("claim ckpt"), "{event:?}");
}

fn step(n: u64) -> tandem_api::Progress {
    tandem_api::Progress { step: n, ..tandem_api::Progress::default() }
}

fn look(job: &TrainingJob, pods: &[Pod], now: Timestamp, progress: Option<&tandem_api::Progress>) -> Plan {
    let pods = cached(pods);
    decide(
        &valid(job),
        &Observed { pods: &pods, lost_nodes: &BTreeSet::new(), now, progress, queue: None },
        &Settings::default(),
    )
}

/// The hybrid fixture with a stall timeout and policy, Running with every pod since `at(5)`.
fn running_with_stall(policy: tandem_api::StallPolicy) -> (TrainingJob, Vec<Pod>) {
    let mut job = fixture("hybrid.yaml");
    job.spec.run_policy.stall_timeout_seconds = Some(60);
    job.spec.run_policy.stall_policy = policy;
    let mut pods = Vec::new();
    let plan = run(&job, &pods, t0());
    apply(&mut job, &mut pods, &plan);
    let pods = all_running(&job);
    let plan = look(&job, &pods, at(5), None);
    job.status = Some(plan.status);
    (job, pods)
}

#[test]
fn a_step_that_stays_put_past_the_timeout_is_declared_stalled_once_and_clears_when_it_advances() {
    let (mut job, pods) = running_with_stall(tandem_api::StallPolicy::None);
    let plan = look(&job, &pods, at(10), Some(&step(40)));
    assert_eq!(plan.status.step_time, Some(Time(at(10))));
    assert!(plan.requeue_after <= Duration::from_secs(60), "looks again at the stall deadline");
    job.status = Some(plan.status);
    // Same step, not yet 60 s after it was first seen: no stall.
    let plan = look(&job, &pods, at(69), Some(&step(40)));
    assert!(plan.status.conditions.iter().all(|c| c.type_ != "Stalled"));
    assert!(!plan.stalled);
    job.status = Some(plan.status);
    let plan = look(&job, &pods, at(71), Some(&step(40)));
    let stalled = condition(&plan, "Stalled");
    assert_eq!((stalled.status.as_str(), stalled.reason.as_str()), ("True", "ProgressStalled"));
    assert!(stalled.message.contains("stayed at 40 since 2026-01-01T00:10:10Z"), "{}", stalled.message);
    assert!(plan.stalled);
    assert!(plan.events.iter().any(|e| e.warning && e.reason == "ProgressStalled"));
    assert!(plan.delete.is_empty() && plan.restarted.is_empty(), "stallPolicy None only reports");
    assert_eq!(plan.status.phase, Some(JobPhase::Running));
    job.status = Some(plan.status);
    // Declared once: the next look says nothing new.
    let plan = look(&job, &pods, at(90), Some(&step(40)));
    assert!(!plan.stalled && plan.events.is_empty());
    job.status = Some(plan.status);
    let plan = look(&job, &pods, at(95), Some(&step(41)));
    let stalled = condition(&plan, "Stalled");
    assert_eq!((stalled.status.as_str(), stalled.reason.as_str()), ("False", "Progressing"));
    assert_eq!(plan.status.step_time, Some(Time(at(95))));
}

#[test]
fn each_step_read_from_the_trainer_becomes_a_point_of_the_status_history() {
    let (mut job, pods) = running_with_stall(tandem_api::StallPolicy::None);
    let read = |n: u64, loss: f64| tandem_api::Progress { step: n, loss: Some(loss), ..step(n) };
    for (t, (n, loss)) in [(10, (10, 2.0)), (20, (20, 1.0)), (30, (20, 1.0)), (40, (30, 0.5))] {
        let plan = look(&job, &pods, at(t), Some(&read(n, loss)));
        job.status = Some(plan.status);
    }
    // A look without a reading (the PS did not answer) keeps the curve as it was.
    let plan = look(&job, &pods, at(50), None);
    let points: Vec<_> = plan.status.history.iter().map(|p| (p.step, p.loss)).collect();
    assert_eq!(points, [(10, Some(2.0)), (20, Some(1.0)), (30, Some(0.5))]);
}

#[test]
fn a_stall_with_restart_group_restarts_every_group_once_and_keeps_the_ps() {
    let (mut job, pods) = running_with_stall(tandem_api::StallPolicy::RestartGroup);
    let plan = look(&job, &pods, at(10), Some(&step(7)));
    job.status = Some(plan.status);
    let plan = look(&job, &pods, at(80), None);
    assert!(plan.stalled);
    assert_eq!(plan.status.phase, Some(JobPhase::Restarting));
    assert_eq!(plan.status.restarts, 1, "one stall is one restart of the job");
    let mut deleted = plan.delete.clone();
    deleted.sort();
    assert_eq!(
        deleted,
        names_of(&[
            (Role::Worker { group: 0, rank: 0 }, 0),
            (Role::Worker { group: 0, rank: 1 }, 0),
            (Role::Worker { group: 1, rank: 0 }, 0),
            (Role::Worker { group: 1, rank: 1 }, 0),
        ])
    );
    let units: Vec<_> = plan.status.attempts.iter().map(|a| (a.unit.as_str(), a.attempt)).collect();
    assert_eq!(units, [("group-0", 1), ("group-1", 1)]);
    assert!(condition(&plan, "Restarting").message.contains("stallPolicy RestartGroup"));
    // Once it runs again, a step that still does not move is a new stall, restarted again.
    let mut job2 = job.clone();
    job2.status = Some(plan.status.clone());
    let mut running_again: Vec<Pod> =
        (0..2).map(|index| pod(&job2, Role::Ps { index }, 0, "Running", true)).collect();
    for group in 0..2 {
        for rank in 0..2 {
            running_again.push(pod(&job2, Role::Worker { group, rank }, 1, "Running", true));
        }
    }
    let plan = look(&job2, &running_again, at(200), None);
    assert_eq!(plan.status.phase, Some(JobPhase::Running), "{:?}", plan.status.conditions);
    assert!(!plan.stalled, "the clock restarts when the job runs again");
    job2.status = Some(plan.status);
    let plan = look(&job2, &running_again, at(261), None);
    assert!(plan.stalled && plan.status.restarts == 2);
}

#[test]
fn a_stall_with_restart_job_restarts_every_unit_and_max_restarts_ends_the_job() {
    let (mut job, pods) = running_with_stall(tandem_api::StallPolicy::RestartJob);
    let plan = look(&job, &pods, at(80), None);
    assert!(condition(&plan, "Stalled").message.contains("no step was reported"));
    assert_eq!(plan.delete.len(), pods.len(), "every pod goes");
    assert_eq!(plan.status.attempts.len(), 4, "ps-0, ps-1, group-0, group-1");
    job.spec.run_policy.max_restarts = 0;
    let plan = look(&job, &pods, at(80), None);
    assert_eq!(plan.status.phase, Some(JobPhase::Failed));
    assert_eq!(condition(&plan, "Failed").reason, "MaxRestartsExceeded");
}

#[test]
fn pending_pods_give_scheduled_false_with_the_schedulers_or_kubelets_reason() {
    let mut job = fixture("hybrid.yaml");
    let mut pods = Vec::new();
    let plan = run(&job, &pods, t0());
    apply(&mut job, &mut pods, &plan);
    let message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.";
    pods[0].status.as_mut().unwrap().conditions = Some(vec![PodCondition {
        type_: "PodScheduled".to_owned(),
        status: "False".to_owned(),
        reason: Some("Unschedulable".to_owned()),
        message: Some(message.to_owned()),
        ..PodCondition::default()
    }]);
    let plan = run(&job, &pods, at(5));
    let scheduled = condition(&plan, "Scheduled");
    assert_eq!((scheduled.status.as_str(), scheduled.reason.as_str()), ("False", "Unschedulable"));
    assert!(scheduled.message.contains(message) && scheduled.message.contains(&pods[0].name_any()));
    assert_ne!(plan.status.phase, Some(JobPhase::Running));
    assert!(plan.status.conditions.iter().all(|c| c.type_ != "Running" || c.status == "False"));
    // Bound, but its image cannot be pulled.
    let status = pods[0].status.as_mut().unwrap();
    status.conditions = None;
    status.container_statuses = Some(vec![ContainerStatus {
        name: names::CONTAINER.to_owned(),
        state: Some(ContainerState {
            waiting: Some(k8s_openapi::api::core::v1::ContainerStateWaiting {
                reason: Some("ImagePullBackOff".to_owned()),
                message: Some("Back-off pulling image \"tandem:nope\"".to_owned()),
            }),
            ..ContainerState::default()
        }),
        ..ContainerStatus::default()
    }]);
    job.status = Some(plan.status);
    let plan = run(&job, &pods, at(9));
    let scheduled = condition(&plan, "Scheduled");
    assert_eq!((scheduled.status.as_str(), scheduled.reason.as_str()), ("False", "ImagePullBackOff"));
    assert!(scheduled.message.contains("tandem:nope"), "{}", scheduled.message);
    job.status = Some(plan.status);
    let plan = run(&job, &all_running(&job), at(20));
    assert_eq!(condition(&plan, "Scheduled").status, "True");
    assert_eq!(plan.status.phase, Some(JobPhase::Running));
}

/// A group that runs the user's command is one torch.distributed world per attempt: it returns
/// only once every pod of its previous attempt has gone, so that a new rank never joins the
/// rendezvous of a rank 0 that is still stopping.
#[test]
fn a_user_commands_group_returns_only_once_its_previous_pods_are_gone() {
    let mut job = fixture("user-command.yaml");
    job.status = Some(run(&job, &all_running(&job), t0()).status);
    let mut pods = all_running(&job);
    let (rank0, rank1) = (Role::Worker { group: 1, rank: 0 }, Role::Worker { group: 1, rank: 1 });
    let i = pods.iter().position(|p| names::role_of(p.labels()) == Some(rank1)).unwrap();
    pods[i] = exited(pods[i].clone(), 143);
    let plan = run(&job, &pods, at(10));
    assert_eq!(plan.status.restarts, 1);
    apply(&mut job, &mut pods, &plan);
    // Rank 1 has gone; rank 0 is still stopping (its checkpoint), past the back-off.
    let mut stopping = pod(&job, rank0, 0, "Running", false);
    stopping.metadata.deletion_timestamp = Some(Time(at(10)));
    pods.push(stopping);
    let waiting = run(&job, &pods, at(120));
    assert!(waiting.create.is_empty(), "group 1 came back beside its stopping rank 0: {:?}", waiting.create);
    pods.pop();
    let back = run(&job, &pods, at(121));
    assert_eq!(back.create, vec![(rank0, 1), (rank1, 1)]);
}
