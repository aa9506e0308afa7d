//! A cluster in a box: `tandem train --node NAME=ADDR` runs each process of a job inside a network
//! namespace of this machine, at that node's address, so what the job sends crosses real links
//! (veth pairs to a bridge, as bench/cluster.sh builds them). Needs root and `ip` (iproute2), as
//! the real-node tests do.

use crate::runner_support::{Run, data_dir, example_yaml, manifest, one_job_at_a_time, repo, set, train};

use std::process::Command;

/// Runs `ip ARGS`, failing the test with its error.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("iproute2's `ip` (run the tests as root)");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// Nodes made for one test: a bridge with an address in their subnet (so the runner reaches
/// them), and per node a namespace with a veth to the bridge. Removed on drop.
struct Nodes {
    bridge: String,
    names: Vec<String>,
    addrs: Vec<String>,
}

impl Nodes {
    fn create(n: usize) -> Self {
        // Names of this process's own, short enough for interface names (15 bytes).
        let tag = std::process::id() % 100_000;
        let subnet = 100 + (tag % 100);
        let nodes = Self {
            bridge: format!("tb{tag}"),
            names: (0..n).map(|i| format!("tandem-it-{tag}-{i}")).collect(),
            addrs: (0..n).map(|i| format!("10.213.{subnet}.{}", i + 1)).collect(),
        };
        ip(&["link", "add", &nodes.bridge, "type", "bridge"]);
        ip(&["addr", "add", &format!("10.213.{subnet}.254/24"), "dev", &nodes.bridge]);
        ip(&["link", "set", &nodes.bridge, "up"]);
        for (i, (name, addr)) in nodes.names.iter().zip(&nodes.addrs).enumerate() {
            let host_end = nodes.veth(i);
            ip(&["netns", "add", name]);
            ip(&["link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns", name]);
            ip(&["link", "set", &host_end, "master", &nodes.bridge, "up"]);
            ip(&["-n", name, "addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
            ip(&["-n", name, "link", "set", "eth0", "up"]);
            ip(&["-n", name, "link", "set", "lo", "up"]);
        }
        nodes
    }

    /// The bridge's end of node `i`'s link.
    fn veth(&self, i: usize) -> String {
        format!("{}v{i}", self.bridge)
    }

    /// `--node` arguments for every node.
    fn args(&self) -> Vec<String> {
        self.names
            .iter()
            .zip(&self.addrs)
            .flat_map(|(n, a)| ["--node".to_owned(), format!("{n}={a}")])
            .collect()
    }

    /// Bytes node `i`'s link has carried, both directions.
    fn bytes(&self, i: usize) -> u64 {
        ["rx_bytes", "tx_bytes"]
            .iter()
            .map(|c| {
                let path = format!("/sys/class/net/{}/statistics/{c}", self.veth(i));
                std::fs::read_to_string(&path).unwrap().trim().parse::<u64>().unwrap()
            })
            .sum()
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).status();
    }
}

/// The MLP of examples/mnist-hybrid.yaml on the digits, one PS and one group of two tcp ranks.
fn hybrid_job(dir: &std::path::Path, steps: u64) -> std::path::PathBuf {
    manifest(dir, "mnist-hybrid.yaml", |doc| {
        set(doc, &["spec", "data"], serde_yaml::from_str("{source: digits, batchSize: 32}").unwrap());
        set(doc, &["spec", "model"], serde_yaml::from_str("{kind: mlp, hidden: [32]}").unwrap());
        set(doc, &["spec", "training", "steps"], steps.into());
        set(doc, &["spec", "parameterServers"], serde_yaml::from_str("{replicas: 1}").unwrap());
        set(
            doc,
            &["spec", "workers"],
            serde_yaml::from_str("{groups: 1, groupSize: 2, minGroups: 1, maxGroups: 1, backend: tcp}")
                .unwrap(),
        );
    })
}

fn run_on(nodes: &Nodes, job: &std::path::Path, out: &std::path::Path) -> Run {
    let args = nodes.args();
    train(job, out, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn each_process_runs_on_its_node_and_the_jobs_traffic_crosses_the_links() {
    let _one = one_job_at_a_time();
    let nodes = Nodes::create(3);
    let dir = tempfile::tempdir().unwrap();
    let steps = 60;
    let job = hybrid_job(dir.path(), steps);
    let before: Vec<u64> = (0..3).map(|i| nodes.bytes(i)).collect();
    let run = run_on(&nodes, &job, &dir.path().join("out"));
    assert!(run.success, "stderr:\n{}", run.stderr);
    let finished = run.finished();
    assert!(finished["test_accuracy"].as_f64().unwrap() > 0.8, "{finished}");

    // The launch contract names each process at its node: the PS on the first, the ranks next.
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("out/job.json")).unwrap()).unwrap();
    let text = config.to_string();
    for (addr, port) in nodes.addrs.iter().zip(20_000..) {
        assert!(text.contains(addr.as_str()) && text.contains(&port.to_string()), "{addr}:{port} in {text}");
    }

    // Every step's gradients and weights went over the veths: the PS node's link carried at least
    // a pull of the model per step. Rank 1's link carried, per step, its half of the model to the
    // PS and back (params/2 values each way), and its part of the group's reduce-scatter of the
    // gradient and allgather of the weights (params/2 values sent and as many received in each):
    // 3 × params values sent plus received, 12 bytes per value of the model. Shared memory between
    // the two ranks would leave the PS's 4 bytes only, and loopback nothing at all.
    let params: u64 = 64 * 32 + 32 + 32 * 10 + 10;
    let carried: Vec<u64> = (0..3).map(|i| nodes.bytes(i) - before[i]).collect();
    assert!(carried[0] >= steps * params * 4, "PS node carried {} bytes: {carried:?}", carried[0]);
    assert!(carried[2] >= steps * params * 10, "rank 1's node carried {} bytes: {carried:?}", carried[2]);
}

#[test]
fn a_node_that_does_not_exist_is_refused_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let job = hybrid_job(dir.path(), 10);
    let out = dir.path().join("out");
    let run = train(&job, &out, &["--node", "tandem-it-no-such-node=10.213.99.1"]);
    assert!(!run.success);
    assert!(
        run.stderr.contains("no network namespace `tandem-it-no-such-node`")
            && run.stderr.contains("ip netns add"),
        "{}",
        run.stderr
    );
    assert!(!out.join("job.json").exists(), "nothing was started");
}

