//! `tandem worker`: one worker rank of a parameter-server job, configured by the launch contract.
//!
//! Reads role, config and token from the environment ([`tandem_api::LaunchEnv`]), trains through
//! the library's worker, prints one JSON progress line per report of rank 0 and a final
//! `{"event":"finished",…}` line on stdout.

use std::path::PathBuf;

use anyhow::{Context, bail};
use tandem::model::{DeviceChoice, select_device};
use tandem::worker::{self, Place};
use tandem_api::contract::Role;

/// Arguments of `tandem worker`.
#[derive(clap::Args)]
pub struct Args {
    /// Folder holding the built-in data sets (`make data` fills it).
    #[arg(long, env = "TANDEM_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,
    /// Compute device.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
}

/// Runs `tandem worker`.
pub fn run(args: Args) -> anyhow::Result<()> {
    super::init_logging();

    let super::Contract { env, job, token } = super::load_contract()?;
    let Role::Worker { group, rank } = env.role else {
        bail!("`tandem worker` runs a worker rank, but TANDEM_ROLE says this process is {}", env.role);
    };
    let device = select_device(args.device)?;
    let place = Place { group, rank, attempt: env.attempt, bind: env.bind.clone() };
    let summary = worker::run(&job, &place, &token, &args.data_dir, &device, |p| {
        println!("{}", serde_json::json!({"event": "progress", "group": group, "progress": p}));
    })
    .with_context(|| format!("worker {group}/{rank}"))?;
    println!(
        "{}",
        serde_json::json!({"event": "finished", "group": group, "rank": rank, "steps": summary.steps, "accuracy": summary.accuracy})
    );
    Ok(())
}
