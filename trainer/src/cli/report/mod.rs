//! What a person sees of a training run: progress on the terminal or as JSON lines
//! ([`display`]) and the training curve ([`curve`], the `tandem-curve` crate, which `kubectl
//! tandem plot` draws with too).

pub mod display;
pub use tandem_curve as curve;
