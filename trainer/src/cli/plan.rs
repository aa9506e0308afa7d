//! `tandem plan -f job.yaml [--link 10gbit …] [--nodes N]`: the shape a job should take on a
//! cluster, chosen by analysis. It measures this machine's compute on the job's model layer by
//! layer (one thread, the job's batch, as many steps as fit in a second), or takes the figure as
//! `--seconds-per-sample`; prices every candidate shape with [`tandem_api::plan::shape`] (PCL-DNN's
//! balance of compute and communication per layer, MXNET-MPI's PS and allreduce traffic); and
//! prints for each link rate the predicted step time of each shape, the best one, and the patch
//! that gives the manifest that shape.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tandem_api::TrainingJobSpec;
use tandem_api::plan::shape::{self, Cluster, LayerCost, LinkRate, Prediction, Workload, algorithm_name};
use tandem_compute::model::{Batch, Engine, Model};
use tandem_input as data;

/// Arguments of `tandem plan`.
#[derive(clap::Args)]
pub struct Args {
    /// TrainingJob manifest to plan.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Each node's link rate (tc's units: 1gbit, 10gbit, 25gbit, 100mbit); repeatable, a table each.
    #[arg(long, default_value = "10gbit")]
    pub link: Vec<LinkRate>,
    /// Nodes, one process (PS replica or rank) each [default: the manifest's processes].
    #[arg(long)]
    pub nodes: Option<u32>,
    /// CPUs of all nodes together [default: this machine's, right for a cluster in a box; on a
    /// real cluster pass nodes × cores per node].
    #[arg(long)]
    pub cpus: Option<f64>,
    /// The model's forward and backward seconds per sample on one thread, instead of measuring.
    #[arg(long)]
    pub seconds_per_sample: Option<f64>,
    /// Let dense layers be split over a group's ranks where PCL-DNN's balance says so.
    #[arg(long)]
    pub model_parallel: bool,
    /// Folder holding the built-in data sets (for the input shape).
    #[arg(long, env = "TANDEM_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,
    /// Output format: a table per link, or one JSON object per shape and link.
    #[arg(short = 'o', long, value_enum, default_value_t = super::train::Output::Text)]
    pub output: super::train::Output,
}

/// Runs `tandem plan`.
pub fn run(args: Args) -> anyhow::Result<()> {
    super::init_logging_at("warn");
    let text =
        std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let job = tandem_api::manifest::parse(&text)
        .with_context(|| format!("{} is not a valid TrainingJob manifest", args.file.display()))?;
    let spec = &job.spec;
    let name = job.metadata.name.clone().unwrap_or_else(|| "job".to_owned());
    let processes = spec.processes();
    let nodes = args.nodes.unwrap_or(processes);
    if nodes == 0 {
        bail!("--nodes 0: a job needs at least one node");
    }
    let cpus =
        args.cpus.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()) as f64);
    if !(cpus.is_finite() && cpus > 0.0) {
        bail!("--cpus {cpus}: give the CPUs of all nodes together, a positive number");
    }
    let layers = match args.seconds_per_sample {
        // The traffic still needs the model's size: taken from the model, without timing it.
        Some(s) if s.is_finite() && s > 0.0 => vec![LayerCost {
            name: "model".into(),
            params: engine(spec, &args.data_dir)?.0.layout().len() as u64,
            dense: None,
            seconds_per_sample: s,
        }],
        Some(s) => bail!("--seconds-per-sample {s}: give a positive number of seconds"),
        None => measure(spec, &args.data_dir)?,
    };
    let work = Workload {
        layers,
        batch: u64::from(spec.data.batch_size),
        tau: u64::from(spec.training.easgd.tau).max(1),
        model_parallel: args.model_parallel,
    };
    let per_sample: f64 = work.layers.iter().map(|l| l.seconds_per_sample).sum();
    let params: u64 = work.layers.iter().map(|l| l.params).sum();
    for link in &args.link {
        let cluster = Cluster { nodes, cpus, link: *link };
        let ranked = shape::plan(&work, &cluster, spec.training.algorithm);
        match args.output {
            super::train::Output::Json => {
                for (i, p) in ranked.iter().enumerate() {
                    println!("{}", json(&name, link, &cluster, p, i == 0));
                }
            }
            super::train::Output::Text => {
                println!(
                    "{name}: {}, {params} parameters, batch {} per rank; {:.1} µs per sample on one thread{}",
                    spec.model.label(),
                    work.batch,
                    per_sample * 1e6,
                    if args.seconds_per_sample.is_some() { " (given)" } else { " (measured here)" }
                );
                println!("cluster: {nodes} nodes, {cpus} CPUs in all, links at {link}\n");
                print_table(&ranked);
                let best = &ranked[0];
                println!(
                    "\nbest: {} — {:.0} samples/s, step {:.2} ms",
                    best.shape,
                    best.samples_per_s,
                    best.step_s * 1e3
                );
                if !args.model_parallel {
                    let split = shape::predict(
                        &Workload { model_parallel: true, ..work.clone() },
                        &cluster,
                        best.shape,
                    );
                    if !split.model_parallel.is_empty() {
                        println!(
                            "PCL-DNN's balance would split {} over the group's ranks (--model-parallel prices it): {:.2} ms a step instead of {:.2}",
                            split.model_parallel.join(", "),
                            split.step_s * 1e3,
                            best.step_s * 1e3
                        );
                    }
                }
                println!("\npatch for {}:\n{}", args.file.display(), patch(spec, best));
            }
        }
    }
    Ok(())
}

