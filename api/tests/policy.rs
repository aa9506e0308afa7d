//! The run policy that both the operator and the local runner apply: which failures restart which
//! unit, the messages users read, back-off, and which roles and units a spec has.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests fail loudly by design

use std::time::Duration;

use tandem_api::policy::{self, Failure, FailureKind, MAX_RESTARTS_EXCEEDED, Unit, Verdict, backoff, judge};
use tandem_api::{Backend, Endpoint, JobConfig, RestartPolicy, Role, RunPolicy, TrainingJobSpec};

fn spec(yaml: &str) -> TrainingJobSpec {
    serde_yaml::from_str(yaml).unwrap()
}

/// Two PS and two groups of two ranks, hybrid, with the given run policy.
fn hybrid(restart_policy: RestartPolicy, max_restarts: u32, retryable: &[i32]) -> TrainingJobSpec {
    let mut spec = spec(
        "model: {kind: mlp, hidden: [8]}\ndata: {source: mnist5k}\ntraining: {algorithm: hybrid, steps: 10}\n\
         parameterServers: {replicas: 2}\nworkers: {groups: 2, groupSize: 2}\n",
    );
    spec.run_policy = RunPolicy {
        restart_policy,
        max_restarts,
        retryable_exit_codes: retryable.to_vec(),
        backoff_seconds: 2,
        ..RunPolicy::default()
    };
    spec
}

fn worker(group: u32, rank: u32, kind: FailureKind) -> Failure {
    Failure { who: format!("worker {group}/{rank}"), role: Role::Worker { group, rank }, kind }
}

#[test]
fn signals_and_exit_codes_from_128_are_retryable_lower_codes_are_not() {
    let on_failure = hybrid(RestartPolicy::OnFailure, 5, &[]).run_policy;
    for kind in
        [FailureKind::Signal(9), FailureKind::Exit(137), FailureKind::Exit(128), FailureKind::Exit(200)]
    {
        assert!(kind.retryable(&on_failure), "{kind:?}");
    }
    for kind in [FailureKind::Exit(1), FailureKind::Exit(127), FailureKind::Exit(-1)] {
        assert!(!kind.retryable(&on_failure), "{kind:?}");
    }

    let exit_code = hybrid(RestartPolicy::ExitCode, 5, &[3]).run_policy;
    assert!(FailureKind::Exit(3).retryable(&exit_code));
    assert!(!FailureKind::Exit(4).retryable(&exit_code));
    assert!(FailureKind::Signal(15).retryable(&exit_code));
    assert!(FailureKind::Exit(143).retryable(&exit_code));

    let never = hybrid(RestartPolicy::Never, 5, &[3]).run_policy;
    for kind in [FailureKind::Signal(9), FailureKind::Exit(200), FailureKind::Exit(3), FailureKind::Evicted] {
        assert!(!kind.retryable(&never), "{kind:?}");
    }
}

#[test]
fn disruptions_of_a_pod_are_retryable_unless_the_policy_is_never() {
    let disruptions = [
        FailureKind::Evicted,
        FailureKind::NodeLost,
        FailureKind::Deleted,
        FailureKind::Other("no exit code".to_owned()),
    ];
    for restart_policy in [RestartPolicy::OnFailure, RestartPolicy::ExitCode] {
        let policy = hybrid(restart_policy, 5, &[]).run_policy;
        for kind in &disruptions {
            assert!(kind.retryable(&policy), "{restart_policy:?} {kind:?}");
        }
    }
}

#[test]
fn failures_read_as_who_and_what_happened() {
    let pod = |kind| Failure { who: "pod j-g0-1".to_owned(), role: Role::Worker { group: 0, rank: 1 }, kind };
    for (kind, text) in [
        (FailureKind::Exit(137), "pod j-g0-1 exited with code 137"),
        (FailureKind::Signal(9), "pod j-g0-1 was killed by signal 9"),
        (FailureKind::Evicted, "pod j-g0-1 was evicted"),
        (FailureKind::NodeLost, "pod j-g0-1 lost its node"),
        (FailureKind::Deleted, "pod j-g0-1 was deleted while the job ran"),
        (FailureKind::Other("OOMKilled".to_owned()), "pod j-g0-1 failed (OOMKilled)"),
    ] {
        assert_eq!(pod(kind).to_string(), text);
    }
    let reasons = [
        (Role::Ps { index: 0 }, "ParameterServerFailed"),
        (Role::Worker { group: 0, rank: 0 }, "WorkerFailed"),
        (Role::Launcher { group: 0 }, "LauncherFailed"),
    ];
    for (role, reason) in reasons {
        assert_eq!(Failure { who: String::new(), role, kind: FailureKind::Exit(1) }.reason(), reason);
    }
}

