//! `tandem bench …`, and the hidden `tandem comm-rank` that runs one rank of a collective self-test,
//! soak or benchmark (started by `tandem bench allreduce`, by tests, or by mpirun).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::Failure;
use anyhow::{Context, bail};
use tandem_api::contract::Endpoint;
use tandem_comm::algo::{AlgoConfig, AllreduceAlgo};
use tandem_comm::selftest::{self, BenchRecord};
use tandem_comm::shm::ShmConfig;
use tandem_comm::tcp::{self, TcpConfig};
use tandem_comm::{Communicator, kernel};

/// Benchmarks.
#[derive(clap::Subcommand)]
pub enum Bench {
    /// Allreduce bandwidth and latency (nccl-tests' algbw and busbw), ranks started on this machine.
    Allreduce(AllreduceArgs),
}

/// Which collective backend.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Tandem's built-in TCP collectives.
    Tcp,
    /// OpenMPI through rsmpi, ranks started by mpirun (OMPI_MCA_* variables pass through).
    Mpi,
}

/// Output format.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// A table.
    Text,
    /// One JSON object per size.
    Json,
}

/// Arguments of `tandem bench allreduce`.
#[derive(clap::Args)]
pub struct AllreduceArgs {
    /// Backend to measure.
    #[arg(long, value_enum, default_value = "tcp")]
    pub backend: Backend,
    /// Number of ranks (processes) to start.
    #[arg(long, default_value_t = 2)]
    pub ranks: usize,
    /// Message sizes in bytes, comma-separated; suffixes K, M, G (powers of 1024) are accepted.
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes, default_value = "4K,64K,1M,16M")]
    pub bytes: Vec<usize>,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
    /// tcp: lay the ranks out over this many simulated hosts (consecutive ranks share one; `0`:
    /// the real host identity, so every local rank shares this machine).
    #[arg(long, default_value_t = 0)]
    pub hosts: usize,
    #[command(flatten)]
    pub tuning: Tuning,
}

/// Settings of the `tcp` backend (defaults: [`TcpConfig::default`]).
#[derive(clap::Args, Clone, Debug)]
pub struct Tuning {
    /// tcp: from 3 ranks, allreduce up to this many bytes by recursive doubling.
    #[arg(long, value_parser = parse_bytes)]
    pub small_bytes: Option<usize>,
    /// tcp: at 2 ranks, allreduce up to this many bytes by the direct exchange, above by the ring.
    #[arg(long, value_parser = parse_bytes)]
    pub pair_bytes: Option<usize>,
    /// tcp: from 3 ranks, allreduce up to this many bytes by Rabenseifner, above by the ring.
    #[arg(long, value_parser = parse_bytes)]
    pub halving_bytes: Option<usize>,
    /// tcp: one allreduce algorithm for every size instead of the decision table: rd (recursive
    /// doubling, the direct exchange at 2 ranks), rabenseifner or ring.
    #[arg(long, value_parser = parse_algo)]
    pub algo: Option<AllreduceAlgo>,
    /// tcp: pipelining chunk in bytes.
    #[arg(long, value_parser = parse_bytes)]
    pub chunk_bytes: Option<usize>,
    /// tcp: SO_SNDBUF/SO_RCVBUF of the data connections (0: the kernel's autotuning).
    #[arg(long, value_parser = parse_bytes)]
    pub socket_buffer: Option<usize>,
    /// tcp: shared memory between ranks on one host (on), or TCP between every rank (off).
    #[arg(long, value_enum, default_value = "on")]
    pub shm: Switch,
    /// tcp: bytes per shared-memory slot (a multiple of 64).
    #[arg(long, value_parser = parse_bytes)]
    pub shm_slot_bytes: Option<usize>,
    /// tcp: shared-memory slots per rank.
    #[arg(long)]
    pub shm_slots: Option<usize>,
    /// tcp: microseconds a waiting rank spins on shared memory before it sleeps.
    #[arg(long)]
    pub shm_spin_us: Option<u64>,
    /// tcp: seconds without progress before a peer is probed and declared failed.
    #[arg(long, default_value_t = 60.0)]
    pub timeout_s: f64,
}

