//! The local runner's supervision logic without processes or sockets: restart decisions and their
//! limits, exit classification (mirroring the operator), chaos parsing, the progress protocol.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::time::Duration;

use tandem::runner::chaos::Chaos;
use tandem::runner::policy::{Decision, Exit, Failure, Supervisor, Unit, backoff};
use tandem::runner::progress::{self, Line, Merged};
use tandem_api::contract::Role;
use tandem_api::{RestartPolicy, RunPolicy};

fn policy(restart_policy: RestartPolicy, max_restarts: u32, retryable: &[i32]) -> RunPolicy {
    RunPolicy {
        restart_policy,
        max_restarts,
        retryable_exit_codes: retryable.to_vec(),
        backoff_seconds: 2,
        ..RunPolicy::default()
    }
}

fn worker(group: u32, rank: u32, exit: Exit) -> Failure {
    Failure { role: Role::Worker { group, rank }, exit }
}

#[test]
fn exit_classification_mirrors_the_operator() {
    let on_failure = policy(RestartPolicy::OnFailure, 5, &[]);
    assert!(Exit::Signal(9).retryable(&on_failure));
    assert!(Exit::Code(137).retryable(&on_failure));
    assert!(Exit::Code(128).retryable(&on_failure));
    assert!(!Exit::Code(1).retryable(&on_failure));
    assert!(!Exit::Code(127).retryable(&on_failure));

    let exit_code = policy(RestartPolicy::ExitCode, 5, &[3]);
    assert!(Exit::Code(3).retryable(&exit_code));
    assert!(!Exit::Code(4).retryable(&exit_code));
    assert!(Exit::Signal(15).retryable(&exit_code));

    let never = policy(RestartPolicy::Never, 5, &[3]);
    assert!(!Exit::Signal(9).retryable(&never));
    assert!(!Exit::Code(200).retryable(&never));
}

#[test]
fn a_killed_worker_restarts_its_group_only_with_the_next_attempt() {
    let mut sup = Supervisor::new(policy(RestartPolicy::OnFailure, 5, &[]));
    let decision = sup.on_failure(Unit::Group(1), &[worker(1, 1, Exit::Signal(9))]);
    let Decision::Restart { unit, attempt, backoff, message } = decision else {
        panic!("expected a restart, got {decision:?}");
    };
    assert_eq!((unit, attempt, backoff), (Unit::Group(1), 1, Duration::from_secs(2)));
    assert!(message.contains("worker 1/1") && message.contains("group 1 only"), "{message}");
    assert_eq!(sup.attempt(Unit::Group(1)), 1);
    assert_eq!(sup.attempt(Unit::Group(0)), 0, "other groups keep their attempt");
    assert_eq!(sup.attempt(Unit::Ps(0)), 0);
    assert_eq!(sup.restarts(), 1);

    // The same group again: attempt 2, back-off doubled.
    let Decision::Restart { attempt, backoff, .. } =
        sup.on_failure(Unit::Group(1), &[worker(1, 0, Exit::Code(139))])
    else {
        panic!("expected a restart");
    };
    assert_eq!((attempt, backoff), (2, Duration::from_secs(4)));
}

#[test]
fn a_killed_rank_outweighs_its_peers_broken_connections() {
    // The peer noticed the dead rank first and exited with 1; the rank killed by SIGKILL is the cause.
    let mut sup = Supervisor::new(policy(RestartPolicy::OnFailure, 5, &[]));
    let failures = [worker(0, 0, Exit::Code(1)), worker(0, 1, Exit::Signal(9))];
    let decision = sup.on_failure(Unit::Group(0), &failures);
    match decision {
        Decision::Restart { message, .. } => {
            assert!(message.contains("worker 0/1 was killed by signal 9"), "{message}")
        }
        other => panic!("expected a restart, got {other:?}"),
    }
}