#[test]
fn a_killed_worker_restarts_its_group_only_with_the_next_attempt_and_back_off() {
    let spec = hybrid(RestartPolicy::OnFailure, 5, &[]);
    let failure = worker(1, 1, FailureKind::Signal(9));
    let Verdict::Restart { attempt, restarts, backoff, message } =
        judge(&spec, Unit::Group(1), &failure, 0, 0)
    else {
        panic!("a signal restarts");
    };
    assert_eq!((attempt, restarts, backoff), (1, 1, Duration::from_secs(2)));
    assert_eq!(
        message,
        "worker 1/1 was killed by signal 9 (retryable): restarting group 1 only (it resumes from the PS \
         weights), attempt 1, restart 1 of 5"
    );
    // The same group again: attempt 2, back-off doubled.
    let again = judge(&spec, Unit::Group(1), &worker(1, 0, FailureKind::Exit(139)), 1, 1);
    assert!(
        matches!(again, Verdict::Restart { attempt: 2, restarts: 2, backoff, .. } if backoff == Duration::from_secs(4))
    );
}

#[test]
fn the_restart_message_says_where_the_unit_resumes() {
    let spec = hybrid(RestartPolicy::OnFailure, 5, &[]);
    let ps =
        Failure { who: "pod j-ps-1".to_owned(), role: Role::Ps { index: 1 }, kind: FailureKind::Exit(137) };
    let Verdict::Restart { message, .. } = judge(&spec, Unit::Ps(1), &ps, 0, 0) else { panic!("restarts") };
    assert!(
        message.contains("restarting parameter server 1 (it resumes from its latest checkpoint)"),
        "{message}"
    );

    let mut allreduce = spec.clone();
    allreduce.training.algorithm = tandem_api::Algorithm::Allreduce;
    let failure = worker(0, 1, FailureKind::Signal(9));
    let Verdict::Restart { message, .. } = judge(&allreduce, Unit::Group(0), &failure, 0, 0) else {
        panic!("restarts")
    };
    assert!(message.contains("restarting group 0 only (it resumes from its latest checkpoint)"), "{message}");
}

#[test]
fn a_killed_rank_outweighs_its_peers_broken_connections() {
    // The peer noticed the dead rank first and exited with 1; the rank killed by SIGKILL is the cause.
    let policy = hybrid(RestartPolicy::OnFailure, 5, &[]).run_policy;
    let failures = [worker(0, 0, FailureKind::Exit(1)), worker(0, 1, FailureKind::Signal(9))];
    assert_eq!(policy::cause(&policy, &failures), Some(&failures[1]));
    // Without a retryable one the earliest decides.
    let failures = [worker(0, 0, FailureKind::Exit(2)), worker(0, 1, FailureKind::Exit(1))];
    assert_eq!(policy::cause(&policy, &failures), Some(&failures[0]));
    assert_eq!(policy::cause(&policy, &[]), None);
}

#[test]
fn a_permanent_exit_fails_the_job_naming_the_process_the_code_and_the_fix() {
    let spec = hybrid(RestartPolicy::OnFailure, 5, &[]);
    let Verdict::Fail { reason, message } =
        judge(&spec, Unit::Group(1), &worker(1, 0, FailureKind::Exit(2)), 0, 0)
    else {
        panic!("exit code 2 is permanent");
    };
    assert_eq!(reason, "WorkerFailed");
    assert_eq!(
        message,
        "worker 1/0 exited with code 2 (permanent: exit codes 1-127 are permanent failures; fix the cause, or \
         use restartPolicy ExitCode with retryableExitCodes)"
    );
}

#[test]
fn listed_exit_codes_restart_with_restart_policy_exit_code() {
    let spec = hybrid(RestartPolicy::ExitCode, 5, &[42]);
    let ps =
        |code| Failure { who: "ps 1".to_owned(), role: Role::Ps { index: 1 }, kind: FailureKind::Exit(code) };
    assert!(matches!(judge(&spec, Unit::Ps(1), &ps(42), 0, 0), Verdict::Restart { attempt: 1, .. }));
    let Verdict::Fail { reason, message } = judge(&spec, Unit::Ps(1), &ps(43), 1, 1) else {
        panic!("43 is not listed");
    };
    assert_eq!(reason, "ParameterServerFailed");
    assert!(
        message.contains("exit code 43 is below 128 and not in runPolicy.retryableExitCodes"),
        "{message}"
    );
}

#[test]
fn restart_policy_never_fails_on_a_signal() {
    let spec = hybrid(RestartPolicy::Never, 5, &[]);
    let Verdict::Fail { message, .. } =
        judge(&spec, Unit::Group(0), &worker(0, 0, FailureKind::Signal(9)), 0, 0)
    else {
        panic!("Never does not restart");
    };
    assert!(message.contains("(permanent: runPolicy.restartPolicy is Never)"), "{message}");
}