/// On or off.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Switch {
    /// On.
    On,
    /// Off.
    Off,
}

fn parse_algo(text: &str) -> Result<AllreduceAlgo, String> {
    AllreduceAlgo::parse(text)
        .ok_or_else(|| format!("{text:?} is not an algorithm: use rd, rabenseifner or ring"))
}

impl Tuning {
    /// The `tcp` configuration these settings describe.
    pub fn config(&self, connect_timeout: Duration, host: Option<String>) -> TcpConfig {
        let defaults = TcpConfig::default();
        let algo = AlgoConfig {
            small_bytes: self.small_bytes.unwrap_or(defaults.algo.small_bytes),
            pair_bytes: self.pair_bytes.unwrap_or(defaults.algo.pair_bytes),
            halving_bytes: self.halving_bytes.unwrap_or(defaults.algo.halving_bytes),
            force: self.algo,
        };
        let shm_defaults = ShmConfig::default();
        let shm = ShmConfig {
            enabled: self.shm == Switch::On,
            slot_bytes: self.shm_slot_bytes.unwrap_or(shm_defaults.slot_bytes),
            slots: self.shm_slots.unwrap_or(shm_defaults.slots),
            spin: self.shm_spin_us.map_or(shm_defaults.spin, Duration::from_micros),
            ..shm_defaults
        };
        TcpConfig {
            timeout: Duration::from_secs_f64(self.timeout_s),
            connect_timeout,
            chunk_bytes: self.chunk_bytes.unwrap_or(defaults.chunk_bytes),
            socket_buffer_bytes: self.socket_buffer.unwrap_or(defaults.socket_buffer_bytes),
            algo,
            shm,
            host,
        }
    }

    /// The same settings as `comm-rank` arguments.
    fn args(&self) -> Vec<String> {
        let mut a = Vec::new();
        let mut push = |flag: &str, v: Option<String>| {
            if let Some(v) = v {
                a.push(format!("--{flag}"));
                a.push(v);
            }
        };
        push("small-bytes", self.small_bytes.map(|v| v.to_string()));
        push("pair-bytes", self.pair_bytes.map(|v| v.to_string()));
        push("halving-bytes", self.halving_bytes.map(|v| v.to_string()));
        push(
            "algo",
            self.algo.map(|v| match v {
                AllreduceAlgo::RecursiveDoubling => "rd".to_owned(),
                AllreduceAlgo::Rabenseifner => "rabenseifner".to_owned(),
                AllreduceAlgo::Ring => "ring".to_owned(),
            }),
        );
        push("chunk-bytes", self.chunk_bytes.map(|v| v.to_string()));
        push("socket-buffer", self.socket_buffer.map(|v| v.to_string()));
        push("shm", Some(if self.shm == Switch::On { "on" } else { "off" }.to_owned()));
        push("shm-slot-bytes", self.shm_slot_bytes.map(|v| v.to_string()));
        push("shm-slots", self.shm_slots.map(|v| v.to_string()));
        push("shm-spin-us", self.shm_spin_us.map(|v| v.to_string()));
        push("timeout-s", Some(self.timeout_s.to_string()));
        a
    }
}

/// Parses `4096`, `4K`, `4KiB`, `1M`, `256MiB`, `1G`.
pub fn parse_bytes(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: usize =
        digits.parse().map_err(|_| format!("{text:?} is not a byte count such as 4096, 64K or 1M"))?;
    let scale = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("{text:?} has an unknown unit {unit:?}; use K, M or G")),
    };
    n.checked_mul(scale).ok_or_else(|| format!("{text:?} is too large"))
}

/// Runs a benchmark.
pub fn run(bench: Bench) -> anyhow::Result<()> {
    match bench {
        Bench::Allreduce(args) => allreduce(args),
    }
}

