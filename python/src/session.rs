//! This process's place in the job and its group communicator, formed once by [`init`], and its
//! exchange with the parameter servers over that communicator, formed by [`ps_start`] in the PS
//! algorithms.
//!
//! Guarantees: [`init`] forms the communicator exactly as `tandem worker` does (the job config's
//! peer list of this rank's group, the job token, `TANDEM_BIND`, the peer deadline of
//! `TANDEM_PEER_TIMEOUT`, the host identity of `TANDEM_HOST_ID`), and [`ps_start`] joins the
//! servers as `tandem worker` does (the job's PS mode, `training.steps` as the run the servers'
//! schedule spans, the launch attempt); the GIL is released while either waits and while any
//! collective or exchange runs. What describes the rank ([`Info`]) is kept apart from the
//! communicator, so reading it never waits for a running collective.

use std::path::PathBuf;
use std::sync::Mutex;

use pyo3::prelude::*;
use tandem_api::PsMode;
use tandem_api::contract::user::env as user_env;
use tandem_api::contract::{JobConfig, LaunchEnv, Role, peer_timeout};
use tandem_comm::CommError;
use tandem_comm::tcp::{self, TcpComm, TcpConfig};
use tandem_ps::client::{ClientConfig, PsClient};
use tandem_ps::group::{ExchangeError, GroupExchange};

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
    /// The launch attempt of this rank's group (`TANDEM_ATTEMPT`): above 0 after a restart.
    pub attempt: u32,
    /// The job's PS mode; `None` for `allreduce`.
    pub ps_mode: Option<PsMode>,
    /// The step the group continues from: the servers' record after [`ps_start`], else 0.
    pub start_step: u64,
}

/// What [`ps_start`] needs of the contract beyond [`Info`].
struct Servers {
    /// `host:port` of each PS shard.
    endpoints: Vec<String>,
    /// The job token.
    token: String,
    /// `training.steps`, the run the servers' schedule spans; `None` for a job in epochs.
    steps: Option<u64>,
    /// How long to keep trying to reach a server.
    timeout: std::time::Duration,
}

/// This rank's link: its group's communicator, which [`ps_start`] turns into an exchange with
/// the parameter servers over it.
enum Link {
    Group(Box<TcpComm>),
    Ps(Box<GroupExchange<TcpComm>>),
}

impl Link {
    fn comm(&mut self) -> &mut TcpComm {
        match self {
            Link::Group(comm) => comm,
            Link::Ps(exchange) => exchange.comm(),
        }
    }
}

static INFO: Mutex<Option<Info>> = Mutex::new(None);
static SERVERS: Mutex<Option<Servers>> = Mutex::new(None);
static COMM: Mutex<Option<Link>> = Mutex::new(None);

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
        attempt: launch.attempt,
        ps_mode: PsMode::of(&job.spec.training),
        start_step: 0,
    };
    let servers = Servers {
        endpoints: job.parameter_servers.iter().map(|e| e.to_string()).collect(),
        token,
        steps: job.spec.training.steps,
        timeout,
    };
    *COMM.lock().map_err(|_| errors::poisoned())? = Some(Link::Group(Box::new(comm)));
    *SERVERS.lock().map_err(|_| errors::poisoned())? = Some(servers);
    *INFO.lock().map_err(|_| errors::poisoned())? = Some(info);
    Ok(())
}

