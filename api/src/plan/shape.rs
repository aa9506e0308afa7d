//! Choosing a job's shape by analysis (what `tandem plan` prints): for every candidate shape — PS
//! replicas, groups, group size, and per dense layer data or model parallelism — the predicted
//! step time from the model's measured compute and a traffic model of the links, after the two
//! papers Tandem implements.
//!
//! Expected flow: the caller measures each layer's compute per sample ([`LayerCost`], at one
//! thread) and describes the machines ([`Cluster`]: nodes, CPUs, link rate); [`candidates`] lists
//! the shapes a job of that many nodes can take (one process per node); [`predict`] prices one;
//! [`plan`] prices them all, fastest first.
//!
//! The model (its terms are each [`Prediction`]'s fields):
//! - Compute: a rank's step is its batch times the layers' seconds per sample, stretched by the
//!   ranks sharing the cluster's CPUs (`ranks / cpus`: time-sliced when there are more ranks than
//!   CPUs, spread over threads when fewer) — a cluster in a box, where every node shares one
//!   machine's cores, and a real cluster (one rank per node of `cpus / nodes` cores) alike.
//! - Inside a group of `n` ranks (PCL-DNN): a data-parallel layer's gradient is ring-allreduced,
//!   `2 (n−1)/n · params` values through every rank's link; a model-parallel dense layer (output
//!   features split over the ranks) instead all-gathers its input activations in the forward pass
//!   and reduce-scatters their gradient in the backward pass, `2 (n−1) · batch · inputs` values per
//!   rank. PCL-DNN's balance: split a layer when that moves less, i.e. when the group's batch
//!   `n · batch` is below the layer's outputs; convolutions stay data-parallel.
//! - Across groups (MXNET-MPI): every step each group's rank 0 pushes the gradient and pulls the
//!   weights (the whole model each way through its link), and the `p` PS replicas' links carry
//!   `groups / p` models each way: the slower of the two bounds the exchange. EASGD exchanges every
//!   τ steps, so a step pays 1/τ of it.
//!
//! Caveats: links are full duplex and rate-limited only (no added latency; bench/cluster.sh's tbf
//! links); compute and communication do not overlap; the PS's own update is not counted. The bench
//! measures how far these hold (`bench/cluster.sh` prints predicted against measured).

use std::fmt;
use std::str::FromStr;

use crate::job::Algorithm;

/// How a dense layer is spread over a group's ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parallelism {
    /// Every rank holds the whole layer and its gradient is allreduced.
    Data,
    /// The layer's output features are split over the ranks.
    Model,
}

/// What the analysis needs to know of one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerCost {
    /// PyTorch-style name (`fc1`, `layer1.0.conv1`).
    pub name: String,
    /// Trainable values.
    pub params: u64,
    /// `(inputs, outputs)` features of a dense layer; `None` for layers that stay data-parallel.
    pub dense: Option<(u64, u64)>,
    /// Forward plus backward seconds per sample, on one thread.
    pub seconds_per_sample: f64,
}

/// What is trained: the model's layers, the per-rank batch and the job's exchange settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// Every layer, in forward order.
    pub layers: Vec<LayerCost>,
    /// Samples per rank per step.
    pub batch: u64,
    /// EASGD's steps between exchanges τ (1 for the other algorithms).
    pub tau: u64,
    /// Whether dense layers may be split over a group's ranks (PCL-DNN's model parallelism); when
    /// not, every layer is data-parallel and the balance is only reported.
    pub model_parallel: bool,
}

/// The machines a job runs on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cluster {
    /// Nodes, one process (PS replica or rank) each.
    pub nodes: u32,
    /// CPUs all nodes together have (a cluster in a box: this machine's).
    pub cpus: f64,
    /// Each node's link.
    pub link: LinkRate,
}

/// A link's rate in bits per second: `1gbit`, `10gbit`, `25gbit`, `100mbit`, ….
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct LinkRate(pub f64);

