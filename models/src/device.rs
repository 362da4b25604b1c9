//! The Burn device that trains heads.
//!
//! Both pure-CPU backends are compiled in, so that `fedge bench-backends` can compare them side
//! by side in one run; the choice is made at run time.

use std::str::FromStr;

use burn::tensor::Device;

/// A CPU backend for head training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// burn-ndarray, deprecated upstream; kept for comparison (`fedge bench-head`).
    NdArray,
    /// burn-flex, the pure-Rust CPU backend that replaces ndarray upstream; the default
    /// because it trained the head 2.3 times faster here (BENCHMARKS.md).
    #[default]
    Flex,
}

impl Backend {
    /// Name as used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Backend::NdArray => "ndarray",
            Backend::Flex => "flex",
        }
    }
}

impl FromStr for Backend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ndarray" => Ok(Backend::NdArray),
            "flex" => Ok(Backend::Flex),
            other => Err(format!("unknown backend {other:?}; use ndarray or flex")),
        }
    }
}

/// A device of `backend` with gradient tracking.
pub fn training_device(backend: Backend) -> Device {
    #[allow(deprecated)]
    let device = match backend {
        Backend::NdArray => Device::ndarray(),
        Backend::Flex => Device::flex(),
    };
    device.autodiff()
}
