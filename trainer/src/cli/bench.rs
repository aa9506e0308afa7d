//! `tandem bench …`.

/// Benchmarks.
#[derive(clap::Subcommand)]
pub enum Bench {
    /// Allreduce bandwidth and latency.
    Allreduce,
}

/// Runs a benchmark.
pub fn run(_bench: Bench) -> anyhow::Result<()> {
    anyhow::bail!("benchmarks are not available yet: the collectives are being built")
}