fn allreduce(args: AllreduceArgs) -> anyhow::Result<()> {
    if args.ranks == 0 {
        bail!("--ranks must be at least 1");
    }
    if args.bytes.iter().any(|&b| b < 4) {
        bail!("every --bytes size must hold at least one f32 (4 bytes)");
    }
    if args.hosts > args.ranks {
        bail!("--hosts {} exceeds --ranks {}: every simulated host needs a rank", args.hosts, args.ranks);
    }
    let sizes = args.bytes.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",");
    let exe = std::env::current_exe().context("cannot find the tandem executable to start ranks")?;
    // The ceiling every transport on one machine copies against, measured in this run.
    let memcpy = memcpy_gbps();
    let records = match args.backend {
        Backend::Tcp => {
            let ranks =
                TcpRanks::start(&exe, args.ranks, args.hosts, &args.tuning, &["bench", "--bytes", &sizes])?;
            ranks.wait_for_output()?
        }
        Backend::Mpi => {
            let mut cmd = mpirun(&exe, args.ranks);
            cmd.args(["--backend", "mpi", "bench", "--bytes", &sizes]);
            let out = cmd.output().context("cannot run mpirun; is OpenMPI installed (make deps)?")?;
            if !out.status.success() {
                bail!(
                    "mpirun failed ({}):\n{}{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    };
    let records: Vec<BenchRecord> = records
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<serde_json::Value>(l).map(|v| record_from(&v, memcpy)))
        .collect::<Result<_, _>>()
        .context("a rank printed a malformed benchmark record")?;
    if records.len() != args.bytes.len() {
        bail!("expected {} benchmark records from rank 0, got {}", args.bytes.len(), records.len());
    }
    match args.output {
        Output::Json => {
            for r in &records {
                println!("{}", serde_json::to_string(r)?);
            }
        }
        Output::Text => {
            println!(
                "# allreduce, backend {}, {} ranks (busbw = algbw·2(n−1)/n; memcpy {memcpy:.2} GB/s on one core, \
                 reduction kernels: {})",
                records.first().map_or("?", |r| r.backend.as_str()),
                args.ranks,
                kernel::Isa::detected()
            );
            println!(
                "{:>12} {:>12} {:>12} {:>12} {:>10}",
                "bytes", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "÷memcpy"
            );
            for r in &records {
                println!(
                    "{:>12} {:>12.1} {:>12.3} {:>12.3} {:>10.3}",
                    r.bytes,
                    r.latency_us,
                    r.algbw_gbps,
                    r.busbw_gbps,
                    r.busbw_gbps / r.memcpy_gbps
                );
            }
        }
    }
    Ok(())
}

fn record_from(v: &serde_json::Value, memcpy_gbps: f64) -> BenchRecord {
    let f = |k: &str| v.get(k).and_then(serde_json::Value::as_f64).unwrap_or(f64::NAN);
    BenchRecord {
        backend: v.get("backend").and_then(|b| b.as_str()).unwrap_or("?").to_owned(),
        ranks: f("ranks") as usize,
        bytes: f("bytes") as usize,
        algbw_gbps: f("algbw_gbps"),
        busbw_gbps: f("busbw_gbps"),
        latency_us: f("latency_us"),
        memcpy_gbps,
    }
}

/// One core's memcpy bandwidth on a 256 MiB buffer (out of every cache), best of five, in GB/s.
pub fn memcpy_gbps() -> f64 {
    let len = 256 << 20;
    let src = vec![1u8; len];
    let mut dst = vec![0u8; len];
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = std::time::Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        best = best.min(start.elapsed().as_secs_f64());
        std::hint::black_box(&mut dst);
    }
    len as f64 / best / 1e9
}

/// `mpirun` for `ranks` copies of `exe comm-rank`, as root and oversubscribed where needed.
pub fn mpirun(exe: &Path, ranks: usize) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", &ranks.to_string()]);
    cmd.arg(exe).arg("comm-rank");
    cmd
}

/// Ranks of the `tcp` backend started as local processes on loopback.
struct TcpRanks {
    children: Vec<Child>,
    token_file: PathBuf,
}

