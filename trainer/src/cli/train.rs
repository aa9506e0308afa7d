//! `tandem train -f job.yaml`: trains a TrainingJob manifest on this machine, in this process.
//!
//! Single-process jobs (one group of one rank, no parameter server) train here; jobs of more
//! processes run through the local runner ([`tandem::runner`]). Progress goes to a bar on a
//! terminal, or one JSON object per line with `--output json`; either way the training curve
//! (`curve.svg`, `curve.csv`; for a multi-process job the merged progress and the final
//! evaluation) is written into the job's output folder and its path printed at the end.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use super::DeviceArg;
use crate::cli::report::curve::Curve;
use anyhow::{Context, bail};
use tandem::compute::data;
use tandem::compute::optim::Optimizer;
use tandem::compute::train::{Event, LocalStep, RunOptions, Trainer};

/// How progress is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// A progress bar on a terminal, lines otherwise, and a summary.
    Text,
    /// One JSON object per line; the last is `{"event":"finished",…}`.
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
    /// Continue from the newest checkpoint in the output folder, if there is one.
    #[arg(long)]
    pub resume: bool,
    /// Kill a process of a multi-process job when the merged progress reaches a step:
    /// `kill:ps:<i>@<step>` or `kill:worker:<group>:<rank>@<step>` (repeatable).
    #[arg(long, value_name = "SPEC")]
    pub chaos: Vec<tandem::runner::chaos::Chaos>,
}

/// Runs `tandem train`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    // The CRD's own schema and CEL rules: refused here exactly when `kubectl apply` would refuse it.
    let job = tandem_api::manifest::parse(&text)
        .with_context(|| format!("{} is not a valid TrainingJob manifest", args.file.display()))?;
    let spec = &job.spec;
    let name = job.metadata.name.clone().unwrap_or_else(|| "job".to_owned());
    if tandem::runner::needs_runner(spec) {
        return run_local(&args, &name, spec);
    }
    if !args.chaos.is_empty() {
        bail!(
            "--chaos kills processes of a multi-process job; {} trains in this one process",
            args.file.display()
        );
    }

    let device = args.device.select()?;
    let data = data::load(&spec.data, &args.data_dir, spec.training.seed)?;
    let mut trainer = Trainer::new(spec, data, &device, 0, 1)?;
    let mut update = LocalStep::new(Optimizer::new(&spec.training.optimizer, trainer.params().len()));
    let out_dir = args.output_dir.unwrap_or_else(|| PathBuf::from("out").join(&name));
    let ckpt_dir = out_dir.join("checkpoints");
    if args.resume
        && let Some(path) = tandem::compute::checkpoint::latest(&ckpt_dir)?
    {
        trainer.resume(&mut update, &path)?;
        if args.output == Output::Text {
            eprintln!("resumed from {} at step {}", path.display(), trainer.step_count());
        }
    }

    let json = args.output == Output::Json;
    let bar = (!json && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(trainer.total_steps());
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} steps {elapsed_precise} eta {eta} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_position(trainer.step_count());
        bar
    });
    let mut curve = Curve::default();
    let mut failure: Option<anyhow::Error> = None;
    let mut stdout = std::io::stdout().lock();
    let title = format!("{name}: {} on {:?}", model_label(spec), spec.data.source);
    let opts = RunOptions { checkpoint_dir: Some(ckpt_dir), keep_checkpoints: 3, log_every: 0 };
    let mut last_test = None;
    trainer.run(&mut update, &opts, &mut |event: &Event| {
        curve.record(event);
        let mut emit = |e: &serde_json::Value| {
            if json {
                let _ = writeln!(stdout, "{e}");
            }
        };
        match event {
            Event::Finished { .. } => match curve.write(&out_dir, &title) {
                Ok(path) => {
                    emit(&serde_json::json!({"event": "curve", "path": path.display().to_string()}));
                    if !json {
                        eprintln!("training curve written to {}", path.display());
                    }
                }
                Err(e) => {
                    failure = Some(anyhow::anyhow!("writing the curve into {}: {e}", out_dir.display()))
                }
            },
            Event::Train { step, loss, .. } => {
                if let Some(bar) = &bar {
                    bar.set_position(*step);
                    let acc = last_test.map(|a: f64| format!(" test acc {a:.4}")).unwrap_or_default();
                    bar.set_message(format!("loss {loss:.4}{acc}"));
                }
            }
            Event::Eval { step, test_loss, test_accuracy } => {
                last_test = Some(*test_accuracy);
                if bar.is_none() && !json {
                    eprintln!("step {step}: test loss {test_loss:.4}, test accuracy {test_accuracy:.4}");
                }
            }
            _ => {}
        }
        if json && let Ok(v) = serde_json::to_value(event) {
            emit(&v);
        }
        if !json
            && let Event::Finished { test_accuracy, test_loss, steps, samples_per_second, wall_seconds } =
                event
        {
            if let Some(bar) = &bar {
                bar.finish_and_clear();
            }
            println!(
                "{name}: test accuracy {test_accuracy:.4}, test loss {test_loss:.4} after {steps} steps; \
                 {samples_per_second:.0} samples/s, {wall_seconds:.1} s"
            );
        }
    })?;
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn model_label(spec: &tandem_api::TrainingJobSpec) -> String {
    let hidden: Vec<String> = spec.model.hidden.iter().map(u32::to_string).collect();
    match spec.model.kind {
        tandem_api::ModelKind::Mlp => format!("mlp [{}]", hidden.join(", ")),
        tandem_api::ModelKind::Cnn => {
            let ch: Vec<String> = spec.model.channels.iter().map(u32::to_string).collect();
            format!("cnn channels [{}] dense [{}]", ch.join(", "), hidden.join(", "))
        }
    }
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
    };
    let mut display = crate::cli::report::display::Display::new(name, args.output == Output::Json);
    // The merged progress is the job's training curve, written when it finishes.
    let mut curve = Curve::default();
    let title = format!(
        "{name}: {} on {:?}, {:?}, {} group(s) of {}, {} PS",
        model_label(spec),
        spec.data.source,
        spec.training.algorithm,
        spec.workers.groups,
        spec.workers.group_size,
        spec.parameter_servers.replicas
    );
    let mut failure: Option<anyhow::Error> = None;
    tandem::runner::run(&opts, &mut |event| {
        match event {
            tandem::runner::Event::Progress { step, loss, accuracy, .. } => {
                curve.record_merged(*step, *loss, *accuracy, None)
            }
            tandem::runner::Event::Finished { test_accuracy, test_loss, steps, .. } => {
                curve.record_merged(*steps, None, Some(*test_accuracy), *test_loss);
                match curve.write(&opts.output, &title) {
                    Ok(path) => display.curve(&path),
                    Err(e) => {
                        failure =
                            Some(anyhow::anyhow!("writing the curve into {}: {e}", opts.output.display()))
                    }
                }
            }
            _ => {}
        }
        display.show(event)
    })
    .with_context(|| format!("{}: {name}", args.file.display()))?;
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
