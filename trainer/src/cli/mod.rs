//! Subcommands of the `tandem` binary; each module parses its arguments and calls the library.

pub mod bench;
pub mod data;
pub mod launcher;
pub mod plan;
pub mod progress;
pub mod ps;
pub mod report;
pub mod train;
pub mod wait_master;
pub mod worker;

use anyhow::{Context, bail};
use tandem_api::ExitClass;
use tandem_api::contract::{JobConfig, LaunchEnv};
use tandem_compute::device::{Device, Preference};

/// Which device to compute on (`--device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DeviceArg {
    /// CUDA when compiled in and a GPU driver is present, else the CPU.
    #[default]
    Auto,
    /// Always the CPU.
    Cpu,
    /// CUDA, or an error saying why not.
    Cuda,
}

impl DeviceArg {
    /// The device this asks for, or an error saying why it is not there.
    pub fn select(self) -> anyhow::Result<Device> {
        let preference = match self {
            DeviceArg::Auto => Preference::Auto,
            DeviceArg::Cpu => Preference::Cpu,
            DeviceArg::Cuda => Preference::Cuda,
        };
        Ok(Device::select(preference)?)
    }
}

/// A role's failure with how the process exits for it: the roles whose failure can be other than
/// permanent (a lost peer, a stop on SIGTERM) return it, so the exit code follows the
/// [`ExitClass`] given where the error was raised, with no downcast. Any other error converts to a
/// permanent one.
#[derive(Debug)]
pub struct Failure {
    /// How the process exits.
    pub class: ExitClass,
    /// What went wrong.
    pub error: anyhow::Error,
}

impl Failure {
    /// A failure of class `class`.
    pub fn new(class: ExitClass, error: impl Into<anyhow::Error>) -> Self {
        Self { class, error: error.into() }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Self {
        Self::new(ExitClass::Permanent, error)
    }
}

/// Ends a role's run: success and a permanent failure go back to `main` (exit 0, or 1 with the
/// error printed and written as the termination message there); any other failure is printed,
/// written as the termination message, and ends the process with its class's code.
pub fn finish(result: Result<(), Failure>) -> anyhow::Result<()> {
    match result {
        Ok(()) => Ok(()),
        Err(Failure { class: ExitClass::Permanent, error }) => Err(error),
        Err(Failure { class, error }) => {
            eprintln!("Error: {error:?}");
            termination_message(&format!("{error:#}"));
            tracing::warn!(%class, "stopping: {error:#}");
            std::process::exit(class.code())
        }
    }
}

/// Writes `message` as this container's termination message, which the kubelet shows in the pod's
/// status (`kubectl describe pod`, `state.terminated.message`) and the operator's events can quote:
/// to `TANDEM_TERMINATION_LOG` when set, else to the kubelet's `/dev/termination-log` when it
/// exists (outside Kubernetes it does not, and nothing is written). Kept under the kubelet's
/// 4 KiB limit; a failure to write is only logged.
pub fn termination_message(message: &str) {
    use tandem_api::contract::{TERMINATION_LOG, env};
    let path = match std::env::var_os(env::TERMINATION_LOG) {
        Some(path) => std::path::PathBuf::from(path),
        None if std::path::Path::new(TERMINATION_LOG).exists() => TERMINATION_LOG.into(),
        None => return,
    };
    let mut end = message.len().min(4000);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    if let Err(e) = std::fs::write(&path, &message[..end]) {
        tracing::warn!(path = %path.display(), error = %e, "cannot write the termination message");
    }
}

/// Logs to stderr at `info` (or `RUST_LOG`), coloured only on a terminal.
pub fn init_logging() {
    init_logging_at("info");
}

/// Logs to stderr at `level` (or `RUST_LOG`), coloured only on a terminal.
pub fn init_logging_at(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // A second initialisation (tests calling in-process) keeps the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}

/// A process's part in a job, read from the launch contract: its environment, the job config
/// file and the job token.
pub struct Contract {
    /// The `TANDEM_*` environment.
    pub env: LaunchEnv,
    /// The job config that `TANDEM_CONFIG` names.
    pub job: JobConfig,
    /// The job token that `TANDEM_TOKEN_FILE` holds.
    pub token: String,
}

/// Reads the launch contract of this process; errors name the variable or file at fault.
pub fn load_contract() -> anyhow::Result<Contract> {
    let env = LaunchEnv::from_lookup(|k| std::env::var(k).ok())?;
    let text = std::fs::read_to_string(&env.config)
        .with_context(|| format!("cannot read the job config {} (TANDEM_CONFIG)", env.config.display()))?;
    let job = JobConfig::from_json(&text)?;
    let token = std::fs::read_to_string(&env.token_file)
        .with_context(|| {
            format!("cannot read the job token {} (TANDEM_TOKEN_FILE)", env.token_file.display())
        })?
        .trim()
        .to_owned();
    if token.is_empty() {
        bail!(
            "the job token file {} is empty; the operator or `tandem train` writes it",
            env.token_file.display()
        );
    }
    Ok(Contract { env, job, token })
}

/// Binds this process's metrics port where the launch contract asks for one
/// ([`tandem_api::contract::env::METRICS_PORT`]) and records its restarts (`attempt`). A value
/// that is not a port is an error; a port that cannot be bound is logged and left out, and the
/// process trains on without metrics.
pub fn metrics_listener(attempt: u32) -> anyhow::Result<Option<std::net::TcpListener>> {
    use tandem_api::contract::{self, env};
    tandem_util::metrics::metrics().restarts.set(i64::from(attempt));
    let Some(port) = contract::metrics_port(|k| std::env::var(k).ok())? else { return Ok(None) };
    match tandem_util::metrics::bind(port) {
        Ok(listener) => {
            if let Ok(at) = listener.local_addr() {
                tracing::info!(%at, "serving Prometheus metrics on /metrics");
            }
            Ok(Some(listener))
        }
        Err(e) => {
            tracing::warn!(
                port,
                error = %e,
                "cannot serve metrics; training goes on without them (set {} to 0 for any free port, or unset it)",
                env::METRICS_PORT
            );
            Ok(None)
        }
    }
}
