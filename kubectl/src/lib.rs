//! `kubectl tandem`: what a person asks of a TrainingJob from a terminal — its status (`status`),
//! its pods' logs (`logs`) and its training curve (`plot`) — through the API server only, with the
//! user's own kubeconfig and RBAC, like kubectl.
//!
//! Expected flow: `main.rs` parses the command line into a [`Cli`], builds a client from the
//! kubeconfig and calls [`run`], which reads the job ([`job::find`]) and its pods, Events or status
//! and writes to the given output.
//!
//! Guarantees: read-only (nothing is created, patched or deleted); every failure is an [`Error`]
//! that says what is missing and what to run next (a job that is not there lists the namespace's
//! jobs; a job without pods or without a curve says why). Pods are found by the labels the operator
//! sets (`tandem_api::names`), never by name patterns.
//!
//! Assumptions: the user may `get`/`list` trainingjobs, pods and events and `get` pods/log in the
//! namespace (what `kubectl get tj`, `kubectl logs` and `kubectl describe` need anyway).

mod error;
pub mod job;
mod logs;
mod plot;
mod status;

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use kube::Client;

pub use error::Error;

/// The command line: `kubectl tandem <command> [-n NAMESPACE]`.
#[derive(Parser, Debug)]
#[command(
    name = "kubectl tandem",
    version,
    about = "Status, logs and the training curve of Tandem TrainingJobs"
)]
pub struct Cli {
    /// Namespace of the job; default: the kubeconfig context's namespace.
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Kubeconfig file; default: $KUBECONFIG, then ~/.kube/config, then the in-cluster account.
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use; default: its current context.
    #[arg(long, global = true)]
    pub context: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

/// What to show.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Phase, conditions, progress, restarts, pods and the job's last Events.
    Status {
        /// The TrainingJob's name.
        name: String,
        /// How many of the job's latest Events to show.
        #[arg(long, default_value_t = 10)]
        events: usize,
    },
    /// The logs of the job's pods, every line prefixed with its pod's name.
    Logs {
        /// The TrainingJob's name.
        name: String,
        /// Only worker group G (its workers and, with `backend: mpi`, its launcher).
        #[arg(long, short = 'g')]
        group: Option<u32>,
        /// Only rank R (of every group, or of `--group`).
        #[arg(long, short = 'r')]
        rank: Option<u32>,
        /// Keep streaming until every selected pod's container ends.
        #[arg(long, short = 'f')]
        follow: bool,
        /// Only the last N lines of each pod.
        #[arg(long)]
        tail: Option<i64>,
    },
    /// The training curve from the job's status: a chart on the terminal and an SVG (or CSV) file.
    Plot {
        /// The TrainingJob's name.
        name: String,
        /// Where to write the curve: `.svg`, or `.csv` for the numbers; default `<name>-curve.svg`.
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
        /// Columns of the terminal chart.
        #[arg(long, default_value_t = 72)]
        width: usize,
        /// Rows of each panel of the terminal chart.
        #[arg(long, default_value_t = 12)]
        height: usize,
        /// Only write the file, draw nothing on the terminal.
        #[arg(long)]
        no_chart: bool,
    },
}

/// Carries out `command` in `namespace`, writing what it shows to `out` and notes (pods skipped,
/// files written) to `notes`.
pub async fn run(
    command: Command,
    client: Client,
    namespace: &str,
    out: &mut (dyn Write + Send),
    notes: &mut (dyn Write + Send),
) -> Result<(), Error> {
    match command {
        Command::Status { name, events } => status::show(&client, namespace, &name, events, out).await,
        Command::Logs { name, group, rank, follow, tail } => {
            let select = logs::Select { group, rank, follow, tail };
            logs::show(&client, namespace, &name, &select, out, notes).await
        }
        Command::Plot { name, output, width, height, no_chart } => {
            let output = output.unwrap_or_else(|| PathBuf::from(format!("{name}-curve.svg")));
            let chart = (!no_chart).then_some((width, height));
            plot::show(&client, namespace, &name, &output, chart, out, notes).await
        }
    }
}
