//! `tandem train -f job.yaml`: trains a TrainingJob manifest on this machine, in this process.
//!
//! Single-process jobs (one group of one rank, no parameter server) train here; jobs of more
//! processes run through the local runner ([`tandem::runner`]). Either way progress goes through
//! one front-end ([`crate::cli::report::display`]), as the runner's events: a bar on a terminal,
//! or one JSON object per line with `--output json`; and the training curve (`curve.svg`,
//! `curve.csv`: the merged progress and the final evaluation) is written into the job's output
//! folder and its path printed at the end.
//!
//! `--resume` continues the run whose checkpoints the output folder holds; without it such a
//! folder is refused ([`tandem::runner::check_output`]), for a job of one process as for one of
//! many, so that no run deletes, prunes or resumes another's checkpoints.

use std::path::PathBuf;

use super::DeviceArg;
use crate::cli::report::display::Display;
use anyhow::{Context, bail};
use tandem::runner::Event;
use tandem::runner::progress::Merged;
use tandem_api::JobPlan;
use tandem_compute::checkpoint;
use tandem_compute::mirror::Mirror;
use tandem_compute::optim::Optimizer;
use tandem_compute::train::{Cadence, LocalStep, Trainer};
use tandem_input as data;

/// How progress is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// A progress bar on a terminal, lines otherwise, and a summary.
    Text,
    /// One JSON object per line (the runner's events); the last is `{"event":"finished",…}`.
    Json,
}

/// Arguments of `tandem train`.
#[derive(clap::Args)]
pub struct Args {
    /// TrainingJob manifest to run.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Progress format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Folder for the curve and checkpoints [default: out/<job name>].
    #[arg(long)]
    pub output_dir: Option<PathBuf>,
    /// Folder holding the built-in data sets (`make data` fills it).
    #[arg(long, env = "TANDEM_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,
    /// Compute device.
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    pub device: DeviceArg,
    /// Continue the run whose checkpoints the output folder holds: every PS shard and group from
    /// where it stopped (a damaged newest checkpoint falls back to the one before). Without it, a
    /// folder holding an earlier run's checkpoints is refused, never cleared or mixed into.
    #[arg(long)]
    pub resume: bool,
    /// Kill a process of a multi-process job when the merged progress reaches a step:
    /// `kill:ps:<i>@<step>` or `kill:worker:<group>:<rank>@<step>` (repeatable).
    #[arg(long, value_name = "SPEC")]
    pub chaos: Vec<tandem::runner::chaos::Chaos>,
    /// Run each process of a multi-process job inside a network namespace of this machine, at its
    /// address: `NAME=ADDR` (repeatable; processes go round-robin, PS replicas first, then each
    /// group's ranks). `bench/cluster.sh` builds such nodes with rate-limited links.
    #[arg(long = "node", value_name = "NAME=ADDR")]
    pub nodes: Vec<tandem::runner::nodes::Node>,
}

