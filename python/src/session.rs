//! This process's place in the job and its group communicator, formed once by [`init`].
//!
//! Guarantees: [`init`] forms the communicator exactly as `tandem worker` does (the job config's
//! peer list of this rank's group, the job token, `TANDEM_BIND`, the peer deadline of
//! `TANDEM_PEER_TIMEOUT`, the host identity of `TANDEM_HOST_ID`); the GIL is released while it
//! waits for the peers and while any collective runs. What describes the rank ([`Info`]) is kept
//! apart from the communicator, so reading it never waits for a running collective.

use std::path::PathBuf;
use std::sync::Mutex;

use pyo3::prelude::*;
use tandem_api::contract::user::env as user_env;
use tandem_api::contract::{JobConfig, LaunchEnv, Role, peer_timeout};
use tandem_comm::CommError;
use tandem_comm::tcp::{self, TcpComm, TcpConfig};

use crate::errors;

/// What describes this rank, fixed at [`init`].
#[derive(Clone, Debug)]
pub struct Info {
    /// Rank in the group.
    pub rank: u32,
    /// Ranks in the group.
    pub size: u32,
    /// Rank among the group's processes on this host (`LOCAL_RANK`).
    pub local_rank: u32,
    /// Group index.
    pub group: u32,
    /// Worker groups of the job.
    pub groups: u32,
    /// `training.algorithm`, as the job writes it.
    pub algorithm: String,
    /// The job's name.
    pub job_name: String,
    /// Where progress lines go (`TANDEM_PROGRESS_FILE`), if the contract names a file.
    pub progress_file: Option<PathBuf>,
}

static INFO: Mutex<Option<Info>> = Mutex::new(None);
static COMM: Mutex<Option<TcpComm>> = Mutex::new(None);

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

/// Reads the contract and joins the group (see the module docs).
pub fn init(py: Python<'_>) -> PyResult<()> {
    if is_initialized()? {
        return Ok(());
    }
    let launch = LaunchEnv::from_lookup(env).map_err(errors::contract)?;
    let Role::Worker { group, rank } = launch.role else {
        return Err(errors::contract(format!(
            "TANDEM_ROLE says this process is {}, not a worker rank",
            launch.role
        )));
    };
    let text = std::fs::read_to_string(&launch.config).map_err(|e| {
        errors::contract(format!(
            "cannot read the job config {} (TANDEM_CONFIG): {e}",
            launch.config.display()
        ))
    })?;
    let job = JobConfig::from_json(&text).map_err(errors::contract)?;
    let token = std::fs::read_to_string(&launch.token_file)
        .map_err(|e| {
            errors::contract(format!(
                "cannot read the job token {} (TANDEM_TOKEN_FILE): {e}",
                launch.token_file.display()
            ))
        })?
        .trim()
        .to_owned();
    if token.is_empty() {
        return Err(errors::contract(format!(
            "the job token file {} (TANDEM_TOKEN_FILE) is empty",
            launch.token_file.display()
        )));
    }
    let topology = job
        .group(group)
        .ok_or_else(|| errors::contract(format!("the job config has no group {group} (TANDEM_GROUP)")))?;
    let size = topology.peers.len() as u32;
    if rank >= size {
        return Err(errors::contract(format!(
            "TANDEM_RANK={rank} is not a rank of group {group}, which has {size}"
        )));
    }
    let local_rank = match env(user_env::LOCAL_RANK) {
        Some(v) => v.trim().parse().map_err(|_| {
            errors::contract(format!("{}={v:?} is not a non-negative integer", user_env::LOCAL_RANK))
        })?,
        None => 0,
    };
    let groups = match env(user_env::GROUPS) {
        Some(v) => v.trim().parse().map_err(|_| {
            errors::contract(format!("{}={v:?} is not a non-negative integer", user_env::GROUPS))
        })?,
        None => job.spec.workers.groups,
    };
    let algorithm = serde_json::to_value(job.spec.training.algorithm)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{:?}", job.spec.training.algorithm));
    let timeout = peer_timeout(env).map_err(errors::contract)?;
    let host = env(tandem_comm::host::HOST_ID_ENV).filter(|h| !h.is_empty());
    let config = TcpConfig { connect_timeout: timeout, host, ..TcpConfig::default() };
    let bind = launch.bind.clone();
    let comm = py
        .detach(|| tcp::connect_from_contract(&job, group, rank as usize, &bind, token.as_bytes(), config))
        .map_err(|e| errors::comm(&format!("init (joining group {group} as rank {rank})"), &e))?;
    let info = Info {
        rank,
        size,
        local_rank,
        group,
        groups,
        algorithm,
        job_name: job.job_name.clone(),
        progress_file: env(user_env::PROGRESS_FILE).filter(|p| !p.is_empty()).map(PathBuf::from),
    };
    *COMM.lock().map_err(|_| errors::poisoned())? = Some(comm);
    *INFO.lock().map_err(|_| errors::poisoned())? = Some(info);
    Ok(())
}

/// Drops the communicator (its peers see a goodbye) and forgets the rank.
pub fn shutdown(py: Python<'_>) -> PyResult<()> {
    INFO.lock().map_err(|_| errors::poisoned())?.take();
    // Dropping says goodbye to every peer, which may block: without the GIL.
    let dropped = py.detach(|| match COMM.lock() {
        Ok(mut comm) => {
            drop(comm.take());
            true
        }
        Err(_) => false,
    });
    if dropped { Ok(()) } else { Err(errors::poisoned()) }
}

/// Whether [`init`] has joined the group.
pub fn is_initialized() -> PyResult<bool> {
    Ok(INFO.lock().map_err(|_| errors::poisoned())?.is_some())
}

/// `read` of this rank's [`Info`]; `call` names the caller in the error before [`init`].
pub fn with_info<T>(call: &str, read: impl FnOnce(&Info) -> T) -> PyResult<T> {
    let info = INFO.lock().map_err(|_| errors::poisoned())?;
    info.as_ref().map(read).ok_or_else(|| errors::not_initialized(call))
}

/// Runs `collective` on the communicator with the GIL released; `call` names it in errors.
pub fn with_comm<T: Send>(
    py: Python<'_>,
    call: &str,
    collective: impl FnOnce(&mut TcpComm) -> Result<T, CommError> + Send,
) -> PyResult<T> {
    enum Failed {
        Poisoned,
        NotInitialized,
        Comm(CommError),
    }
    let result = py.detach(|| {
        let mut guard = COMM.lock().map_err(|_| Failed::Poisoned)?;
        let comm = guard.as_mut().ok_or(Failed::NotInitialized)?;
        collective(comm).map_err(Failed::Comm)
    });
    result.map_err(|f| match f {
        Failed::Poisoned => errors::poisoned(),
        Failed::NotInitialized => errors::not_initialized(call),
        Failed::Comm(e) => errors::comm(call, &e),
    })
}