/// A user's own code on the nodes: the plain PyTorch DDP example (`examples/pytorch/`, real
/// PyTorch over gloo), one group of two ranks, each rank inside its own node's namespace, so the
/// group's allreduce crosses the links as between two pods.
#[test]
fn a_users_ddp_script_runs_a_rank_per_node_and_its_allreduce_crosses_the_links() {
    let torch = Command::new("/usr/bin/python3").args(["-c", "import torch, numpy"]).status();
    assert!(
        torch.is_ok_and(|s| s.success()),
        "/usr/bin/python3 cannot import torch: run scripts/install-deps.sh (Debian's python3-torch)"
    );
    assert!(data_dir().join("fashion-mnist/train-images-idx3-ubyte.gz").exists(), "run `make data`");
    let _one = one_job_at_a_time();
    let nodes = Nodes::create(2);
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(repo().join("examples/pytorch/train.py"), dir.path().join("train.py")).unwrap();
    let mut doc = example_yaml("pytorch/job.yaml");
    set(&mut doc, &["spec", "workers", "groups"], 1.into());
    // The rank's contract first, then the example itself.
    let command =
        r#"[sh, -c, "env | grep -E '^(MASTER_ADDR|TANDEM_BIND|LOCAL_RANK)='; exec python3 train.py"]"#;
    set(&mut doc, &["spec", "workers", "command"], serde_yaml::from_str(command).unwrap());
    let steps = 200;
    set(&mut doc, &["spec", "training", "steps"], steps.into());
    let job = dir.path().join("job.yaml");
    std::fs::write(&job, serde_yaml::to_string(&doc).unwrap()).unwrap();
    let before: Vec<u64> = (0..2).map(|i| nodes.bytes(i)).collect();
    // `python3` in the example's command is Debian's, which sees python3-torch.
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    let out = dir.path().join("out");
    let args = nodes.args();
    let output = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["train", "--output", "json", "-f"])
        .arg(&job)
        .arg("--output-dir")
        .arg(&out)
        .arg("--data-dir")
        .arg(data_dir())
        .args(&args)
        .env("PATH", path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "stderr:\n{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let finished: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(finished["event"], "finished", "{stdout}");
    assert!(finished["test_accuracy"].as_f64().unwrap() >= 0.75, "{finished}");

    // Each rank bound its node's address (rank 0's is MASTER_ADDR) and saw itself as the only
    // rank on its host, as in a pod.
    for (rank, addr) in nodes.addrs.iter().enumerate() {
        let log = std::fs::read_to_string(out.join(format!("logs/worker-0-{rank}.0.log"))).unwrap();
        assert!(log.contains(&format!("MASTER_ADDR={}", nodes.addrs[0])), "rank {rank}'s log:\n{log}");
        assert!(log.contains(&format!("TANDEM_BIND={addr}")) && log.contains("LOCAL_RANK=0"), "{log}");
    }
    // Every step's gradient went over the veths: a two-rank ring allreduce sends and receives the
    // whole gradient (101,770 values of 4 bytes) per step; loopback would leave the links idle.
    let params: u64 = 784 * 128 + 128 + 128 * 10 + 10;
    let carried: Vec<u64> = (0..2).map(|i| nodes.bytes(i) - before[i]).collect();
    for (rank, bytes) in carried.iter().enumerate() {
        assert!(*bytes >= steps * params * 4, "rank {rank}'s node carried {bytes} bytes: {carried:?}");
    }
}