impl LinkRate {
    /// Bytes per second.
    pub fn bytes_per_second(self) -> f64 {
        self.0 / 8.0
    }
}

impl FromStr for LinkRate {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || {
            format!("`{text}` is not a link rate; write <number>kbit, mbit or gbit, e.g. 10gbit (tc's units)")
        };
        let lower = text.trim().to_ascii_lowercase();
        let (number, scale) = [("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)]
            .iter()
            .find_map(|(unit, scale)| lower.strip_suffix(unit).map(|n| (n.to_owned(), *scale)))
            .ok_or_else(bad)?;
        match number.parse::<f64>() {
            Ok(n) if n.is_finite() && n > 0.0 => Ok(Self(n * scale)),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for LinkRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            r if r >= 1e9 => write!(f, "{}gbit", r / 1e9),
            r if r >= 1e6 => write!(f, "{}mbit", r / 1e6),
            r => write!(f, "{}kbit", r / 1e3),
        }
    }
}

/// A job's shape: how its nodes are used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// PS replicas (0: one allreduce group).
    pub ps: u32,
    /// Worker groups.
    pub groups: u32,
    /// Ranks per group.
    pub group_size: u32,
    /// The algorithm the shape runs.
    pub algorithm: Algorithm,
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} PS, {}×{} {}", self.ps, self.groups, self.group_size, algorithm_name(self.algorithm))
    }
}

/// The manifest's name of an algorithm.
pub fn algorithm_name(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::Allreduce => "allreduce",
        Algorithm::PsSync => "ps-sync",
        Algorithm::PsAsync => "ps-async",
        Algorithm::Hybrid => "hybrid",
        Algorithm::Easgd => "easgd",
    }
}

/// What one shape is predicted to cost per step.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// The shape.
    pub shape: Shape,
    /// A rank's forward and backward pass.
    pub compute_s: f64,
    /// Inside the group: allreduce of data-parallel gradients, activations of split layers.
    pub group_s: f64,
    /// The PS exchange (per step).
    pub ps_s: f64,
    /// The whole step.
    pub step_s: f64,
    /// Samples per second of the whole job.
    pub samples_per_s: f64,
    /// Dense layers split over the group's ranks (PCL-DNN's balance).
    pub model_parallel: Vec<String>,
}

/// The shapes a job of `cluster.nodes` nodes can take, one process per node, keeping the family of
/// `algorithm`: with no PS one allreduce group of every node; with `p` PS replicas the other nodes
/// in groups of every size that divides them (`ps-sync` for groups of one, `hybrid` otherwise,
/// unless the job asks for `ps-async` or `easgd`, which stay).
pub fn candidates(cluster: &Cluster, algorithm: Algorithm) -> Vec<Shape> {
    let nodes = cluster.nodes.max(1);
    let mut shapes = vec![Shape { ps: 0, groups: 1, group_size: nodes, algorithm: Algorithm::Allreduce }];
    for ps in 1..=(nodes / 2).max(1) {
        let workers = nodes.saturating_sub(ps);
        for size in (1..=workers).filter(|s| workers % s == 0) {
            let algorithm = match algorithm {
                Algorithm::PsAsync | Algorithm::Easgd => algorithm,
                _ if size == 1 => Algorithm::PsSync,
                _ => Algorithm::Hybrid,
            };
            shapes.push(Shape { ps, groups: workers / size, group_size: size, algorithm });
        }
    }
    shapes
}