#[test]
fn max_restarts_counts_every_unit_and_then_fails() {
    let spec = hybrid(RestartPolicy::OnFailure, 2, &[]);
    assert!(matches!(
        judge(&spec, Unit::Group(0), &worker(0, 0, FailureKind::Signal(9)), 0, 1),
        Verdict::Restart { restarts: 2, .. }
    ));
    let Verdict::Fail { reason, message } =
        judge(&spec, Unit::Group(1), &worker(1, 1, FailureKind::Exit(137)), 0, 2)
    else {
        panic!("a third restart exceeds maxRestarts 2");
    };
    assert_eq!(reason, MAX_RESTARTS_EXCEEDED);
    assert_eq!(
        message,
        "worker 1/1 exited with code 137; the job already used all 2 restarts of runPolicy.maxRestarts"
    );
}

#[test]
fn backoff_doubles_and_is_capped_at_an_hour() {
    assert_eq!(backoff(10, 1), Duration::from_secs(10));
    assert_eq!(backoff(10, 2), Duration::from_secs(20));
    assert_eq!(backoff(10, 4), Duration::from_secs(80));
    assert_eq!(backoff(10, 30), Duration::from_secs(3600));
    assert_eq!(backoff(u32::MAX, 1), policy::MAX_BACKOFF);
    assert_eq!(backoff(0, 5), Duration::ZERO);
    assert_eq!(backoff(10, 0), Duration::from_secs(10), "attempt 0 waits the base");
}

#[test]
fn units_group_the_roles_and_read_back_from_their_keys() {
    assert_eq!(Unit::of(Role::Ps { index: 3 }), Unit::Ps(3));
    assert_eq!(Unit::of(Role::Worker { group: 2, rank: 1 }), Unit::Group(2));
    assert_eq!(Unit::of(Role::Launcher { group: 2 }), Unit::Group(2));
    for unit in [Unit::Ps(0), Unit::Ps(17), Unit::Group(0), Unit::Group(9)] {
        assert_eq!(Unit::from_key(&unit.key()), Some(unit));
    }
    assert_eq!(Unit::Group(4).key(), "group-4");
    assert_eq!(Unit::Ps(1).key(), "ps-1");
    for junk in ["", "group-", "ps-x", "worker-1", "group-1-0", "ps--1"] {
        assert_eq!(Unit::from_key(junk), None, "{junk}");
    }
    assert_eq!(Unit::Group(1).to_string(), "group 1");
    assert_eq!(Unit::Ps(0).to_string(), "parameter server 0");
}

#[test]
fn roles_and_units_are_in_the_spec_within_its_replicas_groups_and_size() {
    let mut spec = hybrid(RestartPolicy::OnFailure, 5, &[]);
    for (role, inside) in [
        (Role::Ps { index: 1 }, true),
        (Role::Ps { index: 2 }, false),
        (Role::Worker { group: 1, rank: 1 }, true),
        (Role::Worker { group: 2, rank: 0 }, false),
        (Role::Worker { group: 0, rank: 2 }, false),
        (Role::Launcher { group: 0 }, false),
    ] {
        assert_eq!(role.in_spec(&spec), inside, "{role}");
    }
    assert!(Unit::Group(1).in_spec(&spec) && Unit::Ps(1).in_spec(&spec));
    spec.workers.groups = 1;
    assert!(!Unit::Group(1).in_spec(&spec), "a scaled-down group");
    assert!(!Unit::Ps(2).in_spec(&spec));
    spec.workers.backend = Backend::Mpi;
    assert!(Role::Launcher { group: 0 }.in_spec(&spec), "an mpi group has a launcher");
    assert!(!Role::Launcher { group: 1 }.in_spec(&spec));
}

#[test]
fn the_job_config_lists_every_ps_and_rank_at_its_endpoint() {
    let spec = hybrid(RestartPolicy::OnFailure, 5, &[]);
    let config = JobConfig::of_spec("j", "ns", &spec, |role| Endpoint::new(role.to_string(), 7));
    assert_eq!((config.job_name.as_str(), config.namespace.as_str()), ("j", "ns"));
    assert_eq!(config.spec, spec);
    let hosts = |endpoints: &[Endpoint]| endpoints.iter().map(|e| e.host.clone()).collect::<Vec<_>>();
    assert_eq!(hosts(&config.parameter_servers), ["ps 0", "ps 1"]);
    assert_eq!(config.groups.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(hosts(&config.groups[1].peers), ["worker 1/0", "worker 1/1"]);
}