#[test]
fn a_permanent_exit_fails_the_job_naming_role_index_and_code() {
    let mut sup = Supervisor::new(policy(RestartPolicy::OnFailure, 5, &[]));
    let Decision::Fail(message) = sup.on_failure(Unit::Group(1), &[worker(1, 0, Exit::Code(2))]) else {
        panic!("exit code 2 must be permanent");
    };
    assert!(message.contains("worker 1/0 exited with code 2"), "{message}");
    assert!(message.contains("permanent"), "{message}");
    assert!(message.contains("retryableExitCodes"), "the message says what to do: {message}");
    assert_eq!(sup.restarts(), 0);
}

#[test]
fn listed_exit_codes_restart_with_restart_policy_exit_code() {
    let mut sup = Supervisor::new(policy(RestartPolicy::ExitCode, 5, &[42]));
    let failure = Failure { role: Role::Ps { index: 1 }, exit: Exit::Code(42) };
    match sup.on_failure(Unit::Ps(1), &[failure]) {
        Decision::Restart { unit, attempt, message, .. } => {
            assert_eq!((unit, attempt), (Unit::Ps(1), 1));
            assert!(message.contains("checkpoint"), "a PS resumes from its checkpoint: {message}");
        }
        other => panic!("expected a restart, got {other:?}"),
    }
    let failure = Failure { role: Role::Ps { index: 1 }, exit: Exit::Code(43) };
    assert!(matches!(sup.on_failure(Unit::Ps(1), &[failure]), Decision::Fail(_)));
}

#[test]
fn restart_policy_never_fails_on_a_signal() {
    let mut sup = Supervisor::new(policy(RestartPolicy::Never, 5, &[]));
    let Decision::Fail(message) = sup.on_failure(Unit::Group(0), &[worker(0, 0, Exit::Signal(9))]) else {
        panic!("Never must not restart");
    };
    assert!(message.contains("restartPolicy is Never"), "{message}");
}

#[test]
fn max_restarts_counts_every_unit_and_then_fails() {
    let mut sup = Supervisor::new(policy(RestartPolicy::OnFailure, 2, &[]));
    assert!(matches!(
        sup.on_failure(Unit::Group(0), &[worker(0, 0, Exit::Signal(9))]),
        Decision::Restart { .. }
    ));
    let ps = Failure { role: Role::Ps { index: 0 }, exit: Exit::Signal(9) };
    assert!(matches!(sup.on_failure(Unit::Ps(0), &[ps]), Decision::Restart { .. }));
    let Decision::Fail(message) = sup.on_failure(Unit::Group(1), &[worker(1, 1, Exit::Code(137))]) else {
        panic!("the third restart exceeds maxRestarts 2");
    };
    assert!(message.contains("worker 1/1 exited with code 137"), "{message}");
    assert!(message.contains("all 2 restarts of runPolicy.maxRestarts"), "{message}");
    assert_eq!(sup.restarts(), 2);
}

#[test]
fn relaunches_raise_the_attempt_without_counting() {
    let mut sup = Supervisor::new(policy(RestartPolicy::OnFailure, 1, &[]));
    assert_eq!(sup.relaunch(Unit::Group(0)), 1);
    assert_eq!(sup.relaunch(Unit::Group(0)), 2);
    assert_eq!(sup.restarts(), 0);
    assert!(matches!(
        sup.on_failure(Unit::Group(0), &[worker(0, 0, Exit::Signal(9))]),
        Decision::Restart { attempt: 3, .. }
    ));
}

#[test]
fn backoff_doubles_and_is_capped_at_an_hour() {
    assert_eq!(backoff(10, 1), Duration::from_secs(10));
    assert_eq!(backoff(10, 2), Duration::from_secs(20));
    assert_eq!(backoff(10, 4), Duration::from_secs(80));
    assert_eq!(backoff(10, 30), Duration::from_secs(3600));
    assert_eq!(backoff(0, 5), Duration::ZERO);
}

