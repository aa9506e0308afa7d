//! The parameter store: every trainable parameter, every non-trainable state value (e.g. batch
//! normalisation's running statistics) and every gradient of a model as flat `f32` buffers — the
//! unit that collectives, the parameter server and checkpoints move — with the [`FlatLayout`]s
//! that name their parts.
//!
//! Order (fixed, part of the wire and checkpoint format): tensors in the order the model declares
//! them, which is forward order, weight before bias (e.g. `fc1.weight`, `fc1.bias`, `fc2.weight`,
//! …); inside a tensor, row-major (C) order. The state has a layout of its own, in the same
//! order, and is empty for models without state (today's MLP and CNN).
//!
//! How the two parts travel: the trainable parameters are what optimizers update, locally or on
//! the parameter servers; the state is carried beside them and never passes through an optimizer.
//! Worker checkpoints store both (state tensors are named `state.<name>`); the ranks of a group
//! average their state after every step ([`crate::train::GradientStep::sync_state`]),
//! and an allreduce group resumes it with the weights from rank 0's checkpoint. The parameter
//! servers do not hold state yet: a PS job refuses a model that has some.
//! [`ParamStore::joined`] (parameters, then state, as one vector) is the layout they will hold.
//!
//! Guarantees: the buffers always have their layouts' lengths; the gradient buffer has the
//! parameters' length.

/// Errors of the flat view.
#[derive(Debug, thiserror::Error)]
pub enum FlatError {
    /// A buffer does not have the layout's length.
    #[error("flat buffer of {what} has {got} values but the model has {expected}")]
    Length {
        /// Which buffer.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Actual length.
        got: usize,
    },
}

/// One tensor's place in the flat buffer.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayoutEntry {
    /// Parameter name, e.g. `fc1.weight`.
    pub name: String,
    /// Tensor shape.
    pub shape: Vec<usize>,
    /// First element in the flat buffer.
    pub offset: usize,
    /// Number of elements.
    pub len: usize,
}

/// Names, shapes and offsets of every parameter tensor in the flat buffer.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FlatLayout {
    entries: Vec<LayoutEntry>,
    len: usize,
}

impl FlatLayout {
    /// A layout of the given tensors, in the given order.
    pub fn new<'a>(tensors: impl IntoIterator<Item = (&'a str, &'a [usize])>) -> Self {
        let mut entries = Vec::new();
        let mut offset = 0;
        for (name, shape) in tensors {
            let len = shape.iter().product();
            entries.push(LayoutEntry { name: name.to_owned(), shape: shape.to_vec(), offset, len });
            offset += len;
        }
        Self { entries, len: offset }
    }

    /// Total number of parameters.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the layout holds no parameter.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The tensors, in flat order.
    pub fn entries(&self) -> &[LayoutEntry] {
        &self.entries
    }

    /// The part of `buf` that holds tensor `i`.
    pub fn slice<'a>(&self, buf: &'a [f32], i: usize) -> &'a [f32] {
        let e = &self.entries[i];
        &buf[e.offset..e.offset + e.len]
    }

    /// Refuses a buffer of another length than the layout's.
    pub fn check(&self, what: &'static str, got: usize) -> Result<(), FlatError> {
        if got == self.len { Ok(()) } else { Err(FlatError::Length { what, expected: self.len, got }) }
    }
}

/// The flat buffers of one model replica: parameters, state and gradients.
///
/// The buffers live in host memory: that is where collectives, parameter servers and checkpoints
/// read them. A model computing on another device keeps its working copies there and reads and
/// writes these at the edges of a step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParamStore {
    layout: FlatLayout,
    state_layout: FlatLayout,
    params: Vec<f32>,
    state: Vec<f32>,
    grads: Vec<f32>,
}

/// The three buffers of a [`ParamStore`], borrowed at once.
#[derive(Debug)]
pub struct Parts<'a> {
    /// Trainable parameters.
    pub params: &'a mut [f32],
    /// Non-trainable state.
    pub state: &'a mut [f32],
    /// Gradients of the parameters.
    pub grads: &'a mut [f32],
}

impl ParamStore {
    /// Zeroed buffers for `layout` (parameters) and `state_layout` (state).
    pub fn new(layout: FlatLayout, state_layout: FlatLayout) -> Self {
        Self {
            params: vec![0.0; layout.len()],
            grads: vec![0.0; layout.len()],
            state: vec![0.0; state_layout.len()],
            layout,
            state_layout,
        }
    }

    /// Names and shapes of the parameters.
    pub fn layout(&self) -> &FlatLayout {
        &self.layout
    }

    /// Names and shapes of the state.
    pub fn state_layout(&self) -> &FlatLayout {
        &self.state_layout
    }

    /// The parameters.
    pub fn params(&self) -> &[f32] {
        &self.params
    }

    /// The state.
    pub fn state(&self) -> &[f32] {
        &self.state
    }

    /// The gradient of the last computed batch.
    pub fn grads(&self) -> &[f32] {
        &self.grads
    }

    /// All three buffers, mutably.
    pub fn parts(&mut self) -> Parts<'_> {
        Parts { params: &mut self.params, state: &mut self.state, grads: &mut self.grads }
    }

    /// Length of the vector a parameter server holds for this model: parameters, then state.
    pub fn exchange_len(&self) -> usize {
        self.params.len() + self.state.len()
    }

    /// Sets the parameters from `params` and the state from `state`.
    pub fn set(&mut self, params: &[f32], state: &[f32]) -> Result<(), FlatError> {
        self.layout.check("parameters", params.len())?;
        self.state_layout.check("state", state.len())?;
        self.params.copy_from_slice(params);
        self.state.copy_from_slice(state);
        Ok(())
    }

    /// Parameters then state, as one vector (what a parameter server holds).
    pub fn joined(&self) -> Vec<f32> {
        let mut v = Vec::with_capacity(self.exchange_len());
        v.extend_from_slice(&self.params);
        v.extend_from_slice(&self.state);
        v
    }

    /// Sets parameters and state from a [`ParamStore::joined`] vector.
    pub fn set_joined(&mut self, joined: &[f32]) -> Result<(), FlatError> {
        if joined.len() != self.exchange_len() {
            return Err(FlatError::Length {
                what: "parameters and state",
                expected: self.exchange_len(),
                got: joined.len(),
            });
        }
        let (params, state) = joined.split_at(self.params.len());
        self.set(params, state)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn state_travels_beside_the_parameters_and_lengths_are_checked() {
        let layout = FlatLayout::new([("w", &[2usize, 2][..]), ("b", &[2][..])]);
        let state_layout = FlatLayout::new([("bn.running_mean", &[3usize][..])]);
        let mut store = ParamStore::new(layout, state_layout);
        assert_eq!((store.params().len(), store.state().len(), store.exchange_len()), (6, 3, 9));
        let joined: Vec<f32> = (0..9).map(|i| i as f32).collect();
        store.set_joined(&joined).unwrap();
        assert_eq!(store.params(), &joined[..6]);
        assert_eq!(store.state(), &joined[6..]);
        assert_eq!(store.joined(), joined);
        assert!(store.set_joined(&joined[1..]).is_err());
        assert!(store.set(&joined[..6], &joined[..2]).is_err());
        let parts = store.parts();
        parts.grads[0] = 1.0;
        assert_eq!(store.grads()[0], 1.0);
        assert_eq!(store.state_layout().entries()[0].name, "bn.running_mean");
    }
}
