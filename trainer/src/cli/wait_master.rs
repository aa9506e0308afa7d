//! `tandem wait-master`: an init container of every rank but 0 of a group that runs the user's
//! own command. It waits until `MASTER_ADDR:MASTER_PORT` (the group's rank 0, its
//! `torch.distributed` store) resolves and accepts a TCP connection, so that the user's process
//! starts only once its rendezvous can succeed. While rank 0's pod is replaced (a restarted group)
//! its name can resolve to the old pod's address for a moment, and PyTorch's store client gives up
//! at once on the "No route to host" that address gives (it retries refused connections and names
//! that do not resolve); a permanent exit code would then fail the job. Kubeflow's PyTorchJob
//! waits for its master the same way.
//!
//! Waits at most the contract's peer timeout (`TANDEM_PEER_TIMEOUT`); then exits with the
//! peer-lost code (retryable: the group restarts) and says why in the termination message.

use anyhow::Context;
use tandem_api::ExitClass;
use tandem_api::contract::{self, user::env as user_env};
use tandem_comm::reach::{self, Target};

/// Arguments of `tandem wait-master` (it reads the contract's variables).
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `tandem wait-master`.
pub fn run(_args: Args) -> anyhow::Result<()> {
    super::init_logging();
    let var = |name: &str| {
        std::env::var(name).ok().filter(|v| !v.is_empty()).with_context(|| {
            format!("{name} is not set: `tandem wait-master` runs before a rank of a group that runs workers.command")
        })
    };
    let host = var(user_env::MASTER_ADDR)?;
    let port = var(user_env::MASTER_PORT)?;
    let port: u16 =
        port.parse().with_context(|| format!("{} is {port:?}, not a TCP port", user_env::MASTER_PORT))?;
    let timeout = contract::peer_timeout(|k| std::env::var(k).ok())?;
    let target = Target { name: format!("rank 0 ({host}:{port})"), host, port };
    tracing::info!(master = %target.name, timeout_s = timeout.as_secs(), "waiting for the group's rank 0");
    if let Err(e) = reach::await_reachable(std::slice::from_ref(&target), timeout) {
        let message = format!("the group's {} did not accept connections: {e}", target.name);
        return super::finish(Err(super::Failure::new(ExitClass::PeerLost, anyhow::anyhow!(message))));
    }
    tracing::info!(master = %target.name, "rank 0 is reachable");
    Ok(())
}
