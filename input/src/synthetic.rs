//! Seeded synthetic data, for tests and benchmarks that need no files.

use super::{Dataset, InputShape};
use tandem_util::rng::Rng;

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
    Dataset::classified(format!("synthetic(seed {seed})"), shape, classes, features, labels)
}

/// Seeded synthetic tokens for a language model's benchmarks: `samples` windows of `context`
/// uniformly random ids below `vocab`, each target the next id. Same seed, same data.
pub fn synthetic_tokens(samples: usize, context: usize, vocab: usize, seed: u64) -> Dataset {
    let mut rng = Rng::derive(seed, 0x70c5);
    let stream: Vec<u32> = (0..samples * context + 1).map(|_| rng.below(vocab as u64) as u32).collect();
    super::text::windows(&stream, context, vocab, format!("synthetic tokens(seed {seed})"))
}
