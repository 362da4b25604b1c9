//! Which engine runs a frozen backbone (`[model]` in a device profile): tract, built into every
//! binary, or an installed ONNX Runtime library loaded at start (the `onnxruntime` feature),
//! with the execution providers a profile asks for.

use std::path::PathBuf;
use std::str::FromStr;

use fedge_wire::UnknownName;

/// The engine that runs the backbone.
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
pub enum Runtime {
    /// tract, compiled into the binary: the only engine of the static gateway build.
    #[default]
    Tract,
    /// ONNX Runtime, loaded from an installed `libonnxruntime` (builds with the `onnxruntime`
    /// feature).
    Onnxruntime,
}

impl Runtime {
    /// Every engine, as profiles and command lines spell them.
    pub const ALL: [Runtime; 2] = [Runtime::Tract, Runtime::Onnxruntime];

    /// Name in a profile, on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Tract => "tract",
            Runtime::Onnxruntime => "onnxruntime",
        }
    }
}

impl std::fmt::Display for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Runtime {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Runtime::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| UnknownName::new("runtime", s, Runtime::ALL.map(Runtime::name)))
    }
}

/// An ONNX Runtime execution provider.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Provider {
    /// ONNX Runtime's own CPU kernels; always there, the last resort.
    Cpu,
    /// NVIDIA GPUs through CUDA (onnxruntime-gpu, JetPack's onnxruntime).
    Cuda,
    /// NVIDIA TensorRT, which compiles the model for the GPU at session start.
    Tensorrt,
}

impl Provider {
    /// Every provider, as profiles spell them.
    pub const ALL: [Provider; 3] = [Provider::Cpu, Provider::Cuda, Provider::Tensorrt];

    /// Name in a profile and in the device's status.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Cpu => "cpu",
            Provider::Cuda => "cuda",
            Provider::Tensorrt => "tensorrt",
        }
    }
}

impl std::fmt::Display for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Provider {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Provider::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownName::new("provider", s, Provider::ALL.map(Provider::name)))
    }
}

/// How a device runs its backbone (`[model]` in a device profile).
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// `tract` (the default, built into every binary) or `onnxruntime` (a build with the
    /// `onnxruntime` feature and an installed ONNX Runtime library).
    #[serde(default)]
    pub runtime: Runtime,
    /// The ONNX Runtime library to load (`libonnxruntime.so.1.x`: from the `onnxruntime` or
    /// `onnxruntime-gpu` Python wheel's `onnxruntime/capi/`, or NVIDIA's build on a Jetson);
    /// relative to the profile. Unset: `ORT_DYLIB_PATH`, else `libonnxruntime.so` on the
    /// loader's path.
    #[serde(default)]
    pub onnxruntime_library: Option<PathBuf>,
    /// ONNX Runtime's execution providers in order of preference, e.g. `["tensorrt", "cuda",
    /// "cpu"]`; one the library lacks or cannot start is skipped with its reason in `check`
    /// and the status, and the CPU is always the last resort.
    #[serde(default = "default_providers")]
    pub providers: Vec<Provider>,
}

fn default_providers() -> Vec<Provider> {
    vec![Provider::Cpu]
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            runtime: Runtime::Tract,
            onnxruntime_library: None,
            providers: default_providers(),
        }
    }
}

impl RuntimeConfig {
    /// tract, as every build has it.
    pub fn tract() -> Self {
        Self::default()
    }

    /// ONNX Runtime from `library` (or the default search) with `providers`.
    pub fn onnxruntime(library: Option<PathBuf>, providers: Vec<Provider>) -> Self {
        Self {
            runtime: Runtime::Onnxruntime,
            onnxruntime_library: library,
            providers,
        }
    }
}

/// Whether this binary can run backbones with ONNX Runtime.
pub const ONNXRUNTIME_BUILT: bool = cfg!(feature = "onnxruntime");

/// Whether tract can run a backbone on more than one thread (the `tract-threads` feature).
pub const TRACT_THREADS_BUILT: bool = cfg!(feature = "tract-threads");

/// What a loaded backbone runs on: the engine, the execution providers in use, and why a
/// provider that was asked for is not among them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RuntimeReport {
    /// The engine.
    pub runtime: Runtime,
    /// ONNX Runtime's version, when it is the engine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Providers registered on the session, in order (empty for tract).
    pub providers: Vec<Provider>,
    /// One line per provider asked for and not used, with the reason.
    pub skipped: Vec<String>,
}

impl std::fmt::Display for RuntimeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.version, self.runtime) {
            (Some(v), _) => write!(f, "{} {v}", self.runtime)?,
            (None, runtime) => write!(f, "{runtime}")?,
        }
        if !self.providers.is_empty() {
            let names: Vec<&str> = self.providers.iter().map(|p| p.name()).collect();
            write!(f, " (providers: {})", names.join(", "))?;
        }
        for skipped in &self.skipped {
            write!(f, "; {skipped}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_list_the_known() {
        for runtime in Runtime::ALL {
            assert_eq!(runtime.name().parse::<Runtime>(), Ok(runtime));
        }
        for provider in Provider::ALL {
            assert_eq!(provider.name().parse::<Provider>(), Ok(provider));
        }
        let err = "ort".parse::<Runtime>().unwrap_err().to_string();
        assert!(err.contains("tract, onnxruntime"), "{err}");
        let toml: RuntimeConfig =
            toml::from_str("runtime = \"onnxruntime\"\nproviders = [\"cuda\", \"cpu\"]").unwrap();
        assert_eq!(toml.runtime, Runtime::Onnxruntime);
        assert_eq!(toml.providers, [Provider::Cuda, Provider::Cpu]);
        assert!(toml::from_str::<RuntimeConfig>("providers = [\"gpu\"]").is_err());
    }
}
