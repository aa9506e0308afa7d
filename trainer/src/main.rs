//! `tandem`: one binary for every role of a training job, and the local runner.

mod cli;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tandem",
    version,
    about = "Distributed training with parameter servers and MPI groups in tandem"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a TrainingJob manifest on this machine, no cluster needed.
    Train(cli::train::Args),
    /// Prepare and check data sets: pack an image folder into tar shards, inspect a data set.
    #[command(subcommand)]
    Data(cli::data::Data),
    /// Choose a job's shape by analysis: predicted step time of each shape on a cluster's links.
    Plan(cli::plan::Args),
    /// Benchmarks of Tandem's building blocks.
    #[command(subcommand)]
    Bench(cli::bench::Bench),
    /// Serve one parameter-server shard (started by the operator or `tandem train`).
    Ps(cli::ps::Args),
    /// One worker rank of a parameter-server job (started by the operator or `tandem train`).
    Worker(cli::worker::Args),
    /// Serve the progress of a group that runs the user's own command (beside its rank 0, started by
    /// the operator).
    Progress(cli::progress::Args),
    /// Wait until a group's rank 0 accepts connections (before every other rank of a group that
    /// runs the user's own command, started by the operator).
    WaitMaster(cli::wait_master::Args),
    /// Start one `backend: mpi` worker group under mpirun (started by the operator or `tandem train`).
    Launcher(cli::launcher::Args),
    /// One rank of a collective self-test, soak or benchmark (started by `bench` and by tests).
    #[command(hide = true, name = "comm-rank")]
    CommRank(cli::bench::RankArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train(args) => cli::train::run(args),
        Command::Data(cmd) => cli::data::run(cmd),
        Command::Plan(args) => cli::plan::run(args),
        Command::Bench(bench) => cli::bench::run(bench),
        Command::Ps(args) => cli::ps::run(args),
        Command::Worker(args) => cli::worker::run(args),
        Command::Launcher(args) => cli::launcher::run(args),
        Command::Progress(args) => cli::progress::run(args),
        Command::WaitMaster(args) => cli::wait_master::run(args),
        Command::CommRank(args) => cli::bench::run_rank(args),
    };
    if let Err(e) = &result {
        cli::termination_message(&format!("{e:#}"));
    }
    result
}