fn print_table(ranked: &[Prediction]) {
    println!(
        "{:<28} {:>11} {:>11} {:>9} {:>10} {:>11}  split layers",
        "shape", "compute ms", "in-group ms", "PS ms", "step ms", "samples/s"
    );
    for p in ranked {
        println!(
            "{:<28} {:>11.2} {:>11.2} {:>9.2} {:>10.2} {:>11.0}  {}",
            p.shape.to_string(),
            p.compute_s * 1e3,
            p.group_s * 1e3,
            p.ps_s * 1e3,
            p.step_s * 1e3,
            p.samples_per_s,
            if p.model_parallel.is_empty() { "-".to_owned() } else { p.model_parallel.join(",") }
        );
    }
}

fn json(name: &str, link: &LinkRate, cluster: &Cluster, p: &Prediction, best: bool) -> serde_json::Value {
    serde_json::json!({
        "job": name,
        "link": link.to_string(),
        "nodes": cluster.nodes,
        "cpus": cluster.cpus,
        "ps": p.shape.ps,
        "groups": p.shape.groups,
        "group_size": p.shape.group_size,
        "algorithm": algorithm_name(p.shape.algorithm),
        "compute_s": p.compute_s,
        "group_s": p.group_s,
        "ps_s": p.ps_s,
        "step_s": p.step_s,
        "samples_per_s": p.samples_per_s,
        "model_parallel": p.model_parallel,
        "best": best,
    })
}

/// The manifest fields that give the job `p`'s shape (a strategic-merge patch's `spec`).
fn patch(spec: &TrainingJobSpec, p: &Prediction) -> String {
    let s = p.shape;
    let max_groups = spec.workers.max_groups.max(s.groups);
    let min_groups = spec.workers.min_groups.min(s.groups);
    format!(
        "spec:\n  training: {{algorithm: {}}}\n  parameterServers: {{replicas: {}}}\n  workers: {{groups: {}, groupSize: {}, minGroups: {min_groups}, maxGroups: {max_groups}}}",
        algorithm_name(s.algorithm),
        s.ps,
        s.groups,
        s.group_size
    )
}

/// The job's model on this machine, one thread: each layer's forward and backward seconds per
/// sample (what no layer claims — the loss — goes to a last entry), its parameters, and for dense
/// layers their features.
fn measure(spec: &TrainingJobSpec, data_dir: &std::path::Path) -> anyhow::Result<Vec<LayerCost>> {
    let (mut engine, per_sample) = engine(spec, data_dir)?;
    let batch = spec.data.batch_size as usize;
    let (mut params, mut state, mut grads) = (
        vec![0f32; engine.layout().len()],
        vec![0f32; engine.state_layout().len()],
        vec![0f32; engine.layout().len()],
    );
    engine.init(&mut params, &mut state)?;
    let features = vec![0f32; batch * per_sample];
    let labels = vec![0u32; if spec.model.kind.is_language_model() { features.len() } else { batch }];
    let mut step = |engine: &mut Engine| {
        engine.forward_backward(
            &params,
            &mut state,
            &mut grads,
            Batch { features: &features, labels: &labels },
        )
    };
    step(&mut engine)?; // buffers sized, caches warm
    engine.network_mut().set_profiling(true);
    let started = Instant::now();
    let mut steps = 0usize;
    while steps < 3 || (started.elapsed() < Duration::from_secs(1) && steps < 200) {
        step(&mut engine)?;
        steps += 1;
    }
    let wall = started.elapsed().as_secs_f64();
    let times = engine.network().layer_times();
    engine.network_mut().set_profiling(false);
    let samples = (steps * batch) as f64;
    let layout = engine.layout().entries().to_vec();
    let mut layers: Vec<LayerCost> = times
        .iter()
        .filter(|t| t.leaf)
        .map(|t| {
            let prefix = format!("{}.", t.name);
            let own = || layout.iter().filter(|e| e.name.starts_with(&prefix));
            let params = own().map(|e| e.len as u64).sum();
            let is_dense = t.kind.starts_with("dense ") || t.kind.starts_with("linear ");
            let dense = own()
                .find(|e| is_dense && e.name.ends_with(".weight") && e.shape.len() == 2)
                .map(|e| (e.shape[1] as u64, e.shape[0] as u64));
            LayerCost {
                name: t.name.clone(),
                params,
                dense,
                seconds_per_sample: (t.forward + t.backward) / samples,
            }
        })
        .collect();
    let counted: f64 = layers.iter().map(|l| l.seconds_per_sample).sum();
    let claimed: u64 = layers.iter().map(|l| l.params).sum();
    let rest = (wall / samples - counted).max(0.0);
    let unclaimed = layout.iter().map(|e| e.len as u64).sum::<u64>().saturating_sub(claimed);
    layers.push(LayerCost {
        name: "(loss, tied and other)".into(),
        params: unclaimed,
        dense: None,
        seconds_per_sample: rest,
    });
    Ok(layers)
}

/// The job's model on the CPU engine at one thread, shaped by its data, and the values of one
/// sample (a language model's: token ids).
fn engine(spec: &TrainingJobSpec, data_dir: &std::path::Path) -> anyhow::Result<(Engine, usize)> {
    let data = data::open_job(spec, data_dir).context("opening the job's data for its input shape")?;
    let (shape, classes) = (data.train.shape(), data.train.classes().max(data.test.classes));
    Ok((Engine::new(&spec.model, shape, classes, spec.training.seed, 1)?, shape.features()))
}
