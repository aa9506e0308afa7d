//! `tandem train -f job.yaml`.

use std::path::PathBuf;

/// Arguments of `tandem train`.
#[derive(clap::Args)]
pub struct Args {
    /// TrainingJob manifest to run.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
}

/// Runs `tandem train`.
pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::bail!("training {} is not available yet: the trainer is being built", args.file.display())
}
