//! The Burn device that trains heads: which CPU backend, and whether a CUDA GPU is used.
//!
//! Every build carries burn-flex; the `ndarray` feature (`cargo build --features ndarray` at
//! the workspace root) adds burn-ndarray, so that `fedge bench head --backends ndarray,flex`
//! can compare them side by side in one run. With the `cuda` feature, [`select_device`] trains on an NVIDIA GPU when one
//! answers and on the CPU otherwise.

use std::str::FromStr;

pub use burn::tensor::Device;
use fedge_wire::UnknownName;

/// A CPU backend for head training.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Backend {
    /// burn-ndarray, deprecated upstream; kept for comparison (`fedge bench head`).
    #[cfg(feature = "ndarray")]
    #[serde(rename = "ndarray")]
    #[cfg_attr(feature = "clap", value(name = "ndarray"))]
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
            #[cfg(feature = "ndarray")]
            Backend::NdArray => "ndarray",
            Backend::Flex => "flex",
        }
    }
}

impl Backend {
    /// Every backend this build has.
    pub const ALL: &[Backend] = &[
        #[cfg(feature = "ndarray")]
        Backend::NdArray,
        Backend::Flex,
    ];
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = UnknownName;

    /// A backend of this build by name (`ndarray` only with the `ndarray` feature).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Backend::ALL
            .iter()
            .copied()
            .find(|b| b.name() == s)
            .ok_or_else(|| UnknownName::new("backend", s, Backend::ALL.iter().map(|b| b.name())))
    }
}

/// A device of `backend` with gradient tracking.
pub fn training_device(backend: Backend) -> Device {
    #[allow(deprecated)]
    let device = match backend {
        #[cfg(feature = "ndarray")]
        Backend::NdArray => Device::ndarray(),
        Backend::Flex => Device::flex(),
    };
    device.autodiff()
}

/// Where a profile asks head training to run (`device` in a device profile).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Accelerator {
    /// A CUDA GPU when the build has the `cuda` feature and one answers, else the CPU.
    #[default]
    Auto,
    /// Always the CPU backend.
    Cpu,
    /// A CUDA GPU; falls back to the CPU (with a reason) when there is none.
    Cuda,
}

impl Accelerator {
    /// Name in a device profile.
    pub fn name(self) -> &'static str {
        match self {
            Accelerator::Auto => "auto",
            Accelerator::Cpu => "cpu",
            Accelerator::Cuda => "cuda",
        }
    }
}

impl FromStr for Accelerator {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let all = [Accelerator::Auto, Accelerator::Cpu, Accelerator::Cuda];
        all.into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| UnknownName::new("device", s, all.map(Accelerator::name)))
    }
}

/// The device training will use, what to call it in status, and why it is not the one asked
/// for when it is not.
#[derive(Debug, Clone)]
pub struct SelectedDevice {
    /// Burn device with gradient tracking.
    pub device: Device,
    /// `cpu` or `cuda:<index>` (the device status's `device` field).
    pub name: String,
    /// Set when a GPU was asked for (or `auto` in a CUDA build) and the CPU is used instead.
    pub fallback: Option<String>,
}

/// Whether this binary was built with the `cuda` feature.
pub const CUDA_BUILT: bool = cfg!(feature = "cuda");

/// Picks the training device: a CUDA GPU when asked for (or `auto`), built in and found, else
/// `backend` on the CPU. Never fails: a missing GPU is a fallback with its reason.
pub fn select_device(accelerator: Accelerator, backend: Backend) -> SelectedDevice {
    let cpu = |fallback: Option<String>| SelectedDevice {
        device: training_device(backend),
        name: "cpu".into(),
        fallback,
    };
    if accelerator == Accelerator::Cpu {
        return cpu(None);
    }
    match probe_cuda() {
        Ok(device) => SelectedDevice {
            device: device.autodiff(),
            name: "cuda:0".into(),
            fallback: None,
        },
        // `auto` in a CPU build is the CPU by design, not a fallback.
        Err(_) if accelerator == Accelerator::Auto && !CUDA_BUILT => cpu(None),
        Err(reason) => cpu(Some(format!(
            "{reason}; training on the CPU ({})",
            backend.name()
        ))),
    }
}

/// The first CUDA device, opened and checked with one small computation.
#[cfg(feature = "cuda")]
fn probe_cuda() -> Result<Device, String> {
    use burn::tensor::{DeviceType, Tensor, TensorData};
    // No driver library (libcuda.so) or no GPU the driver lets this process use: cubecl lists
    // no CUDA device. A device that is listed but fails to open or compute panics in the CUDA
    // runtime; keep that panic's message out of the log while probing, and report it as a reason.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let probed = std::panic::catch_unwind(|| {
        let Some(device) = Device::enumerate(DeviceType::Cuda).first().cloned() else {
            return Err(
                "no CUDA device found (the CUDA driver library, libcuda.so, did not \
                 load, or the driver lists no GPU this process may use)"
                    .to_string(),
            );
        };
        let values = Tensor::<1>::from_data(TensorData::new(vec![1.0f32, 2.0], [2]), &device)
            .sum()
            .into_data()
            .try_into_vec::<f32>();
        match values {
            Ok(values) if values == [3.0] => Ok(device),
            _ => Err("the CUDA device did not compute 1 + 2 = 3".to_string()),
        }
    });
    std::panic::set_hook(hook);
    match probed {
        Ok(probed) => probed,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown error".into());
            Err(format!("CUDA unavailable: {message}"))
        }
    }
}

/// Without the `cuda` feature there is no GPU to probe.
#[cfg(not(feature = "cuda"))]
fn probe_cuda() -> Result<Device, String> {
    Err(
        "this build has no CUDA support (build fedge-edge with `--features cuda`, \
         docs/deploy.md)"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_chosen_without_a_fallback_note_when_asked_for() {
        let selected = select_device(Accelerator::Cpu, Backend::Flex);
        assert_eq!(selected.name, "cpu");
        assert!(selected.fallback.is_none());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_falls_back_to_the_cpu_with_a_reason_in_a_cpu_build() {
        let selected = select_device(Accelerator::Cuda, Backend::Flex);
        assert_eq!(selected.name, "cpu");
        let reason = selected.fallback.expect("a reason for the fallback");
        assert!(reason.contains("--features cuda"), "{reason}");
        assert!(reason.contains("training on the CPU (flex)"), "{reason}");
        // Auto is the CPU by design in a CPU build: no fallback to report.
        let auto = select_device(Accelerator::Auto, Backend::Flex);
        assert_eq!((auto.name.as_str(), auto.fallback), ("cpu", None));
    }

    #[test]
    fn device_names_parse() {
        for (name, accelerator) in [
            ("auto", Accelerator::Auto),
            ("cpu", Accelerator::Cpu),
            ("cuda", Accelerator::Cuda),
        ] {
            assert_eq!(name.parse::<Accelerator>(), Ok(accelerator));
        }
        let err = "gpu".parse::<Accelerator>().unwrap_err().to_string();
        assert!(err.contains("auto, cpu, cuda"), "{err}");
    }
}
