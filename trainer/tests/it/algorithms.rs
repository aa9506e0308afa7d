//! Acceptance: every parallel SGD algorithm reaches 0.90 test accuracy on MNIST-5k from its example
//! manifest, as real `tandem ps` and `tandem worker` processes on loopback started by
//! `tandem train -f` (the local runner), and the job writes its merged training curve.
//!
//! `hybrid` is covered by `runner_e2e.rs`. Needs the MNIST-5k sample in `data/` (`make data`). The
//! jobs run one at a time: each already keeps four workers busy.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeSet;

use crate::runner_support::{example, example_yaml, one_job_at_a_time, processes_of, train};

/// Trains `examples/<name>` and checks the target, the topology's progress and the curve.
fn reaches_the_target(name: &str) {
    let _one = one_job_at_a_time();
    let spec = &example_yaml(name)["spec"];
    let steps = spec["training"]["steps"].as_u64().expect("the example sets training.steps");
    let groups = spec["workers"]["groups"].as_u64().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");

    let run = train(&example(name), &out, &[]);
    eprintln!("{name}: {:.1} s", run.wall.as_secs_f64());
    assert!(run.success, "{name} failed; stderr:\n{}", run.stderr);
    let done = run.finished();
    let accuracy = done["test_accuracy"].as_f64().unwrap();
    assert!(accuracy >= 0.90, "{name}: {done}");
    assert_eq!(done["steps"], steps, "{name}: {done}");
    assert_eq!(done["restarts"], 0, "{name}: {done}");

    // Every group trained and reported, and the merged step reached the end.
    let reported: BTreeSet<u64> = run.of("progress").iter().map(|e| e["group"].as_u64().unwrap()).collect();
    assert_eq!(reported, (0..groups).collect(), "{name}: groups that reported progress");
    let last = run.of("progress").last().map(|e| e["step"].as_u64().unwrap());
    assert_eq!(last, Some(steps), "{name}: merged step at the end");

    // The merged training curve, announced just before the finished line.
    let curve = &run.events[run.events.len() - 2];
    assert_eq!(curve["event"], "curve", "{name}: {curve}");
    let svg = std::path::PathBuf::from(curve["path"].as_str().unwrap());
    assert_eq!(svg, out.join("curve.svg"));
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<polyline"), "{name}: the SVG draws the curve");
    let csv = std::fs::read_to_string(out.join("curve.csv")).unwrap();
    let test_rows: Vec<Vec<&str>> =
        csv.lines().filter(|l| l.starts_with("test,")).map(|l| l.split(',').collect()).collect();
    assert!(test_rows.len() >= 2, "{name}: test accuracy at several steps:\n{csv}");
    let final_row = test_rows.last().unwrap();
    assert_eq!(final_row[1], steps.to_string(), "{name}:\n{csv}");
    assert!((final_row[3].parse::<f64>().unwrap() - accuracy).abs() < 1e-9, "{name}:\n{csv}");
    assert!(csv.lines().any(|l| l.starts_with("train,")), "{name}: training loss:\n{csv}");

    assert!(processes_of(&out).is_empty(), "{name}: every process of the job ended");
}

#[test]
fn ps_sync_reaches_090() {
    reaches_the_target("mnist-ps-sync.yaml");
}

#[test]
fn ps_async_reaches_090() {
    reaches_the_target("mnist-ps-async.yaml");
}

#[test]
fn easgd_reaches_090() {
    reaches_the_target("mnist-easgd.yaml");
}

#[test]
fn allreduce_reaches_090() {
    reaches_the_target("mnist-allreduce.yaml");
}
