//! `tandem-operator`: reconciles TrainingJobs into parameter-server pods and worker groups.

fn main() -> anyhow::Result<()> {
    anyhow::bail!("tandem-operator is not available yet: the controller is being built")
}
