//! ResNet (He et al. 2016) with batch norm in training mode, torchvision's parameter names
//! (`conv1`, `bn1`, `layer{i}.{j}.conv1`, `layer{i}.{j}.downsample.0`, `fc`) and flat order.
//!
//! Two families:
//! - **ImageNet** (18, 34: basic blocks `[2,2,2,2]`, `[3,4,6,3]`; 50, 101, 152: bottleneck blocks
//!   `[3,4,6,3]`, `[3,4,23,3]`, `[3,8,36,3]`): 7×7/2 stem convolution and 3×3/2 max pooling, four
//!   stages of width 64·2ⁱ (bottleneck outputs 4×), the stride in the first block of stages 2–4
//!   (in the 3×3 convolution of a bottleneck: torchvision's "v1.5").
//! - **CIFAR** (6n+2: 20, 32, 44, 56, 110): a 3×3 stride-1 stem and three stages of n basic blocks
//!   of width 16, 32, 64, for small images. On Fashion-MNIST's 28×28 the stages run at 28, 14 and
//!   7 pixels, as CIFAR's 32, 16, 8: the 7×7/2 stem and max pooling would leave 7×7 maps before
//!   the first block, and padding the images to 32×32 would cost 30 % more work for nothing.
//!
//! Shortcuts change shape by projection (1×1 convolution with the block's stride, then batch norm:
//! He et al.'s option B, torchvision's `downsample`), otherwise they are the identity. Convolutions
//! have no bias (batch norm follows each); ReLU is fused into batch norm inside a block and applied
//! after the sum. Global average pooling feeds the dense classifier `fc`.

use super::check_classes;
use crate::layers::{
    BatchNorm, ChainBuilder, Conv2d, ConvSpec, Dense, GlobalAvgPool, Layout, MaxPool2d, PoolSpec, Residual,
};
use crate::net::{NetError, Network, NetworkBuilder};

/// Which stem and stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum ResNetFamily {
    /// 7×7/2 stem, max pooling, four stages (ResNet-18/34/50/101/152).
    ImageNet,
    /// 3×3 stem, three stages of basic blocks (ResNet-6n+2).
    Cifar,
}

impl ResNetFamily {
    /// The family a depth names: 18, 34, 50, 101 and 152 are ImageNet ResNets, other depths of the
    /// form 6n+2 CIFAR ones.
    pub fn for_depth(depth: usize) -> Result<Self, NetError> {
        match depth {
            18 | 34 | 50 | 101 | 152 => Ok(Self::ImageNet),
            d if d >= 8 && (d - 2).is_multiple_of(6) => Ok(Self::Cifar),
            d => Err(NetError::Build(format!(
                "ResNet depth {d} is neither an ImageNet depth (18, 34, 50, 101, 152) nor 6n+2 (20, 32, 44, 56, 110)"
            ))),
        }
    }
}

/// A ResNet's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ResNetConfig {
    /// Layers with weights (convolutions and the classifier).
    pub depth: usize,
    /// Stem and stages.
    pub family: ResNetFamily,
    /// Width of the first stage (64 for ImageNet, 16 for CIFAR; smaller for tests).
    pub width: usize,
}

impl ResNetConfig {
    /// The standard ResNet of `depth` (family by [`ResNetFamily::for_depth`], standard width).
    pub fn standard(depth: usize) -> Result<Self, NetError> {
        let family = ResNetFamily::for_depth(depth)?;
        let width = match family {
            ResNetFamily::ImageNet => 64,
            ResNetFamily::Cifar => 16,
        };
        Ok(Self { depth, family, width })
    }

    /// Blocks per stage and whether they are bottlenecks.
    fn stages(&self) -> Result<(Vec<usize>, bool), NetError> {
        match (self.family, self.depth) {
            (ResNetFamily::ImageNet, 18) => Ok((vec![2, 2, 2, 2], false)),
            (ResNetFamily::ImageNet, 34) => Ok((vec![3, 4, 6, 3], false)),
            (ResNetFamily::ImageNet, 50) => Ok((vec![3, 4, 6, 3], true)),
            (ResNetFamily::ImageNet, 101) => Ok((vec![3, 4, 23, 3], true)),
            (ResNetFamily::ImageNet, 152) => Ok((vec![3, 8, 36, 3], true)),
            (ResNetFamily::Cifar, d) if d >= 8 && (d - 2).is_multiple_of(6) => {
                Ok((vec![(d - 2) / 6; 3], false))
            }
            (family, d) => Err(NetError::Build(format!("there is no {family:?} ResNet of depth {d}"))),
        }
    }
}

