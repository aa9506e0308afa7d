//! The local runner's supervision logic without processes or sockets: restart bookkeeping, chaos
//! parsing, the progress protocol. The restart rules themselves are `tandem_api::policy`'s, tested
//! in the api crate.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::time::Duration;

use tandem::runner::chaos::Chaos;
use tandem::runner::policy::{Decision, Supervisor};
use tandem::runner::progress::{self, Line, Merged};
use tandem_api::contract::Role;
use tandem_api::policy::{Failure, FailureKind, Unit};
use tandem_api::{RestartPolicy, RunPolicy, TrainingJobSpec};

fn spec(max_restarts: u32) -> TrainingJobSpec {
    let mut spec: TrainingJobSpec = serde_yaml::from_str(
        "model: {kind: mlp, hidden: [8]}\ndata: {source: mnist5k}\ntraining: {algorithm: hybrid, steps: 10}\n\
         parameterServers: {replicas: 2}\nworkers: {groups: 2, groupSize: 2}\n",
    )
    .unwrap();
    spec.run_policy = RunPolicy {
        restart_policy: RestartPolicy::OnFailure,
        max_restarts,
        backoff_seconds: 2,
        ..RunPolicy::default()
    };
    spec
}

fn worker(group: u32, rank: u32, kind: FailureKind) -> Failure {
    let role = Role::Worker { group, rank };
    Failure { who: role.to_string(), role, kind }
}

#[test]
fn a_killed_worker_restarts_its_group_only_with_the_next_attempt() {
    let mut sup = Supervisor::new(spec(5));
    let decision = sup.on_failure(Unit::Group(1), &[worker(1, 1, FailureKind::Signal(9))]);
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
        sup.on_failure(Unit::Group(1), &[worker(1, 0, FailureKind::Exit(139))])
    else {
        panic!("expected a restart");
    };
    assert_eq!((attempt, backoff), (2, Duration::from_secs(4)));
}

#[test]
fn restarts_count_towards_max_restarts_and_a_permanent_exit_fails() {
    let mut sup = Supervisor::new(spec(1));
    assert!(matches!(
        sup.on_failure(
            Unit::Group(0),
            &[worker(0, 0, FailureKind::Exit(1)), worker(0, 1, FailureKind::Signal(9))]
        ),
        Decision::Restart { .. }
    ));
    let Decision::Fail(message) = sup.on_failure(Unit::Group(1), &[worker(1, 1, FailureKind::Signal(9))])
    else {
        panic!("maxRestarts 1 is used up");
    };
    assert!(message.contains("all 1 restarts of runPolicy.maxRestarts"), "{message}");
    let mut sup = Supervisor::new(spec(5));
    assert!(matches!(
        sup.on_failure(Unit::Group(0), &[worker(0, 0, FailureKind::Exit(2))]),
        Decision::Fail(_)
    ));
    assert_eq!(sup.restarts(), 0);
}

#[test]
fn relaunches_raise_the_attempt_without_counting() {
    let mut sup = Supervisor::new(spec(1));
    assert_eq!(sup.relaunch(Unit::Group(0)), 1);
    assert_eq!(sup.relaunch(Unit::Group(0)), 2);
    assert_eq!(sup.restarts(), 0);
    assert!(matches!(
        sup.on_failure(Unit::Group(0), &[worker(0, 0, FailureKind::Signal(9))]),
        Decision::Restart { attempt: 3, .. }
    ));
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