impl TcpRanks {
    /// Starts `ranks` ranks; with `hosts > 0`, consecutive ranks are told they share one of `hosts`
    /// simulated hosts.
    fn start(exe: &Path, ranks: usize, hosts: usize, tuning: &Tuning, mode: &[&str]) -> anyhow::Result<Self> {
        let ports = tandem_util::proc::free_ports(ranks).context("no free port on 127.0.0.1")?;
        let peers = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
        let token_file = std::env::temp_dir().join(format!("tandem-bench-{}.token", std::process::id()));
        let token = format!("{:x}{:x}", std::process::id(), ports[0]);
        std::fs::write(&token_file, token)
            .with_context(|| format!("cannot write {}", token_file.display()))?;
        let mut this = Self { children: Vec::new(), token_file };
        for rank in 0..ranks {
            let mut cmd = Command::new(exe);
            cmd.arg("comm-rank")
                .args(["--backend", "tcp", "--rank", &rank.to_string(), "--peers", &peers])
                .arg("--token-file")
                .arg(&this.token_file)
                .args(tuning.args());
            if hosts > 0 {
                cmd.args(["--host-id", &format!("host{}", rank * hosts / ranks)]);
            }
            cmd.args(mode).stdout(if rank == 0 { Stdio::piped() } else { Stdio::null() });
            this.children.push(cmd.spawn().with_context(|| format!("cannot start rank {rank}"))?);
        }
        Ok(this)
    }

    fn wait_for_output(mut self) -> anyhow::Result<String> {
        let mut text = String::new();
        if let Some(stdout) = self.children[0].stdout.take() {
            for line in BufReader::new(stdout).lines() {
                text.push_str(&line?);
                text.push('\n');
            }
        }
        let mut failed = Vec::new();
        for (rank, child) in self.children.iter_mut().enumerate() {
            let status = child.wait()?;
            if !status.success() {
                failed.push(format!("rank {rank} {status}"));
            }
        }
        if !failed.is_empty() {
            bail!("ranks failed: {} (their errors are above)", failed.join(", "));
        }
        Ok(text)
    }
}

