//! `tandem worker`: one worker rank of a multi-process job, configured by the launch contract.
//!
//! Reads role, config and token from the environment ([`tandem_api::LaunchEnv`]), forms the
//! group's communicator — `tcp` from the job config's peer list, or with `backend: mpi` MPI's
//! world communicator of the `mpirun` that started the group's ranks, whose MPI rank replaces
//! `TANDEM_RANK` — trains through the library's worker, prints one JSON progress line per report
//! of rank 0 and a final `{"event":"finished",…}` line on stdout. Where `TANDEM_PROGRESS_FILE`
//! is set, rank 0 also appends each report to it, as a user's command would (a job without
//! parameter servers on Kubernetes, whose progress sidecar serves that file).

use std::path::PathBuf;

use super::{DeviceArg, Failure};
use anyhow::Context;
use tandem::worker::{self, Place};
use tandem_api::Backend;
use tandem_api::contract::user::{UserProgress, env as user_env};
use tandem_api::contract::{GroupReport, Role, WorkerLine};
use tandem_comm::Communicator;

/// Arguments of `tandem worker`.
#[derive(clap::Args)]
pub struct Args {
    /// Folder holding the built-in data sets (`make data` fills it).
    #[arg(long, env = "TANDEM_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,
    /// Compute device.
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    pub device: DeviceArg,
}

/// Runs `tandem worker`. A worker that failed because another process of the job was lost
/// exits with [`tandem_api::ExitClass::PeerLost`]'s code (retryable) instead of 1; one that SIGTERM stopped
/// at a step boundary, its state saved, with [`tandem_api::ExitClass::Preempted`]'s ([`super::finish`]).
pub fn run(args: Args) -> anyhow::Result<()> {
    super::finish(run_worker(args))
}

/// [`worker::run`]'s error as this rank's failure, of the class its cause was given.
fn failure(e: worker::WorkerError, group: u32, rank: u32) -> Failure {
    Failure::new(e.exit_class(), anyhow::Error::new(e).context(format!("worker {group}/{rank}")))
}

fn run_worker(args: Args) -> Result<(), Failure> {
    super::init_logging();

    let super::Contract { env, job, token } = super::load_contract()?;
    let Role::Worker { group, rank } = env.role else {
        return Err(anyhow::anyhow!(
            "`tandem worker` runs a worker rank, but TANDEM_ROLE says this process is {}",
            env.role
        )
        .into());
    };
    let device = args.device.select()?;
    if let Some(listener) = super::metrics_listener(env.attempt)? {
        tandem_util::metrics::start(listener, tandem_util::metrics::worker_page())
            .context("cannot start the metrics thread")?;
    }
    let mut place = Place {
        group,
        rank,
        attempt: env.attempt,
        bind: env.bind.clone(),
        output: env.output.clone(),
        stop_on_sigterm: true,
    };
    match job.spec.workers.backend {
        Backend::Tcp => {
            let timeout =
                tandem_api::contract::peer_timeout(|k| std::env::var(k).ok()).map_err(anyhow::Error::from)?;
            let host = std::env::var(tandem_comm::host::HOST_ID_ENV).ok().filter(|h| !h.is_empty());
            let comm = worker::connect_tcp(&job, &place, &token, timeout, host)
                .map_err(|e| failure(e, group, rank))?;
            if job.spec.model.parallelism.is_data() {
                train(&job, &place, &token, &args, &device, comm, None)
            } else {
                // The model's split layers and the group's step share the communicator.
                let comm = worker::Shared::new(comm);
                let model_group = comm.model_group();
                train(&job, &place, &token, &args, &device, comm, Some(model_group))
            }
        }
        Backend::Mpi => {
            #[cfg(feature = "mpi")]
            {
                let runtime = tandem_comm::mpi::MpiRuntime::init().map_err(anyhow::Error::from)?;
                let comm = runtime.world();
                place.rank = comm.rank() as u32;
                train(&job, &place, &token, &args, &device, comm, None)
            }
            #[cfg(not(feature = "mpi"))]
            {
                let _ = &mut place;
                Err(anyhow::anyhow!(
                    "this job uses backend: mpi, but this tandem was built without the `mpi` feature; rebuild with it"
                )
                .into())
            }
        }
    }
}

fn train<C: Communicator>(
    job: &tandem_api::contract::JobConfig,
    place: &Place,
    token: &str,
    args: &Args,
    device: &tandem_compute::device::Device,
    comm: C,
    model_group: Option<Box<dyn tandem_kernels::split::Group>>,
) -> Result<(), Failure> {
    let (group, rank) = (place.group, place.rank);
    let mut file = ProgressFile::from_env();
    let comm = tandem_comm::Metered(comm);
    let summary = worker::run(job, place, token, &args.data_dir, device, comm, model_group, |&progress| {
        println!("{}", WorkerLine::Progress { group, progress }.to_line());
        if let Some(file) = &mut file {
            file.append(&progress);
        }
    })
    .map_err(|e| failure(e, group, rank))?;
    let finished = WorkerLine::Finished {
        group,
        rank,
        steps: summary.steps,
        start_step: summary.start_step,
        accuracy: Some(summary.accuracy),
    };
    println!("{}", finished.to_line());
    Ok(())
}

/// The group's progress file ([`user_env::PROGRESS_FILE`], set on Kubernetes for a job without
/// parameter servers), where rank 0 appends each report as a [`UserProgress`] line for the
/// `tandem progress` sidecar that serves the job's progress. A file that cannot be written costs
/// the job its progress, not its training: the error is logged once and the file given up.
struct ProgressFile {
    path: PathBuf,
    file: Option<std::fs::File>,
    given_up: bool,
}

impl ProgressFile {
    fn from_env() -> Option<Self> {
        let path = std::env::var_os(user_env::PROGRESS_FILE).filter(|p| !p.is_empty())?;
        Some(Self { path: path.into(), file: None, given_up: false })
    }

    fn append(&mut self, report: &GroupReport) {
        if self.given_up {
            return;
        }
        let line = format!("{}\n", UserProgress::of_report(report).to_line());
        if let Err(e) = self.write(line.as_bytes()) {
            tracing::warn!(
                path = %self.path.display(),
                error = %e,
                "cannot append to the progress file; the job's status shows no further progress"
            );
            self.given_up = true;
        }
    }

    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        let file = match &mut self.file {
            Some(file) => file,
            None => {
                if let Some(parent) = self.path.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                let file = std::fs::OpenOptions::new().create(true).append(true).open(&self.path)?;
                self.file.insert(file)
            }
        };
        file.write_all(bytes)
    }
}
