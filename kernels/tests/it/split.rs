//! Model parallelism: a split network on `p` in-process ranks (threads sharing buffers) computes
//! the loss and gradient of the unsplit network on the whole batch — the ranks' gradient vectors
//! average to one process's gradient, their losses to its loss — for every layer arrangement:
//! all dense layers split (MLP), dense after convolutions (LeNet, VGG), split then data-parallel
//! dense layers, uneven row counts (10 classes on 3 or 4 ranks) and a rank with no rows.
//! Real ranks over the tcp collectives are the trainer's test (`trainer/tests/it/model_parallel.rs`).

use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use tandem_kernels::models::{self, VggConfig, VggVariant};
use tandem_kernels::net::{Batch, Network};
use tandem_kernels::split::{Group, GroupError, SplitNetwork};

use crate::common::{Rand, assert_close};

/// A group of threads: each collective posts this rank's buffer and reads the others' after a
/// barrier.
struct Threads {
    rank: usize,
    size: usize,
    posted: Arc<Mutex<Vec<Vec<f32>>>>,
    barrier: Arc<Barrier>,
}

impl Threads {
    fn group(size: usize) -> Vec<Threads> {
        let posted = Arc::new(Mutex::new(vec![Vec::new(); size]));
        let barrier = Arc::new(Barrier::new(size));
        (0..size)
            .map(|rank| Threads { rank, size, posted: posted.clone(), barrier: barrier.clone() })
            .collect()
    }

    fn exchange(&mut self, buf: &[f32]) -> Vec<Vec<f32>> {
        self.posted.lock().unwrap()[self.rank] = buf.to_vec();
        self.barrier.wait();
        let all = self.posted.lock().unwrap().clone();
        self.barrier.wait();
        all
    }
}

impl Group for Threads {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn allgather(&mut self, buf: &mut [f32]) -> Result<(), GroupError> {
        let all = self.exchange(buf);
        let block = buf.len() / self.size;
        for (r, theirs) in all.iter().enumerate() {
            buf[r * block..(r + 1) * block].copy_from_slice(&theirs[r * block..(r + 1) * block]);
        }
        Ok(())
    }

    fn reduce_scatter_sum(&mut self, buf: &mut [f32]) -> Result<(), GroupError> {
        let all = self.exchange(buf);
        let block = buf.len() / self.size;
        let mine = self.rank * block..(self.rank + 1) * block;
        buf[mine.clone()].fill(0.0);
        for theirs in &all {
            for (d, s) in buf[mine.clone()].iter_mut().zip(&theirs[mine.clone()]) {
                *d += s;
            }
        }
        Ok(())
    }
}

/// Builds the same network for every rank.
type Build = fn() -> Network;

/// One process on `p·b` samples against `p` split ranks on `b` each, splitting `split`.
fn check(build: Build, split: &[&str], p: usize, b: usize, seed: u64) {
    let mut whole = build();
    let mut rng = Rand::new(seed);
    let (np, ns) = (whole.num_params(), whole.num_state());
    let (mut params, mut state) = (vec![0.0; np], vec![0.0; ns]);
    whole.init(&mut params, &mut state, &mut |lo, hi| lo + (hi - lo) * (rng.sym() + 1.0) / 2.0).unwrap();
    let per = whole.input_len();
    let n = p * b;
    let x = rng.vec(n * per);
    let y: Vec<u32> = (0..n).map(|_| rng.below(whole.classes()) as u32).collect();
    let mut grads = vec![0.0; np];
    let mut whole_state = state.clone();
    let stats = whole.forward_backward(&params, &mut whole_state, &mut grads, Batch::Values(&x), &y).unwrap();

    let split: Vec<String> = split.iter().map(|s| s.to_string()).collect();
    let ranks: Vec<_> = Threads::group(p)
        .into_iter()
        .enumerate()
        .map(|(r, group)| {
            let (params, mut state, split) = (params.clone(), state.clone(), split.clone());
            let x = x[r * b * per..(r + 1) * b * per].to_vec();
            let y = y[r * b..(r + 1) * b].to_vec();
            thread::spawn(move || {
                let (input, layers) = build().into_layers().unwrap();
                let mut net = SplitNetwork::new(input, layers, &split, Box::new(group), 1).unwrap();
                let mut g = vec![f32::NAN; np];
                let s = net.forward_backward(&params, &mut state, &mut g, Batch::Values(&x), &y).unwrap();
                (g, s)
            })
        })
        .collect();
    let results: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
    let mut mean = vec![0.0f32; np];
    let (mut loss, mut correct) = (0.0f64, 0);
    for (g, s) in &results {
        for (m, v) in mean.iter_mut().zip(g) {
            *m += v / p as f32;
        }
        loss += s.loss as f64 * s.targets as f64;
        correct += s.correct;
        assert_eq!(s.targets, b);
    }
    let what = format!("{split:?} over {p} ranks");
    assert!(
        (loss / n as f64 - stats.loss as f64).abs() < 1e-5,
        "{what}: loss {} vs {}",
        loss / n as f64,
        stats.loss
    );
    assert_eq!(correct, stats.correct, "{what}: correct predictions");
    assert_close(&mean, &grads, 2e-5, &format!("{what}: mean gradient"));
    assert!(grads.iter().any(|g| g.abs() > 1e-4), "{what}: the gradient is not trivially zero");
}

fn mlp() -> Network {
    models::mlp(12, &[9, 7], 10, 1).unwrap()
}

fn lenet() -> Network {
    models::lenet((1, 8, 8), [3, 4], &[11], 10, 1).unwrap()
}

fn vgg() -> Network {
    models::vgg(VggConfig { variant: VggVariant::A, width: 2, hidden: 13 }, (3, 8, 8), 10, 1).unwrap()
}

#[test]
fn every_dense_layer_of_an_mlp_split_gives_one_processs_loss_and_gradient() {
    for p in [2, 3, 4] {
        check(mlp, &["fc1", "fc2", "fc3"], p, 5, 11 + p as u64);
    }
}

#[test]
fn split_and_data_parallel_dense_layers_mix() {
    check(mlp, &["fc1"], 3, 4, 21);
    check(mlp, &["fc2"], 2, 4, 22);
    check(mlp, &["fc1", "fc3"], 4, 3, 23);
}

#[test]
fn a_cnns_dense_head_split_after_data_parallel_convolutions_gives_one_processs_gradient() {
    for p in [2, 3] {
        check(lenet, &["fc1", "fc2"], p, 3, 31 + p as u64);
    }
    check(vgg, &["classifier.0", "classifier.3", "classifier.6"], 3, 2, 41);
    check(vgg, &["classifier.0", "classifier.3"], 2, 2, 42);
}

#[test]
fn a_rank_may_own_no_rows() {
    // 10 classes over 6 ranks: ⌈10/6⌉ = 2 rows each, the last rank none.
    check(mlp, &["fc3"], 6, 2, 51);
}

#[test]
fn only_dense_layers_can_be_split() {
    let mut groups = Threads::group(1);
    let (input, layers) = lenet().into_layers().unwrap();
    let err = SplitNetwork::new(input, layers, &["conv1".into()], Box::new(groups.remove(0)), 1).unwrap_err();
    assert!(err.to_string().contains("conv1 is a conv"), "{err}");
    assert!(err.to_string().contains("[fc1, fc2]"), "{err}");
    let mut groups = Threads::group(1);
    let (input, layers) = mlp().into_layers().unwrap();
    let err = SplitNetwork::new(input, layers, &["fc9".into()], Box::new(groups.remove(0)), 1).unwrap_err();
    assert!(err.to_string().contains("fc9 is not a layer"), "{err}");
}
