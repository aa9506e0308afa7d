//! Model parallelism on the CPU engine: a [`Model`] whose dense layers are split over the ranks
//! of a worker group by output features (PCL-DNN), the other layers data-parallel
//! ([`tandem_kernels::split`] has the scheme and its guarantees).
//!
//! A [`Split`] keeps the unsplit model's flat layout, names and initialisation, so everything
//! that moves the flat vectors — the group's step, the parameter servers, checkpoints — treats it
//! like the data-parallel model: its gradient follows data parallelism's convention (the ranks'
//! average is one process's gradient on the group's batch). Training steps run the split network,
//! a collective over the group; evaluation runs the whole network on the rank that evaluates
//! (the group's leader), whose parameters the group's step keeps whole after every step.

use tandem_api::{ModelSpec, Parallelism};
use tandem_kernels::net as knet;
use tandem_kernels::split::{self as ksplit, Group, SplitNetwork};

use super::engine::{self, Engine};
use super::{Batch, BatchStats, Model, ModelError, Partition};
use crate::device::Device;
use crate::params::FlatLayout;
use tandem_input::InputShape;

/// A model whose dense layers are split over a group.
pub struct Split {
    /// The whole network: layout, initialisation and evaluation.
    whole: Engine,
    net: SplitNetwork,
}

impl std::fmt::Debug for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Split").field("net", &self.net).finish()
    }
}

impl Split {
    /// The model of `spec` for inputs of `input` and `classes` classes, initialised from `seed`,
    /// with the dense layers that `spec.parallelism` and `spec.layerParallelism` choose split over
    /// `group`, on `threads` threads.
    pub fn new(
        spec: &ModelSpec,
        input: InputShape,
        classes: usize,
        seed: u64,
        threads: usize,
        group: Box<dyn Group>,
    ) -> Result<Self, ModelError> {
        if spec.kind.is_language_model() {
            return Err(ModelError::Spec(format!(
                "model kind {} has no dense layers to split over a group; use model.parallelism data",
                spec.kind.name()
            )));
        }
        let whole = Engine::new(spec, input, classes, seed, threads)?;
        let (layout, layers) = engine::network(spec, input, classes, threads)?.into_layers()?;
        let dense = ksplit::dense_layers(&layers);
        if let Some(name) = spec.layer_parallelism.keys().find(|n| !dense.contains(n)) {
            return Err(ModelError::Spec(format!(
                "model.layerParallelism names {name}, which is not a dense layer of this {}; its dense layers \
                 are [{}]",
                spec.kind.name(),
                dense.join(", ")
            )));
        }
        let chosen: Vec<String> = dense.iter().filter(|n| Parallelism::splits(spec, n)).cloned().collect();
        if chosen.is_empty() {
            return Err(ModelError::Spec(
                "model.layerParallelism sets every dense layer to data, so nothing is split over the group; \
                 use model.parallelism data"
                    .into(),
            ));
        }
        let net = SplitNetwork::new(layout, layers, &chosen, group, threads)?;
        if net.num_params() != whole.layout().len() {
            return Err(ModelError::Spec(format!(
                "the split network has {} parameters but the whole one {}; this is a bug, please report it",
                net.num_params(),
                whole.layout().len()
            )));
        }
        tracing::info!(layers = ?net.describe(), "model-parallel layers");
        Ok(Self { whole, net })
    }

    /// The split network (which rows of which layer this rank computes).
    pub fn network(&self) -> &SplitNetwork {
        &self.net
    }
}

impl Model for Split {
    fn layout(&self) -> &FlatLayout {
        self.whole.layout()
    }

    fn state_layout(&self) -> &FlatLayout {
        self.whole.state_layout()
    }

    fn classes(&self) -> usize {
        self.whole.classes()
    }

    fn device(&self) -> &Device {
        self.whole.device()
    }

    fn init(&self, params: &mut [f32], state: &mut [f32]) -> Result<(), ModelError> {
        self.whole.init(params, state)
    }

    fn forward_backward(
        &mut self,
        params: &[f32],
        state: &mut [f32],
        grads: &mut [f32],
        batch: Batch<'_>,
    ) -> Result<BatchStats, ModelError> {
        let s = self.net.forward_backward(
            params,
            state,
            grads,
            knet::Batch::Values(batch.features),
            batch.labels,
        )?;
        Ok(BatchStats { loss: s.loss, correct: s.correct, samples: s.targets })
    }

    fn evaluate(
        &mut self,
        params: &[f32],
        state: &[f32],
        batch: Batch<'_>,
    ) -> Result<BatchStats, ModelError> {
        self.whole.evaluate(params, state, batch)
    }

    fn partition(&self) -> Option<Partition> {
        let (split, owned) = self.net.split_tensors().into_iter().unzip();
        Some(Partition { split, owned, ranks: self.net.ranks() })
    }
}
