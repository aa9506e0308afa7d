//! Which failures restart their unit: signals and exit codes from 128, pod disruptions, the
//! listed codes of `restartPolicy: ExitCode`; never with `restartPolicy: Never`. How a failure reads,
//! and which of a unit's failures decides about it.

use tandem_api::policy::{self, Failure, FailureKind};
use tandem_api::{ExitClass, RestartPolicy, Role};

use super::{hybrid, worker};

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
fn each_exit_class_has_one_code_which_the_policy_reads_back() {
    let classes = [ExitClass::Permanent, ExitClass::Preempted, ExitClass::PeerLost];
    assert_eq!(classes.map(ExitClass::code), [1, 143, 200]);
    let on_failure = hybrid(RestartPolicy::OnFailure, 5, &[]).run_policy;
    for class in classes {
        let kind = FailureKind::Exit(class.code());
        assert_eq!(kind.exit_class(), Some(class));
        // Only a permanent failure is not retried.
        assert_eq!(kind.retryable(&on_failure), class != ExitClass::Permanent, "{class}");
    }
    // Success, a signal seen by the parent and another signal's code are no class of Tandem's.
    for kind in [FailureKind::Exit(0), FailureKind::Exit(137), FailureKind::Signal(15), FailureKind::Evicted]
    {
        assert_eq!(kind.exit_class(), None, "{kind:?}");
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
    let pod = |kind| Failure {
        who: "pod j-g0-1".to_owned(),
        role: Role::Worker { group: 0, rank: 1 },
        kind,
        message: None,
    };
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
        assert_eq!(
            Failure { who: String::new(), role, kind: FailureKind::Exit(1), message: None }.reason(),
            reason
        );
    }
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
