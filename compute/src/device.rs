//! Where a model computes: the CPU always; CUDA when this build has the `cuda` feature *and* a CUDA
//! driver is present at run time ([`Device::select`] checks before touching the driver, which
//! panics when absent).
//!
//! This is the one place the rest of the crate learns about devices: roles pass a [`Device`] to
//! the model they build and never name candle's. Parameters, state and gradients are exchanged
//! with the roles as host slices ([`crate::params::ParamStore`]); a model on another
//! device keeps its own copies there and moves them at the edges of a step.

use std::fmt;

/// A compute device.
#[derive(Clone, Debug)]
pub enum Device {
    /// The host CPU.
    Cpu,
    /// A CUDA GPU (only constructed when built with the `cuda` feature).
    Cuda(candle_core::Device),
}

/// Which device a process asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Preference {
    /// CUDA when compiled in and a GPU driver is present, else the CPU.
    #[default]
    Auto,
    /// Always the CPU.
    Cpu,
    /// CUDA, or an error saying why not.
    Cuda,
}

/// The requested device is not usable.
#[derive(Debug, thiserror::Error)]
#[error("device {0}")]
pub struct DeviceError(String);

impl Device {
    /// The device `preference` asks for, if this build and machine have it.
    pub fn select(preference: Preference) -> Result<Self, DeviceError> {
        match preference {
            Preference::Cpu => Ok(Device::Cpu),
            Preference::Auto => Ok(cuda_device().map_or(Device::Cpu, Device::Cuda)),
            Preference::Cuda => cuda_device().map(Device::Cuda).ok_or_else(|| {
                DeviceError(if cfg!(feature = "cuda") {
                    "cuda: no CUDA driver (libcuda) or no GPU found on this machine; use --device cpu".into()
                } else {
                    "cuda: this tandem was built without the `cuda` feature; rebuild with \
                     `cargo build --release --features cuda` (needs the CUDA toolkit) or use --device cpu"
                        .into()
                })
            }),
        }
    }

    /// Whether tensors on this device are host memory.
    pub fn is_host(&self) -> bool {
        matches!(self, Device::Cpu)
    }

    /// candle's handle of the device, for the candle-backed models.
    pub(crate) fn candle(&self) -> candle_core::Device {
        match self {
            Device::Cpu => candle_core::Device::Cpu,
            Device::Cuda(d) => d.clone(),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "Cpu"),
            Device::Cuda(d) => write!(f, "{d:?}"),
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_device() -> Option<candle_core::Device> {
    // cudarc panics instead of returning an error when libcuda cannot be loaded: ask the loader first.
    if !candle_core::cuda::cudarc::driver::sys::is_culib_present() {
        return None;
    }
    candle_core::Device::new_cuda(0).ok()
}

#[cfg(not(feature = "cuda"))]
fn cuda_device() -> Option<candle_core::Device> {
    None
}
