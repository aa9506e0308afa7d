//! The local runner's inputs without processes or sockets: chaos parsing and targets, the progress
//! protocol and its merge. The supervisor's decisions are tested in `runner::state`'s unit tests,
//! the restart rules (`tandem_api::policy`) in the api crate.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use tandem::runner::chaos::{Action, Chaos};
use tandem::runner::progress::{self, Line, Merged};
use tandem_api::contract::Role;

#[test]
fn chaos_specs_parse() {
    let c: Chaos = "kill:ps:1@300".parse().unwrap();
    assert_eq!(c, Chaos { target: Role::Ps { index: 1 }, step: 300, action: Action::Kill });
    let c: Chaos = "kill:worker:0:1@150".parse().unwrap();
    assert_eq!(c, Chaos { target: Role::Worker { group: 0, rank: 1 }, step: 150, action: Action::Kill });
    assert_eq!(c.to_string(), "kill:worker:0:1@150");
    let c: Chaos = "term:worker:1:0@40".parse().unwrap();
    assert_eq!(c, Chaos { target: Role::Worker { group: 1, rank: 0 }, step: 40, action: Action::Term });
    assert_eq!(c.to_string(), "term:worker:1:0@40");
}

#[test]
fn bad_chaos_specs_say_what_is_wrong_and_show_the_forms() {
    for (spec, says) in [
        ("kill:ps:1", "step after '@' is missing"),
        ("kill:ps:1@soon", "not a whole number"),
        ("kill:worker:1@10", "group and rank"),
        ("kill:ps:x@10", "PS index \"x\""),
        ("kill:launcher:0@10", "ps or worker"),
        ("stop:ps:0@10", "the action must be kill or term"),
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
        Some(Line::Progress {
            group: 1,
            step: 200,
            loss: Some(0.25),
            accuracy: Some(0.93),
            samples: 12800,
            data_wait: 0.0,
            skipped: 0
        })
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
