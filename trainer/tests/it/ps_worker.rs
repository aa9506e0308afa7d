//! `tandem worker` processes in two groups of two ranks train through a `tandem ps` process,
//! everything wired by the launch contract on loopback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;

use crate::ps_common::{Job, addrs, loopback_endpoints};

/// The last line of worker `g`/`r`, which must have exited 0 with a `finished` line.
fn finished(job: &Job, g: u32, r: u32, mut child: std::process::Child) -> serde_json::Value {
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let status = child.wait().unwrap();
    let log = std::fs::read_to_string(job.dir.path().join(format!("worker-{g}-{r}.log"))).unwrap_or_default();
    assert!(status.success(), "worker {g}/{r} failed:\n{out}\n{log}");
    let last: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(last["event"], "finished", "worker {g}/{r}");
    last
}

fn run_job(algorithm: &str) {
    let job = Job::with_spec(serde_json::json!({
        "model": {"kind": "mlp", "hidden": [32]},
        "data": {"source": "synthetic", "batchSize": 16, "syntheticSamples": 1200},
        "training": {
            "algorithm": algorithm,
            "steps": 40,
            "evalEverySteps": 20,
            "optimizer": {"kind": "sgd", "learningRate": 0.05, "momentum": 0.9},
            "easgd": {"alpha": 0.45, "tau": 2},
            "checkpoint": {"everySteps": 10}
        },
        "parameterServers": {"replicas": 2},
        "workers": {"groups": 2, "groupSize": 2, "minGroups": 1, "maxGroups": 4}
    }));
    let ps = [job.spawn_ps(0, 0), job.spawn_ps(1, 0)];
    job.write_topology(&ps, &[loopback_endpoints(2), loopback_endpoints(2)]);
    let workers: Vec<_> = (0..2)
        .flat_map(|g| (0..2).map(move |r| (g, r)))
        .map(|(g, r)| (g, r, job.spawn_worker(g, r)))
        .collect();
    for (g, r, child) in workers {
        let last = finished(&job, g, r, child);
        assert_eq!(last["steps"], 40);
        assert!(last["accuracy"].as_f64().unwrap() >= 0.9, "worker {g}/{r}: {last}");
    }
    let mut observer = job.observer(&addrs(&ps));
    for shard in 0..2 {
        let status = observer.status(shard).unwrap();
        assert_eq!(status["progress"]["step"], 40, "{status}");
        assert!(status["progress"]["accuracy"].as_f64().unwrap() >= 0.9, "{status}");
        assert!(
            status["groups"].as_array().unwrap().iter().all(|g| g["member"] == false),
            "groups left at the end"
        );
    }
}

#[test]
fn hybrid_workers_train_through_the_parameter_servers() {
    run_job("hybrid");
}

#[test]
fn easgd_workers_train_against_the_centre() {
    run_job("easgd");
}
