//! A parameter server whose container the kubelet restarted in place (`restartPolicy:
//! OnFailure`, same pod, output folder kept): its restarts are judged by the same exit-code rules
//! and counted towards `maxRestarts`, without a new attempt or a back-off of the operator's.

use std::time::Duration;

use tandem_api::RestartPolicy;
use tandem_api::policy::{
    FailureKind, MAX_RESTARTS_EXCEEDED, Relaunch, Unit, Verdict, judge, judge_in_place,
};

use super::{hybrid, ps};

#[test]
fn an_in_place_restart_counts_keeps_the_attempt_and_says_the_pod_kept_its_checkpoints() {
    let spec = hybrid(RestartPolicy::OnFailure, 5, &[]);
    let verdict = judge_in_place(&spec, &ps(0, FailureKind::Exit(137)), 2, 1, 1);
    let Verdict::Restart { attempt, restarts, backoff, message } = verdict else {
        panic!("retryable: {verdict:?}")
    };
    assert_eq!((attempt, restarts, backoff), (2, 2, Duration::ZERO), "same attempt, the kubelet's back-off");
    assert_eq!(
        message,
        "pod j-ps-0 exited with code 137 (retryable): the kubelet restarted its container in place, in the same \
         pod, whose output volume keeps its checkpoints: it resumes from its newest checkpoint there, if it \
         wrote one; restart 2 of 5"
    );
}

#[test]
fn several_restarts_seen_at_once_all_count() {
    let spec = hybrid(RestartPolicy::OnFailure, 5, &[]);
    let verdict = judge_in_place(&spec, &ps(1, FailureKind::Exit(139)), 0, 3, 1);
    assert!(matches!(verdict, Verdict::Restart { restarts: 4, attempt: 0, .. }), "{verdict:?}");
    // Reaching maxRestarts exactly is allowed; going past it fails the job.
    assert!(matches!(
        judge_in_place(&spec, &ps(1, FailureKind::Exit(139)), 0, 4, 1),
        Verdict::Restart { restarts: 5, .. }
    ));
    let Verdict::Fail { reason, message } = judge_in_place(&spec, &ps(1, FailureKind::Exit(139)), 0, 2, 4)
    else {
        panic!("6 restarts exceed maxRestarts 5");
    };
    assert_eq!(reason, MAX_RESTARTS_EXCEEDED);
    assert_eq!(
        message,
        "pod j-ps-1 exited with code 139; the job already used all 5 restarts of runPolicy.maxRestarts"
    );
}

#[test]
fn an_in_place_restart_is_judged_like_a_new_attempt_would_be() {
    // The same exit, the same policy, the same restarts used: the job fails, or goes on, alike, with
    // the same failure message.
    for (restart_policy, listed, kind) in [
        (RestartPolicy::OnFailure, &[][..], FailureKind::Exit(1)),
        (RestartPolicy::OnFailure, &[], FailureKind::Exit(137)),
        (RestartPolicy::ExitCode, &[3], FailureKind::Exit(3)),
        (RestartPolicy::ExitCode, &[3], FailureKind::Exit(4)),
        (RestartPolicy::Never, &[], FailureKind::Exit(137)),
        (RestartPolicy::OnFailure, &[], FailureKind::Other("restarted by the kubelet".to_owned())),
    ] {
        let spec = hybrid(restart_policy, 1, listed);
        let cause = ps(0, kind);
        for used in [0, 1] {
            let in_place = judge_in_place(&spec, &cause, 0, 1, used);
            let new_pod = judge(&spec, Relaunch::NewPod, Unit::Ps(0), &cause, 0, used);
            match (&in_place, &new_pod) {
                (Verdict::Fail { .. }, Verdict::Fail { .. }) => assert_eq!(in_place, new_pod),
                (Verdict::Restart { restarts: a, .. }, Verdict::Restart { restarts: b, .. }) => {
                    assert_eq!(a, b)
                }
                _ => panic!("{restart_policy:?} {cause} after {used}: {in_place:?} vs {new_pod:?}"),
            }
        }
    }
}

#[test]
fn a_permanent_exit_in_place_fails_the_job_saying_what_to_change() {
    let spec = hybrid(RestartPolicy::OnFailure, 5, &[]);
    let Verdict::Fail { reason, message } = judge_in_place(&spec, &ps(0, FailureKind::Exit(2)), 0, 1, 0)
    else {
        panic!("exit code 2 is permanent");
    };
    assert_eq!(reason, "ParameterServerFailed");
    assert!(message.starts_with("pod j-ps-0 exited with code 2 (permanent: exit codes 1-127"), "{message}");
}