/// Prices `shape` for `work` on `cluster`.
pub fn predict(work: &Workload, cluster: &Cluster, shape: Shape) -> Prediction {
    let layers = &work.layers;
    let link = cluster.link.bytes_per_second();
    let n = f64::from(shape.group_size.max(1));
    let ranks = f64::from(shape.groups * shape.group_size);
    let batch = work.batch as f64;
    let per_sample: f64 = layers.iter().map(|l| l.seconds_per_sample).sum();
    let compute_s = per_sample * batch * ranks / cluster.cpus.max(1e-9);
    let mut model_parallel = Vec::new();
    let mut group_values = 0.0;
    for layer in layers {
        let data = 2.0 * (n - 1.0) / n * layer.params as f64;
        let split = match layer.dense {
            Some((inputs, outputs)) if n > 1.0 && n * batch < outputs as f64 => {
                Some(2.0 * (n - 1.0) * batch * inputs as f64)
            }
            _ => None,
        };
        match split {
            Some(values) if work.model_parallel && values < data => {
                model_parallel.push(layer.name.clone());
                group_values += values;
            }
            _ => group_values += data,
        }
    }
    let group_s = group_values * 4.0 / link;
    let model_bytes = layers.iter().map(|l| l.params).sum::<u64>() as f64 * 4.0;
    let ps_s = if shape.ps == 0 {
        0.0
    } else {
        let through_ps = f64::from(shape.groups) / f64::from(shape.ps);
        let per_exchange = model_bytes * through_ps.max(1.0) / link;
        match shape.algorithm {
            Algorithm::Easgd => per_exchange / work.tau.max(1) as f64,
            _ => per_exchange,
        }
    };
    let step_s = compute_s + group_s + ps_s;
    let samples_per_s = ranks * batch / step_s.max(1e-12);
    Prediction { shape, compute_s, group_s, ps_s, step_s, samples_per_s, model_parallel }
}

