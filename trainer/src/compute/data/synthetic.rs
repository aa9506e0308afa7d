//! Seeded synthetic data, for tests and benchmarks that need no files.

use super::{Dataset, InputShape};
use crate::compute::rng::Rng;

/// Seeded synthetic classification data: each class has a random prototype image, each sample is its
/// class's prototype plus Gaussian noise. Same seed, same data.
pub fn synthetic(samples: usize, shape: InputShape, classes: usize, seed: u64) -> Dataset {
    let d = shape.features();
    let mut rng = Rng::derive(seed, 0x5157);
    let protos: Vec<f32> = (0..classes * d).map(|_| rng.next_f32()).collect();
    let mut features = Vec::with_capacity(samples * d);
    let mut labels = Vec::with_capacity(samples);
    for _ in 0..samples {
        let c = rng.below(classes as u64) as usize;
        labels.push(c as u32);
        features.extend(protos[c * d..(c + 1) * d].iter().map(|&p| p + 0.5 * rng.normal()));
    }
    Dataset { name: format!("synthetic(seed {seed})"), shape, classes, features, labels }
}
