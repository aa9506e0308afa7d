//! What a person sees of a training run: progress on the terminal or as JSON lines
//! ([`display`]) and the training curve ([`curve`]).

pub mod curve;
pub mod display;