/// Every candidate shape priced, the fastest (most samples per second) first.
pub fn plan(work: &Workload, cluster: &Cluster, algorithm: Algorithm) -> Vec<Prediction> {
    let mut all: Vec<Prediction> =
        candidates(cluster, algorithm).into_iter().map(|s| predict(work, cluster, s)).collect();
    all.sort_by(|a, b| b.samples_per_s.total_cmp(&a.samples_per_s));
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The MLP [784 → 256 → 128 → 10] of the MNIST examples, 20 µs per sample per layer, at
    /// batch 32 (EASGD's τ 4), dense layers splittable.
    fn mlp() -> Workload {
        let layers = [(784, 256), (256, 128), (128, 10)]
            .iter()
            .enumerate()
            .map(|(i, &(inputs, outputs))| LayerCost {
                name: format!("fc{}", i + 1),
                params: inputs * outputs + outputs,
                dense: Some((inputs, outputs)),
                seconds_per_sample: 20e-6,
            })
            .collect();
        Workload { layers, batch: 32, tau: 4, model_parallel: true }
    }

    fn cluster(nodes: u32, link: &str) -> Cluster {
        Cluster { nodes, cpus: f64::from(nodes), link: link.parse().unwrap() }
    }

    #[test]
    fn link_rates_read_like_tcs_and_bad_ones_say_how_to_write_them() {
        assert_eq!("10gbit".parse::<LinkRate>().unwrap().bytes_per_second(), 1.25e9);
        assert_eq!("100mbit".parse::<LinkRate>().unwrap().0, 1e8);
        assert_eq!("25gbit".parse::<LinkRate>().unwrap().to_string(), "25gbit");
        for bad in ["10", "fast", "0gbit", "-1gbit", "10gbps"] {
            let err = bad.parse::<LinkRate>().unwrap_err();
            assert!(err.contains("e.g. 10gbit"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_candidates_of_six_nodes_use_every_node_once() {
        let shapes = candidates(&cluster(6, "1gbit"), Algorithm::Hybrid);
        assert!(shapes.iter().all(|s| s.ps + s.groups * s.group_size == 6), "{shapes:?}");
        assert_eq!(shapes[0], Shape { ps: 0, groups: 1, group_size: 6, algorithm: Algorithm::Allreduce });
        assert!(shapes.contains(&Shape { ps: 2, groups: 4, group_size: 1, algorithm: Algorithm::PsSync }));
        assert!(shapes.contains(&Shape { ps: 2, groups: 2, group_size: 2, algorithm: Algorithm::Hybrid }));
        assert!(shapes.contains(&Shape { ps: 1, groups: 1, group_size: 5, algorithm: Algorithm::Hybrid }));
        let easgd = candidates(&cluster(6, "1gbit"), Algorithm::Easgd);
        assert!(easgd.iter().filter(|s| s.ps > 0).all(|s| s.algorithm == Algorithm::Easgd));
    }

    #[test]
    fn a_ps_exchange_costs_the_model_through_the_busiest_link() {
        let work = mlp();
        let model: u64 = work.layers.iter().map(|l| l.params).sum();
        let c = cluster(6, "1gbit");
        let shape = Shape { ps: 2, groups: 4, group_size: 1, algorithm: Algorithm::PsSync };
        let p = predict(&work, &c, shape);
        // 4 groups over 2 replicas: each PS link carries 2 models each way per step.
        let expected = 2.0 * model as f64 * 4.0 / 1.25e8;
        assert!((p.ps_s - expected).abs() < 1e-12, "{} vs {expected}", p.ps_s);
        assert_eq!(p.group_s, 0.0);
        // 4 ranks on 6 CPUs: each rank's 32 samples at 60 µs, spread over its share of the CPUs.
        assert!((p.compute_s - 32.0 * 60e-6 * 4.0 / 6.0).abs() < 1e-12, "{}", p.compute_s);
        assert!((p.samples_per_s - 4.0 * 32.0 / p.step_s).abs() < 1e-9);
        let easgd = predict(&work, &c, Shape { algorithm: Algorithm::Easgd, ..shape });
        assert!((easgd.ps_s - expected / 4.0).abs() < 1e-12);
    }

    #[test]
    fn dense_layers_wider_than_the_groups_batch_are_split_and_the_rest_allreduced() {
        // A group of 4 at batch 32 sees 128 samples: fc1 (256 outputs) is worth splitting, fc2
        // (128 outputs, not more than the batch) and fc3 (10) are not.
        let shape = Shape { ps: 0, groups: 1, group_size: 4, algorithm: Algorithm::Allreduce };
        let p = predict(&mlp(), &cluster(4, "1gbit"), shape);
        assert_eq!(p.model_parallel, vec!["fc1".to_owned()]);
        let fc1 = 2.0 * 3.0 * 32.0 * 784.0;
        let rest = 2.0 * 0.75 * (256.0 * 128.0 + 128.0 + 128.0 * 10.0 + 10.0);
        assert!((p.group_s - (fc1 + rest) * 4.0 / 1.25e8).abs() < 1e-12, "{}", p.group_s);
        // Without model parallelism every layer's gradient is allreduced.
        let data_only = predict(&Workload { model_parallel: false, ..mlp() }, &cluster(4, "1gbit"), shape);
        let all = 2.0 * 0.75 * (784.0 * 256.0 + 256.0 + 256.0 * 128.0 + 128.0 + 128.0 * 10.0 + 10.0);
        assert!(data_only.model_parallel.is_empty());
        assert!((data_only.group_s - all * 4.0 / 1.25e8).abs() < 1e-12);
    }

    #[test]
    fn slow_links_favour_fewer_exchanges_and_fast_links_more_ranks() {
        let work = mlp();
        let slow = plan(&work, &cluster(6, "100mbit"), Algorithm::Hybrid);
        let fast = plan(&work, &cluster(6, "25gbit"), Algorithm::Hybrid);
        // With fast links communication is nearly free: the shape with the most ranks wins.
        let best_fast = fast[0].shape;
        assert_eq!(best_fast.groups * best_fast.group_size, 6, "{best_fast}");
        // Slow links: one allreduce group with fc1 split moves the least through any one link.
        assert_eq!(slow[0].shape.ps, 0, "{}", slow[0].shape);
        assert!(slow[0].step_s > fast[0].step_s);
        assert!(slow.windows(2).all(|w| w[0].samples_per_s >= w[1].samples_per_s));
    }
}
