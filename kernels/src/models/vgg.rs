//! VGG (Simonyan & Zisserman 2015) with torchvision's parameter names (`features.{i}`,
//! `classifier.{0,3,6}`): 3×3 convolutions with padding 1, bias and ReLU, 2×2/2 max pooling, then
//! three dense layers (ReLU after the first two), no dropout.
//! - **VGG-A** (11 layers, the configuration PCL-DNN trains): 64, M, 128, M, 256, 256, M, 512, 512,
//!   M, 512, 512, M; dense 4096, 4096, classes.
//! - **VGG-16** (configuration D): 64, 64, M, 128, 128, M, 256, 256, 256, M, 512, 512, 512, M, 512,
//!   512, 512, M.
//!
//! On 224×224 images the classifier reads 512×7×7 features, as in the paper. Smaller images work
//! too: a pooling that would leave less than one pixel is left out, and the classifier reads
//! whatever the convolutions leave (512×1×1 on 28×28).

use super::check_classes;
use super::resnet::conv_with;
use crate::layers::{ChainBuilder, ConvSpec, Dense, Flatten, Layout, MaxPool2d, PoolSpec};
use crate::net::{NetError, Network, NetworkBuilder};

/// Which VGG.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum VggVariant {
    /// VGG-A: 8 convolutions (VGG-11).
    A,
    /// VGG-16 (configuration D): 13 convolutions.
    Vgg16,
}

/// A VGG's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct VggConfig {
    /// Which configuration.
    pub variant: VggVariant,
    /// Channels of the first convolutions (64; later ones 2×, 4×, 8×); smaller for tests.
    pub width: usize,
    /// Width of the two hidden dense layers (4096; smaller for tests).
    pub hidden: usize,
}

impl VggConfig {
    /// The standard widths (64 channels, 4096 hidden units).
    pub fn standard(variant: VggVariant) -> Self {
        Self { variant, width: 64, hidden: 4096 }
    }
}

/// `Some(multiple of the width)` for a convolution, `None` for a max pooling.
fn layers(variant: VggVariant) -> &'static [Option<usize>] {
    const M: Option<usize> = None;
    match variant {
        VggVariant::A => {
            &[Some(1), M, Some(2), M, Some(4), Some(4), M, Some(8), Some(8), M, Some(8), Some(8), M]
        }
        VggVariant::Vgg16 => &[
            Some(1),
            Some(1),
            M,
            Some(2),
            Some(2),
            M,
            Some(4),
            Some(4),
            Some(4),
            M,
            Some(8),
            Some(8),
            Some(8),
            M,
            Some(8),
            Some(8),
            Some(8),
            M,
        ],
    }
}

/// The VGG `cfg` on `c × h × w` images with `classes` outputs, on `threads` threads.
pub fn vgg(
    cfg: VggConfig,
    input: (usize, usize, usize),
    classes: usize,
    threads: usize,
) -> Result<Network, NetError> {
    check_classes(classes)?;
    if cfg.width == 0 || cfg.hidden == 0 {
        return Err(NetError::Build("a VGG's width and hidden width must be at least 1".into()));
    }
    let (c, h, w) = input;
    let mut b = ChainBuilder::new(Layout::Image { c, h, w });
    // torchvision's indices: a convolution and its ReLU take two, a pooling one.
    let mut index = 0;
    for layer in layers(cfg.variant) {
        let name = format!("features.{index}");
        match *layer {
            Some(mult) => {
                let spec = ConvSpec {
                    cin: 0,
                    cout: mult * cfg.width,
                    kh: 3,
                    kw: 3,
                    stride: 1,
                    pad: 1,
                    bias: true,
                    relu: true,
                };
                b = conv_with(b, &name, spec);
                index += 2;
            }
            None => {
                if let Layout::Image { c, h, w } = b.output()
                    && h >= 2
                    && w >= 2
                {
                    b = b.try_push(&name, MaxPool2d::new(PoolSpec { k: 2, stride: 2, pad: 0 }, c, h, w));
                }
                index += 1;
            }
        }
    }
    if let Layout::Image { c, h, w } = b.output() {
        b = b.push("flatten", Flatten::new(c, h, w));
    }
    let features = b.output().features();
    let b = b
        .push("classifier.0", Dense::new(features, cfg.hidden, true))
        .push("classifier.3", Dense::new(cfg.hidden, cfg.hidden, true))
        .push("classifier.6", Dense::new(cfg.hidden, classes, false));
    NetworkBuilder::from(b).build(threads)
}