/// Appends a convolution without bias reading the chain's current image.
pub(super) fn conv(
    b: ChainBuilder,
    name: &str,
    cout: usize,
    k: usize,
    stride: usize,
    pad: usize,
) -> ChainBuilder {
    conv_with(b, name, ConvSpec { cin: 0, cout, kh: k, kw: k, stride, pad, bias: false, relu: false })
}

/// Appends the convolution `spec` (its `cin` taken from the chain's current image).
pub(super) fn conv_with(b: ChainBuilder, name: &str, spec: ConvSpec) -> ChainBuilder {
    match b.output() {
        Layout::Image { c, h, w } => b.try_push(name, Conv2d::new(ConvSpec { cin: c, ..spec }, h, w)),
        other => {
            b.try_push::<Conv2d>(name, Err(format!("a convolution needs an image, the input is {other:?}")))
        }
    }
}

fn bn(b: ChainBuilder, name: &str, relu: bool) -> ChainBuilder {
    let norm = BatchNorm::new(b.output());
    b.push(name, if relu { norm.with_relu() } else { norm })
}

/// One residual block on `input`: basic (two 3×3) or bottleneck (1×1, 3×3, 1×1 ×4), the stride in
/// its 3×3 convolution, a projection shortcut when the shape changes.
fn block(input: Layout, width: usize, stride: usize, bottleneck: bool) -> Result<Residual, String> {
    let Layout::Image { c: cin, .. } = input else {
        return Err(format!("a residual block needs an image, the input is {input:?}"));
    };
    let b = ChainBuilder::new(input);
    let (main, cout) = if bottleneck {
        let b = bn(conv(b, "conv1", width, 1, 1, 0), "bn1", true);
        let b = bn(conv(b, "conv2", width, 3, stride, 1), "bn2", true);
        (bn(conv(b, "conv3", 4 * width, 1, 1, 0), "bn3", false), 4 * width)
    } else {
        let b = bn(conv(b, "conv1", width, 3, stride, 1), "bn1", true);
        (bn(conv(b, "conv2", width, 3, 1, 1), "bn2", false), width)
    };
    let main = main.build()?;
    let shortcut = if stride != 1 || cin != cout {
        Some(bn(conv(ChainBuilder::new(input), "0", cout, 1, stride, 0), "1", false).build()?)
    } else {
        None
    };
    Residual::new(main, shortcut.map(|s| ("downsample", s)), true)
}

/// The ResNet `cfg` on `c × h × w` images with `classes` outputs, on `threads` threads.
pub fn resnet(
    cfg: ResNetConfig,
    input: (usize, usize, usize),
    classes: usize,
    threads: usize,
) -> Result<Network, NetError> {
    check_classes(classes)?;
    let (stages, bottleneck) = cfg.stages()?;
    if cfg.width == 0 {
        return Err(NetError::Build("a ResNet's width must be at least 1".into()));
    }
    let (c, h, w) = input;
    let mut b = ChainBuilder::new(Layout::Image { c, h, w });
    b = match cfg.family {
        ResNetFamily::ImageNet => {
            let b = bn(conv(b, "conv1", cfg.width, 7, 2, 3), "bn1", true);
            match b.output() {
                Layout::Image { c, h, w } => {
                    b.try_push("maxpool", MaxPool2d::new(PoolSpec { k: 3, stride: 2, pad: 1 }, c, h, w))
                }
                _ => b,
            }
        }
        ResNetFamily::Cifar => bn(conv(b, "conv1", cfg.width, 3, 1, 1), "bn1", true),
    };
    for (i, &blocks) in stages.iter().enumerate() {
        let width = cfg.width << i;
        for j in 0..blocks {
            let stride = if i > 0 && j == 0 { 2 } else { 1 };
            let out = b.output();
            b = b.try_push(&format!("layer{}.{j}", i + 1), block(out, width, stride, bottleneck));
        }
    }
    if let Layout::Image { c, h, w } = b.output() {
        b = b.push("avgpool", GlobalAvgPool::new(c, h, w));
    }
    let features = b.output().features();
    NetworkBuilder::from(b.push("fc", Dense::new(features, classes, false))).build(threads)
}
