//! `tandem ps`: one parameter-server replica, configured by the launch contract.
//!
//! Reads the role, config and token from the environment ([`tandem_api::LaunchEnv`]), serves
//! its shard on `TANDEM_BIND` and the job config's port for it, keeps checkpoints under
//! `$TANDEM_OUTPUT/ps-<index>/` stamped with the job's identity, resumes from the newest intact
//! one of this job (refusing to start on another job's), and stops on SIGTERM or Ctrl-C after
//! writing a last checkpoint, exiting with [`ExitClass::Preempted`] (retryable: a PS that was
//! evicted or preempted is restarted and resumes from that checkpoint). Prints `listening on
//! <addr>` on stdout once bound.
//!
//! It also serves the HTTP status endpoint ([`tandem::ps::server::http`]) on `TANDEM_BIND` and
//! `TANDEM_STATUS_PORT` (default [`tandem_api::contract::STATUS_PORT`]; `0` any free port, `off`
//! none) and then prints `status on <addr>`, or `status off` when it serves none. An endpoint that
//! cannot bind is logged and left out: the shard trains on without it. Where
//! `TANDEM_METRICS_PORT` is set it serves Prometheus metrics there without the token
//! ([`tandem_util::metrics`]), likewise left out if the port cannot be bound.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, bail};
use tandem::ps::server::checkpoint;
use tandem::ps::server::http::StatusListener;
use tandem::ps::server::state::{JobBounds, ShardConfig};
use tandem::ps::server::{Server, ServerConfig};
use tandem_api::contract::{self, Role};
use tandem_api::{ExitClass, PsMode};

/// Arguments of `tandem ps`.
#[derive(clap::Args)]
pub struct Args {
    /// Port to listen on instead of the job config's port for this shard (0: any free port).
    #[arg(long)]
    pub port: Option<u16>,
    /// Seconds a new connection has, from its accept, to prove the job token in its hello.
    #[arg(long, default_value_t = 10)]
    pub hello_timeout: u64,
}

/// Runs `tandem ps`.
pub fn run(args: Args) -> anyhow::Result<()> {
    super::init_logging();

    let super::Contract { env, job, token } = super::load_contract()?;
    let Role::Ps { index } = env.role else {
        bail!("`tandem ps` runs a parameter server, but TANDEM_ROLE says this process is {}", env.role);
    };
    let replicas = job.parameter_servers.len() as u32;
    let Some(endpoint) = job.parameter_servers.get(index as usize) else {
        bail!("this is PS {index}, but the job config lists {replicas} parameter servers");
    };
    let training = &job.spec.training;
    let Some(mode) = PsMode::of(training) else {
        bail!("algorithm {:?} uses no parameter server; do not start `tandem ps` for it", training.algorithm);
    };
    let shard = ShardConfig {
        index,
        replicas,
        mode,
        token,
        checkpoint_every: training.checkpoint.every_steps,
        optimizer: training.optimizer.clone(),
        max_total_len: max_total_len(&job.spec, replicas),
        groups: job.spec.workers.groups,
        bounds: JobBounds {
            max_groups: job.spec.workers.max_groups.max(job.spec.workers.groups),
            group_size: job.spec.workers.group_size,
            steps: training.steps,
        },
    };
    let mut config = ServerConfig::new(shard);
    let job_identity = checkpoint::JobIdentity::of(&job);
    let mirror = tandem_compute::mirror::Mirror::of(&job.spec, &job.job_name, &env.output);
    config.checkpoints = Some(
        checkpoint::Store::open(env.output.join(format!("ps-{index}")), index, job_identity)?
            .mirrored(mirror)?,
    );
    config.hello_timeout = Duration::from_secs(args.hello_timeout.max(1));
    // Scaling rewrites the config in place (a ConfigMap volume, the local runner's job.json).
    config.job_config = Some(env.config.clone());
    let port = args.port.unwrap_or(endpoint.port);
    let host = if env.bind.contains(':') { format!("[{}]", env.bind) } else { env.bind.clone() };
    let addr = format!("{host}:{port}");
    let status_port = contract::status_port(|k| std::env::var(k).ok())?;
    let metrics = super::metrics_listener(env.attempt)?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let mut server = Server::bind(&addr, config).await?;
        if let Some(listener) = metrics {
            server = server.with_metrics(listener);
        }
        let bound = server.local_addr().context("cannot read the bound address")?;
        tracing::info!(shard = index, replicas, %mode, %bound, version = server.version(), "parameter server listening");
        let mut stdout = std::io::stdout();
        let _ = writeln!(stdout, "listening on {bound}");
        let mut status_line = "status off".to_owned();
        if let Some(status_port) = status_port {
            let status_addr = format!("{host}:{status_port}");
            match StatusListener::bind(&status_addr).await {
                Ok(listener) => {
                    let at = listener.local_addr().context("cannot read the status endpoint's address")?;
                    tracing::info!(shard = index, %at, "status endpoint listening");
                    status_line = format!("status on {at}");
                    server = server.with_status(listener);
                }
                Err(e) => tracing::warn!(
                    shard = index,
                    addr = %status_addr,
                    error = %e,
                    "cannot serve the status endpoint; training goes on without it (set {} to 0 for any free port, or to off)",
                    contract::env::STATUS_PORT
                ),
            }
        }
        let _ = writeln!(stdout, "{status_line}");
        let _ = stdout.flush();
        server.run(shutdown_signal()).await?;
        tracing::info!(shard = index, "parameter server stopped on SIGTERM after its last checkpoint");
        anyhow::Ok(())
    })?;
    // The server returns only when the signal stopped it; the code tells restart policies that
    // the stop was not this shard's fault.
    eprintln!("parameter server {index} stopped on SIGTERM after writing its last checkpoint");
    std::process::exit(ExitClass::Preempted.code())
}

/// The longest parameter vector a worker may declare: the model's parameter count when the spec
/// tells it (built-in data sets, `tandem_api::plan::memory`), else what this machine's memory can
/// hold of this shard's range with its gradient, mean and optimizer state.
fn max_total_len(spec: &tandem_api::TrainingJobSpec, replicas: u32) -> u64 {
    use tandem_api::plan::memory::{MemoryEstimate, builtin_data};
    // A user's command trains its own model, whose size the spec does not tell.
    if let Some(shape) = builtin_data(spec).filter(|_| spec.workers.command.is_none()) {
        return MemoryEstimate::of(spec, shape).parameters;
    }
    let available = tandem_util::proc::available_memory().unwrap_or(u64::MAX);
    // Weights, one group's gradient, the sync mean and two optimizer moments, as f32.
    (available / (5 * 4)).saturating_mul(u64::from(replicas.max(1)))
}

pub(super) async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
