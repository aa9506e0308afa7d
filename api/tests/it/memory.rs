//! A job's memory is estimated from its spec before anything is allocated, and a job larger than
//! the memory at hand is refused with the fields to change (`tandem_api::plan::memory`).
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests fail loudly by design

use tandem_api::manifest;
use tandem_api::plan::memory::{MemoryEstimate, builtin_data};

const GIB: u64 = 1 << 30;

fn estimate(spec_yaml: &str) -> MemoryEstimate {
    let job = manifest::parse(&format!(
        "apiVersion: tandem.dev/v1alpha1\nkind: TrainingJob\nmetadata: {{name: m}}\nspec:\n{spec_yaml}"
    ))
    .expect("valid manifest");
    MemoryEstimate::of(&job.spec, builtin_data(&job.spec).expect("built-in data"))
}

#[test]
fn three_layers_of_65536_are_refused_naming_model_hidden() {
    let e =
        estimate("  model: {hidden: [65536, 65536, 65536]}\n  training: {algorithm: allreduce, steps: 10}\n");
    // 784·65536 + 2·65536² + 65536·10 weights, and the biases: 8.6 G parameters.
    assert!(e.parameters > 8_500_000_000 && e.parameters < 8_700_000_000, "{}", e.parameters);
    let err = e.check(e.worker_bytes, 24 * GIB).expect_err("8.6 G parameters do not fit in 24 GiB");
    let text = err.to_string();
    assert!(text.contains("model.hidden [65536, 65536, 65536]") && text.contains("GiB"), "{text}");
    assert!(err.need > 100 * GIB, "{text}");
}

#[test]
fn four_billion_synthetic_samples_are_refused_naming_the_field() {
    let e = estimate(
        "  data: {source: synthetic, syntheticSamples: 4e9}\n  training: {algorithm: allreduce, steps: 10}\n",
    );
    let err = e.check(e.worker_bytes, 24 * GIB).expect_err("4e9 samples of 784 floats do not fit");
    let text = err.to_string();
    assert!(text.contains("data.syntheticSamples 4000000000") && text.contains("TiB"), "{text}");
}

#[test]
fn the_examples_fit_and_every_local_process_counts() {
    let one = estimate("  model: {hidden: [256, 128]}\n  training: {algorithm: allreduce, steps: 10}\n");
    assert!(one.worker_bytes < GIB, "{}", one.worker_bytes);
    one.check(one.local_total(), 2 * GIB).expect("an MNIST MLP fits in 2 GiB");
    let many = estimate(
        "  model: {hidden: [256, 128]}\n  training: {algorithm: hybrid, steps: 10}\n  parameterServers: {replicas: 2}\n  workers: {groups: 2, groupSize: 2}\n",
    );
    assert_eq!(many.workers, 4);
    assert!(many.local_total() > 4 * one.worker_bytes, "four workers and the shards");
}

/// The parameter counts of the new models match their published sizes: ResNet-20 0.27 M,
/// torchvision's ResNet-50 25,557,032 and VGG-11 132,863,336 (1,000 classes on 3×224×224).
#[test]
fn real_models_count_their_published_parameters() {
    let resnet20 = estimate(
        "  model: {kind: resnet, depth: 20}\n  data: {source: fashion-mnist}\n  training: {algorithm: allreduce, steps: 10}\n",
    );
    assert_eq!(resnet20.parameters, 272_186, "ResNet-20 on 1-channel 28×28, 10 classes");
    assert!(resnet20.drivers.contains("resnet-20"), "{}", resnet20.drivers);
    let imagenet = "  data: {source: synthetic, syntheticShape: [3, 224, 224], syntheticClasses: 1000, syntheticSamples: 64, batchSize: 8}\n  training: {algorithm: allreduce, steps: 10}\n";
    let resnet50 = estimate(&format!("  model: {{kind: resnet, depth: 50}}\n{imagenet}"));
    assert_eq!(resnet50.parameters, 25_557_032);
    let vgg_a = estimate(&format!("  model: {{kind: vgg, variant: a}}\n{imagenet}"));
    assert_eq!(vgg_a.parameters, 132_863_336);
    assert!(vgg_a.worker_bytes > 4 * 132_863_336 * 4, "weights, gradient, copy and momentum");
    vgg_a.check(vgg_a.worker_bytes, 24 * GIB).expect("the VGG-A example fits this machine");
}

#[test]
fn a_gpt_counts_embeddings_blocks_and_the_tied_head_once() {
    let gpt = estimate(
        "  model: {kind: gpt, layers: 4, heads: 4, dim: 128, context: 128}\n  data: {source: shakespeare, batchSize: 32}\n  training: {algorithm: allreduce, steps: 10}\n",
    );
    // wte 256·128, wpe 128·128, 4 × (12·128² + 13·128), ln_f 2·128; lm_head is wte.
    assert_eq!(gpt.parameters, 256 * 128 + 128 * 128 + 4 * (12 * 128 * 128 + 13 * 128) + 2 * 128);
    let huge = estimate(
        "  model: {kind: gpt, layers: 96, heads: 96, dim: 12288, context: 2048}\n  data: {source: shakespeare, batchSize: 8}\n  training: {algorithm: allreduce, steps: 10}\n",
    );
    let err = huge.check(huge.worker_bytes, 24 * GIB).expect_err("GPT-3's shape does not fit 24 GiB");
    assert!(err.to_string().contains("model gpt 96 layers × 12288"), "{err}");
}
