//! A failed unit restarts as its next attempt after the back-off, counted towards `maxRestarts`,
//! with a message that says what happened, what restarts and what it resumes from; or the job
//! fails, saying why and what to change.

use std::time::Duration;

use tandem_api::RestartPolicy;
use tandem_api::policy::{FailureKind, MAX_RESTARTS_EXCEEDED, Relaunch, Unit, Verdict, judge};

use super::{hybrid, ps, worker};

#[test]
fn a_killed_worker_restarts_its_group_only_with_the_next_attempt_and_back_off() {
    let spec = hybrid(RestartPolicy::OnFailure, 5, &[]);
    let failure = worker(1, 1, FailureKind::Signal(9));
    let Verdict::Restart { attempt, restarts, backoff, message } =
        judge(&spec, Relaunch::SameFolder, Unit::Group(1), &failure, 0, 0)
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
    let again =
        judge(&spec, Relaunch::SameFolder, Unit::Group(1), &worker(1, 0, FailureKind::Exit(139)), 1, 1);
    assert!(
        matches!(again, Verdict::Restart { attempt: 2, restarts: 2, backoff, .. } if backoff == Duration::from_secs(4))
    );
}

#[test]
fn the_restart_message_says_where_the_unit_resumes() {
    let hybrid = hybrid(RestartPolicy::OnFailure, 5, &[]);
    let mut allreduce = hybrid.clone();
    allreduce.training.algorithm = tandem_api::Algorithm::Allreduce;
    let mut claimed = allreduce.clone();
    claimed.training.checkpoint.claim_name = Some("ckpt".to_owned());
    let restart = |spec, relaunch, unit, failure| match judge(spec, relaunch, unit, failure, 0, 0) {
        Verdict::Restart { message, .. } => message,
        Verdict::Fail { message, .. } => panic!("restarts: {message}"),
    };
    let killed_ps = ps(1, FailureKind::Exit(137));
    let killed_rank = worker(0, 1, FailureKind::Signal(9));
    // A PS-algorithm group takes the PS weights, wherever it runs.
    for relaunch in [Relaunch::SameFolder, Relaunch::NewPod] {
        let message = restart(&hybrid, relaunch, Unit::Group(0), &killed_rank);
        assert!(message.contains("restarting group 0 only (it resumes from the PS weights)"), "{message}");
    }
    // Locally the output folder stays: a PS and an allreduce group resume from their checkpoint.
    let message = restart(&hybrid, Relaunch::SameFolder, Unit::Ps(1), &killed_ps);
    assert!(
        message.contains("restarting parameter server 1 (it resumes from its latest checkpoint)"),
        "{message}"
    );
    let message = restart(&allreduce, Relaunch::SameFolder, Unit::Group(0), &killed_rank);
    assert!(message.contains("restarting group 0 only (it resumes from its latest checkpoint)"), "{message}");
    // A new pod keeps checkpoints only on a claim; with an emptyDir it says it starts afresh, and how
    // to keep them.
    let message = restart(&claimed, Relaunch::NewPod, Unit::Ps(1), &killed_ps);
    assert!(
        message.contains(
            "restarting parameter server 1 in a new pod (it resumes from its newest checkpoint on claim ckpt, \
             if it wrote one)"
        ),
        "{message}"
    );
    for (unit, failure, what) in
        [(Unit::Ps(1), &killed_ps, "parameter server 1"), (Unit::Group(0), &killed_rank, "group 0 only")]
    {
        let message = restart(&allreduce, Relaunch::NewPod, unit, failure);
        assert!(
            message.contains(&format!(
                "restarting {what} in a new pod, with a new emptyDir output volume: it starts from its initial \
                 weights (set spec.training.checkpoint.claimName to keep checkpoints when a pod is lost)"
            )),
            "{message}"
        );
        assert!(!message.contains("resumes"), "{message}");
    }
}

#[test]
fn a_permanent_exit_fails_the_job_naming_the_process_the_code_and_the_fix() {
    let spec = hybrid(RestartPolicy::OnFailure, 5, &[]);
    let Verdict::Fail { reason, message } =
        judge(&spec, Relaunch::SameFolder, Unit::Group(1), &worker(1, 0, FailureKind::Exit(2)), 0, 0)
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
    let exit = |code| ps(1, FailureKind::Exit(code));
    assert!(matches!(
        judge(&spec, Relaunch::NewPod, Unit::Ps(1), &exit(42), 0, 0),
        Verdict::Restart { attempt: 1, .. }
    ));
    let Verdict::Fail { reason, message } = judge(&spec, Relaunch::NewPod, Unit::Ps(1), &exit(43), 1, 1)
    else {
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
        judge(&spec, Relaunch::SameFolder, Unit::Group(0), &worker(0, 0, FailureKind::Signal(9)), 0, 0)
    else {
        panic!("Never does not restart");
    };
    assert!(message.contains("(permanent: runPolicy.restartPolicy is Never)"), "{message}");
}

#[test]
fn max_restarts_counts_every_unit_and_then_fails() {
    let spec = hybrid(RestartPolicy::OnFailure, 2, &[]);
    assert!(matches!(
        judge(&spec, Relaunch::SameFolder, Unit::Group(0), &worker(0, 0, FailureKind::Signal(9)), 0, 1),
        Verdict::Restart { restarts: 2, .. }
    ));
    let Verdict::Fail { reason, message } =
        judge(&spec, Relaunch::SameFolder, Unit::Group(1), &worker(1, 1, FailureKind::Exit(137)), 0, 2)
    else {
        panic!("a third restart exceeds maxRestarts 2");
    };
    assert_eq!(reason, MAX_RESTARTS_EXCEEDED);
    assert_eq!(
        message,
        "worker 1/1 exited with code 137; the job already used all 2 restarts of runPolicy.maxRestarts"
    );
}
