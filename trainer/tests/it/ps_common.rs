//! Shared by the `ps_*` tests: a job folder with the launch contract, and real `tandem ps`
//! processes on loopback.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tandem_api::contract::{Endpoint, GroupTopology, JobConfig, LaunchEnv, Role};
use tandem_ps::client::{ClientConfig, PsClient};

pub const TOKEN: &str = "ps-test-token-7f3a";

/// `n` distinct free loopback endpoints ([`tandem_util::proc::free_ports`]).
pub fn loopback_endpoints(n: usize) -> Vec<Endpoint> {
    let ports = tandem_util::proc::free_ports(n).unwrap();
    ports.into_iter().map(|port| Endpoint::new("127.0.0.1", port)).collect()
}

/// A job folder: config, token, outputs.
pub struct Job {
    pub dir: tempfile::TempDir,
    pub replicas: usize,
}

impl Job {
    /// A job whose PS runs `algorithm` with plain SGD at rate 1 (updates subtract the gradient).
    pub fn new(algorithm: &str, staleness: u32, replicas: usize, checkpoint_every: u64) -> Self {
        Self::with_spec(Self::spec(algorithm, staleness, replicas, checkpoint_every))
    }

    /// [`Job::new`] whose groups have `group_size` ranks: the servers refuse a rank beyond it.
    pub fn with_group_size(
        algorithm: &str,
        staleness: u32,
        replicas: usize,
        checkpoint_every: u64,
        group_size: u32,
    ) -> Self {
        let mut spec = Self::spec(algorithm, staleness, replicas, checkpoint_every);
        spec["workers"] = serde_json::json!({"groupSize": group_size});
        Self::with_spec(spec)
    }

    fn spec(algorithm: &str, staleness: u32, replicas: usize, checkpoint_every: u64) -> serde_json::Value {
        serde_json::json!({
            "training": {
                "algorithm": algorithm,
                "steps": 1000,
                "staleness": staleness,
                "optimizer": {"kind": "sgd", "learningRate": 1.0},
                "easgd": {"alpha": 0.5, "tau": 1},
                "checkpoint": {"everySteps": checkpoint_every}
            },
            "parameterServers": {"replicas": replicas}
        })
    }