/// Runs `tandem train`.
pub fn run(args: Args) -> anyhow::Result<()> {
    // Warnings only (a skipped corrupt image, say): the display shows the progress.
    super::init_logging_at("warn");
    let text =
        std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    // The CRD's own schema and CEL rules: refused here exactly when `kubectl apply` would refuse it.
    let job = tandem_api::manifest::parse(&text)
        .with_context(|| format!("{} is not a valid TrainingJob manifest", args.file.display()))?;
    let spec = &job.spec;
    let name = job.metadata.name.clone().unwrap_or_else(|| "job".to_owned());
    if spec.workers.command.is_none() {
        check_memory(spec)
            .with_context(|| format!("{} is too large for this machine", args.file.display()))?;
    }
    if tandem::runner::needs_runner(spec) {
        return run_local(&args, &name, spec);
    }
    if !args.nodes.is_empty() {
        bail!(
            "--node places the processes of a multi-process job; {} trains in this one process",
            args.file.display()
        );
    }
    if !args.chaos.is_empty() {
        bail!(
            "--chaos kills processes of a multi-process job; {} trains in this one process",
            args.file.display()
        );
    }

    let out_dir = args.output_dir.clone().unwrap_or_else(|| PathBuf::from("out").join(&name));
    tandem::runner::check_output(&out_dir, args.resume)?;
    let device = args.device.select()?;
    let data = data::open_job(spec, &args.data_dir)?;
    let plan = JobPlan::resolve(spec, data.train.samples())?;
    let mut trainer = Trainer::new(spec, &plan, data, &device, 0)?;
    let mut update = LocalStep::new(Optimizer::new(&spec.training.optimizer, trainer.params().len()));
    let ckpt_dir = out_dir.join("checkpoints");
    // This process writes the checkpoints: it takes the folder over.
    checkpoint::remove_partial(&ckpt_dir)?;
    // Checkpoints in object storage are the job's wherever it runs: a run resumes from them.
    let mirror = Mirror::of(spec, &name, &out_dir);
    if let Some(mirror) = &mirror {
        mirror.restore(&ckpt_dir, checkpoint::is_checkpoint)?;
    }
    let title = format!("{name}: {} on {:?}", model_label(spec), spec.data.source);
    let mut display = Display::new(&name, args.output == Output::Json, title, out_dir.clone());
    if (args.resume || mirror.is_some())
        && let Some(newest) = checkpoint::newest_intact(&ckpt_dir)?
    {
        trainer.restore(&mut update, &newest.path, &newest.checkpoint)?;
        let skipped = match newest.skipped {
            0 => String::new(),
            n => format!(" ({n} newer checkpoint(s) failed their checks and were skipped)"),
        };
        display.note(&format!(
            "resumed from {} at step {}{skipped}",
            newest.path.display(),
            trainer.step_count()
        ));
    }
    // The one front-end: this process is group 0 of a job of one, its reports merged and shown
    // as the runner shows a job of many.
    display.show(&Event::Started {
        job: name.clone(),
        processes: 1,
        total_steps: trainer.total_steps(),
        output: out_dir.display().to_string(),
    });
    let mut merged = Merged::default();
    let cadence = Cadence { mirror, ..Cadence::of(spec, Some(ckpt_dir)) };
    let summary = trainer.run(&mut update, &cadence, &mut |r| display.show(&merged.report(0, r)))?;
    display.show(&Event::Finished {
        test_accuracy: Some(summary.evaluation.accuracy),
        test_loss: Some(summary.evaluation.loss),
        steps: summary.steps,
        samples_per_second: summary.samples_per_second,
        wall_seconds: summary.wall_seconds,
        restarts: 0,
    });
    display.finish()
}

/// Refuses a job whose estimated memory ([`tandem_api::plan::memory`]) exceeds what this machine
/// has available, before any process allocates it; data sets read from a path are sized by the
/// model alone until they are read.
fn check_memory(spec: &tandem_api::TrainingJobSpec) -> anyhow::Result<()> {
    use tandem_api::plan::memory::{DataShape, MemoryEstimate, builtin_data};
    let Some(available) = tandem_util::proc::available_memory() else { return Ok(()) };
    let shape = builtin_data(spec).unwrap_or(DataShape {
        channels: 1,
        height: 28,
        width: 28,
        samples: 0,
        classes: 10,
    });
    let estimate = MemoryEstimate::of(spec, shape);
    let need =
        if tandem::runner::needs_runner(spec) { estimate.local_total() } else { estimate.worker_bytes };
    Ok(estimate.check(need, available)?)
}

fn model_label(spec: &tandem_api::TrainingJobSpec) -> String {
    spec.model.label()
}

/// A job of several processes: the local runner starts and supervises them.
fn run_local(args: &Args, name: &str, spec: &tandem_api::TrainingJobSpec) -> anyhow::Result<()> {
    let output = args.output_dir.clone().unwrap_or_else(|| PathBuf::from("out").join(name));
    std::fs::create_dir_all(&output).with_context(|| format!("creating {}", output.display()))?;
    let absolute = |p: &std::path::Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let device = clap::ValueEnum::to_possible_value(&args.device)
        .map(|v| v.get_name().to_owned())
        .unwrap_or_else(|| "auto".to_owned());
    let opts = tandem::runner::Options {
        job_name: name.to_owned(),
        spec: spec.clone(),
        output: absolute(&output),
        exe: std::env::current_exe().context("cannot find the tandem executable to start its processes")?,
        data_dir: absolute(&args.data_dir),
        worker_args: vec!["--device".to_owned(), device],
        chaos: args.chaos.clone(),
        resume: args.resume,
        placement: tandem::runner::nodes::Placement::new(args.nodes.clone()),
        // A relative path in workers.command names a file beside the manifest.
        workdir: absolute(
            args.file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new(".")),
        ),
    };
    let what = match &spec.workers.command {
        Some(command) => format!("`{}`", command.join(" ")),
        None => format!("{} on {:?}", model_label(spec), spec.data.source),
    };
    let title = format!(
        "{name}: {what}, {:?}, {} group(s) of {}, {} PS",
        spec.training.algorithm,
        spec.workers.groups,
        spec.workers.group_size,
        spec.parameter_servers.replicas
    );
    let mut display = Display::new(name, args.output == Output::Json, title, opts.output.clone());
    tandem::runner::run(&opts, &mut |event| display.show(event))
        .with_context(|| format!("{}: {name}", args.file.display()))?;
    display.finish()
}
