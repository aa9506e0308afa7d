//! The LeNet-style CNN: two blocks of 5×5 convolution ("same" padding, stride 1) → ReLU → 2×2
//! max-pool with `model.channels` filters, then the MLP's dense layers on the flattened maps.

use candle_core::{Device, Tensor};

use super::ModelError;
use super::layers::{Conv2d, Im2col};
use super::mlp::Mlp;
use super::net::Declare;
use tandem_input::InputShape;

/// Kernel size of LeNet's convolutions.
const KERNEL: usize = 5;

/// A LeNet's architecture, prepared for one input size.
#[derive(Clone, Debug)]
pub struct LeNet {
    input: InputShape,
    convs: [Im2col; 2],
    head: Mlp,
}

impl LeNet {
    /// Declares `conv1`, `conv2` (`[c_out, c_in, 5, 5]` weights) and the dense head for inputs of
    /// `input` and `channels = [c1, c2]` filters.
    pub fn declare(
        params: &mut Declare<'_>,
        input: InputShape,
        channels: &[u32],
        hidden: &[usize],
        classes: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let [c1, c2] = match channels {
            &[a, b] if a >= 1 && b >= 1 => [a as usize, b as usize],
            other => {
                return Err(ModelError::Spec(format!(
                    "model.channels needs exactly two values >= 1 (one per convolution block), got {other:?}"
                )));
            }
        };
        if input.height < 4 || input.width < 4 {
            return Err(ModelError::Spec(format!(
                "a cnn needs images of at least 4×4 pixels (two 2×2 poolings), the data has {}×{}",
                input.height, input.width
            )));
        }
        let same =
            |c_in, c_out| Conv2d { c_in, c_out, kernel: (KERNEL, KERNEL), stride: 1, padding: KERNEL / 2 };
        let (conv1, conv2) = (same(input.channels, c1), same(c1, c2));
        params.add("conv1.weight".into(), vec![c1, input.channels, KERNEL, KERNEL], conv1.fan_in())?;
        params.add("conv1.bias".into(), vec![c1], conv1.fan_in())?;
        params.add("conv2.weight".into(), vec![c2, c1, KERNEL, KERNEL], conv2.fan_in())?;
        params.add("conv2.bias".into(), vec![c2], conv2.fan_in())?;
        let (h2, w2) = (input.height / 2, input.width / 2);
        let convs = [conv1.im2col(input.height, input.width, device)?, conv2.im2col(h2, w2, device)?];
        let flat = c2 * (h2 / 2) * (w2 / 2);
        Ok(Self { input, convs, head: Mlp::declare(params, flat, hidden, classes)? })
    }

    /// Logits for `x` (`[batch, features]`).
    pub fn forward(&self, x: &Tensor, vars: &[&Tensor]) -> candle_core::Result<Tensor> {
        let b = x.dim(0)?;
        let InputShape { channels, height, width } = self.input;
        let x = x.reshape((b, channels, height, width))?;
        let x = self.convs[0].forward(&x, vars[0], vars[1])?.relu()?.max_pool2d(2)?;
        let x = self.convs[1].forward(&x, vars[2], vars[3])?.relu()?.max_pool2d(2)?;
        self.head.forward(x.flatten_from(1)?, vars, 4)
    }
}
