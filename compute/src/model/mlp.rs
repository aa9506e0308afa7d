//! The multi-layer perceptron: `model.hidden` dense layers of those widths with ReLU between them,
//! then a dense layer to the classes, on the flattened input.

use candle_core::Tensor;

use super::ModelError;
use super::layers::dense_stack;
use super::net::Declare;

/// An MLP's architecture.
#[derive(Clone, Debug)]
pub struct Mlp {
    layers: usize,
}

impl Mlp {
    /// Declares the parameters of dense layers from `inputs` features through `hidden` to
    /// `classes` (`fc1.weight`, `fc1.bias`, …, weights `[out, in]`).
    pub fn declare(
        params: &mut Declare<'_>,
        inputs: usize,
        hidden: &[usize],
        classes: usize,
    ) -> Result<Self, ModelError> {
        let mut width = inputs;
        let widths = hidden.iter().copied().chain(std::iter::once(classes));
        let mut layers = 0;
        for (i, out) in widths.enumerate() {
            params.add(format!("fc{}.weight", i + 1), vec![out, width], width)?;
            params.add(format!("fc{}.bias", i + 1), vec![out], width)?;
            width = out;
            layers += 1;
        }
        Ok(Self { layers })
    }

    /// Logits for `x` (`[batch, features]`) from the weights starting at `vars[first]`.
    pub fn forward(&self, x: Tensor, vars: &[&Tensor], first: usize) -> candle_core::Result<Tensor> {
        dense_stack(x, vars, first, self.layers)
    }
}