    /// A job with the given TrainingJob spec (JSON).
    pub fn with_spec(spec: serde_json::Value) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let replicas = spec["parameterServers"]["replicas"].as_u64().unwrap() as usize;
        let config = serde_json::json!({
            "jobName": "ps-test",
            "namespace": "local",
            "spec": spec,
            // Ports come from `--port 0`; the list gives the number of shards.
            "parameterServers": (0..replicas).map(|_| serde_json::json!({"host": "127.0.0.1", "port": 0})).collect::<Vec<_>>(),
            "groups": []
        });
        let parsed = JobConfig::from_json(&config.to_string()).unwrap();
        assert_eq!(parsed.parameter_servers, vec![Endpoint::new("127.0.0.1", 0); replicas]);
        std::fs::write(dir.path().join("job.json"), parsed.to_json()).unwrap();
        std::fs::write(dir.path().join("token"), format!("{TOKEN}\n")).unwrap();
        Self { dir, replicas }
    }

    pub fn output(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    /// The launch contract of `role` in attempt `attempt` of this job, bound to 127.0.0.1.
    pub fn launch(&self, role: Role, attempt: u32) -> LaunchEnv {
        LaunchEnv {
            role,
            config: self.dir.path().join("job.json"),
            token_file: self.dir.path().join("token"),
            bind: "127.0.0.1".into(),
            output: self.output(),
            attempt,
        }
    }

    /// The launch contract of PS shard `index` of this job, bound to 127.0.0.1.
    pub fn ps_launch(&self, index: u32) -> LaunchEnv {
        self.launch(Role::Ps { index }, 0)
    }

    /// Starts `tandem ps` for shard `index` on `port` (0: a free port below the kernel's ephemeral
    /// range, so that no outgoing connection takes it while a test restarts the PS there) and
    /// waits until it listens.
    pub fn spawn_ps(&self, index: u32, port: u16) -> PsProcess {
        if port != 0 {
            return self.try_spawn_ps(index, port).unwrap_or_else(|e| panic!("{e}"));
        }
        // Another test may take the chosen port before this PS binds it: try another then.
        let mut last = String::new();
        for _ in 0..3 {
            let port = tandem_util::proc::free_ports(1).unwrap()[0];
            match self.try_spawn_ps(index, port) {
                Ok(ps) => return ps,
                Err(e) => last = e,
            }
        }
        panic!("{last}")
    }

    fn try_spawn_ps(&self, index: u32, port: u16) -> Result<PsProcess, String> {
        let env = self.ps_launch(index);
        let log = self.dir.path().join(format!("ps-{index}-{}.log", Instant::now().elapsed().as_nanos()));
        let log = unique(log);
        let mut child = Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(["ps", "--port", &port.to_string(), "--hello-timeout", "5"])
            .envs(env.to_vars())
            .env("RUST_LOG", "info")
            // A free port each: tests run in parallel, and none may take another's endpoint.
            .env(tandem_api::contract::env::STATUS_PORT, "0")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let Some(addr) = line.trim().strip_prefix("listening on ") else {
            let _ = child.wait();
            return Err(format!(
                "tandem ps did not start on port {port}: {line:?}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ));
        };
        Ok(PsProcess { child: Some(child), addr: addr.to_owned(), log })
    }

    /// Rewrites the job config with the real PS addresses and each group's collective endpoints.
    pub fn write_topology(&self, ps: &[PsProcess], groups: &[Vec<Endpoint>]) {
        let path = self.dir.path().join("job.json");
        let mut job = JobConfig::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap();
        job.parameter_servers = ps.iter().map(|p| Endpoint::new("127.0.0.1", p.port())).collect();
        job.groups = groups
            .iter()
            .enumerate()
            .map(|(i, peers)| GroupTopology { index: i as u32, peers: peers.clone() })
            .collect();
        std::fs::write(&path, job.to_json()).unwrap();
    }

    /// Starts `tandem worker` for rank `rank` of group `group`; stdout is piped.
    pub fn spawn_worker(&self, group: u32, rank: u32) -> Child {
        let env = self.launch(Role::Worker { group, rank }, 0);
        let log = unique(self.dir.path().join(format!("worker-{group}-{rank}.log")));
        Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(["worker", "--device", "cpu"])
            .envs(env.to_vars())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap()
    }

    pub fn worker(&self, servers: &[String], group: u32, rank: u32, total: u64) -> PsClient {
        PsClient::connect(worker_config(servers, group, rank, 0, total)).unwrap()
    }

    pub fn observer(&self, servers: &[String]) -> PsClient {
        PsClient::connect(ClientConfig::observer(servers.to_vec(), TOKEN)).unwrap()
    }
}

fn unique(path: PathBuf) -> PathBuf {
    let mut p = path.clone();
    let mut n = 0;
    while p.exists() {
        n += 1;
        p = path.with_extension(format!("{n}.log"));
    }
    p
}

pub fn worker_config(servers: &[String], group: u32, rank: u32, attempt: u32, total: u64) -> ClientConfig {
    let mut c = ClientConfig::worker(servers.to_vec(), TOKEN, group, rank, attempt, total);
    // The run of every job these tests write (`training.steps: 1000`), in any mode.
    c.total_steps = 1000;
    c.request_timeout = Duration::from_secs(120);
    c.connect_timeout = Duration::from_secs(60);
    c
}

/// A running `tandem ps`; killed when dropped.
pub struct PsProcess {
    child: Option<Child>,
    pub addr: String,
    pub log: PathBuf,
}

impl PsProcess {
    pub fn port(&self) -> u16 {
        self.addr.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Resident memory of the process, in bytes (`VmRSS` of `/proc/<pid>/status`).
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid().unwrap())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then waits for the exit (after its last checkpoint, with the retryable code).
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().unwrap();
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        c.wait().unwrap()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PsProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn addrs(ps: &[PsProcess]) -> Vec<String> {
    ps.iter().map(|p| p.addr.clone()).collect()
}

/// Polls `check` until it holds; fails with `what` after a generous deadline (machine load is high).
pub fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn exists(p: &Path) -> bool {
    p.exists()
}