#[test]
fn chaos_specs_parse() {
    let c: Chaos = "kill:ps:1@300".parse().unwrap();
    assert_eq!(c, Chaos { target: Role::Ps { index: 1 }, step: 300 });
    let c: Chaos = "kill:worker:0:1@150".parse().unwrap();
    assert_eq!(c, Chaos { target: Role::Worker { group: 0, rank: 1 }, step: 150 });
    assert_eq!(c.to_string(), "kill:worker:0:1@150");
}

#[test]
fn bad_chaos_specs_say_what_is_wrong_and_show_the_forms() {
    for (spec, says) in [
        ("kill:ps:1", "step after '@' is missing"),
        ("kill:ps:1@soon", "not a whole number"),
        ("kill:worker:1@10", "group and rank"),
        ("kill:ps:x@10", "PS index \"x\""),
        ("kill:launcher:0@10", "ps or worker"),
        ("stop:ps:0@10", "only action is kill"),
    ] {
        let err = spec.parse::<Chaos>().unwrap_err().to_string();
        assert!(err.contains(says), "{spec}: {err}");
        assert!(err.contains("kill:worker:<group>:<rank>@<step>"), "{spec}: {err}");
    }
}

#[test]
fn chaos_targets_must_exist_in_the_job() {
    let spec: tandem_api::TrainingJobSpec = serde_yaml::from_str(
        "model: {kind: mlp, hidden: [8]}\ndata: {source: mnist5k}\ntraining: {algorithm: hybrid, steps: 10}\n\
         parameterServers: {replicas: 2}\nworkers: {groups: 2, groupSize: 2}\n",
    )
    .unwrap();
    let ok: Vec<Chaos> = vec!["kill:ps:1@5".parse().unwrap(), "kill:worker:1:1@5".parse().unwrap()];
    tandem::runner::check_chaos(&spec, &ok).unwrap();
    for bad in ["kill:ps:2@5", "kill:worker:2:0@5", "kill:worker:0:2@5"] {
        let err = tandem::runner::check_chaos(&spec, &[bad.parse().unwrap()]).unwrap_err().to_string();
        assert!(err.contains("2 parameter server(s) and 2 group(s) of 2 rank(s)"), "{bad}: {err}");
    }
}

#[test]
fn worker_lines_parse_and_other_output_is_ignored() {
    let line = r#"{"event":"progress","group":1,"progress":{"step":200,"loss":0.25,"accuracy":0.93,"samples":12800}}"#;
    assert_eq!(
        progress::parse(line),
        Some(Line::Progress { group: 1, step: 200, loss: Some(0.25), accuracy: Some(0.93), samples: 12800 })
    );
    let line = r#"{"event":"finished","group":0,"rank":1,"steps":600,"accuracy":0.94}"#;
    assert_eq!(
        progress::parse(line),
        Some(Line::Finished { group: 0, rank: 1, steps: 600, accuracy: Some(0.94) })
    );
    assert_eq!(progress::parse("listening on 127.0.0.1:4000"), None);
    assert_eq!(progress::parse(r#"{"event":"progress","group":1}"#), None);
    assert_eq!(progress::parse("{not json"), None);
}

#[test]
fn merged_progress_never_goes_back_and_keeps_samples_of_restarted_groups() {
    let mut m = Merged::default();
    assert_eq!(m.record(0, 100, Some(0.5), Some(0.9), 6400), 100);
    assert_eq!(m.record(1, 200, Some(0.3), None, 12800), 200);
    assert_eq!(m.loss(), Some(0.4));
    assert_eq!(m.accuracy(), Some(0.9));
    m.restart(1);
    assert_eq!(m.record(1, 100, Some(0.7), Some(0.8), 6400), 200, "the merged step stays at the front");
    assert_eq!(m.samples(), 6400 + 12800 + 6400);
    assert_eq!(m.accuracy(), Some(0.8));
}