/// Joins the parameter servers as `tandem worker` does, with `params` (this rank's flat
/// parameter vector, equal on every rank of the group) as the initial weights the servers take
/// when they hold none; `params` then holds the servers' weights, and the group's step count
/// continues from their record ([`GroupExchange::start`]). Returns that step. Collective: every
/// rank of the group calls it once, after [`init`].
pub fn ps_start(py: Python<'_>, params: &mut [f32]) -> PyResult<u64> {
    const CALL: &str = "DistributedOptimizer";
    let (group, rank, attempt, mode) = with_info(CALL, |i| (i.group, i.rank, i.attempt, i.ps_mode))?;
    let Some(mode) = mode else {
        return Err(errors::ps_config(
            CALL,
            "this job's training.algorithm is allreduce, which has no parameter server",
        ));
    };
    let (endpoints, token, steps, timeout) = {
        let servers = SERVERS.lock().map_err(|_| errors::poisoned())?;
        let s = servers.as_ref().ok_or_else(|| errors::not_initialized(CALL))?;
        (s.endpoints.clone(), s.token.clone(), s.steps, s.timeout)
    };
    if endpoints.is_empty() {
        return Err(errors::contract("the job config lists no parameter server for its PS algorithm"));
    }
    let Some(steps) = steps else {
        return Err(errors::ps_config(
            CALL,
            "the parameter servers run training.optimizer's schedule over training.steps, and this job sets training.epochs: set training.steps to the steps your script runs",
        ));
    };
    let mut config =
        ClientConfig::worker(endpoints, token, group, rank, attempt, params.len() as u64).run(steps, mode);
    config.connect_timeout = timeout;
    enum Failed {
        Poisoned,
        NotInitialized,
        Started,
        Exchange(ExchangeError),
    }
    let started = py.detach(|| {
        let client = PsClient::connect(config).map_err(|e| Failed::Exchange(e.into()))?;
        let mut link = COMM.lock().map_err(|_| Failed::Poisoned)?;
        let comm = match link.take() {
            Some(Link::Group(comm)) => *comm,
            Some(ps @ Link::Ps(_)) => {
                *link = Some(ps);
                return Err(Failed::Started);
            }
            None => return Err(Failed::NotInitialized),
        };
        let exchange = GroupExchange::start(comm, client, params).map_err(Failed::Exchange)?;
        let start = exchange.start_step();
        *link = Some(Link::Ps(Box::new(exchange)));
        Ok(start)
    });
    let start = started.map_err(|f| match f {
        Failed::Poisoned => errors::poisoned(),
        Failed::NotInitialized => errors::not_initialized(CALL),
        Failed::Started => errors::ps_config(
            CALL,
            "this rank already joined the parameter servers: wrap one optimizer per process",
        ),
        Failed::Exchange(e) => errors::ps(CALL, &e),
    })?;
    if let Some(info) = INFO.lock().map_err(|_| errors::poisoned())?.as_mut() {
        info.start_step = start;
    }
    Ok(start)
}

/// Drops the communicator (its peers see a goodbye) and forgets the rank; a rank that joined the
/// parameter servers leaves them first (rank 0 of its group says the group is done).
pub fn shutdown(py: Python<'_>) -> PyResult<()> {
    INFO.lock().map_err(|_| errors::poisoned())?.take();
    SERVERS.lock().map_err(|_| errors::poisoned())?.take();
    // Dropping says goodbye to every peer, which may block: without the GIL.
    let dropped = py.detach(|| match COMM.lock() {
        Ok(mut link) => {
            if let Some(Link::Ps(exchange)) = link.as_mut() {
                // The servers also see a group leave when its connections close.
                let _ = exchange.leave();
            }
            drop(link.take());
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
        let link = guard.as_mut().ok_or(Failed::NotInitialized)?;
        collective(link.comm()).map_err(Failed::Comm)
    });
    result.map_err(|f| match f {
        Failed::Poisoned => errors::poisoned(),
        Failed::NotInitialized => errors::not_initialized(call),
        Failed::Comm(e) => errors::comm(call, &e),
    })
}

/// Runs `exchange` on the exchange with the parameter servers with the GIL released; `call` names
/// it in errors. Before [`ps_start`] it is an error that says so.
pub fn with_ps<T: Send>(
    py: Python<'_>,
    call: &str,
    exchange: impl FnOnce(&mut GroupExchange<TcpComm>) -> Result<T, ExchangeError> + Send,
) -> PyResult<T> {
    enum Failed {
        Poisoned,
        NotInitialized,
        NotStarted,
        Exchange(ExchangeError),
    }
    let result = py.detach(|| {
        let mut guard = COMM.lock().map_err(|_| Failed::Poisoned)?;
        match guard.as_mut() {
            None => Err(Failed::NotInitialized),
            Some(Link::Group(_)) => Err(Failed::NotStarted),
            Some(Link::Ps(x)) => exchange(x).map_err(Failed::Exchange),
        }
    });
    result.map_err(|f| match f {
        Failed::Poisoned => errors::poisoned(),
        Failed::NotInitialized => errors::not_initialized(call),
        Failed::NotStarted => errors::ps_config(
            call,
            "this rank has not joined the parameter servers: wrap the optimizer in \
             tandem.torch.DistributedOptimizer first",
        ),
        Failed::Exchange(e) => errors::ps(call, &e),
    })
}
