//! Tandem's CPU compute engine: the training step of a network as a few GEMMs and fused
//! elementwise passes over flat vectors, with no autograd graph, no allocation in the steady
//! state and no copy of parameters or gradients between formats.
//!
//! - [`gemm`]: single-precision GEMM whose operands are addressed in place (strides or offset
//!   tables), AVX-512 micro-kernels, fused bias/ReLU epilogues.
//! - [`pool`]: the fork-join thread pool of a job (none at all with one thread).
//! - [`layers`]: dense, convolution (any kernel, stride, padding), max/average/global pooling,
//!   batch norm, layer norm, ReLU, GELU, flatten, token and position embeddings, token-major
//!   linear, causal multi-head self-attention, fused softmax cross-entropy, and the composites
//!   chain and residual.
//! - [`net`]: a network of layers over one flat parameter vector, one flat gradient vector and one
//!   flat state vector owned by the caller, on float or token-id input, with weight tying.
//! - [`models`]: the trainer's MLP and LeNet-style CNN, ResNet, VGG and a GPT on the engine.
//! - [`peak`]: this machine's GEMM peak at the training step's shapes.
//! - [`split`]: model parallelism (PCL-DNN): dense layers split over a group's ranks by output
//!   features, the other layers data-parallel, over collectives the caller provides.
//!
//! The crate depends on no async runtime and no tensor library.

pub mod gemm;
pub mod layers;
mod math;
pub mod models;
pub mod net;
pub mod peak;
pub mod pool;
mod simd;
pub mod split;
