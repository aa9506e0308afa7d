//! `tandem ps`: one parameter-server replica, configured by the launch contract.
//!
//! Reads the role, config and token from the environment ([`tandem_api::LaunchEnv`]), serves
//! its shard on `TANDEM_BIND` and the job config's port for it, keeps checkpoints under
//! `$TANDEM_OUTPUT/ps-<index>/`, resumes from the newest one, and stops on SIGTERM or Ctrl-C
//! after writing a last checkpoint. Prints `listening on <addr>` on stdout once bound.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, bail};
use tandem::ps::Mode;
use tandem::ps::server::{Server, ServerConfig};
use tandem::ps::state::ShardConfig;
use tandem_api::contract::Role;

/// Arguments of `tandem ps`.
#[derive(clap::Args)]
pub struct Args {
    /// Port to listen on instead of the job config's port for this shard (0: any free port).
    #[arg(long)]
    pub port: Option<u16>,
    /// Seconds a new connection may take to say hello.
    #[arg(long, default_value_t = 30)]
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
    let Some(mode) = Mode::for_algorithm(training.algorithm, training.staleness) else {
        bail!("algorithm {:?} uses no parameter server; do not start `tandem ps` for it", training.algorithm);
    };
    let shard = ShardConfig {
        index,
        replicas,
        mode,
        token,
        checkpoint_every: training.checkpoint.every_steps,
        optimizer: training.optimizer.clone(),
        total_steps: training.steps,
    };
    let mut config = ServerConfig::new(shard);
    config.checkpoint_dir = Some(env.output.join(format!("ps-{index}")));
    config.hello_timeout = Duration::from_secs(args.hello_timeout.max(1));
    let port = args.port.unwrap_or(endpoint.port);
    let addr = if env.bind.contains(':') {
        format!("[{}]:{port}", env.bind)
    } else {
        format!("{}:{port}", env.bind)
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let server = Server::bind(&addr, config).await?;
        let bound = server.local_addr().context("cannot read the bound address")?;
        tracing::info!(shard = index, replicas, %mode, %bound, version = server.version(), "parameter server listening");
        let mut stdout = std::io::stdout();
        let _ = writeln!(stdout, "listening on {bound}");
        let _ = stdout.flush();
        server.run(shutdown_signal()).await?;
        tracing::info!(shard = index, "parameter server stopped");
        anyhow::Ok(())
    })
}

async fn shutdown_signal() {
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
