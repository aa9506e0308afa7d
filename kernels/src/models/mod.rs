//! Models as engine networks, each with PyTorch's parameter names and flat order, adapting to
//! the input shape the data gives:
//! - [`mlp`] and [`lenet`]: the trainer's MLP and LeNet-style CNN, with the trainer's names, flat
//!   order and initialisation (`trainer/src/model.rs`): He-uniform weights (±√(6/fan_in)) drawn in
//!   flat order, biases zero, so [`crate::net::Network::init`] with the trainer's generator
//!   reproduces the trainer's weights;
//! - [`resnet`]: ResNet with batch norm, basic and bottleneck blocks (torchvision's names);
//! - [`vgg`]: VGG-A (PCL-DNN's 8-convolution configuration) and VGG-16 (torchvision's names);
//! - [`gpt`]: a decoder-only transformer over token ids (nanoGPT's names), tied output projection.

mod gpt;
mod resnet;
mod vgg;

pub use gpt::{GptConfig, gpt};
pub use resnet::{ResNetConfig, ResNetFamily, resnet};
pub use vgg::{VggConfig, VggVariant, vgg};

use crate::layers::{Conv2d, ConvSpec, Dense, Flatten, Layout, MaxPool2d, PoolSpec};
use crate::net::{NetError, Network, NetworkBuilder};

fn dense_head(mut b: NetworkBuilder, hidden: &[usize], classes: usize) -> NetworkBuilder {
    let mut width = b.output().features();
    for (i, &out) in hidden.iter().chain(std::iter::once(&classes)).enumerate() {
        let relu = i < hidden.len();
        b = b.push(&format!("fc{}", i + 1), Dense::new(width, out, relu));
        width = out;
    }
    b
}

fn check_classes(classes: usize) -> Result<(), NetError> {
    if classes < 2 {
        return Err(NetError::Build(format!("a classifier needs at least 2 classes, got {classes}")));
    }
    Ok(())
}

fn check_widths(hidden: &[usize], classes: usize) -> Result<(), NetError> {
    check_classes(classes)?;
    if let Some(w) = hidden.iter().find(|&&w| w == 0) {
        return Err(NetError::Build(format!("hidden widths must be at least 1, got {w}")));
    }
    Ok(())
}

/// The MLP: `features → hidden… → classes`, ReLU between dense layers.
pub fn mlp(features: usize, hidden: &[usize], classes: usize, threads: usize) -> Result<Network, NetError> {
    check_widths(hidden, classes)?;
    if features == 0 {
        return Err(NetError::Build("an MLP needs at least one input feature".into()));
    }
    dense_head(NetworkBuilder::new(Layout::Features(features)), hidden, classes).build(threads)
}

/// The LeNet-style CNN on `c × h × w` images with `channels = [c1, c2]`.
pub fn lenet(
    input: (usize, usize, usize),
    channels: [usize; 2],
    hidden: &[usize],
    classes: usize,
    threads: usize,
) -> Result<Network, NetError> {
    check_widths(hidden, classes)?;
    let (c, h, w) = input;
    if h < 4 || w < 4 {
        return Err(NetError::Build(format!(
            "a cnn needs images of at least 4×4 pixels (two 2×2 poolings), the data has {h}×{w}"
        )));
    }
    if channels.contains(&0) {
        return Err(NetError::Build(format!("cnn channels must be at least 1, got {channels:?}")));
    }
    let conv = |cin, cout| ConvSpec { cin, cout, kh: 5, kw: 5, stride: 1, pad: 2, bias: true, relu: true };
    let pool = PoolSpec { k: 2, stride: 2, pad: 0 };
    let (h2, w2) = (h / 2, w / 2);
    let (h4, w4) = (h2 / 2, w2 / 2);
    let b = NetworkBuilder::new(Layout::Image { c, h, w })
        .try_push("conv1", Conv2d::new(conv(c, channels[0]), h, w))
        .try_push("pool1", MaxPool2d::new(pool, channels[0], h, w))
        .try_push("conv2", Conv2d::new(conv(channels[0], channels[1]), h2, w2))
        .try_push("pool2", MaxPool2d::new(pool, channels[1], h2, w2))
        .push("flatten", Flatten::new(channels[1], h4, w4));
    dense_head(b, hidden, classes).build(threads)
}