impl Drop for TcpRanks {
    fn drop(&mut self) {
        for child in &mut self.children {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_file(&self.token_file);
    }
}

/// Arguments of the hidden `tandem comm-rank`.
#[derive(clap::Args)]
pub struct RankArgs {
    /// Backend.
    #[arg(long, value_enum)]
    pub backend: Backend,
    /// tcp: this rank.
    #[arg(long, default_value_t = 0)]
    pub rank: usize,
    /// tcp: every rank's endpoint in rank order, `host:port,…`.
    #[arg(long, value_delimiter = ',')]
    pub peers: Vec<String>,
    /// tcp: address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: String,
    /// tcp: file holding the job token.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// tcp: seconds to wait for every peer to connect.
    #[arg(long, default_value_t = 120.0)]
    pub connect_timeout_s: f64,
    /// tcp: this rank's host identity instead of the detected one: ranks given the same string
    /// count as one host (tests and benchmarks that simulate several hosts on one machine).
    #[arg(long)]
    pub host_id: Option<String>,
    #[command(flatten)]
    pub tuning: Tuning,
    /// What to run.
    #[command(subcommand)]
    pub mode: RankMode,
}

/// What one rank runs.
#[derive(clap::Subcommand)]
pub enum RankMode {
    /// Every collective against the serial reference, and fused against per-tensor allreduce.
    Selftest {
        /// mpi: also split the world by rank parity and test the halves.
        #[arg(long)]
        split: bool,
    },
    /// Allreduce a buffer repeatedly, printing `iteration N` after each.
    Soak {
        /// Elements per allreduce.
        #[arg(long)]
        len: usize,
        /// Number of allreduces.
        #[arg(long)]
        iterations: usize,
    },
    /// Time allreduce-sum per size; rank 0 prints one JSON record per size.
    Bench {
        /// Sizes in bytes.
        #[arg(long, value_delimiter = ',', value_parser = parse_bytes)]
        bytes: Vec<usize>,
    },
}

fn parse_endpoint(text: &str) -> anyhow::Result<Endpoint> {
    let (host, port) = text.rsplit_once(':').with_context(|| format!("peer {text:?} is not host:port"))?;
    let port = port.parse().with_context(|| format!("peer {text:?} has an invalid port"))?;
    Ok(Endpoint::new(host, port))
}

/// Runs one rank. A rank whose group lost a peer exits with
/// [`tandem_api::ExitClass::PeerLost`]'s code (as `tandem worker` does), any other failure with 1.
pub fn run_rank(args: RankArgs) -> anyhow::Result<()> {
    super::init_logging();
    super::finish(run_rank_inner(args))
}

fn run_rank_inner(args: RankArgs) -> Result<(), Failure> {
    match args.backend {
        Backend::Tcp => {
            let peers = args.peers.iter().map(|p| parse_endpoint(p)).collect::<anyhow::Result<Vec<_>>>()?;
            let token_file =
                args.token_file.as_ref().context("--token-file is required with --backend tcp")?;
            let token = std::fs::read(token_file)
                .with_context(|| format!("cannot read the job token from {}", token_file.display()))?;
            let config =
                args.tuning.config(Duration::from_secs_f64(args.connect_timeout_s), args.host_id.clone());
            let trimmed = token.trim_ascii();
            let mut comm = tcp::connect(args.rank, &peers, &args.bind, trimmed, config).map_err(|e| {
                Failure::new(
                    e.exit_class(),
                    anyhow::Error::new(e).context(format!("rank {} could not join the group", args.rank)),
                )
            })?;
            run_mode(&mut comm, &args.mode)
        }
        Backend::Mpi => run_mpi(&args.mode),
    }
}

#[cfg(feature = "mpi")]
fn run_mpi(mode: &RankMode) -> Result<(), Failure> {
    use tandem_comm::mpi::MpiRuntime;
    let runtime = MpiRuntime::init().map_err(anyhow::Error::from)?;
    let mut world = runtime.world();
    if let RankMode::Selftest { split: true } = mode {
        let rank = world.rank();
        let mut half = world.split((rank % 2) as u32, rank as i32).map_err(anyhow::Error::from)?;
        let checks = selftest::run_selftest(&mut half).map_err(|e| {
            let context = format!("split group {} (world rank {rank})", rank % 2);
            Failure::new(e.exit_class(), anyhow::Error::new(e).context(context))
        })?;
        println!("rank {rank}: split group {} selftest passed: {checks} checks", rank % 2);
    }
    if let RankMode::Bench { bytes } = mode {
        // MPI_Allreduce out of place, as osu_allreduce measures it.
        let timed = runtime.world();
        let out_of_place = |send: &[f32], recv: &mut [f32]| timed.allreduce_out_of_place(send, recv);
        selftest::run_bench(&mut world, bytes, Some(&out_of_place)).map_err(anyhow::Error::from)?;
        return Ok(());
    }
    run_mode(&mut world, mode)
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_mode: &RankMode) -> Result<(), Failure> {
    Err(anyhow::anyhow!("this tandem was built without the `mpi` feature; rebuild with default features")
        .into())
}

fn run_mode(comm: &mut dyn Communicator, mode: &RankMode) -> Result<(), Failure> {
    let rank = comm.rank();
    let comm_failure = |e: tandem_comm::CommError| Failure::new(e.exit_class(), e);
    match mode {
        RankMode::Selftest { .. } => {
            let checks = selftest::run_selftest(comm).map_err(|e| Failure::new(e.exit_class(), e))?;
            println!("rank {rank}: selftest passed: {checks} checks");
        }
        RankMode::Soak { len, iterations } => {
            selftest::run_soak(comm, *len, *iterations).map_err(comm_failure)?
        }
        RankMode::Bench { bytes } => {
            selftest::run_bench(comm, bytes, None).map_err(comm_failure)?;
        }
    }
    Ok(())
}
